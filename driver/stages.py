"""The stages a target's chain is made of: `make_<stage>(compilation)`.

Each stage reads the `Compilation` (the IR so far, the options, the artifacts
of earlier stages) and returns its own artifact: MLIR text for IR stages,
bytes for a module, assembly text. Which stages a target runs, in which
order, is its row of the table in `driver.targets`; nothing here branches on
a target's name.

A failure inside a stage is located (`DiagnosticError`, `file:line:col`) where
the IR has a location, or a `StageError` with a command that reproduces it.
"""

from __future__ import annotations

import glob
import re
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from iree.compiler import ir
from iree.compiler.tools import CompilerToolError, compile_str

from ..dialects.int8attn import ATTENTION, CACHE_WRITE, PAGED_ATTENTION, verify
from .cpu_target import HOST, split_mmt4d_tiles
from .cpu_target import resolve as resolve_cpu
from .graph import FunctionInfo, describe_functions
from .onnx_import import import_model
from .options import CompileOptions
from ..pipelines import algorithm_to_linalg, to_algorithm
from ..passes import RaiseInt8Attention
from ..pipelines.manager import UpstreamPass, run_passes
from ..support.diagnostics import DiagnosticError, StageError, save_for_repro
from ..support.ir import NAMESPACE, parse_module, walk


@dataclass
class Compilation:
    """The state one compile carries from stage to stage (inside one context)."""

    source: str | bytes                    # MLIR text, or an ONNX model's bytes
    filename: str
    options: CompileOptions
    target: "object"                       # the driver.targets.Target row
    module: ir.Operation | None = None     # the IR of the latest IR stage
    functions: dict[str, FunctionInfo] = field(default_factory=dict)
    artifacts: dict[str, str | bytes] = field(default_factory=dict)
    kernel_layouts: dict[str, dict] = field(default_factory=dict)   # per function: what
                                           # its kernels' host side must pass them
    assembly: str | None = None
    llvm: "object" = None                  # the llvm stage's LLVMModule
    companions: dict[str, dict[str, str]] = field(default_factory=dict)   # per stage:
                                           # files written beside its artifact, by suffix
    timings: dict[str, float] = field(default_factory=dict)
    print_ir_after_all: bool = False

    def __post_init__(self):
        # A flag that does not apply is refused, never ignored: the row says which
        # stages print (driver.targets.Stage.prints_ir).
        if self.print_ir_after_all:
            self.target.check_print_ir(self.options.kernel_object is not None,
                                       isinstance(self.source, bytes))

    def last_ir(self) -> str:
        """The text of the latest IR artifact (the input of a module stage)."""
        return next(a for a in reversed(self.artifacts.values()) if isinstance(a, str))


def make_graph(c: Compilation) -> str:
    """Parse (an ONNX model: import, raise its attention), verify the ops, read the signatures."""
    if isinstance(c.source, bytes):
        c.module = import_model(c.source, c.filename)
        run_passes(c.module, [RaiseInt8Attention()], print_ir_after_all=c.print_ir_after_all)
    else:
        c.module = parse_module(c.source, c.filename)
    verify(c.module)
    c.functions = describe_functions(c.module)
    if not c.functions:
        raise DiagnosticError(c.module.location, "the graph has no public func.func to "
                              "compile (e.g. func.func @decode(...) returning an "
                              "int8attn.attention)")
    if not isinstance(c.source, bytes):   # a model's inputs are the model's to choose
        _refuse_unused_arguments(c)
    return str(c.module)


def _refuse_unused_arguments(c: Compilation) -> None:
    # An argument nothing reads is a caller's mistake (a cache passed twice,
    # a stale operand): say so instead of compiling a function that ignores it.
    for op in c.module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "func.func" or "sym_visibility" in op.attributes:
            continue
        for argument in op.regions[0].blocks[0].arguments:
            if not list(argument.uses):
                name = ir.StringAttr(op.attributes["sym_name"]).value
                raise DiagnosticError(op.location, f"argument {argument.arg_number} of "
                                      f"@{name} ({argument.type}) is not used; remove it "
                                      f"from the signature")


def make_algorithm(c: Compilation) -> str:
    """The tensor-level algorithm: INT8 QK, partitions / online softmax, verified W groups."""
    run_passes(c.module, to_algorithm(c.options.pipeline_options()),
               print_ir_after_all=c.print_ir_after_all)
    return str(c.module)


