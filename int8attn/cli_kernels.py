"""`int8attn compile/run` for the lane-level kernel targets (gfx936, gfx942)."""

from __future__ import annotations

import sys
import time

import numpy as np

from int8attn.support.files import check_output_path, write_atomic

EMITS = {"gfx936": ("mlir",), "gfx942": ("vmfb", "mlir", "isa"), "cuda": ("vmfb", "mlir", "isa")}


def _write(output: str, data, graph: str) -> None:
    if output == "-":
        sys.stdout.write(data if isinstance(data, str) else data.decode())
        return
    write_atomic(check_output_path(output, [graph]), data, [graph])


def compile_kernels(args, source: str) -> int:
    from int8attn.cli import UserError
    from int8attn.pipelines.kernel import make_kernel_module, make_rocm_vmfb

    emit = args.emit or EMITS[args.target][0]
    if emit not in EMITS[args.target]:
        raise UserError(f"--target {args.target} emits {' or '.join(EMITS[args.target])}, "
                        f"not {emit}")
    if args.output != "-":
        check_output_path(args.output, [args.graph])
    start = time.perf_counter()
    if args.pv == "f32":
        raise UserError("the kernel targets have INT8 PV and (cuda) the BF16-PV baseline; "
                        "use --pv int8 or --pv bf16")
    kernel_ir = make_kernel_module(source, args.graph, args.target, pv=args.pv)
    if emit == "mlir":
        _write(args.output, kernel_ir, args.graph)
        return 0
    vmfb, isa = make_rocm_vmfb(kernel_ir, args.target)
    _write(args.output, vmfb if emit == "vmfb" else isa, args.graph)
    print(f"{args.target} kernels compiled by IREE's ROCm backend in "
          f"{time.perf_counter() - start:.2f} s", file=sys.stderr)
    return 0


def run_simulated(args, source: str, load_inputs, report) -> int:
    from int8attn.cli import UserError
    from int8attn.driver.graph import describe_functions, random_inputs
    from int8attn.pipelines.compile import CompileOptions, new_context, parse_graph
    from int8attn.simulator import simulate_decode

    on_gpu = args.target == "cuda" and not args.simulate
    if args.target not in EMITS or not (args.simulate or on_gpu):
        raise UserError(f"--target {args.target} runs only in the lane simulator here (add "
                        f"--simulate); --simulate needs --target gfx936, gfx942 or cuda")
    with new_context():
        infos = describe_functions(parse_graph(source, args.graph))
    candidates = [i for n, i in infos.items() if args.function in (None, n)]
    if len(candidates) != 1 or candidates[0].attention is None:
        raise UserError("--simulate needs one public function (or --function) returning an "
                        "int8attn.attention of its arguments")
    info = candidates[0]
    if info.attention.mode != "decode":
        raise UserError(f"the {args.target} kernel covers decode; run mode = "
                        f"\"{info.attention.mode}\" with --target cpu")
    if args.inputs:
        arrays = load_inputs(args.inputs, info)
    else:
        seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        print(f"random inputs, seed {seed} (repeat with --seed {seed})")
        arrays = random_inputs(info, seed)
    start = time.perf_counter()
    operands = [arrays[i] for i in info.attention.argument_of]
    if on_gpu:
        out = _run_on_cuda(source, args, info, arrays)
        print(f"@{info.name}: cuda kernels compiled and run in "
              f"{time.perf_counter() - start:.2f} s")
    else:
        out = simulate_decode(*operands, info.attention.softmax_scale, target=args.target,
                              pv=args.pv)
        print(f"@{info.name}: {args.target} kernels simulated in "
              f"{time.perf_counter() - start:.2f} s")
    if args.output:
        import io

        buffer = io.BytesIO()
        np.savez(buffer, result0=out)
        write_atomic(args.output, buffer.getvalue(), [args.graph, args.inputs])
        print(f"wrote {args.output} (result0)")
    if not args.inputs:
        report([out], arrays, info, CompileOptions(pv=args.pv, target=args.target))
    return 0


def _run_on_cuda(source: str, args, info, arrays):
    """Compile the kernel module for sm_80 and call it through IREE's CUDA driver."""
    from int8attn.cli import UserError
    from int8attn.pipelines.kernel import make_kernel_module, make_rocm_vmfb
    from int8attn.runtime import LoadedModule

    vmfb, _ = make_rocm_vmfb(make_kernel_module(source, args.graph, "cuda", pv=args.pv), "cuda")
    try:
        module = LoadedModule(vmfb, {info.name: list(info.arguments)}, driver="cuda")
    except (RuntimeError, ValueError) as error:
        raise UserError(f"IREE's CUDA driver is not usable here ({error}); run on a machine "
                        f"with an NVIDIA GPU, or add --simulate") from None
    return module.call(info.name, *arrays)[info.attention.result_index]
