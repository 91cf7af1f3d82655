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
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from int8attn.bench_harness import BenchSettings, output_paths, write_results
from int8attn.bench_kinds import BENCH_KINDS, bench_kind, mode_flags
from int8attn.driver.onnx_import import ModelError, is_onnx, read_model
from int8attn.driver.options import CompileOptions
from int8attn.driver.targets import STAGE_NAMES, TARGETS, OptionRefused, describe
from int8attn.runtime.module import InputError
from int8attn.support.diagnostics import DiagnosticError, StageError, UsageError
from int8attn.support.files import OutputError, check_output_path, write_atomic
from int8attn.support.options import OptionError, add_arguments, given

# Flags of CompileOptions the CLI offers (v_token_innermost changes the
# function's signature: a Python API / bench choice).
CLI_OPTIONS = ("target", "target_cpu", "pv", "fragment_model", "scale_groups", "verify",
               "partition_tokens", "tile_tokens", "q_terms", "w_quant", "w_terms", "contraction")


class UserError(Exception):
    """A problem with the user's files or inputs: printed as `error: ...`, exit 1."""


def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", help="MLIR file with int8attn.attention graphs, or an ONNX "
                        "model (.onnx: its INT8-cache attention is raised, the rest goes to "
                        "IREE; needs the onnx extra)")
    add_arguments(parser, CompileOptions, only=CLI_OPTIONS)
    parser.add_argument("--save-stages", metavar="DIR",
                        help="write every stage's artifact to DIR (00-graph.mlir, ...), so a "
                             "failing stage can be reproduced from its input")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="int8attn", description="Compile and run attention over an INT8 KV cache.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compile_cmd = commands.add_parser(
        "compile", help="compile a graph through its target's stages",
        description="Run the target's chain of stages (int8attn targets lists them) up to "
                    "--emit and write that stage's artifact.")
    _add_compile_options(compile_cmd)
    compile_cmd.add_argument("-o", "--output", required=True,
                             help="output file ('-' writes to stdout)")
    compile_cmd.add_argument("--emit", choices=STAGE_NAMES, default=None,
                             help="stop after this stage and write its artifact (default: "
                                  "vmfb on cpu, gfx942 and cuda; kernel on gfx936)")
    compile_cmd.add_argument("--print-ir-after-all", action="store_true",
                             help="print the IR to stderr after every pass")

    run_cmd = commands.add_parser(
        "run", help="compile (cached) and execute: IREE CPU/CUDA runtime or the lane simulator",
        description="Without --inputs: random inputs from a printed seed and a report of "
                    "the error against the exact and the fragment-level reference.")
    _add_compile_options(run_cmd)
    run_cmd.add_argument("--simulate", action="store_true",
                         help="with --target gfx936, gfx942 or cuda: run the generated "
                              "lane-level kernels in the lane simulator")
    run_cmd.add_argument("--inputs", help="npz with the arguments as arg0, arg1, ... (an ONNX "
                         "model's: its input names, or arg0, ...)")
    run_cmd.add_argument("--output", help="npz to write the results to (result0, ...; an ONNX "
                         "model's: its output names)")
    run_cmd.add_argument("--function", help="public function to call (default: the only one)")
    run_cmd.add_argument("--seed", type=_seed, default=None,
                         help="seed of the random inputs (default: drawn and printed)")
    run_cmd.add_argument("--no-cache", action="store_true",
                         help="compile even if the module cache has this graph")
    run_cmd.add_argument("--report", action="store_true",
                         help="split the error against exact attention on the float cache "
                              "into its INT8-QK, V-cache and W-quantization terms, and "
                              "compare INT8 PV with BF16 and f32 PV (random inputs)")

    commands.add_parser("targets", help="list the targets and their stages",
                        description="Print each target's chain of stages and what runs it.")

    bench_cmd = commands.add_parser(
        "bench", help="time the decode kernels on a GPU (cuda) against BF16 PV and torch SDPA",
        description="Compile (sm_80 PTX) and run the INT8-PV and BF16-PV decode kernels "
                    "through IREE's CUDA runtime; check them against the fragment-level "
                    "reference; time them, torch SDPA on a bf16 KV cache and a device copy. "
                    "Writes a Markdown table, a JSON file and a PNG plot.")
    bench_cmd.add_argument("--target", choices=("cuda",), default="cuda")
    bench_cmd.add_argument("--mode", choices=tuple(BENCH_KINDS), default="decode",
                           help="decode: dense batches, one module per context; paged: one "
                                "module for uniform batches at each --context, a ragged batch "
                                "(lengths uniform on [1, 2*mean-1]) and B=1 at the longest; "
                                "prefill: causal Sq = S at each --context and a history case "
                                "(--history cached + --new-tokens new tokens), TFLOP/s on the "
                                "causal work")
    bench_cmd.add_argument("--history", type=_count, default=None, metavar="TOKENS",
                           help="--mode prefill: cached tokens of the history case "
                                "(default 8192)")
    bench_cmd.add_argument("--new-tokens", type=_count, default=None, metavar="TOKENS",
                           help="--mode prefill: new tokens of the history case (default 512; "
                                "0 leaves the case out)")
    bench_cmd.add_argument("--ragged-mean", type=_positive, default=None, metavar="TOKENS",
                           help="--mode paged: mean length of the ragged batch (default 8192)")
    bench_cmd.add_argument("--seed", type=_seed, default=0,
                           help="--mode paged: seed of the lengths, tables and data")
    bench_cmd.add_argument("--numerics", choices=("seed", "defaults"), default=None,
                           help="--mode paged: the kernels' q-terms / w-quant: the seed's (1, s8; "
                                "the kernel targets' default) or the cpu pipeline's defaults "
                                "(its q-terms and w-quant; the kernels have one W term)")
    bench_cmd.add_argument("--context", type=_contexts, default=(4096, 8192, 16384),
                           help="comma-separated context lengths (default 4096,8192,16384)")
    bench_cmd.add_argument("--batch", type=_positive, default=None,
                           help="batch size (default 16 for decode and paged, 1 for prefill)")
    bench_cmd.add_argument("--q-heads", type=_positive, default=32)
    bench_cmd.add_argument("--kv-heads", type=_positive, default=8)
    bench_cmd.add_argument("--head-dim", type=_positive, default=128)
    bench_cmd.add_argument("--iterations", type=_positive, default=50)
    bench_cmd.add_argument("--prepare-only", metavar="DIR",
                           help="only compile the modules into DIR (for a GPU machine "
                                "without IREE's compiler)")
    bench_cmd.add_argument("--from", dest="from_dir", metavar="DIR",
                           help="run modules compiled earlier with --prepare-only")
    bench_cmd.add_argument("--out", default="bench-cuda", metavar="PREFIX",
                           help="writes PREFIX.md, PREFIX.json and PREFIX.png")
    bench_cmd.set_defaults(misuse=bench_cmd.error)   # a usage message and exit status 2
    return parser


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer below 2**63, got {value}")
    return value


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _count(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def _contexts(text: str) -> tuple[int, ...]:
    """`--context 4096,8192`: positive token counts, comma-separated."""
    items = text.split(",")
    for item in items:
        if not item.strip():
            raise argparse.ArgumentTypeError(
                f"'{text}' has an empty item; give token counts separated by single commas, "
                f"e.g. 4096,8192")
        if not item.strip().isdigit() or int(item) < 1:
            where = f"'{item}' in '{text}'" if len(items) > 1 else f"'{item}'"
            raise argparse.ArgumentTypeError(
                f"{where} is not a positive token count; give whole numbers of tokens "
                f"separated by commas, e.g. 4096,8192 (no suffixes such as 4k)")
    return tuple(int(item) for item in items)


def _options(args) -> dict:
    """The compile keywords the user gave (the rest keep CompileOptions' defaults)."""
    return given(args, CompileOptions)


def _read_graph(path: str) -> str | bytes:
    if is_onnx(path):
        return read_model(path)
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise UserError(f"graph file '{path}' does not exist") from None
    except IsADirectoryError:
        raise UserError(f"graph file '{path}' is a directory") from None
    except UnicodeDecodeError:
        raise UserError(f"graph file '{path}' is not MLIR text (not UTF-8)") from None
    except OSError as error:
        raise UserError(f"cannot read graph file '{path}': {error.strerror}") from None


def _print_remarks(remarks, graph: str) -> None:
    # An ONNX model's locations are node names: say which file they are in.
    prefix = f"{graph}: " if is_onnx(graph) else ""
    for line in remarks:
        print(prefix + line, file=sys.stderr, flush=True)


def _progress(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def cmd_targets(args) -> int:
    print(describe())
    return 0


def cmd_compile(args) -> int:
    from int8attn.driver.compile import compile

    _refuse_for_models(args)
    options = CompileOptions(**_options(args))
    target = TARGETS[options.target]
    emit = args.emit or target.default_emit
    target.chain(emit)  # refuses a stage the target does not have, before any work
    if args.output != "-":
        check_output_path(args.output, [args.graph])
    source = _read_graph(args.graph)
    compiled = compile(source, options, filename=args.graph, until=emit,
                       save_stages=args.save_stages, print_ir_after_all=args.print_ir_after_all)
    _print_remarks(compiled.remarks, args.graph)
    artifact = compiled.last
    if args.output == "-":
        if isinstance(artifact, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(artifact)
        else:
            sys.stdout.write(artifact if artifact.endswith("\n") else artifact + "\n")
        return 0
    write_atomic(args.output, artifact if isinstance(artifact, bytes) or artifact.endswith("\n")
                 else artifact + "\n", [args.graph])
    stages = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in compiled.timings.items())
    print(f"wrote {args.output} ({emit}, {len(artifact)} bytes; {stages})", file=sys.stderr)
    return 0


def _load_inputs(path: str, info) -> list[np.ndarray]:
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"inputs file '{path}' does not exist") from None
    except IsADirectoryError:
        raise UserError(f"inputs file '{path}' is a directory") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile):
        raise UserError(f"inputs file '{path}' is not an .npz archive (or is damaged); write "
                        f"one with numpy.savez(path, arg0=..., arg1=...)") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UserError(f"inputs file '{path}' holds a single array (.npy), not an .npz "
                        f"archive of the arguments; write one with numpy.savez(path, "
                        f"arg0=..., arg1=...)")
    with archive:
        keys = set(archive.files)
        arrays = []
        for i, spec in enumerate(info.arguments):
            # An ONNX model's inputs go by their names; arg<i> is always accepted.
            named = [k for k in dict.fromkeys((info.argument_name(i), f"arg{i}")) if k in keys]
            if len(named) != 1:
                which = " or ".join(repr(k) for k in dict.fromkeys((info.argument_name(i),
                                                                      f"arg{i}")))
                has = "both" if named else "no array"
                raise UserError(f"inputs file '{path}' has {has} {which} for argument {i} "
                                f"({spec.describe()}) of @{info.name}; it has "
                                f"{', '.join(sorted(keys)) or 'no arrays'}")
            key = named[0]
            try:
                arrays.append(archive[key])
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                raise UserError(f"array '{key}' of inputs file '{path}' cannot be read "
                                f"without pickle ({error}); save plain numeric arrays") from None
        expected = [info.argument_name(i) for i in range(len(info.arguments))]
        extra = keys - set(expected) - {f"arg{i}" for i in range(len(info.arguments))}
        if extra:
            listed = (", ".join(expected) if info.argument_names else
                      f"arg0..arg{len(expected) - 1}")
            raise UserError(f"inputs file '{path}' has arrays {', '.join(sorted(extra))} that "
                            f"are not arguments of @{info.name} (expected {listed})")
    return arrays