def make_linalg(c: Compilation) -> str:
    """The algorithm's ops lowered to linalg/arith/math; no int8attn op may be left."""
    run_passes(c.module, algorithm_to_linalg(c.options.pipeline_options()),
               print_ir_after_all=c.print_ir_after_all)
    for op in walk(c.module):
        if op.name.startswith(NAMESPACE):
            raise DiagnosticError(op.location, f"'{op.name}' was not lowered by the pipeline")
    return str(c.module)


def make_kernel(c: Compilation) -> str:
    """The lane-level kernels of each public function, with its host function.

    Decode, paged decode, prefill and cache_write kernels, all in one module (e.g.
    @write and @attend of one pool)."""
    from ..kernels.target_spec import target_spec

    spec = target_spec(c.options.target)
    module, owners, layouts = None, {}, {}
    for info, op in _kernel_entries(c):
        kernels = _function_kernels(c, info, op, spec)
        layouts[info.name] = {"function": info.name, "mode": info.attention.mode,
                              **kernels.layout}
        if module is None:
            module = kernels.module
        _adopt_executables(module, kernels.module, info.name, owners, op.location)
    c.module = module
    c.kernel_layouts = layouts
    if c.options.v_token_innermost:
        c.functions = describe_functions(c.module)
    return str(c.module)


def _function_kernels(c: Compilation, info: FunctionInfo, attention: ir.Operation, spec):
    """One function's kernels, with its host function built into their module."""
    with attention.location:
        try:
            kernels = _build_kernels(info, spec, c.options)
        except (ValueError, KeyError) as error:
            raise DiagnosticError(attention.location, f"the {c.options.target} "
                                  f"{_kernel_name(info)} kernel: "
                                  + str(error).strip("'")) from None
        with ir.InsertionPoint(kernels.module.regions[0].blocks[0]):
            _build_host(c, info, kernels)
        run_passes(kernels.module, [UpstreamPass("canonicalize")])
    return kernels


def _adopt_executables(module: ir.Operation, built: ir.Operation, function: str,
                       owners: dict[str, tuple[str, str]], location: ir.Location) -> None:
    """Moves `built`'s ops (one function's executables and host function) into `module`
    (nothing to move when it is `module`), recording which function each symbol serves.
    One symbol twice is refused, not renamed: two functions needing one kernel name
    (two paged decodes of other shapes, both `decode_partition`) would call each
    other's kernels, and the KernelABI and the serving launcher name kernels by it."""
    ops = [op.operation for op in built.regions[0].blocks[0].operations]
    for op in ops:
        name = ir.StringAttr(op.attributes["sym_name"]).value
        kind = "host function" if op.name == "func.func" else "kernel"
        if name in owners:
            owner, owner_kind = owners[name]
            fix = ("rename the function" if "host function" in (kind, owner_kind) else
                   "compile the functions as separate modules")
            raise DiagnosticError(location, f"@{function}'s {kind} and @{owner}'s "
                                  f"{owner_kind} would both be the symbol @{name} of the "
                                  f"one module a kernel target compiles: {fix}")
        owners[name] = function, kind
    if built == module:
        return
    body = ir.InsertionPoint(module.regions[0].blocks[0])
    for op in ops:
        op.detach_from_parent()
        body.insert(op)


def _kernel_name(info: FunctionInfo) -> str:
    """decode, prefill, paged decode, paged prefill (a chunked prefill's q is 4-D) or
    cache-write."""
    call = info.attention
    if call.mode == "cache_write":
        return "cache-write"
    if call.mode != "paged":
        return call.mode
    rank = len(info.arguments[call.argument("q")].shape)
    return "paged prefill" if rank == 4 else "paged decode"


