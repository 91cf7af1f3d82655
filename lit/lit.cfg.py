# lit configuration: every .mlir file under lit/ is a test.
import os
import shutil
import sys

import lit.formats

config.name = "int8attn"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Output"]
# Tools come from the environment lit runs in: the folder of the Python running lit
# (`.venv/bin/lit lit/` finds the venv's int8attn-opt and filecheck without an
# activated venv), then PATH.
TOOLS_DIR = os.path.dirname(sys.executable)
config.environment["PATH"] = os.pathsep.join(
    [TOOLS_DIR] + [p for p in os.environ.get("PATH", "").split(os.pathsep) if p])
for var in ("HOME", "INT8ATTN_CACHE_DIR", "PYTHONPATH", "VIRTUAL_ENV"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
for tool in ("int8attn-opt", "int8attn", "filecheck"):
    if shutil.which(tool, path=config.environment["PATH"]) is None:
        lit_config.fatal(f"'{tool}' is neither beside the Python running lit ({TOOLS_DIR}) "
                         f"nor on PATH; install the project into that environment with "
                         f"pip install -e '.[test]'")