def _note_nonfinite_queries(info, arrays) -> None:
    from int8attn.driver.graph import nonfinite_query_rows

    bad, rows = nonfinite_query_rows(info, arrays)
    if bad:
        index = info.attention.argument_of[0]
        print(f"note: arg{index} (q) holds NaN or Inf in {bad} of its {rows} rows; the results "
              f"of exactly those rows are NaN (README: non-finite inputs)", file=sys.stderr)


class _SlowProgress:
    """Progress lines on stderr, once a step has run longer than `after` seconds."""

    def __init__(self, after: float = 2.0):
        self.start, self.after = time.perf_counter(), after

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.after:
            print(f"  {message} ({elapsed:.0f} s)", file=sys.stderr, flush=True)


def _accuracy(result, arrays, info, options) -> None:
    from int8attn.driver.graph import error_stats, references

    numerics = options.numerics
    refs = references(info, arrays, pv=options.pv, model=options.fragment_model,
                      partition_tokens=options.partition_tokens, tile_tokens=options.tile_tokens,
                      scale_groups=options.scale_groups, numerics=numerics,
                      progress=_SlowProgress())
    variant = f", {numerics.describe()}" if options.pv == "int8" \
        else f", q-terms {numerics.q_terms}"
    print(f"accuracy of @{info.name} (target {options.target}, pv={options.pv}, fragment "
          f"model {options.fragment_model}{variant}):")
    for name, label in (("exact", "vs exact f32 reference      "),
                        ("fragment", "vs fragment-level reference")):
        stats = error_stats(result, refs[name])
        print(f"  {label}  max abs {stats['max_abs']:.3e}   rms {stats['rms']:.3e}")


