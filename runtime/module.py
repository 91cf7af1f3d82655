"""A compiled module loaded into the IREE runtime, called on numpy arrays.

A failure inside iree.runtime (a module that does not load, a call that
raises) is a `StageError` naming the stage, with an `iree-run-module` command
line that reproduces it on the saved vmfb and inputs.

Arguments are copied into device buffers, except those a call passes
`by_reference` (the paged caches): on a host-memory device (local-task) a
writable, C-contiguous, 64-byte aligned numpy array is imported as the HAL
buffer itself (`import_host_allocation`, no copy), so a module that updates
it in place (`lower-cache-write`) writes into the caller's array, and a
result `tied` to such an argument is returned as that very array. Any other
array is copied in and, when tied, the result is copied back into it: the
caller's array is updated either way, without a copy only in the first case
(`aligned_empty` makes arrays that qualify). A read-only array for a tied
argument is refused (`check_writable`): the call could not update it.

A bf16 argument (e.g. q of an attention taking bf16 queries) is given as an f32
(or f16) array: it is rounded to bf16 (to nearest, ties to even:
`support.bf16.round_to_bf16`, `bf16_values`), checked and returned as f32
holding those values, and passed to IREE as a bf16 buffer of their bits.
"""

from __future__ import annotations

import math
import shlex
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import iree.runtime as rt

from ..support.bf16 import bf16_bits, round_to_bf16
from ..support.diagnostics import StageError, save_for_repro

# Byte alignment IREE's CPU dispatches may assume for a buffer binding.
HOST_ALIGNMENT = 64

# MLIR element type -> numpy dtype accepted at the module boundary.
NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "i32": np.int32,
                "i64": np.int64, "f64": np.float64}
# bf16 has no numpy dtype of its own: a bf16 argument is given (and drawn, and
# compared) as f32 holding bf16 values (`bf16_values`); these dtypes are accepted.
BF16 = "bf16"
BF16_FROM = (np.dtype(np.float32), np.dtype(np.float16))


def host_dtype(element: str):
    """The numpy dtype an argument of MLIR element type `element` is given as (bf16:
    float32, rounded to bf16 at the boundary), or None where there is none."""
    return np.float32 if element == BF16 else NUMPY_DTYPES.get(element)


def bf16_values(array) -> np.ndarray:
    """`array` (f32, f16 or ml_dtypes.bfloat16) rounded to bf16 as f32
    (`support.bf16.round_to_bf16`: to nearest, ties to even, a NaN kept a NaN)."""
    values = np.asarray(array).astype(np.float32)
    return round_to_bf16(values).reshape(values.shape)


def _bf16_accepted(dtype: np.dtype) -> bool:
    return dtype in BF16_FROM or dtype.name == "bfloat16"   # ml_dtypes.bfloat16


