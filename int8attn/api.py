"""The Python API: compile a graph for a target, call it on numpy arrays.

    graph = int8attn.compile(open("decode.mlir").read(), filename="decode.mlir", pv="int8")
    out = graph(q, k, k_scale, v, v_scale)
    graph = int8attn.compile(source, target="gfx936", simulate=True)   # lane simulator

The keywords are the fields of `CompileOptions` (declared once, shared with
the CLI); `numerics=` (a `Numerics`) gives its q_terms, w_quant, w_terms, w_second and
q_second at once. Every call checks its inputs first (`driver.graph.check_arguments`),
whichever executes it: IREE's CPU or CUDA runtime, or the lane simulator.
Compiled modules are cached by content and options (`int8attn.runtime.ModuleCache`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from .contract.numerics import Numerics
from .driver.compile import compile as compile_stages
from .driver.cpu_target import UnknownTargetCPU, check_runnable_here
from .driver.graph import FunctionInfo, check_arguments, choose_function
from .driver.onnx_import import is_onnx, read_model
from .driver.options import CompileOptions
from .driver.targets import TARGETS, OptionRefused
from .runtime import LoadedModule, ModuleCache
from .runtime.module import InputError, check_out, check_writable, write_out

__all__ = ["compile", "compile_file", "CompiledGraph", "CompileOptions"]


class _Simulated:
    """Calls run the kernel-stage module in the lane simulator (the called function's
    kernels, as its layout says)."""

    def __init__(self, kernel_ir: str, layouts: dict[str, dict]):
        self.kernel_ir, self.layouts = kernel_ir, layouts

    def call(self, function: str, *arrays) -> list[np.ndarray]:
        from .simulator import simulate_kernel_ir

        arrays = [np.ascontiguousarray(a) for a in arrays]
        results = simulate_kernel_ir(self.kernel_ir, self.layouts[function], arrays)
        return list(results) if isinstance(results, tuple) else [results]


class CompiledGraph:
    """A compiled graph, loaded lazily into its executor on the first call."""

    def __init__(self, functions: dict[str, FunctionInfo], options: CompileOptions, *,
                 vmfb: bytes | None = None, kernel_ir: str | None = None,
                 kernel_layouts: dict[str, dict] | None = None, artifacts: dict | None = None,
                 timings: dict | None = None, cache_hit: bool = False,
                 remarks: tuple[str, ...] = ()):
        self.functions = functions
        self.remarks = tuple(remarks)   # e.g. which attention of an ONNX model was raised
        self.options = options
        self.vmfb = vmfb
        self.kernel_ir = kernel_ir
        self.kernel_layouts = dict(kernel_layouts or {})   # per function (kernel targets)
        self.artifacts = dict(artifacts or {})
        self.timings = dict(timings or {})
        self.cache_hit = cache_hit
        self._executor = None

    @property
    def linalg_ir(self) -> str | None:
        return self.artifacts.get("linalg")

    @property
    def simulated(self) -> bool:
        return self.vmfb is None

    def entry(self, function: str | None = None) -> FunctionInfo:
        """The named public function, or the only one."""
        return choose_function(self.functions, function)

    def kernel_layout_of(self, function: str | None = None) -> dict | None:
        """What the named function's kernels need from a host (mode, ABI, ...; see
        driver/stages.make_kernel), or the only function's; None on the cpu target."""
        return self.kernel_layouts.get(self.entry(function).name)

    @property
    def kernel_layout(self) -> dict | None:
        """The only public function's kernel layout (`kernel_layout_of` names one)."""
        return self.kernel_layout_of() if self.kernel_layouts else None

    @property
    def executor(self):
        if self._executor is None:
            if self.simulated:
                self._executor = _Simulated(self.kernel_ir, self.kernel_layouts)
            else:
                signatures = {name: list(info.arguments) for name, info in self.functions.items()}
                target = TARGETS[self.options.target]
                if target.takes_target_cpu:
                    try:
                        check_runnable_here(target.cpu(self.options.target_cpu))
                    except UnknownTargetCPU as error:
                        raise OptionRefused(str(error)) from None
                driver = (target.object_runtime_driver if self.options.kernel_object
                          else target.runtime_driver)
                self._executor = LoadedModule(self.vmfb, signatures, driver=driver)
        return self._executor

    module = executor  # the loaded IREE module (for timing calls)

    def run(self, arrays, function: str | None = None, out=None) -> list[np.ndarray]:
        """Results as numpy arrays. On the cpu target every argument is read in place,
        without a copy, when it is C-contiguous and 64-byte aligned
        (`int8attn.runtime.aligned_empty` makes such arrays; torch's CPU tensors are);
        any other is copied once, and `graph.executor.copies` says which and why
        (`int8attn.runtime.module`). A cache_write function updates the caller's
        cache arrays in place and returns them (a copied-in cache gets its result
        copied back); a read-only cache array is refused (InputError), as it could
        not be updated. `out`: a caller-owned array the result is copied into (one per
        result for several; None leaves one as a new array), returned in its place.
        A bf16 argument is given as f32 (or f16) and rounded to bf16
        (`runtime.module.bf16_values`)."""
        info = self.entry(function)
        originals = list(arrays)
        call = info.attention
        arrays = check_arguments(info, arrays)
        given = None if out is None else check_out(info.name, info.results, out)
        tied = call.tied if call is not None else ()
        if tied:
            check_writable(info.name, tied, originals,
                           dict(zip(call.argument_of, call.operands)))
        start = time.perf_counter()
        results = (self.executor.call(info.name, *arrays) if self.simulated else
                   self.executor.call(info.name, *arrays, tied=tied))
        self.timings["run"] = time.perf_counter() - start
        for r, a in tied:
            # the caller's array, or the numpy view of an array-like's own memory (a torch
            # tensor, contiguous or not); a result computed elsewhere is copied back
            original = originals[a]
            target = original if isinstance(original, np.ndarray) else _memory_view(original)
            if target is None or not target.flags.writeable or \
                    target.shape != results[r].shape:
                continue
            if not _same_memory(results[r], target):
                np.copyto(target, results[r])
            results[r] = target
        return results if given is None else write_out(results, given)

    def __call__(self, *arrays, function: str | None = None, out=None):
        results = self.run(arrays, function, out=out)
        return results[0] if len(results) == 1 else tuple(results)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.vmfb if self.vmfb is not None else self.kernel_ir.encode())