def _executed_how(graph) -> str:
    if graph.simulated:
        return f"{graph.options.target} kernels simulated"
    return f"ran on IREE {TARGETS[graph.options.target].runtime_driver}"


def _refuse_what_would_not_fit(source: str, args) -> None:
    """Random inputs too large for this machine are refused before compiling."""
    from int8attn.driver.compile import compile
    from int8attn.driver.graph import check_memory

    graph = compile(source, CompileOptions(**_options(args)), filename=args.graph, until="graph")
    for name, info in graph.functions.items():
        if args.function in (None, name) and info.attention is not None:
            check_memory(info, float_caches=True)


def _refuse_for_models(args) -> None:
    """Flags that do not apply to an ONNX model, refused before any work."""
    if not is_onnx(args.graph):
        return
    if getattr(args, "report", False):
        raise UsageError("--report splits the error of one int8attn.attention of the "
                         "graph's arguments; an ONNX model is compared with onnxruntime "
                         "instead (drop --report)")
    if (args.target or "cpu") != "cpu":
        raise UsageError(f"--target {args.target} compiles int8attn graphs to lane-level "
                         f"kernels; an ONNX model (its float ops too) compiles with --target "
                         f"cpu")


def _compare_with_onnxruntime(model: bytes, info, arrays, outputs) -> None:
    from int8attn.driver.onnx_inputs import comparison_lines, onnxruntime_outputs

    expected = onnxruntime_outputs(model, info, arrays)
    if expected is None:
        print("note: install onnxruntime (pip install -e '.[onnx]') to compare with it",
              file=sys.stderr)
        return
    print("vs onnxruntime (f32) on the same inputs:")
    for line in comparison_lines(info, outputs, expected):
        print(f"  {line}")


