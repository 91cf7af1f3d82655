"""The `int8attn` command: compile and run attention graphs.

    int8attn compile GRAPH.mlir --target cpu [--pv int8|bf16|f32] -o OUT.vmfb
    int8attn run GRAPH.mlir [--inputs IN.npz] [--output OUT.npz] [--pv ...]

Exit status: 0 success, 1 an error in the input or a failing stage (printed
as `file:line:col: error: ...` where there is a location), 2 misuse.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from int8attn.support.diagnostics import DiagnosticError, StageError
from int8attn.support.files import OutputError, check_output_path, write_atomic
from int8attn.fragments import SCALE_GROUP_KINDS, FRAGMENT_MODELS
from int8attn.pipelines import PV_CHOICES
from int8attn.pipelines.compile import BACKENDS, CompileOptions
from int8attn.pipelines.kernel import KERNEL_TARGETS
from int8attn.runtime.module import InputError


class UserError(Exception):
    """A problem with the user's files or inputs: printed as `error: ...`, exit 1."""


def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", help="MLIR file with int8attn.attention graphs")
    parser.add_argument("--target", choices=sorted(BACKENDS) + list(KERNEL_TARGETS),
                        default="cpu",
                        help="cpu: the tensor-level pipeline on IREE llvm-cpu (default); "
                             "gfx936/gfx942: the lane-level decode kernels")
    parser.add_argument("--pv", choices=PV_CHOICES, default="int8",
                        help="PV precision: int8 (MMAC tiles), or the bf16/f32 baselines "
                             "(default: int8)")
    parser.add_argument("--fragment-model", choices=sorted(FRAGMENT_MODELS), default="gfx936",
                        help="matrix instruction whose token groups the W scales follow "
                             "(default: gfx936)")
    parser.add_argument("--scale-groups", choices=SCALE_GROUP_KINDS, default="fragment",
                        help="token sets of the W scales: fragment (the MMAC's real sets, "
                             "default) or contiguous (the seed's bug, rejected by the "
                             "verifier unless --no-verify)")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip verify-scale-groups (to measure a wrong grouping)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="int8attn", description="Compile and run attention over an INT8 KV cache.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compile_cmd = commands.add_parser("compile", help="compile a graph to an IREE module",
                                      description="Run the whole pipeline, then IREE.")
    _add_compile_options(compile_cmd)
    compile_cmd.add_argument("-o", "--output", required=True, help="output file")
    compile_cmd.add_argument("--emit", choices=("vmfb", "linalg", "mlir", "isa"), default=None,
                             help="cpu: vmfb (default) or linalg, the IR handed to IREE; "
                                  "gfx936: mlir (default), the kernel IR with MMAC intrinsics; "
                                  "gfx942: vmfb (default), mlir or isa (AMDGPU assembly). "
                                  "'-o -' writes text to stdout")

    run_cmd = commands.add_parser(
        "run", help="compile (cached) and execute on the IREE CPU runtime",
        description="Without --inputs: random inputs from a printed seed and a report of "
                    "the error against the exact and the fragment-level reference.")
    _add_compile_options(run_cmd)
    run_cmd.add_argument("--inputs", help="npz with the arguments as arg0, arg1, ...")
    run_cmd.add_argument("--output", help="npz to write the results to (result0, ...)")
    run_cmd.add_argument("--function", help="public function to call (default: the only one)")
    run_cmd.add_argument("--simulate", action="store_true",
                         help="with --target gfx936/gfx942/cuda: run the generated lane-level "
                              "kernels in the lane simulator")
    run_cmd.add_argument("--seed", type=_seed, default=None,
                         help="seed of the random inputs (default: drawn and printed)")
    run_cmd.add_argument("--no-cache", action="store_true",
                         help="compile even if the module cache has this graph")
    run_cmd.add_argument("--report", action="store_true",
                         help="split the error against exact attention on the float cache "
                              "into its INT8-QK, V-cache and W-quantization terms, and "
                              "compare INT8 PV with BF16 and f32 PV (random inputs)")
    bench_cmd = commands.add_parser(
        "bench", help="time the decode kernels on a GPU (cuda) against BF16 PV and torch SDPA",
        description="Compile (sm_80 PTX) and run the INT8-PV and BF16-PV decode kernels "
                    "through IREE's CUDA runtime; check them against the fragment-level "
                    "reference; time them, torch SDPA on a bf16 KV cache and a device copy. "
                    "Writes a Markdown table, a JSON file and a PNG plot.")
    bench_cmd.add_argument("--target", choices=("cuda",), default="cuda")
    bench_cmd.add_argument("--mode", choices=("decode",), default="decode")
    bench_cmd.add_argument("--context", default="4096,8192,16384",
                           help="comma-separated context lengths (default 4096,8192,16384)")
    bench_cmd.add_argument("--batch", type=int, default=16)
    bench_cmd.add_argument("--q-heads", type=int, default=32)
    bench_cmd.add_argument("--kv-heads", type=int, default=8)
    bench_cmd.add_argument("--head-dim", type=int, default=128)
    bench_cmd.add_argument("--iterations", type=int, default=50)
    bench_cmd.add_argument("--prepare-only", metavar="DIR",
                           help="only compile the modules into DIR (for a GPU machine "
                                "without IREE's compiler)")
    bench_cmd.add_argument("--from", dest="from_dir", metavar="DIR",
                           help="run modules compiled earlier with --prepare-only")
    bench_cmd.add_argument("--out", default="bench-cuda", metavar="PREFIX",
                           help="writes PREFIX.md, PREFIX.json and PREFIX.png")
    return parser