def option_keywords(numerics: Numerics | None = None, **options) -> dict:
    """The keywords with `numerics` (a `Numerics`), if given, as the CompileOptions fields
    it declares (q_terms, w_quant, w_terms, w_second, q_second); given with any of them,
    refused."""
    if numerics is None:
        return options
    if not isinstance(numerics, Numerics):
        raise OptionRefused(f"numerics must be an int8attn.contract.numerics.Numerics, "
                            f"not {type(numerics).__name__}")
    fields = dataclasses.asdict(numerics)
    both = [name for name in fields if options.get(name) is not None]
    if both:
        raise OptionRefused(f"numerics= and {', '.join(f'{n}=' for n in both)} both given: "
                            f"pass the variant once")
    return {**options, **fields}


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """Are `a` and `b` views of the same elements (same start, shape and strides)?"""
    return (a.shape == b.shape and a.strides == b.strides
            and (a.size == 0 or a.ctypes.data == b.ctypes.data))


def _memory_view(array_like) -> np.ndarray | None:
    """A numpy view of `array_like`'s own memory (what `numpy.asarray` gives a torch
    tensor), or None where numpy made a new array of it."""
    try:
        view = np.asarray(array_like)
    except Exception:  # noqa: BLE001  (whatever __array__ raises: check_arguments named it)
        return None
    return view if view.base is not None else None


def compile_options(**options) -> CompileOptions:
    """CompileOptions from keywords (`numerics=` as `option_keywords` expands it), with an
    unknown keyword named as such."""
    options = option_keywords(**options)
    known = [f.name for f in dataclasses.fields(CompileOptions)]
    unknown = [k for k in options if k not in known]
    if unknown:
        raise OptionRefused(f"unknown option {', '.join(map(repr, unknown))} (options: "
                            f"{', '.join(known + ['numerics'])})")
    return CompileOptions(**options)