def _build_kernels(info: FunctionInfo, spec, options: CompileOptions):
    """The decode (dense or paged) or prefill kernels of the graph's attention."""
    from ..kernels.decode import build_decode_kernels, dense_access, paged_access
    from ..kernels.shapes import DenseShape, PagedPrefillShape, PagedShape, PrefillShape
    from ..kernels.prefill import build_prefill_kernels

    call = info.attention
    if call.mode == "cache_write":
        from ..kernels.cache_write import CacheWriteShape, build_cache_write_kernels

        _, kv_heads, block_size, head_dim = info.arguments[call.argument("k_cache")].shape
        shape = CacheWriteShape(kv_heads, head_dim, block_size, "k_bias" in call.operands)
        return build_cache_write_kernels(shape, spec.model)
    chosen = {"numerics": options.numerics, "pv": options.pv, "pv_atom": options.pv_atom,
              "w_chain": options.w_chain}
    q_shape = info.arguments[call.argument("q")].shape
    q_heads, head_dim = q_shape[1], q_shape[-1]
    if call.mode == "paged":
        _, kv_heads, block_size, _ = info.arguments[call.argument("k_cache")].shape
        rows = q_heads // kv_heads
        if len(q_shape) == 4:           # chunked prefill over the pool
            shape = PagedPrefillShape(kv_heads, rows, q_shape[2], head_dim, block_size,
                                      call.softmax_scale)
            return build_prefill_kernels(shape, spec, **chosen)
        access = paged_access(PagedShape(kv_heads, rows, head_dim, block_size,
                                         call.softmax_scale), spec)
        return build_decode_kernels(access, spec, **chosen)
    batch, kv_heads, tokens, _ = info.arguments[call.argument("k")].shape
    rows = q_heads // kv_heads
    if call.mode == "prefill":
        shape = PrefillShape(batch, kv_heads, rows, tokens, q_shape[2], head_dim,
                             call.softmax_scale)
        return build_prefill_kernels(shape, spec, **chosen)
    access = dense_access(DenseShape(batch, kv_heads, rows, tokens, head_dim,
                                     call.softmax_scale), spec)
    return build_decode_kernels(access, spec, **chosen)


def _build_host(c: Compilation, info: FunctionInfo, kernels) -> None:
    from ..kernels.host import (build_host_function, build_paged_host_function,
                                build_paged_prefill_host_function,
                                build_prefill_host_function)

    def tensor_type(spec):
        dims = "x".join("?" if n is None else str(n) for n in spec.shape)
        return ir.Type.parse(f"tensor<{dims}x{spec.element}>")

    mode, q_type = info.attention.mode, tensor_type(info.arguments[0])
    if mode == "cache_write":
        from ..kernels.host import build_cache_write_host_function

        build_cache_write_host_function(kernels, info.name,
                                        [tensor_type(a) for a in info.arguments],
                                        [tensor_type(r) for r in info.results])
    elif mode == "paged":
        build = (build_paged_prefill_host_function if kernels.layout["kernel"] == "prefill"
                 else build_paged_host_function)
        build(kernels, info.name, [tensor_type(a) for a in info.arguments],
              tensor_type(info.results[0]))
    elif mode == "prefill":
        build_prefill_host_function(kernels, info.name, q_type,
                                    v_token_innermost=c.options.v_token_innermost)
    else:
        build_host_function(kernels, info.name, q_type,
                            v_token_innermost=c.options.v_token_innermost)


def _kernel_entries(c: Compilation) -> list[tuple[FunctionInfo, ir.Operation]]:
    """(function, its attention / paged_attention / cache_write op) for every public
    function: on a kernel target each one must return such an op of its arguments."""
    plain = [name for name, info in c.functions.items() if info.attention is None]
    if plain:
        raise DiagnosticError(c.module.location, f"--target {c.options.target} compiles "
                              f"public functions that each return an int8attn.attention, "
                              f"paged_attention or cache_write of their arguments; @{plain[0]} "
                              f"does not (this graph has {len(c.functions)} public "
                              f"function(s), {len(c.functions) - len(plain)} of them such)")
    entries = []
    for function in c.module.regions[0].blocks[0].operations:
        function = function.operation
        name = (ir.StringAttr(function.attributes["sym_name"]).value
                if function.name == "func.func" else None)
        if name not in c.functions:
            continue
        info = c.functions[name]
        attention = next(op for op in walk(function)
                         if op.name in (ATTENTION, PAGED_ATTENTION, CACHE_WRITE))
        if info.attention.argument_of != tuple(range(len(info.attention.operands))):
            raise DiagnosticError(attention.location, "the kernel host function expects "
                                  "the attention operands as the function's arguments, in "
                                  "order (" + ", ".join(info.attention.operands) + ")")
        entries.append((info, attention))
    return entries


def make_vmfb(c: Compilation) -> bytes:
    """IREE compiles the latest IR for the target's HAL device (and keeps its assembly)."""
    vmfb, c.assembly = iree_compile(c.last_ir(), c.target, c.options.iree_flags,
                                    c.options.target_cpu)
    return vmfb