def cmd_run(args) -> int:
    import int8attn
    from int8attn.driver.graph import random_inputs
    from int8attn.driver.onnx_inputs import random_model_inputs

    if args.output:
        check_output_path(args.output, [args.graph, args.inputs])
    if args.inputs and args.report:
        raise UsageError("--report needs random inputs (it uses the float cache behind them); "
                         "drop --inputs")
    _refuse_for_models(args)
    source = _read_graph(args.graph)
    if not args.inputs and not is_onnx(args.graph):
        _refuse_what_would_not_fit(source, args)
    start = time.perf_counter()
    graph = int8attn.compile(source, filename=args.graph, cache=not args.no_cache,
                             simulate=args.simulate, save_stages=args.save_stages,
                             **_options(args))
    compile_seconds = time.perf_counter() - start
    _print_remarks(graph.remarks, args.graph)
    info = graph.entry(args.function)
    if args.inputs:
        arrays = _load_inputs(args.inputs, info)
        _note_nonfinite_queries(info, arrays)
    else:
        seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        print(f"random inputs, seed {seed} (repeat with --seed {seed})", flush=True)
        try:
            if is_onnx(args.graph):
                arrays, floats = random_model_inputs(info, seed), None
            else:
                arrays, floats = random_inputs(info, seed, float_caches=True)
        except ValueError as error:
            raise UserError(str(error)) from None
    outputs = graph.run(arrays, info.name)
    cached = "cached module" if graph.cache_hit else "compiled"
    print(f"@{info.name}: {cached} in {compile_seconds:.2f} s, {_executed_how(graph)} in "
          f"{graph.timings['run'] * 1e3:.1f} ms", flush=True)
    if args.output:
        buffer = io.BytesIO()
        names = [info.result_name(i) for i in range(len(outputs))]
        np.savez(buffer, **dict(zip(names, outputs)))
        write_atomic(args.output, buffer.getvalue(), [args.graph, args.inputs])
        print(f"wrote {args.output} ({', '.join(names)})")
    if not args.inputs and info.attention is not None:
        _accuracy(outputs[info.attention.result_index], arrays, info, graph.options)
    if is_onnx(args.graph):
        _compare_with_onnxruntime(source, info, arrays, outputs)
    if args.report:
        from int8attn.report import print_report

        if info.attention is None or graph.simulated or graph.options.target != "cpu":
            raise UsageError("--report needs --target cpu and a graph returning one "
                             "int8attn.attention of its arguments")
        print_report(graph, source, args.graph, info, arrays, floats, outputs, graph.options)
    return 0