def cmd_bench(args) -> int:
    import json
    import tempfile
    from pathlib import Path

    from int8attn import bench_cuda

    contexts = [int(c) for c in args.context.split(",")]
    if args.from_dir:
        directory = Path(args.from_dir)
    else:
        directory = Path(args.prepare_only or tempfile.mkdtemp(prefix="int8attn-bench-"))
        bench_cuda.prepare(directory, contexts, args.batch, args.q_heads, args.kv_heads,
                           args.head_dim)
        if args.prepare_only:
            return 0
    try:
        rows = bench_cuda.run(directory, iterations=args.iterations)
    except RuntimeError as error:
        raise UserError(f"cannot run on CUDA here ({error}); compile with --prepare-only "
                        f"and run with --from on a machine with an NVIDIA GPU") from None
    table = bench_cuda.markdown(rows)
    print(table)
    write_atomic(f"{args.out}.md", table + "\n")
    write_atomic(f"{args.out}.json", json.dumps(rows, indent=2))
    try:
        bench_cuda.plot(rows, Path(f"{args.out}.png"))
    except ImportError:
        print(f"note: no PNG written: install matplotlib (pip install 'int8attn[bench]')",
              file=sys.stderr)
    return 0


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer below 2**63, got {value}")
    return value


def _options(args) -> CompileOptions:
    return CompileOptions(backend=args.target, pv=args.pv, target=args.fragment_model,
                          scale_groups=args.scale_groups, verify=not args.no_verify)


def _read_graph(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"graph file '{path}' does not exist") from None
    except UnicodeDecodeError:
        raise UserError(f"graph file '{path}' is not MLIR text (not UTF-8)") from None
    except OSError as error:
        raise UserError(f"cannot read graph file '{path}': {error.strerror}") from None


def cmd_compile(args) -> int:
    from int8attn.pipelines.compile import compile_graph, make_linalg, new_context, parse_graph

    if args.target in KERNEL_TARGETS:
        from int8attn.cli_kernels import compile_kernels

        return compile_kernels(args, _read_graph(args.graph))
    if args.emit not in (None, "vmfb", "linalg"):
        raise UserError(f"--emit {args.emit} needs --target gfx936 or gfx942")
    output = check_output_path(args.output, [args.graph])
    source = _read_graph(args.graph)
    options = _options(args)
    if args.emit == "linalg":
        with new_context():
            module = make_linalg(parse_graph(source, args.graph), options)
            write_atomic(output, str(module) + "\n", [args.graph])
        return 0
    compiled = compile_graph(source, args.graph, options)
    write_atomic(output, compiled.vmfb, [args.graph])
    print(f"wrote {output} ({len(compiled.vmfb)} bytes; passes {compiled.timings['passes']:.2f} s, "
          f"iree-compile {compiled.timings['iree_compile']:.2f} s)", file=sys.stderr)
    return 0


