# lit configuration: every .mlir file under lit/ is a test.
import os
import shutil

import lit.formats

config.name = "int8attn"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["Output"]
# Tools come from the environment the tests run in (the project's venv).
config.environment["PATH"] = os.environ.get("PATH", "")
for var in ("HOME", "INT8ATTN_CACHE_DIR", "PYTHONPATH", "VIRTUAL_ENV"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
for tool in ("int8attn-opt", "int8attn", "filecheck"):
    if shutil.which(tool) is None:
        lit_config.fatal(f"'{tool}' is not on PATH; install the project with "
                         f"pip install -e '.[test]'")
