"""The fast tier's guard (tests/fast_tier.py): a test marked fast that compiles or
simulates fails, in the test's own process or in a command it starts, even where it
catches the error; without -m fast the same tests pass."""

import os
import subprocess
import sys

import pytest

import fast_tier
from conftest import REPO

# Each test reaches one guarded entry point the way a test could, and passes when
# nothing is guarded: the calls fail before compiling or simulating anything.
PROBE = '''
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.fast


def test_compile_str_caught():
    from iree.compiler.tools import compile_str

    with pytest.raises(Exception):          # a test of an error path could do this
        compile_str("module {}", output_format="no-such-format")


def test_simulator_caught():
    from int8attn.simulator import Machine

    with pytest.raises(Exception):
        Machine.run(None)


def test_compile_in_a_command():
    # Only PYTHONPATH reaches the command, as lit passes the environment on.
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    subprocess.run([sys.executable, "-c", "from iree.compiler.tools import compile_str; "
                    "compile_str('module {}', output_format='no-such-format')"], env=env)


def test_iree_compile_executable(tmp_path):
    tool = tmp_path / "iree-compile"        # stands in for the real one
    tool.write_text("#!/bin/sh\\nexit 3\\n")
    tool.chmod(0o755)
    with pytest.raises(Exception):
        subprocess.run([str(tool), "-"], check=True)


def test_numpy_only():
    assert sum(range(4)) == 6
'''


def run_probe(tmp_path, *args):
    """pytest on PROBE with this suite's conftest, started without the guard of the
    run this test is in."""
    (tmp_path / "test_guard_probe.py").write_text(PROBE)
    env = fast_tier.without_guard(dict(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO / "tests")] + ([env["PYTHONPATH"]] if "PYTHONPATH" in env else []))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", "-q", "-rA",
         "test_guard_probe.py", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)


def test_the_guard_fails_fast_tests_that_compile_or_simulate(tmp_path):
    proc = run_probe(tmp_path, "-m", "fast")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "4 failed, 1 passed" in out, out
    for test, what in [("test_compile_str_caught", "iree.compiler.tools.compile_str"),
                       ("test_simulator_caught", "int8attn.simulator Machine.run"),
                       ("test_compile_in_a_command", "iree.compiler.tools.compile_str"),
                       ("test_iree_compile_executable", "subprocess iree-compile")]:
        assert (f"fast-tier test test_guard_probe.py::{test} compiled/simulated ({what}): "
                f"mark it slow or unmark fast") in out, (test, out)
    assert "PASSED test_guard_probe.py::test_numpy_only" in out, out


def test_without_the_fast_tier_the_probe_passes(tmp_path):
    proc = run_probe(tmp_path, "-m", "not slow")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "5 passed" in out and "fast-tier" not in out, out


@pytest.mark.parametrize("markexpr, guarded", [
    ("fast", True), ("fast and not slow", True), ("not slow and fast", True),
    ("(fast)", True), ("", False), ("not slow", False), ("slow", False),
    ("not fast", False), ("fast or slow", False), ("fast or not slow", False),
])
def test_the_guard_is_on_when_the_marks_select_only_fast_tests(markexpr, guarded):
    assert fast_tier.requires_fast(markexpr) is guarded


@pytest.mark.parametrize("argv, tool", [
    (["/venv/lib/iree/compiler/_mlir_libs/iree-compile", "-", "-o", "x.vmfb"], "iree-compile"),
    (["iree-run-module", "--module=x.vmfb"], "iree-run-module"),
    (["bash", "-o", "pipefail", "-c", "iree-compile in.mlir | head"], "iree-compile"),
    (["/bin/sh", "-c", "int8attn run x.mlir"], None),
    (["int8attn-opt", "x.mlir"], None),
    (["echo", "iree-compile"], None),
])
def test_the_guard_knows_an_iree_tool_from_its_command(argv, tool):
    assert fast_tier._tool_in(argv, None) == tool
