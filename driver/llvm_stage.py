"""The `llvm` stage: a kernel target's kernels as one standalone LLVM IR module.

Route: IREE's ROCm backend lowers the kernel module (the `kernel` stage) for the
target's `llvm_proxy` chip, as it does for a vmfb, and leaves the linked LLVM
IR of every executable (ours and the dispatches IREE forms itself, e.g. the
dense graph's V transpose) in its dump folder. A target whose matrix
instruction upstream LLVM does not know (gfx936's MMAC) goes through IREE with
an upstream stand-in of the same operand types (`TargetSpec.llvm_stand_in`),
renamed back afterwards. `driver.portable_llvm` then rewrites the module for
the target's own LLVM. The module ends with a marker symbol holding the digest
of its text, which the code object keeps, so a packaging step can tell an
object built from this graph's IR from a stale one.

The manifest beside it lists every kernel the code object must export, each
with its `KernelABI` (bindings, push constants, grid, workgroup size), the LDS
it allocates and the pipeline layout IREE dispatches it with, and the command
that builds the code object.
"""

from __future__ import annotations

import glob
import hashlib
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from iree.compiler import ir
from iree.compiler.dialects import llvm
from iree.compiler.tools import CompilerToolError, compile_str

from .portable_llvm import PortableIRError, Rename, portable_module
from ..kernels.target_spec import target_spec
from ..support.diagnostics import StageError, save_for_repro
from ..support.ir import walk

MARKER_PREFIX = "int8attn.ir."
# How each target's own toolchain turns the module into a code object: the
# same two steps everywhere (llc, then ld.lld making the shared object the HIP
# runtime loads); only where the tools live differs.
TOOLCHAINS = {
    "gfx936": "${ROCM_PATH:-/opt/dtk}/llvm/bin",   # Hygon DTK's LLVM
    "gfx942": "${LLVM_BIN:-/usr/lib/llvm-19/bin}",  # upstream LLVM >= 19 (Debian's llvm-19)
}
# The IREE flags of the proxy build (and of the packaged one, which must
# dispatch the kernels exactly as the proxy build laid them out).
def proxy_flags(chip: str) -> list[str]:
    return ["--iree-hal-target-device=hip", f"--iree-rocm-target={chip}",
            # keep every binding its own kernel argument (as the vmfb stage does)
            "--iree-scheduling-optimize-bindings=false",
            # plain global pointers: buffer fat pointers need a recent LLVM
            "--iree-rocdl-enable-buffer-instructions=false"]


@dataclass(frozen=True)
class LLVMModule:
    """The `llvm` stage's results."""

    text: str                      # the portable LLVM IR, marker included
    digest: str                    # of the text before the marker
    manifest: dict
    sources: dict[str, str]        # hal.executable name -> IREE's source of it (proxy)


def build_command(target: str, ll: str = "KERNELS.ll", co: str = "KERNELS.co") -> str:
    tools = TOOLCHAINS[target]
    obj = co[:-3] + ".o" if co.endswith(".co") else co + ".o"
    return (f'"{tools}/llc" -O3 -mtriple=amdgcn-amd-amdhsa -mcpu={target} -filetype=obj '
            f'{shlex.quote(ll)} -o {shlex.quote(obj)} && "{tools}/ld.lld" -shared '
            f'{shlex.quote(obj)} -o {shlex.quote(co)}')


def build_llvm_module(kernel_module: ir.Operation, kernel_layouts: dict, target: str,
                      location: ir.Location) -> LLVMModule:
    spec = target_spec(target)
    source, stand_ins = _with_stand_ins(kernel_module, spec)
    with tempfile.TemporaryDirectory(prefix="int8attn-llvm-") as dump:
        flags = proxy_flags(spec.llvm_proxy) + [
            f"--iree-hal-dump-executable-intermediates-to={dump}",
            f"--iree-hal-dump-executable-sources-to={dump}"]
        try:
            compile_str(source, extra_args=flags)
        except CompilerToolError as error:
            from .stages import compiler_messages

            saved = save_for_repro({"input.mlir": source})
            raise StageError(f"IREE {spec.llvm_proxy} lowering to LLVM IR (iree-compile)",
                             compiler_messages(str(error)),
                             shlex.join(["iree-compile", str(saved / "input.mlir"), *flags[:4],
                                         f"--iree-hal-dump-executable-intermediates-to={saved}",
                                         "-o", str(saved / "out.vmfb")])) from None
        linked = sorted(glob.glob(f"{dump}/*.linked.ll"))
        sources = {Path(p).stem.removeprefix("module_"): Path(p).read_text()
                   for p in sorted(glob.glob(f"{dump}/module_*.mlir"))}
        text = "\n".join(Path(p).read_text() for p in linked)
    exports = _exports(sources)
    rename = None
    if spec.llvm_stand_in is not None:
        name, immediates = spec.llvm_stand_in
        rename = Rename(name, spec.model.instruction.intrinsic, immediates, "<4 x i32>",
                        "i64, i64, <4 x i32>")
    try:
        portable, renamed = portable_module(text, target,
                                            tuple(e["kernel"] for e in exports), rename)
    except PortableIRError as error:
        raise StageError(f"rewriting IREE's {spec.llvm_proxy} LLVM IR for {target}",
                         str(error), "int8attn compile GRAPH --target "
                         f"{target} --emit llvm -o out.ll") from None
    if renamed != stand_ins:
        raise StageError(f"rewriting IREE's {spec.llvm_proxy} LLVM IR for {target}",
                         f"{stand_ins} {spec.model.instruction.name} calls went in, "
                         f"{renamed} came out of IREE's LLVM IR", "int8attn compile GRAPH "
                         f"--target {target} --emit llvm -o out.ll")
    digest = hashlib.sha256(portable.encode()).hexdigest()[:16]
    marker = (f"; Marks the code object as built from exactly this text (int8attn checks it "
              f"when packaging).\n@{MARKER_PREFIX}{digest} = protected addrspace(4) "
              f"constant i8 0\n")
    header = (f"; int8attn kernels for {target} (int8attn compile --emit llvm).\n"
              f"; Build the code object: {build_command(target)}\n")
    manifest = _manifest(target, digest, exports, kernel_layouts, kernel_module, spec)
    return LLVMModule(header + portable + marker, digest, manifest, sources)


