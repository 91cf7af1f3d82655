"""The lit/FileCheck suite under lit/, run as one pytest test."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_lit_suite():
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    lit = shutil.which("lit", path=env["PATH"])
    assert lit, "lit is not installed (pip install -e '.[test]')"
    proc = subprocess.run([lit, "-v", str(REPO / "lit")],
                          capture_output=True, text=True, env=env, timeout=900)
    print(proc.stdout[-5000:], proc.stderr[-3000:])
    assert proc.returncode == 0
    assert "Failed" not in proc.stdout and "Passed" in proc.stdout