class InputError(ValueError):
    """An argument that does not match the function's signature."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int | None, ...]      # None: a dynamic dimension (any size)
    element: str

    def describe(self) -> str:
        dims = ("?" if d is None else str(d) for d in self.shape)
        return "tensor<" + "x".join(dims) + f"x{self.element}>"

    def accepts(self, shape) -> bool:
        return len(shape) == len(self.shape) and all(
            d is None or d == n for d, n in zip(self.shape, shape))


def argument_label(index: int, name: str | None = None) -> str:
    """How every input check names an argument: `argument 2 (k_scale, arg2)`, or
    `argument 2 (arg2)` where it has no other name."""
    named = f"{name}, " if name and name != f"arg{index}" else ""
    return f"argument {index} ({named}arg{index})"


def check_signature(function: str, specs, arrays, names=None) -> list[np.ndarray]:
    """Arrays as the function takes them: count, dtype and shape, each named.

    `names` (argument index -> a name such as 'q') makes the messages clearer.
    """
    names = names or {}
    label = lambda i: argument_label(i, names.get(i))
    if len(arrays) != len(specs):
        detail = (", ".join(f"{label(i)}: {specs[i].describe()}"
                            for i in range(len(arrays), len(specs))))
        what = f"missing {detail}" if len(arrays) < len(specs) else \
            f"{len(arrays) - len(specs)} too many"
        raise InputError(f"@{function} takes {len(specs)} arguments, got {len(arrays)}: {what}")
    checked = []
    for i, (value, spec) in enumerate(zip(arrays, specs)):
        array = np.asarray(value)
        _check_array_like(function, label(i), spec, value, array)
        if spec.element == BF16:
            if not _bf16_accepted(array.dtype):
                raise InputError(f"{label(i)} of @{function} must be float32 (rounded to "
                                 f"bf16 at the call) for {spec.describe()}, got "
                                 f"{array.dtype} (convert it: array.astype(numpy.float32))")
            if not spec.accepts(array.shape):
                expected = "[" + ", ".join("?" if d is None else str(d)
                                           for d in spec.shape) + "]"
                raise InputError(f"{label(i)} of @{function} must have shape {expected} "
                                 f"for {spec.describe()}, got {list(array.shape)}")
            checked.append(bf16_values(array))
            continue
        dtype = NUMPY_DTYPES.get(spec.element)
        if dtype is None:
            raise InputError(f"{label(i)} of @{function} has element type {spec.element}, "
                             f"which the runner cannot pass from numpy")
        if array.dtype != dtype:
            fix = (quantize_hint(names.get(i), names) if spec.element == "i8" else
                   f"convert it: array.astype(numpy.{np.dtype(dtype)})")
            raise InputError(f"{label(i)} of @{function} must be {np.dtype(dtype)} for "
                             f"{spec.describe()}, got {array.dtype} ({fix})")
        if not spec.accepts(array.shape):
            expected = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
            raise InputError(f"{label(i)} of @{function} must have shape {expected} "
                             f"for {spec.describe()}, got {list(array.shape)}")
        checked.append(np.asarray(array, order="C"))  # (ascontiguousarray makes 0-d 1-d)
    return checked


def quantize_hint(name: str | None, names: dict) -> str:
    """How to make an INT8 cache of a float (or wider integer) one: quantize it by the
    contract's rule; a cast would wrap or truncate its values."""
    cache = name or "x"
    scale = f"{name}_scale" if name and f"{name}_scale" in names.values() else "scale"
    if cache.endswith("_cache"):     # a paged pool: tokens are written into it
        return ("a cast wraps or truncates the values: write float tokens into the pool "
                "with the cache write, which quantizes each one, e.g. "
                "int8attn.serving.PagedAttention(...).write(k_new, v_new, slot_mapping, "
                "k_cache, k_scale, v_cache, v_scale)")
    return (f"a cast wraps or truncates the values: quantize the float cache instead, one "
            f"scale per token, e.g. {cache}, {scale} = "
            f"int8attn.reference.quantize_cache({cache}_float)")


def _python_kind(value) -> str | None:
    """'a list', 'a Python float', ...: what a value that is no array is, or None."""
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__}"
    if isinstance(value, np.generic):      # (numpy.float64 is a float too)
        return f"a numpy {value.dtype} scalar ({value!r})"
    if isinstance(value, (bool, int, float, complex)):
        return f"a Python {type(value).__name__} ({value!r})"
    return None


def _check_array_like(function: str, label: str, spec: TensorSpec, value, array) -> None:
    """A list or a scalar that numpy would not turn into the argument (a list of floats
    is float64, a scalar has no shape) is named as what it is, not by numpy's dtype."""
    kind = _python_kind(value)
    dtype = host_dtype(spec.element)
    if kind is None or dtype is None or (
            (array.dtype == dtype or spec.element == BF16 and _bf16_accepted(array.dtype))
            and spec.accepts(array.shape)):
        return
    expected = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
    raise InputError(f"{label} of @{function} must be a numpy array (or a tensor) of shape "
                     f"{expected} and dtype {np.dtype(dtype)} for {spec.describe()}, got "
                     f"{kind}; pass numpy.asarray(x, dtype=numpy.{np.dtype(dtype)}) of that "
                     f"shape")