# Flags that only one --mode reads (the others would ignore them): flag -> (name, mode),
# from the table of kinds, checked in the order `int8attn bench --help` lists them (of
# two misused, the first is named).
_HELP_ORDER = ("--history", "--new-tokens", "--ragged-mean", "--numerics")
MODE_FLAGS = dict(sorted(mode_flags().items(), key=lambda item: (
    _HELP_ORDER.index(item[0]) if item[0] in _HELP_ORDER else len(_HELP_ORDER))))


def _check_bench_shape(args, misuse) -> None:
    """The kernels' limits on the shape flags, before anything is compiled."""
    from int8attn.fragments import FRAGMENT_MODELS
    from int8attn.kernels.decode import ROWS

    if args.q_heads % args.kv_heads:
        misuse(f"--q-heads {args.q_heads} is not a multiple of --kv-heads {args.kv_heads} "
               f"(each KV head serves the same number of query heads)")
    rows = args.q_heads // args.kv_heads
    if bench_kind(args.mode).query_heads_in_one_tile and rows > ROWS:
        misuse(f"--q-heads {args.q_heads} over --kv-heads {args.kv_heads} is {rows} query heads "
               f"per KV head; the decode kernels' MMAC tile holds {ROWS} (raise --kv-heads)")
    k = FRAGMENT_MODELS["cuda"].instruction.k
    if args.head_dim % k:
        misuse(f"--head-dim {args.head_dim} is not a multiple of {k}, the K of the cuda "
               f"kernels' int8 mma.sync (e.g. 64 or 128)")


