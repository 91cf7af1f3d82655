"""The `int8attn` command: compile and run attention graphs, for every target.

    int8attn compile GRAPH.mlir [--target T] [--emit STAGE] [--save-stages DIR] -o OUT
    int8attn run GRAPH.mlir [--target T] [--simulate] [--inputs IN.npz] [--output OUT.npz]
    int8attn targets
    int8attn bench --target cuda

One driver serves every target (`int8attn.driver`): the compile flags are the
fields of `CompileOptions`, the stages those of the target's row in
`driver.targets`. Exit status: 0 success, 1 an error in the input or a failing
stage (printed as `file:line:col: error: ...` where there is a location),
2 misuse (an unknown flag, or an option the target does not offer).

This module is the console script: it parses (`cli_parser`), dispatches to the
commands (`cli_compile_run`, `cli_bench`) and turns their errors into the exit
status; the names it imports from them stay importable from here.
"""

from __future__ import annotations

import os
import sys
import warnings

from .cli_bench import MODE_FLAGS, cmd_bench
from .cli_compile_run import _print_remarks, cmd_compile, cmd_run, cmd_targets
from .cli_errors import UserError
from .cli_parser import CLI_OPTIONS, build_parser
from .driver.onnx_import import ModelError
from .driver.packaging import KernelObjectError
from .driver.targets import OptionRefused
from .runtime.module import InputError
from .support.diagnostics import DiagnosticError, StageError, UsageError
from .support.files import OutputError
from .support.options import OptionError

__all__ = ["CLI_OPTIONS", "MODE_FLAGS", "UserError", "build_parser", "cmd_bench",
           "cmd_compile", "cmd_run", "cmd_targets", "main"]


def _quiet_broken_pipe() -> int:
    # The reader went away (`int8attn run ... | head -1`): nothing left to say.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # a command line user gets the warning, not the source line that raised it
    print(f"warning: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench,
               "targets": cmd_targets}[args.command]
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        return _run(handler, args)


def _run(handler, args) -> int:
    """`handler(args)`, its errors turned into a message and the exit status."""
    try:
        return handler(args)
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except (OptionRefused, OptionError, UsageError) as error:
        print(f"int8attn {args.command}: error: {error}", file=sys.stderr)
        return 2
    except DiagnosticError as error:
        _print_remarks(getattr(error, "remarks", ()), getattr(args, "graph", ""))
        print(error.format(), file=sys.stderr)
    except StageError as error:
        # e.g. why an attention was left to IREE, before IREE's own error
        _print_remarks(getattr(error, "remarks", ()), getattr(args, "graph", ""))
        print(f"error: {error}", file=sys.stderr)
    except (UserError, InputError, OutputError, ModelError, KernelObjectError) as error:
        print(f"error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
