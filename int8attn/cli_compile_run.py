"""The `int8attn compile`, `run` and `targets` commands.

`compile` runs a graph (MLIR, or an ONNX model) through its target's stages and
writes one stage's artifact; `run` compiles (cached) and executes it on given
or random inputs, with the accuracy lines, the ONNX comparison and `--report`;
`targets` lists what they choose from. Reading the graph and the inputs file,
and the checks made before any work, are here too.
"""

from __future__ import annotations

import dataclasses

import io
import sys
import time
import zipfile
from pathlib import Path

import numpy as np

from .cli_errors import UserError
from .cli_results import check_cache_write, compare_with_onnxruntime, print_accuracy
from .driver.devices import check_runs_here
from .driver.onnx_import import is_onnx, read_model
from .driver.options import CompileOptions
from .driver.targets import TARGETS, OptionRefused, describe
from .runtime.module import InputError
from .support.diagnostics import UsageError
from .support.files import OutputError, check_output_path, write_atomic
from .support.options import given


def _options(args) -> dict:
    """The compile keywords the user gave (the rest keep CompileOptions' defaults)."""
    return given(args, CompileOptions)


def _input_files(args) -> list[str]:
    """Every file the command reads, which no output may replace: the graph, an ONNX
    model's external data files, --inputs and --kernel-object."""
    files = [args.graph, getattr(args, "inputs", None), getattr(args, "kernel_object", None)]
    return [f for f in files if f] + _external_data_files(args.graph)


def _external_data_files(graph: str) -> list[str]:
    """The files an ONNX model keeps tensors in (relative to the model's folder); none
    for a model that cannot be read, whose reading names the problem later."""
    if not is_onnx(graph):
        return []
    try:
        import onnx
        from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, \
            uses_external_data

        model = onnx.load(graph, load_external_data=False)
    except Exception:  # noqa: BLE001  (no onnx, no file, protobuf's DecodeError)
        return []
    folder = Path(graph).parent
    return sorted({str(folder / ExternalDataInfo(t).location)
                   for t in _get_all_tensors(model) if uses_external_data(t)})


def _check_save_stages(args, until: str) -> None:
    """--save-stages DIR, refused before any work (driver.compile.check_save_stages)."""
    if args.save_stages is None:
        return
    from .driver.compile import check_save_stages

    target = TARGETS[args.target or CompileOptions.target]
    chain = target.chain(until, args.kernel_object is not None)
    # the file written after the stages: run's results, or compile's artifact (whose
    # --emit llvm manifest beside it shares its stem, so its name too)
    outputs = [] if args.output in (None, "-") else [args.output]
    check_save_stages(args.save_stages, chain, _input_files(args), flag="--save-stages",
                      outputs=outputs)


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
    from .driver.compile import compile

    _refuse_for_models(args)
    _refuse_flags_that_do_nothing(args)
    options = CompileOptions(**_options(args))
    target = TARGETS[options.target]
    emit = args.emit or ("vmfb" if options.kernel_object else target.default_emit)
    target.chain(emit, options.kernel_object is not None)  # refuses a stage the target
    # does not have, before any work
    inputs = _input_files(args)
    if args.output != "-":
        check_output_path(args.output, inputs)
        for beside in _companion_paths(args.output, emit):
            if Path(beside).absolute() == Path(args.output).absolute():
                raise OutputError(f"--emit {emit} writes its manifest beside the output, as "
                                  f"'{beside}', which is the output '{args.output}' itself; "
                                  f"give the output another suffix (-o "
                                  f"{Path(args.output).with_suffix('.ll')})")
            check_output_path(beside, inputs)
    _check_save_stages(args, emit)
    source = _read_graph(args.graph)
    compiled = compile(source, options, filename=args.graph, until=emit,
                       save_stages=args.save_stages, print_ir_after_all=args.print_ir_after_all)
    _print_remarks(compiled.remarks, args.graph)
    artifact = compiled.last
    companions = compiled.companions.get(emit, {})
    if args.output == "-":
        if isinstance(artifact, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(artifact)
        else:
            sys.stdout.write(artifact if artifact.endswith("\n") else artifact + "\n")
        sys.stdout.flush()
        # stdout holds the artifact alone (it may be piped on): the manifest, which a
        # file output gets beside it, goes to stderr with the build hint.
        for suffix, content in companions.items():
            print(f"the {emit} stage's manifest (-o OUT writes it as OUT{suffix}; saved as "
                  f"KERNELS{suffix}, --kernel-object KERNELS.co checks it):\n"
                  f"{content.rstrip()}", file=sys.stderr)
        _print_next_steps("KERNELS.ll", args.graph, emit, options)
        return 0
    write_atomic(args.output, artifact if isinstance(artifact, bytes) or artifact.endswith("\n")
                 else artifact + "\n", inputs)
    stages = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in compiled.timings.items())
    print(f"wrote {args.output} ({emit}, {len(artifact)} bytes; {stages})", file=sys.stderr)
    for suffix, content in companions.items():
        beside = str(Path(args.output).with_suffix(suffix))
        write_atomic(beside, content, inputs + [args.output])
        print(f"wrote {beside} (the {emit} stage's manifest)", file=sys.stderr)
    _print_next_steps(args.output, args.graph, emit, options)
    return 0