def iree_compile(source: str, target, extra_flags=(),
                 target_cpu: str = HOST) -> tuple[bytes, str | None]:
    """(vmfb, device assembly or None): `iree-compile` with the target row's flags
    (and, for an llvm-cpu target, `target_cpu`'s)."""
    cpu_flags = list(target.cpu(target_cpu).iree_flags()) if target.takes_target_cpu else []
    flags = list(target.iree_flags) + cpu_flags + list(extra_flags)
    # An mmt4d's tiles go to IREE's ukernel whole or not at all: check IREE's tiling.
    check_mmt4d = bool(cpu_flags) and "mmt4d" in source
    with tempfile.TemporaryDirectory(prefix="int8attn-dump-") as dump:
        dumps = ([f"--iree-hal-dump-executable-intermediates-to={dump}",
                  f"--iree-hal-dump-executable-binaries-to={dump}"]
                 if target.assembly_glob else [])
        if check_mmt4d:
            dumps.append(f"--iree-hal-dump-executable-configurations-to={dump}")
        try:
            vmfb = compile_str(source, extra_args=flags + dumps)
        except CompilerToolError as error:
            raise StageError(f"IREE {target.name} compilation (iree-compile)",
                             compiler_messages(str(error)),
                             _reproducer(source, flags)) from None
        if check_mmt4d:
            _refuse_split_mmt4d_tiles(dump, target_cpu, source, flags)
        if not target.assembly_glob:
            return vmfb, None
        return vmfb, "\n".join(open(path).read() for path in
                               sorted(glob.glob(f"{dump}/{target.assembly_glob}")))


def target_cpu_isa(target_cpu: str) -> str:
    return resolve_cpu(target_cpu).vector_isa


def _reproducer(source: str, flags: list[str]) -> str:
    saved = save_for_repro({"input.mlir": source})
    return shlex.join(["iree-compile", str(saved / "input.mlir"), *flags,
                       "-o", str(saved / "out.vmfb")])


def _refuse_split_mmt4d_tiles(dump: str, target_cpu: str, source: str, flags) -> None:
    split = [f"{Path(path).name}: {what}"
             for path in sorted(glob.glob(f"{dump}/configured_*.mlir"))
             for what in split_mmt4d_tiles(Path(path).read_text())]
    if split:
        raise StageError(
            "IREE llvm-cpu compilation (iree-compile)",
            f"IREE splits the inner tile of a linalg mmt4d for --target-cpu {target_cpu} "
            f"({'; '.join(split[:3])}), and its mmt4d ukernel would then sum the wrong "
            f"elements; nothing was written. Lower the MMAC tiles for this CPU's register "
            f"file (lower-mmac-tiles vector-isa={target_cpu_isa(target_cpu)}), or use "
            f"contraction=f32", _reproducer(source, list(flags) + [
                "--iree-hal-dump-executable-configurations-to=configured"]))


def make_llvm(c: Compilation) -> str:
    """The kernels as one LLVM IR module for the target's own LLVM, and its manifest
    (kernels, their ABI, the command that builds the code object)."""
    import json

    from .llvm_stage import build_llvm_module

    c.llvm = build_llvm_module(c.module, c.kernel_layouts, c.options.target,
                               c.module.location)
    c.companions["llvm"] = {".json": json.dumps(c.llvm.manifest, indent=1) + "\n"}
    return c.llvm.text


def make_packaged_vmfb(c: Compilation) -> bytes:
    """The host functions with every executable taken from the --kernel-object code
    object (checked against this graph's llvm stage first), as IREE packages it."""
    from .packaging import package

    return package(c.artifacts["kernel"], c.llvm, c.options)


def make_assembly(c: Compilation) -> str:
    """The device assembly IREE produced in the vmfb stage (AMDGPU ISA or PTX)."""
    return c.assembly or ""


def compiler_messages(text: str, lines: int = 12) -> str:
    """The compiler's own messages: no invocation, temp-file hints or stack frames."""
    body = text.split("Diagnostics:", 1)[-1].split("Invoked with:", 1)[0]
    kept = [line for line in body.strip().splitlines()
            if line.strip() and not re.match(r"\s*#\d+ 0x", line)]
    return "\n".join(kept[:lines]) or text.strip()
