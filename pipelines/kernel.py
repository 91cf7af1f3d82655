"""Compilation stages of the lane-level kernel targets (gfx936, gfx942).

    make_kernel_module: graph -> stream.executables + host function (the
                        `--emit mlir` product; for gfx936 it holds the MMAC
                        intrinsic calls that only a gfx936 toolchain translates)
    make_rocm_vmfb:     gfx942 only: IREE's ROCm backend -> vmfb and ISA
"""

from __future__ import annotations

import glob
import shlex
import tempfile

from iree.compiler import ir
from iree.compiler.tools import CompilerToolError, compile_str

from int8attn.support.diagnostics import DiagnosticError, StageError, save_for_repro
from int8attn.fragments import fragment_model
from int8attn.driver.graph import describe_functions
from int8attn.kernels.decode import DecodeShape, build_decode_kernels
from int8attn.kernels.host import build_host_function
from int8attn.passes import LowerQuantize
from int8attn.pipelines.compile import new_context, parse_graph
from int8attn.pipelines.manager import UpstreamPass, run_passes

KERNEL_TARGETS = ("gfx936", "gfx942", "cuda")
# IREE 3.13 knows sm_80, not sm_90: the driver JITs the PTX on Hopper. Binding
# fusion is off: it packs the three partition outputs into one buffer, and its
# offsets do not reach the hand-written kernel's subspans (seen on an H200: the
# outputs landed on top of each other).
_KERNEL_FLAGS = ["--iree-scheduling-optimize-bindings=false"]
ROCM_FLAGS = {"gfx942": ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"] + _KERNEL_FLAGS,
              "cuda": ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"] + _KERNEL_FLAGS}
ASSEMBLY = {"gfx942": "*.rocmasm", "cuda": "*.ptx"}


def _attention_function(module: ir.Operation, function: str | None):
    infos = {n: i for n, i in describe_functions(module).items() if i.attention is not None}
    if function:
        infos = {n: i for n, i in infos.items() if n == function}
    if len(infos) != 1:
        raise DiagnosticError(module.location, "the kernel targets need exactly one public "
                              "function that returns an int8attn.attention of its arguments"
                              + (f" (named @{function})" if function else ""))
    return next(iter(infos.values()))


def make_kernel_module(source: str, filename: str, target: str, function: str | None = None,
                       fragments=None, v_token_innermost: bool = False,
                       pv: str = "int8") -> str:
    """MLIR text: the two decode executables and the host function."""
    with new_context():
        graph = parse_graph(source, filename)
        info = _attention_function(graph, function)
        call = info.attention
        attention = next(op for op in _ops(graph) if op.name == "int8attn.attention")
        if call.mode != "decode":
            raise DiagnosticError(attention.location, f"the {target} kernel covers decode; "
                                  f"run mode = \"{call.mode}\" with --target cpu")
        q_spec = info.arguments[call.argument_of[0]]
        k_spec = info.arguments[call.argument_of[1]]
        batch, kv_heads, tokens, head_dim = k_spec.shape
        shape = DecodeShape(batch, kv_heads, q_spec.shape[1] // kv_heads, tokens, head_dim,
                            call.softmax_scale)
        if call.argument_of != (0, 1, 2, 3, 4):
            raise DiagnosticError(attention.location, "the kernel host function expects the "
                                  "attention operands as arguments 0..4 in order")
        with attention.location:
            try:
                kernels = build_decode_kernels(shape, fragments or fragment_model(target), target,
                                               pv)
            except (ValueError, KeyError) as error:
                    raise DiagnosticError(attention.location, str(error).strip("'")) from None
            with ir.InsertionPoint(kernels.module.regions[0].blocks[0]):
                build_host_function(kernels, info.name, ir.Type.parse(
                    f"tensor<{'x'.join(map(str, q_spec.shape))}x{q_spec.element}>"),
                    v_token_innermost=v_token_innermost)
            run_passes(kernels.module, [LowerQuantize(), UpstreamPass("canonicalize")])
        return str(kernels.module)


def _ops(module):
    from int8attn.dialects.int8attn import walk

    return walk(module)


def make_rocm_vmfb(kernel_ir: str, target: str) -> tuple[bytes, str]:
    """(vmfb, assembly: AMDGPU ISA or PTX) from IREE's ROCm or CUDA backend."""
    if target not in ROCM_FLAGS:
        raise DiagnosticError(None, f"IREE has no backend for {target}; emit the kernel IR "
                              f"with --emit mlir for a {target} toolchain")
    with tempfile.TemporaryDirectory(prefix="int8attn-rocm-") as dump:
        flags = ROCM_FLAGS[target] + [f"--iree-hal-dump-executable-intermediates-to={dump}",
                                      f"--iree-hal-dump-executable-binaries-to={dump}"]
        try:
            vmfb = compile_str(kernel_ir, extra_args=flags)
        except CompilerToolError as error:
            saved = save_for_repro({"kernels.mlir": kernel_ir}) / "kernels.mlir"
            command = shlex.join(["iree-compile", str(saved), *ROCM_FLAGS[target], "-o",
                                  "out.vmfb"])
            raise StageError(f"IREE {target} compilation (iree-compile)",
                             "\n".join(str(error).strip().splitlines()[-12:]), command) from None
        isa = "\n".join(open(path).read()
                         for path in sorted(glob.glob(f"{dump}/{ASSEMBLY[target]}")))
    return vmfb, isa
