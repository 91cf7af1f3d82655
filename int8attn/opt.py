"""int8attn-opt: an mlir-opt style driver for int8attn's passes.

    int8attn-opt FILE [-p "a,b{opt=v}" | --pipeline NAME] [-o OUT]
                 [--print-ir-after-all] [--split-input-file]

Passes are int8attn's own (see `int8attn-opt --list-passes`) plus any pass
IREE registers (canonicalize, cse, ...). Errors are printed as
`file:line:col: error: ...` with exit status 1; misuse exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from . import arg_types
from .passes import PASSES
from .pipelines import NAMED_PIPELINES, PipelineOptions, named_pipeline
from .pipelines.manager import PipelineError, parse_pipeline, run_passes
from .support.diagnostics import DiagnosticError
from .support.docs import first_sentence
from .support.files import OutputError, check_output_path, write_atomic
from .support.ir import new_context, parse_module
from .support.options import describe_options
from .support.remarks import collect

SPLIT_MARKER = "// -----"


def split_input(text: str) -> list[str]:
    """Chunks at `// -----` lines, each padded so its line numbers stay the file's."""
    chunks, current, first_line = [], [], 0
    for number, line in enumerate(text.splitlines(keepends=True)):
        if line.strip() == SPLIT_MARKER:
            chunks.append("\n" * first_line + "".join(current))
            current, first_line = [], number + 1
        else:
            current.append(line)
    chunks.append("\n" * first_line + "".join(current))
    return chunks


def build_parser() -> argparse.ArgumentParser:
    parser = arg_types.FlagParser(
        prog="int8attn-opt", description="Run int8attn and IREE passes on an MLIR file.")
    parser.add_argument("input", nargs="?", type=arg_types.path, help="MLIR file ('-' for stdin)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-p", "--pass-pipeline", dest="pipeline_text", metavar="PIPELINE",
                       help='comma-separated passes, e.g. "int8-qk,decode-split-kv{partition-tokens=256}"')
    group.add_argument("--pipeline", metavar="NAME",
                       help='a named pipeline, e.g. "int8attn-to-linalg{pv=int8 fragment-model=gfx936}"')
    parser.add_argument("-o", "--output", type=arg_types.path,
                        help="write the result here ('-': stdout, the "
                        "default)")
    parser.add_argument("--print-ir-after-all", action="store_true",
                        help="print the IR to stderr after every pass")
    parser.add_argument("--mlir-timing", action="store_true",
                        help="print MLIR's pass timing report to stderr")
    parser.add_argument("--split-input-file", action="store_true",
                        help="process chunks separated by '// -----' independently")
    parser.add_argument("--list-passes", action="store_true",
                        help="list int8attn's passes and named pipelines, then exit")
    return parser


def list_passes() -> str:
    lines = ["int8attn passes:"]
    for name, cls in PASSES.items():
        summary = first_sentence(cls.__doc__)
        lines.append(f"  {name:22} {summary}")
        lines += describe_options(cls, indent=" " * 27)
    lines.append("named pipelines:")
    for name, fn in NAMED_PIPELINES.items():
        lines.append(f"  {name:22} {first_sentence(fn.__doc__)}")
    lines.append("  options of both:")
    lines += describe_options(PipelineOptions, indent=" " * 27)
    return "\n".join(lines)


def process(chunk: str, filename: str, passes, print_after_all: bool, timing: bool) -> str:
    with new_context() as context:
        remarks = collect(context)
        try:
            module = parse_module(chunk, filename)
            run_passes(module, passes, print_ir_after_all=print_after_all, timing=timing)
            return str(module)
        finally:
            for line in remarks:  # passes' remarks, as mlir-opt prints them: on stderr
                print(line, file=sys.stderr)


def main(argv=None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # the reader went away (`int8attn-opt --list-passes | head -2`): nothing left to say
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.list_passes:
        print(list_passes())
        return 0
    if args.input is None:
        parser.error("the input file is required")
    try:
        if args.pipeline:
            passes = named_pipeline(args.pipeline)
        else:
            passes = parse_pipeline(args.pipeline_text or "")
    except PipelineError as error:
        parser.error(str(error))
    filename = "<stdin>" if args.input == "-" else args.input
    if args.output == "-":   # stdout, as for `int8attn compile -o -`; not a file named '-'
        args.output = None
    try:
        if args.output:
            check_output_path(args.output, [args.input])
        text = sys.stdin.read() if args.input == "-" else open(args.input).read()
    except OutputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot read '{args.input}': {error.strerror}", file=sys.stderr)
        return 1
    except UnicodeDecodeError:
        print(f"error: '{filename}' is not MLIR text (not UTF-8)", file=sys.stderr)
        return 1
    chunks = split_input(text) if args.split_input_file else [text]
    outputs, failed = [], False
    for chunk in chunks:
        try:
            outputs.append(process(chunk, filename, passes, args.print_ir_after_all,
                                   args.mlir_timing))
        except DiagnosticError as error:
            print(error.format(), file=sys.stderr)
            failed = True
    result = f"\n{SPLIT_MARKER}\n".join(outputs) + "\n"
    if args.output and not failed:
        try:
            write_atomic(args.output, result, inputs=[args.input])
        except OutputError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    elif not args.output:
        sys.stdout.write(result)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
