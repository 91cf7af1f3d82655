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


def _path_without(folder: Path) -> str:
    """PATH with `folder` (the venv's bin) left out, as in a shell without the venv."""
    kept = [p for p in os.environ.get("PATH", "").split(os.pathsep)
            if p and Path(p).resolve() != folder.resolve()]
    return os.pathsep.join(kept or ["/usr/bin", "/bin"])


def test_lit_finds_the_tools_beside_its_python_without_the_venv_on_path():
    """`.venv/bin/lit lit/` from a shell whose PATH lacks .venv/bin: lit.cfg.py takes
    int8attn-opt and filecheck from the folder of the Python that runs lit."""
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=_path_without(bin_dir))
    env.pop("VIRTUAL_ENV", None)
    assert shutil.which("int8attn-opt", path=env["PATH"]) is None, "venv still on PATH"
    lit = bin_dir / "lit"       # the script, as a user runs it: `.venv/bin/lit`
    assert lit.is_file(), "lit is not installed (pip install -e '.[test]')"
    proc = subprocess.run([str(lit), "-v", str(REPO / "lit" / "algorithm" / "int8-qk.mlir")],
                          capture_output=True, text=True, env=env, timeout=300)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr
    assert "PASS: int8attn :: algorithm/int8-qk.mlir" in proc.stdout


def test_lit_names_where_it_looked_when_the_tools_are_missing(tmp_path):
    """A Python whose folder holds no int8attn-opt (a link to the interpreter
    elsewhere, the venv's packages on PYTHONPATH) and a PATH without the venv: lit
    stops with where it looked and how to install, not a failing RUN line."""
    import lit as lit_package

    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.symlink_to(Path(sys.executable).resolve())
    site = Path(lit_package.__file__).resolve().parent.parent
    env = dict(os.environ, PATH=_path_without(Path(sys.executable).parent),
               PYTHONPATH=str(site))
    env.pop("VIRTUAL_ENV", None)
    run_lit = "import sys; from lit.main import main; sys.argv[0] = 'lit'; main()"
    proc = subprocess.run([str(python), "-c", run_lit,
                           str(REPO / "lit" / "algorithm" / "int8-qk.mlir")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode != 0
    assert "'int8attn-opt' is neither beside the Python running lit" in proc.stderr, \
        proc.stderr
    assert str(python.parent) in proc.stderr and "pip install -e '.[test]'" in proc.stderr
