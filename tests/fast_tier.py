"""The fast tier's guard: while a run selects the fast tier (`pytest -m fast`), the
entry points of IREE compilation and of the lane simulator raise instead of working,
and any call of them fails the test that made it, even where the test catches the
error. tests/conftest.py installs it; tests/test_fast_tier.py proves it fires.

Guarded, in this process and in the Python commands a test starts (the CLIs, lit
and its int8attn-opt / int8attn runs, examples), which the run's PYTHONPATH makes
load a sitecustomize.py that installs the same guard (write_site):
  * iree.compiler.tools compile_str / compile_file and the tools' invoke_immediate /
    invoke_pipeline (every way the Python API starts iree-compile);
  * starting an IREE tool executable (iree-compile, iree-lld, iree-run-module, ...)
    as a subprocess, directly or as the command of `sh -c` / `bash -c` (the CPU
    probe of driver/cpu_target.py, reproducer commands);
  * the lane simulator: int8attn.simulator's Machine.run and run_executable.
A guarded call raises FastTierViolation and is logged; the run marks the test
failed when its log gained a line, so a test that expects an error (a
`pytest.raises(Exception)`, a CLI expected to exit 1) is still caught.
"""

from __future__ import annotations

import importlib.abc
import os
import re
import subprocess
import sys
from pathlib import Path

# `INT8ATTN_FAST_TIER_GUARD=1 pytest tests/test_x.py` turns the guard on without -m
# fast: how to check whether the tests of a file qualify before marking them.
FORCE_VARIABLE = "INT8ATTN_FAST_TIER_GUARD"
SITE_PREFIX = "int8attn-fast-tier-"      # the folder write_site fills

_TOOL = re.compile(r"(?<![\w.-])iree-(compile|lld|opt|run-module|run-mlir|benchmark-module"
                   r"|benchmark-executable|import-onnx)(?![\w.-])")
_log: str | None = None                  # where hits go; None: not installed


class FastTierViolation(RuntimeError):
    pass


def current_test() -> str:
    """The test's node id; "?" in a command that did not inherit pytest's variable
    (the run fills in the test it was running)."""
    return os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]


def violation(what: str) -> FastTierViolation:
    """Log the hit (for the run, which fails the test) and return the error to raise."""
    message = (f"fast-tier test {current_test()} compiled/simulated ({what}): "
               f"mark it slow or unmark fast (tests/conftest.py FAST_FILES, FAST_TESTS)")
    with open(_log, "a") as f:
        f.write(f"{message} [pid {os.getpid()}]\n")
    return FastTierViolation(message)


def _guard(what: str):
    def guarded(*args, **kwargs):
        raise violation(what)
    guarded.__fast_tier_guard__ = what
    return guarded


def _replace(original, replacement, prefixes=("iree.compiler", "int8attn")) -> None:
    """Rebind every module-level name bound to `original` (`from m import f` copies)."""
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(prefixes):
            continue
        for attr, value in list(vars(module).items()):
            if value is original:
                setattr(module, attr, replacement)


def _tool_in(args, executable) -> str | None:
    """The IREE tool a subprocess would start, or None."""
    if isinstance(args, (str, bytes, os.PathLike)):
        argv = [os.fsdecode(args)]
    else:
        argv = [os.fsdecode(a) for a in args]
    program = os.path.basename(os.fsdecode(executable or (argv[0] if argv else "")))
    if _TOOL.fullmatch(program):
        return program
    if program in ("sh", "bash", "dash", "zsh"):
        match = _TOOL.search(" ".join(argv[1:]))
        return match.group(0) if match else None
    return None


def _patch_core(core) -> None:
    for name in ("compile_str", "compile_file"):
        _replace(getattr(core, name), _guard(f"iree.compiler.tools.{name}"))


def _patch_binaries(binaries) -> None:
    for name in ("invoke_immediate", "invoke_pipeline"):
        _replace(getattr(binaries, name), _guard(f"iree.compiler.tools {name}"))


def _patch_interpreter(interpreter) -> None:
    interpreter.Machine.run = _guard("int8attn.simulator Machine.run")


def _patch_run(run) -> None:
    _replace(run.run_executable, _guard("int8attn.simulator.run_executable"))


# Patched when imported (at once if already), so that a command the guard rides
# along into pays no import it would not have made.
_PATCHES = {"iree.compiler.tools.binaries": _patch_binaries,
            "iree.compiler.tools.core": _patch_core,
            "int8attn.simulator.interpreter": _patch_interpreter,
            "int8attn.simulator.run": _patch_run}


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)

    def __getattr__(self, name):            # get_source, get_filename, ...
        return getattr(self.loader, name)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, patch)
                return spec
        return None


def install(log: str) -> None:
    """Turn the guard on in this process, hits appended to `log` (idempotent)."""
    global _log
    if _log is not None:
        return
    _log = log
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _PatchOnImport())

    execute_child = subprocess.Popen._execute_child

    def _execute_child(self, args, executable, *rest, **kwargs):
        tool = _tool_in(args, executable)
        if tool:
            raise violation(f"subprocess {tool}")
        return execute_child(self, args, executable, *rest, **kwargs)

    subprocess.Popen._execute_child = _execute_child


def write_site(directory: Path, log: Path) -> str:
    """Write `directory`/sitecustomize.py, which installs the guard (hits to `log`) in
    any Python started with `directory` on its PYTHONPATH; returns that PYTHONPATH.
    The folder, not a variable, carries the guard: lit passes PYTHONPATH on to its
    commands and drops other variables."""
    (directory / "sitecustomize.py").write_text(
        "# Written by tests/fast_tier.py for one fast-tier run: its guard, installed in\n"
        "# each Python command that the run's tests start.\n"
        "import importlib.util, sys\n"
        f"_spec = importlib.util.spec_from_file_location('int8attn_fast_tier_guard', "
        f"{str(Path(__file__).resolve())!r})\n"
        "_guard = importlib.util.module_from_spec(_spec)\n"
        "sys.modules[_spec.name] = _guard\n"
        "_spec.loader.exec_module(_guard)\n"
        f"_guard.install({str(log)!r})\n")
    path = os.environ.get("PYTHONPATH")
    return os.pathsep.join([str(directory)] + ([path] if path else []))


def without_guard(env: dict[str, str]) -> dict[str, str]:
    """`env` less the guard, for a command that must run unguarded."""
    env = {k: v for k, v in env.items() if k != FORCE_VARIABLE}
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
             if p and not Path(p).name.startswith(SITE_PREFIX)]
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)
    return env


def requires_fast(markexpr: str) -> bool:
    """Whether the -m expression selects only tests marked fast: it is false for a
    test without the mark whether every other mark is present or absent."""
    if not markexpr.strip():
        return False
    try:
        from _pytest.mark.expression import Expression
        expression = Expression.compile(markexpr)
    except Exception:          # pytest's private API moved, or a bad expression
        return bool(re.fullmatch(r"\s*fast\s*(and\s.*)?", markexpr))
    return not any(expression.evaluate(lambda name, /, **kw: name != "fast" and others)
                   for others in (False, True))
