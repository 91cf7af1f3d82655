"""The module boundary's arguments: the signature checks (count, dtype, shape, what was
given instead of an array), the arrays a call may write in place, 64-byte aligned host
arrays, and results written into caller-owned arrays (`out=`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..support.bf16 import round_to_bf16

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
        checked.append(array)     # as laid out: the runtime copies only what it must
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


def check_out(function: str, specs, out) -> list:
    """`out` as one entry per result of `function` (result specs `specs`): a writable
    numpy array of the result's dtype and shape, or None. `out` is one array for a
    function of one result, else a sequence. Checked before the call (a dynamic
    dimension: after it, by `write_out`)."""
    single = isinstance(out, np.ndarray) or not isinstance(out, (list, tuple))
    given = [out] if single else list(out)
    if len(given) != len(specs):
        raise InputError(f"out= gives {len(given)} arrays for the {len(specs)} results of "
                         f"@{function}: give one per result (None for a result returned as "
                         f"a new array)")
    for i, (target, spec) in enumerate(zip(given, specs)):
        what = f"out= (result {i} of @{function})"
        dtype = np.dtype(host_dtype(spec.element) or np.float32)
        expected = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
        if target is None:
            continue
        if not isinstance(target, np.ndarray):
            raise InputError(f"{what} must be a numpy array of shape {expected} and dtype "
                             f"{dtype}, got {type(target).__name__}")
        if target.dtype != dtype or not spec.accepts(target.shape):
            raise InputError(f"{what} must have shape {expected} and dtype {dtype} for "
                             f"{spec.describe()}, got {list(target.shape)} {target.dtype}")
        if not target.flags.writeable:
            raise InputError(f"{what} is a read-only array: pass a writable one")
    return given


def write_out(results: list, given: list) -> list:
    """`results` copied into the arrays `check_out` gave (None: left as returned);
    returns the results with each given array in its result's place."""
    for i, (target, result) in enumerate(zip(given, results)):
        if target is None:
            continue
        if target.shape != result.shape:
            raise InputError(f"out= for result {i} has shape {list(target.shape)}, but the "
                             f"result is {list(result.shape)}: pass an array of that shape")
        np.copyto(target, result)
        results[i] = target
    return results