def compile(source: str | bytes, *, filename: str = "<string>", cache: bool | ModuleCache = True,
            simulate: bool = False, save_stages: str | Path | None = None,
            progress=None, **options) -> CompiledGraph:
    """Compile MLIR text, or an ONNX model's bytes, for `target` (keywords: the
    fields of CompileOptions, or `numerics=` for its three numerics fields; the
    resolved variant is `graph.options.numerics`). `graph.remarks` says which
    attention of a model was raised into int8attn's pipeline and why any other was not.

    `simulate=True` (kernel targets) runs calls in the lane simulator instead
    of on the target's GPU.
    """
    if not isinstance(source, (str, bytes)):
        raise TypeError(f"int8attn.compile takes the graph's MLIR text (str) or an ONNX "
                        f"model's bytes, got {type(source).__name__}; for a file use "
                        f"int8attn.compile_file(path)")
    if isinstance(source, str) and _looks_like_a_path(source):
        raise TypeError(f"int8attn.compile takes the graph's MLIR text (or an ONNX model's "
                        f"bytes), and {source!r} looks like a file path: for a file use "
                        f"int8attn.compile_file({source!r})")
    compile_options_ = compile_options(**options)
    target = TARGETS[compile_options_.target]
    # The options first: one that does not apply to the target (--kernel-object on
    # --target cpu) is named as such, not as a missing runtime for it.
    checked = target.check(compile_options_)
    target.check_source(isinstance(source, bytes))    # an ONNX model's bytes
    if simulate and not target.simulates:
        raise OptionRefused(f"--simulate runs lane-level kernels; --target "
                            f"{target.name} has none (use --target gfx936, gfx942 or cuda)")
    with_object = compile_options_.kernel_object is not None
    if simulate and with_object:
        raise OptionRefused("--simulate runs the generated kernels in the lane simulator; "
                            "--kernel-object runs a code object on the device: give one")
    if not simulate and (target.object_runtime_driver if with_object
                         else target.runtime_driver) is None:
        raise OptionRefused(f"--target {target.name} has no IREE runtime here (its kernels "
                            f"need a {target.name} toolchain); run them in the lane "
                            f"simulator with --simulate")
    until = "kernel" if simulate else "vmfb"
    store = None if simulate or save_stages is not None else (ModuleCache() if cache is True else cache) or None
    # `host` names a different CPU on another machine: key by what IREE resolved.
    cpu = target.cpu(checked.target_cpu) if target.takes_target_cpu else None
    # A code object is keyed by its bytes (one path may hold a rebuilt object).
    code = _object_digest(checked.kernel_object) if with_object else None
    key = store.key(source, (checked, cpu, code)) if store else None
    if store:
        hit = store.load(key)
        if hit is not None:
            vmfb, meta = hit
            functions = {f["name"]: FunctionInfo.from_json(f) for f in meta["functions"]}
            return CompiledGraph(functions, target.check(compile_options_), vmfb=vmfb,
                                 kernel_layouts=meta.get("kernel_layouts"),
                                 cache_hit=True, remarks=tuple(meta.get("remarks", ())))
    compiled = compile_stages(source, compile_options_, filename=filename, until=until,
                              save_stages=save_stages, progress=progress)
    if simulate:
        return CompiledGraph(compiled.functions, compiled.options, kernel_ir=compiled.last,
                             kernel_layouts=compiled.kernel_layouts,
                             artifacts=compiled.artifacts, timings=compiled.timings,
                             remarks=compiled.remarks)
    if store:
        store.store(key, compiled.last,
                    {"functions": [f.to_json() for f in compiled.functions.values()],
                     "remarks": list(compiled.remarks),
                     "kernel_layouts": compiled.kernel_layouts})
    return CompiledGraph(compiled.functions, compiled.options, vmfb=compiled.last,
                         kernel_layouts=compiled.kernel_layouts, artifacts=compiled.artifacts,
                         timings=compiled.timings,
                         remarks=compiled.remarks)


def _looks_like_a_path(source: str) -> bool:
    """One line without an operation's brackets that names a file, or ends like one:
    no MLIR module reads so."""
    text = source.strip()
    if not text or "\n" in text or any(c in text for c in "({"):
        return False
    try:
        exists = Path(text).expanduser().is_file()
    except (OSError, ValueError):   # a name too long, a NUL byte
        exists = False
    return exists or text.lower().endswith((".mlir", ".onnx"))


def _object_digest(path: str) -> str | None:
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None     # the packaging stage names what is wrong with the path


def compile_file(path: str | Path, **options) -> CompiledGraph:
    """An MLIR file, or an ONNX model (`.onnx`: imported, its attention raised)."""
    path = Path(path)
    source = read_model(path) if is_onnx(path) else path.read_text()
    return compile(source, filename=str(path), **options)