def _with_stand_ins(module: ir.Operation, spec) -> tuple[str, int]:
    """The kernel module's text, the target's own MMA intrinsic calls replaced by the
    stand-in (the same operands, then zero immediates), and how many were replaced."""
    if spec.llvm_stand_in is None:
        return str(module), 0
    name, immediates = spec.llvm_stand_in
    intrinsic = spec.model.instruction.intrinsic
    copy = ir.Module.parse(str(module)).operation
    calls = [op for op in walk(copy) if op.name == "llvm.call_intrinsic"
             and ir.StringAttr(op.attributes["intrin"]).value == intrinsic]
    i32 = ir.IntegerType.get_signless(32)
    for call in calls:
        with ir.InsertionPoint(call), call.location:
            zeros = [llvm.mlir_constant(ir.IntegerAttr.get(i32, 0))] * immediates
            stand_in = llvm.CallIntrinsicOp(call.results[0].type, name,
                                            list(call.operands) + zeros, [], []).result
        call.results[0].replace_all_uses_with(stand_in)
        call.erase()
    return str(copy), len(calls)


def _exports(sources: dict[str, str]) -> list[dict]:
    """Every executable's exports as IREE laid them out: kernel symbol, bindings and
    push constants (32-bit words) of its pipeline layout."""
    exports = []
    for executable, text in sources.items():
        module = ir.Module.parse(text)
        for op in walk(module.operation):
            if op.name != "hal.executable.export":
                continue
            layout = str(op.attributes["layout"])
            constants = 0
            if "constants = " in layout:
                constants = int(layout.split("constants = ", 1)[1].split(",")[0].split(">")[0])
            exports.append({"kernel": ir.StringAttr(op.attributes["sym_name"]).value,
                            "executable": executable,
                            "bindings": layout.count("#hal.pipeline.binding<"),
                            "push_constant_words": constants})
    return exports


def _lds_bytes(kernel_module: ir.Operation) -> dict[str, int]:
    """Per kernel function: the bytes of its workgroup (LDS) allocations."""
    sizes: dict[str, int] = {}
    for op in walk(kernel_module):
        if op.name != "func.func" or op.parent is None or "translation_info" not in op.attributes:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        total = 0
        for inner in walk(op):
            if inner.name == "memref.alloc" and "workgroup" in str(inner.results[0].type):
                memref = ir.MemRefType(inner.results[0].type)
                count = 1
                for dim in memref.shape:
                    count *= dim
                total += count * max(1, memref.element_type.width // 8)
        sizes[name] = total
    return sizes


def _manifest(target: str, digest: str, exports: list[dict], kernel_layouts: dict,
              kernel_module: ir.Operation, spec) -> dict:
    abis = {abi["kernel"]: (function, abi) for function, layout in kernel_layouts.items()
            for abi in layout["abi"]}
    lds = _lds_bytes(kernel_module)
    kernels, generated = [], []
    for export in exports:
        if export["kernel"] in abis:
            function, abi = abis[export["kernel"]]
            kernels.append({**export, "function": function, "abi": abi,
                            "lds_bytes": lds.get(export["kernel"], 0)})
        else:   # a dispatch IREE formed from the host function (a pad or transpose)
            generated.append(export)
    intrinsic = None
    if spec.llvm_stand_in is not None:
        intrinsic = {"name": spec.model.instruction.intrinsic,
                     "signature": "<4 x i32> (i64, i64, <4 x i32>)",
                     "instruction": spec.model.instruction.name}
    return {"target": target, "ir_digest": digest, "marker_symbol": MARKER_PREFIX + digest,
            "kernels": kernels, "iree_dispatches": generated, "target_intrinsic": intrinsic,
            "build": build_command(target)}