def aligned_empty(shape, dtype, alignment: int = HOST_ALIGNMENT) -> np.ndarray:
    """An uninitialized C-contiguous array whose data is `alignment`-byte aligned, so
    the runtime can pass it by reference (no copy). `shape` as numpy.empty takes it."""
    dtype = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in dims):
        raise TypeError(f"aligned_empty: shape {shape!r} must be integers")
    if any(d < 0 for d in dims):
        raise ValueError(f"aligned_empty: negative dimensions are not allowed, got {shape!r}")
    if not (isinstance(alignment, int) and alignment > 0 and alignment & (alignment - 1) == 0):
        raise ValueError(f"aligned_empty: alignment must be a positive power of two, got "
                         f"{alignment!r}")
    size = math.prod(int(d) for d in dims) * dtype.itemsize     # Python ints: no overflow
    raw = np.empty(size + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + size].view(dtype).reshape(dims)


def aligned_copy(array) -> np.ndarray:
    array = np.asarray(array)
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def check_writable(function: str, tied, arrays, names=None) -> None:
    """Refuse a read-only numpy array for an argument the call updates in place (the
    argument of a `tied` (result, argument) pair): it could not be written, and the
    caller would keep its old contents; and two such arguments in one memory (the same
    array as k_scale and v_scale): one update would overwrite the other."""
    names = names or {}
    label = lambda a: f"{argument_label(a, names.get(a))} of @{function}"
    updated = []
    for _, a in tied:
        array = arrays[a] if a < len(arrays) else None
        if not isinstance(array, np.ndarray):
            continue
        if not array.flags.writeable:
            raise InputError(f"{label(a)} is a read-only array, and the call updates it in "
                             f"place: pass a writable array, e.g. numpy.array(x) (a copy; "
                             f"then use that copy), or x.setflags(write=True) where x owns "
                             f"its memory")
        for b in updated:
            if _shared(array, arrays[b]):
                raise InputError(f"{label(a)} and {argument_label(b, names.get(b))} share "
                                 f"memory, and the call updates both in place: pass separate "
                                 f"arrays")
        updated.append(a)


def _shared(a: np.ndarray, b: np.ndarray) -> bool:
    """Do `a` and `b` share an element? (Where numpy cannot tell within its work bound,
    an interleaving it cannot untangle, they are taken as separate.)"""
    try:
        return bool(np.shares_memory(a, b, max_work=10 ** 6))
    except getattr(np, "exceptions", np).TooHardError:     # (numpy 1.24: np.TooHardError)
        return False


def _host_memory(array) -> int | None:
    return array.ctypes.data if isinstance(array, np.ndarray) and array.size else None


def _repro_inputs(specs, arguments) -> list[tuple[str, object, str]]:
    """(file name, contents, the --input prefix before `@`) of each argument for
    iree-run-module: an .npy file, or for a bf16 argument (numpy has no bf16; the
    array holds its f32 values) the raw bf16 bits with the shape and type spelled
    out (`--input=2x3xbf16=@arg0.bin`)."""
    inputs = []
    for i, array in enumerate(arguments):
        spec = specs[i] if i < len(specs) else None
        if spec is not None and spec.element == BF16 and isinstance(array, np.ndarray):
            shape = "x".join(str(d) for d in array.shape)
            inputs.append((f"arg{i}.bin", bf16_bits(array).astype("<u2").tobytes(),
                           f"{shape}x{BF16}=" if shape else f"{BF16}="))
        else:
            inputs.append((f"arg{i}.npy", array, ""))
    return inputs