# Files a stage writes beside its artifact, by suffix: the llvm stage's manifest
# (driver/stages.make_llvm), known here so that its path is checked before any work.
_COMPANIONS = {"llvm": (".json",)}


def _companion_paths(output: str, emit: str) -> list[str]:
    return [str(Path(output).with_suffix(suffix)) for suffix in _COMPANIONS.get(emit, ())]


def _print_next_steps(output: str, graph: str, emit: str, options) -> None:
    """After --emit llvm: how to build the code object and package it."""
    if emit == "llvm":
        from .driver.llvm_stage import build_command

        co = str(Path(output).with_suffix(".co"))
        saved = "save the IR as KERNELS.ll and " if output == "KERNELS.ll" else ""
        print(f"{saved}build the code object with:\n  "
              f"{build_command(options.target, output, co)}\n"
              f"then: int8attn compile {graph} --target {options.target} --kernel-object {co} "
              f"-o {Path(output).with_suffix('.vmfb')}", file=sys.stderr)


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
    """After the inputs' checks (a q of another dtype or shape gets its named error
    first), the rows of q whose results will be NaN."""
    from .driver.graph import check_arguments, nonfinite_query_rows

    bad, rows = nonfinite_query_rows(info, check_arguments(info, arrays))
    if bad:
        index = info.attention.argument_of[0]
        print(f"note: arg{index} (q) holds NaN or Inf in {bad} of its {rows} rows; the results "
              f"of exactly those rows are NaN "
              f"(docs/numerics.md, *Non-finite and extreme inputs*)", file=sys.stderr)


def _executed_how(graph) -> str:
    if graph.simulated:
        return f"{graph.options.target} kernels simulated"
    return f"ran on IREE {TARGETS[graph.options.target].runtime_driver}"


def _check_graph_before_compiling(source: str, args) -> None:
    """From the graph stage alone (parsed and verified, nothing compiled): the function
    to run (--function, needed where there are several), --report's attention, and
    random inputs too large for this machine."""
    from .driver.compile import compile
    from .driver.graph import check_memory, choose_function

    # (only the graph is read here: a code object belongs to the vmfb, not to this stage)
    options = dataclasses.replace(CompileOptions(**_options(args)), kernel_object=None)
    graph = compile(source, options, filename=args.graph, until="graph")
    try:
        info = choose_function(graph.functions, args.function)
    except InputError as error:
        raise UsageError(str(error)) from None
    if args.report and info.attention is None:
        raise UsageError(f"--report splits the error of one int8attn.attention of the "
                         f"graph's arguments, and @{info.name} returns none (drop --report)")
    if not args.inputs and info.attention is not None:
        check_memory(info, float_caches=True)