def _load_inputs(path: str, info) -> list[np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"inputs file '{path}' does not exist") from None
    except IsADirectoryError:
        raise UserError(f"inputs file '{path}' is a directory") from None
    except (OSError, ValueError, EOFError):
        raise UserError(f"inputs file '{path}' is not an .npz archive; write one with "
                        f"numpy.savez(path, arg0=..., arg1=...)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UserError(f"inputs file '{path}' holds a single array (.npy), not an .npz "
                        f"archive of the arguments; write one with numpy.savez(path, "
                        f"arg0=..., arg1=...)")
    with archive:
        keys = set(archive.files)
        arrays = []
        for i, spec in enumerate(info.arguments):
            key = f"arg{i}"
            if key not in keys:
                raise UserError(f"inputs file '{path}' has no array '{key}' for argument {i} "
                                f"({spec.describe()}) of @{info.name}; it has "
                                f"{', '.join(sorted(keys)) or 'no arrays'}")
            try:
                arrays.append(archive[key])
            except (OSError, ValueError, EOFError) as error:
                raise UserError(f"array '{key}' of inputs file '{path}' cannot be read "
                                f"without pickle ({error}); save plain numeric arrays") from None
        extra = keys - {f"arg{i}" for i in range(len(info.arguments))}
        if extra:
            raise UserError(f"inputs file '{path}' has arrays {', '.join(sorted(extra))} that "
                            f"are not arguments of @{info.name} (expected arg0..arg"
                            f"{len(info.arguments) - 1})")
    return arrays


def _note_nonfinite_queries(info, arrays) -> None:
    from int8attn.driver.graph import nonfinite_query_rows

    bad, rows = nonfinite_query_rows(info, arrays)
    if bad:
        index = info.attention.argument_of[0]
        print(f"note: arg{index} (q) holds NaN or Inf in {bad} of its {rows} rows; the results "
              f"of exactly those rows are NaN (README: non-finite inputs)", file=sys.stderr)


def _report(outputs, arrays, info, options) -> None:
    from int8attn.driver.graph import error_stats, references

    refs = references(info, arrays, pv=options.pv, target=options.target,
                      partition_tokens=options.partition_tokens, tile_tokens=options.tile_tokens,
                      scale_groups=options.scale_groups)
    result = outputs[info.attention.result_index]
    print(f"accuracy of @{info.name} (pv={options.pv}, fragment model {options.target}):")
    for name, label in (("exact", "vs exact f32 reference      "),
                        ("fragment", "vs fragment-level reference")):
        stats = error_stats(result, refs[name])
        print(f"  {label}  max abs {stats['max_abs']:.3e}   rms {stats['rms']:.3e}")


def cmd_run(args) -> int:
    import int8attn
    from int8attn.driver.graph import random_inputs

    if args.output:
        check_output_path(args.output, [args.graph, args.inputs])
    source = _read_graph(args.graph)
    if args.target in KERNEL_TARGETS or args.simulate:  # lane simulator, or cuda on the GPU
        from int8attn.cli_kernels import run_simulated

        return run_simulated(args, source, _load_inputs, _report)
    options = _options(args)
    start = time.perf_counter()
    graph = int8attn.compile(source, filename=args.graph, cache=not args.no_cache,
                             **options.__dict__)
    compile_seconds = time.perf_counter() - start
    info = graph.entry(args.function)
    if args.inputs:
        arrays = _load_inputs(args.inputs, info)
        _note_nonfinite_queries(info, arrays)
    else:
        seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        print(f"random inputs, seed {seed} (repeat with --seed {seed})")
        try:
            arrays, floats = random_inputs(info, seed, float_caches=True)
        except ValueError as error:
            raise UserError(str(error)) from None
    outputs = graph.run(arrays, info.name)
    cached = "cached module" if graph.cache_hit else "compiled"
    print(f"@{info.name}: {cached} in {compile_seconds:.2f} s, ran in {graph.timings['run'] * 1e3:.1f} ms")
    if args.output:
        import io

        buffer = io.BytesIO()
        np.savez(buffer, **{f"result{i}": r for i, r in enumerate(outputs)})
        write_atomic(args.output, buffer.getvalue(), [args.graph, args.inputs])
        print(f"wrote {args.output} ({', '.join(f'result{i}' for i in range(len(outputs)))})")
    if not args.inputs and info.attention is not None:
        _report(outputs, arrays, info, options)
    if args.report:
        from int8attn.report import print_report

        if args.inputs or info.attention is None:
            raise UserError("--report needs random inputs of a graph returning one "
                            "int8attn.attention (it uses the float cache behind them)")
        print_report(graph, source, args.graph, info, arrays, floats, outputs, options)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench}[args.command]
    try:
        return handler(args)
    except DiagnosticError as error:
        print(error.format(), file=sys.stderr)
    except StageError as error:
        print(f"error: {error}", file=sys.stderr)
    except (UserError, InputError, OutputError) as error:
        print(f"error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