class LoadedModule:
    """One vmfb in its own runtime context on `driver` (default: local-task CPU)."""

    def __init__(self, vmfb: bytes, signatures: dict[str, list[TensorSpec]],
                 driver: str = "local-task"):
        self.vmfb = vmfb
        self.signatures = signatures
        self.driver = driver
        self._context = None

    def _functions(self, function: str, arguments):
        if self._context is None:
            with self._stage("loading the module", function, arguments):
                context = rt.SystemContext(config=rt.Config(self.driver))
                context.add_vm_module(rt.VmModule.copy_buffer(context.instance, self.vmfb))
            self._context = context
        return self._context.modules.module

    @contextmanager
    def _stage(self, what: str, function: str, arguments):
        try:
            yield
        except (RuntimeError, ValueError) as error:
            message = "\n".join(str(error).strip().splitlines()[:6])
            if "Could not create device" in message and self.driver != "local-task":
                # no GPU here: nothing of the module's to reproduce, no files to save
                raise StageError(
                    f"IREE runtime ({what})",
                    f"{message}\nno IREE {self.driver} device is present here (no such GPU, or "
                    f"no driver for it); `int8attn run --simulate` (simulate=True in the "
                    f"Python API) runs the lane kernels in the lane simulator instead",
                    None) from None
            inputs = _repro_inputs(self.signatures.get(function, ()), arguments)
            saved = save_for_repro({"module.vmfb": self.vmfb,
                                    **{name: data for name, data, _ in inputs}})
            command = ["iree-run-module", f"--module={saved / 'module.vmfb'}",
                       f"--device={self.driver}", f"--function={function}"]
            command += [f"--input={prefix}@{saved / name}" for name, _, prefix in inputs]
            raise StageError(f"IREE runtime ({what})", message, shlex.join(command)) from None

    def check_arguments(self, function: str, arrays) -> list[np.ndarray]:
        return check_signature(function, self.signatures[function], arrays)

    def time_calls(self, function: str, arrays, iterations: int = 20, warmup: int = 3,
                   clock=None) -> list[float]:
        """Seconds per call with the arguments already on the device, by `clock`
        (default `time.perf_counter`; `time.process_time` counts this process's CPU
        time, which on the inline `local-sync` driver is the call's own work)."""
        import time

        clock = time.perf_counter if clock is None else clock

        arguments = self.check_arguments(function, arrays)
        entry = self._functions(function, arguments)[function]
        device_args = [self._bf16_view(a) if spec.element == BF16 else
                       rt.asdevicearray(self._context.config.device, a)
                       for a, spec in zip(arguments, self.signatures[function])]
        for _ in range(warmup):
            entry(*device_args)
        seconds = []
        for _ in range(iterations):
            start = clock()
            result = entry(*device_args)
            (result[0] if isinstance(result, (tuple, list)) else result).to_host()
            seconds.append(clock() - start)
        return seconds

    def _bf16_view(self, values: np.ndarray):
        """A bf16 HAL buffer view holding `values` (f32 already rounded to bf16: its
        upper 16 bits are the bf16 bits, the lower 16 zero), a copy on the device."""
        bits = bf16_bits(values)
        device = self._context.config.device
        return device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
            device=device, buffer=bits, element_type=rt.HalElementType.BFLOAT_16)

    def _by_reference(self, array: np.ndarray):
        """A HAL buffer view over `array`'s own memory, or None where it cannot be one
        (read-only, not C-contiguous or not aligned, or a device that is not the host)."""
        if not (array.size and array.flags.c_contiguous and array.flags.writeable
                and array.ctypes.data % HOST_ALIGNMENT == 0 and self.driver == "local-task"):
            return None
        from iree.runtime.array_interop import map_dtype_to_element_type

        element = map_dtype_to_element_type(array.dtype)
        if element is None:
            return None
        allocator = self._context.config.device.allocator
        try:
            buffer = allocator.import_host_allocation(
                array, memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.DEFAULT))
        except (RuntimeError, ValueError):
            return None
        return rt.HalBufferView(buffer, array.shape, element)

    def call(self, function: str, *arrays, by_reference=(), tied=()) -> list[np.ndarray]:
        """Results as numpy arrays. `by_reference`: argument indices to pass without a
        copy where possible; `tied`: (result, argument) pairs whose result is that
        argument updated, returned as the caller's array (module docstring)."""
        if function not in self.signatures:
            raise InputError(f"no public function @{function}; the module has "
                             f"{', '.join('@' + f for f in self.signatures)}")
        arguments = self.check_arguments(function, arrays)
        check_writable(function, tied, arrays)
        entry = self._functions(function, arguments)[function]
        passed = list(arguments)
        for i, spec in enumerate(self.signatures[function]):
            if spec.element == BF16:
                passed[i] = self._bf16_view(arguments[i])
        for i in by_reference:
            view = self._by_reference(arguments[i])
            if view is not None:
                passed[i] = view
        with self._stage(f"calling @{function}", function, arguments):
            results = entry(*passed)
            if not isinstance(results, (tuple, list)):
                results = [results]
            results = [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
        for r, a in tied:
            target = arrays[a] if isinstance(arrays[a], np.ndarray) else arguments[a]
            if _host_memory(results[r]) == _host_memory(target):
                results[r] = target
            elif target.flags.writeable and target.shape == results[r].shape:
                np.copyto(target, results[r])
                results[r] = target
        return results