def _refuse_report_before_work(args) -> None:
    """--report's target and PV, refused before compiling (report.py says why)."""
    from .report import refuse_unreportable

    target = args.target or CompileOptions.target
    if target != "cpu":
        raise UsageError(f"--report splits the error of the cpu pipeline's module; --target "
                         f"{target} compiles lane-level kernels (use --target cpu, or drop "
                         f"--report)")
    refuse_unreportable(args.pv or CompileOptions.pv)


def _refuse_flags_that_do_nothing(args) -> None:
    """A flag that does nothing with the others, or on the target, is refused even at
    its default value: the CLI knows which flags were given (the Python API cannot tell
    a default it was passed from one it was not, and refuses the other values)."""
    given = _options(args)
    options = CompileOptions(**given)
    TARGETS[options.target].refuse(options, given=set(given))   # (no compile: no CPU probe)


def _refuse_for_models(args) -> None:
    """Flags that do not apply to an ONNX model, refused before any work."""
    if not is_onnx(args.graph):
        return
    if getattr(args, "report", False):
        raise UsageError("--report splits the error of one int8attn.attention of the "
                         "graph's arguments; an ONNX model is compared with onnxruntime "
                         "instead (drop --report)")
    try:
        TARGETS[args.target or CompileOptions.target].check_source(model=True)
    except OptionRefused as error:
        raise UsageError(str(error)) from None


def cmd_run(args) -> int:
    from . import api
    from .driver.graph import random_inputs
    from .driver.onnx_inputs import random_model_inputs

    if args.inputs and args.report:
        raise UsageError("--report needs random inputs (it uses the float cache behind them); "
                         "drop --inputs")
    if args.inputs and args.seed is not None:
        raise UsageError(f"--seed {args.seed} draws random inputs, but --inputs gives them, "
                         f"so the seed would be unused; drop --seed (or --inputs)")
    _refuse_for_models(args)
    _refuse_flags_that_do_nothing(args)
    if args.report:
        _refuse_report_before_work(args)
    inputs = _input_files(args)
    if args.output:
        check_output_path(args.output, inputs)
    _check_save_stages(args, "kernel" if args.simulate else "vmfb")   # what api.compile runs
    source = _read_graph(args.graph)
    if not is_onnx(args.graph):
        _check_graph_before_compiling(source, args)
    if not args.simulate:
        check_runs_here(TARGETS[args.target or CompileOptions.target], args.kernel_object,
                        args.graph)
    start = time.perf_counter()
    graph = api.compile(source, filename=args.graph, cache=not args.no_cache,
                        simulate=args.simulate, save_stages=args.save_stages,
                        **_options(args))
    compile_seconds = time.perf_counter() - start
    _print_remarks(graph.remarks, args.graph)
    info = graph.entry(args.function)
    if args.report and info.attention is None:
        raise UsageError(f"--report splits the error of one int8attn.attention of the "
                         f"graph's arguments, and @{info.name} returns none (drop --report)")
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
    writes = info.attention is not None and info.attention.mode == "cache_write"
    before = [np.array(a, copy=True) for a in arrays] if writes else None
    outputs = graph.run(arrays, info.name)
    cached = "cached module" if graph.cache_hit else "compiled"
    print(f"@{info.name}: {cached} in {compile_seconds:.2f} s, {_executed_how(graph)} in "
          f"{graph.timings['run'] * 1e3:.1f} ms", flush=True)
    if args.output:
        buffer = io.BytesIO()
        names = [info.result_name(i) for i in range(len(outputs))]
        np.savez(buffer, **dict(zip(names, outputs)))
        write_atomic(args.output, buffer.getvalue(), inputs)
        print(f"wrote {args.output} ({', '.join(names)})")
    if writes and not check_cache_write(outputs, before, info, graph.options):
        raise UserError(f"@{info.name} wrote caches that differ from "
                        f"reference.paged_cache_write (above)")
    if not args.inputs and info.attention is not None and not writes:
        print_accuracy(outputs[info.attention.result_index], arrays, info, graph.options)
    if is_onnx(args.graph):
        compare_with_onnxruntime(source, info, arrays, outputs)
    if args.report:
        from .report import print_report

        print_report(graph, source, args.graph, info, arrays, floats, outputs, graph.options)
    return 0