def _check_prepared(directory: Path, mode: str) -> None:
    """`--from DIR` must hold what `--prepare-only DIR --mode MODE` writes."""
    import json

    kind = bench_kind(mode)
    if not directory.exists():
        raise UserError(f"--from folder '{directory}' does not exist; prepare it with "
                        f"int8attn bench --mode {mode} --prepare-only {directory}")
    if not directory.is_dir():
        raise UserError(f"--from '{directory}' is not a folder; give the folder that "
                        f"--prepare-only wrote")
    manifest = directory / kind.manifest
    if not manifest.is_file():
        other = [m for m, k in BENCH_KINDS.items()
                 if m != mode and (directory / k.manifest).is_file()]
        hint = (f"it holds --mode {other[0]} modules (add --mode {other[0]})" if other else
                f"prepare it with int8attn bench --mode {mode} --prepare-only {directory}")
        raise UserError(f"--from folder '{directory}' has no {kind.manifest}, so no "
                        f"--mode {mode} modules; {hint}")
    try:
        meta = json.loads(manifest.read_text())
        files = kind.module_files(meta)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"--from folder '{directory}': {manifest.name} is damaged ({error}); "
                        f"prepare the folder again with --prepare-only") from None
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise UserError(f"--from folder '{directory}' lacks {', '.join(missing)} that its "
                        f"{manifest.name} lists; prepare the folder again with --prepare-only")


def _check_prepare_folder(directory: Path) -> None:
    """`--prepare-only DIR`: a folder (made if missing) that can be written."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--prepare-only '{directory}' is a file, not a folder; give a folder "
                        f"to write the modules to (it is made if missing)")
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--prepare-only '{directory}': '{existing}' is a file, so the folder "
                        f"cannot be made; give another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--prepare-only '{directory}': '{existing}' is not writable; give a "
                        f"folder you can write to")


def cmd_bench(args) -> int:
    import tempfile

    misuse = args.misuse
    kind = bench_kind(args.mode)
    # Every check first: none needs a GPU, and a mistake must not cost a compilation.
    for flag, (name, wanted) in MODE_FLAGS.items():
        if getattr(args, name) is not None and kind.mode != wanted:
            misuse(f"{flag} applies to --mode {wanted}, not --mode {kind.mode}")
    if args.from_dir and args.prepare_only:
        misuse("--prepare-only compiles the modules and --from runs compiled ones; give one")
    settings = BenchSettings(
        contexts=tuple(args.context), batch=args.batch, q_heads=args.q_heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim, iterations=args.iterations,
        seed=args.seed, history=args.history, new_tokens=args.new_tokens,
        ragged_mean=args.ragged_mean, numerics=args.numerics)
    if args.from_dir:
        directory = Path(args.from_dir)
        _check_prepared(directory, kind.mode)
    else:
        _check_bench_shape(args, misuse)
        if args.prepare_only:
            _check_prepare_folder(Path(args.prepare_only))
    outputs = [] if args.prepare_only else output_paths(args.out, kind.plot is not None)
    for output in outputs:
        try:
            check_output_path(output)
        except OutputError as error:
            raise OutputError(f"--out {args.out}: {error}") from None
    if not args.from_dir:
        directory = Path(args.prepare_only or tempfile.mkdtemp(prefix="int8attn-bench-"))
        kind.prepare(directory, settings)
        if args.prepare_only:
            return 0
    try:
        rows = kind.run(directory, settings)
    except RuntimeError as error:
        raise UserError(f"cannot run on CUDA here ({error}); compile with --prepare-only "
                        f"and run with --from on a machine with an NVIDIA GPU") from None
    write_results(rows, kind.markdown, args.out, kind.plot)
    return 0


def _quiet_broken_pipe() -> int:
    # The reader went away (`int8attn run ... | head -1`): nothing left to say.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"compile": cmd_compile, "run": cmd_run, "bench": cmd_bench,
               "targets": cmd_targets}[args.command]
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
    except (UserError, InputError, OutputError, ModelError) as error:
        print(f"error: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
