"""A compiled module loaded into the IREE runtime, called on numpy arrays.

A failure inside iree.runtime (a module that does not load, a call that
raises) is a `StageError` naming the stage, with an `iree-run-module` command
line that reproduces it on the saved vmfb and inputs.

Arguments are passed by reference on a host-memory device (`local-task`,
`local-sync`): a C-contiguous numpy array whose data is 64-byte aligned is
imported as the HAL buffer itself (`import_host_allocation`, no copy), and the
module reads the caller's memory. A read-only array is imported too where the
module only reads it: IREE never writes an argument it imports without `consume`.
An argument the module takes as a `!hal.buffer_view` (a cache `lower-cache-write`
imports with `consume`, updated in place) is passed by reference only when the
call is `tied` to it: the update lands in the caller's array and the result is
returned as that very array; a read-only array there is refused
(`check_writable`); otherwise it is copied, so the caller's array is left as it was.

What is still copied, each once, into a fresh 64-byte aligned buffer (and, when
tied, its result copied back into the caller's array), and why (`copies`
records every one, `Copy`):
  - not C-contiguous (a strided view, a transposed array): the compiled code
    reads dense row-major buffers;
  - not 64-byte aligned (numpy's own allocations are 16-byte aligned): the
    compiled code may assume its bindings are (`aligned_empty` and
    `aligned_copy` make arrays that are not copied; torch's CPU allocator aligns
    to 64 already);
  - a bf16 argument: given as f32 (or f16), rounded to bf16 (to nearest, ties to
    even: `support.bf16.round_to_bf16`, `bf16_values`) and passed as a bf16
    buffer of their bits;
  - a device that is not the host's memory (cuda, hip): copied to the device.
A result is returned as a numpy view of the module's own output buffer (no
copy); `out=` copies it into a caller-owned array (the module's ABI has no
output argument to write into).
"""

from __future__ import annotations

import ctypes
import math
import re
import shlex
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import iree.runtime as rt

from ..support.bf16 import bf16_bits
from ..support.diagnostics import StageError, save_for_repro
from .arguments import (
    HOST_ALIGNMENT, BF16, InputError, TensorSpec, check_signature, aligned_copy,
    check_writable, _shared)
from .arguments import (  # noqa: F401  (runtime.module was their home before)
    NUMPY_DTYPES, BF16_FROM, host_dtype, bf16_values, argument_label, quantize_hint,
    aligned_empty, check_out, write_out)

# IREE drivers whose buffers are host memory: numpy arrays can be imported as they are.
HOST_DRIVERS = ("local-task", "local-sync")

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
        self._consumed: dict[str, frozenset[int]] = {}
        self._entries: dict[str, object] = {}
        self._updating: dict[int, np.ndarray] = {}
        self.copies: list[Copy] = []     # what the last call copied (`Copy`), in order

    def _functions(self, function: str, arguments):
        if self._context is None:
            with self._stage("loading the module", function, arguments):
                context = rt.SystemContext(config=rt.Config(self.driver))
                context.add_vm_module(rt.VmModule.copy_buffer(context.instance, self.vmfb))
            self._context = context
        return self._context.modules.module

    def _entry(self, function: str, arguments):
        """`function`'s invoker, made once (each lookup parses its ABI anew)."""
        if function not in self._entries:
            self._entries[function] = self._functions(function, arguments)[function]
        return self._entries[function]

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
        """Seconds per call with the arguments already on the device (or passed by
        reference, as a call passes them), by `clock`
        (default `time.perf_counter`; `time.process_time` counts this process's CPU
        time, which on the inline `local-sync` driver is the call's own work)."""
        import time

        clock = time.perf_counter if clock is None else clock

        arguments = self.check_arguments(function, arrays)
        entry = self._entry(function, arguments)
        held: list[np.ndarray] = []
        device_args = self._pass(function, arguments, (), held)
        for _ in range(warmup):
            entry(*device_args)
        seconds = []
        for _ in range(iterations):
            start = clock()
            result = entry(*device_args)
            (result[0] if isinstance(result, (tuple, list)) else result).to_host()
            seconds.append(clock() - start)
        return seconds

    def consumed(self, function: str) -> frozenset[int]:
        """Arguments `function` takes as `!hal.buffer_view`, imported with `consume`: the
        module may update them in place. Without the module's declaration, all of them."""
        if function not in self._consumed:
            entry = self._entry(function, ())
            declaration = entry.vm_function.reflection.get("iree.abi.declaration")
            self._consumed[function] = (
                frozenset(range(len(self.signatures[function]))) if declaration is None else
                frozenset(int(i) for i in re.findall(r"%input(\d+): !hal\.buffer_view",
                                                     declaration)))
        return self._consumed[function]

    def result_aliases(self, function: str, tied=()) -> frozenset[int]:
        """The arguments of `function` that a result not in `tied` may be computed in.
        IREE 3.13 may compute a result in the buffer of an imported argument of its type,
        even one it does not consume (bufferization writes in place into an `outs` that
        is an argument): such an argument is copied, never read in place. Types are read
        from the ABI declaration: the same type, or, static, the same element type and
        count (a reshape between them); without a declaration, every argument."""
        entry = self._entry(function, ())
        declaration = entry.vm_function.reflection.get("iree.abi.declaration")
        count = len(self.signatures[function])
        if declaration is None:
            return frozenset(range(count))
        inputs = dict((int(i), t) for i, t in re.findall(r"%input(\d+): tensor<([^>]*)>",
                                                          declaration))
        tied_results = {r for r, _ in tied}
        outputs = [t for r, t in re.findall(r"%output(\d+): tensor<([^>]*)>", declaration)
                   if int(r) not in tied_results]
        return frozenset(i for i, t in inputs.items()
                         if any(_may_alias(t, o) for o in outputs))

    def _why_copied(self, index: int, array: np.ndarray, updated: set, consumed,
                    aliases=frozenset()) -> str | None:
        """Why argument `index` cannot be read in place, or None where it can."""
        if self.driver not in HOST_DRIVERS:
            return f"the {self.driver} device has its own memory"
        if index in consumed and index not in updated:
            return ("the module updates it in place, and this call keeps the caller's array "
                    "as it was")
        if not array.flags.c_contiguous:
            return f"not C-contiguous (strides {list(array.strides)})"
        if array.ctypes.data % HOST_ALIGNMENT:
            return (f"not {HOST_ALIGNMENT}-byte aligned (address % {HOST_ALIGNMENT} = "
                    f"{array.ctypes.data % HOST_ALIGNMENT}; runtime.aligned_empty makes "
                    f"arrays that are)")
        if index not in updated and index in aliases:
            return ("a result of its type may be computed in its buffer (IREE may reuse an "
                    "argument's buffer for a result), so the caller's array is kept apart")
        shared = [b for b in updated if b != index and _shared(array, self._updating[b])]
        if shared:
            return f"shares memory with argument {shared[0]}, which the call updates in place"
        return None

    def _copy(self, index: int, array: np.ndarray, why: str, held: list, bf16: bool = False):
        """The one place a call copies caller memory in: `array` (a bf16 argument: its
        bf16 bits) into a fresh 64-byte aligned host buffer, imported, or on a device
        driver into device memory. Each copy is recorded in `copies`."""
        self.copies.append(Copy(index, "in", array.nbytes, why))
        source = bf16_bits(array) if bf16 else array
        element = rt.HalElementType.BFLOAT_16 if bf16 else _element_type(source.dtype)
        if self.driver in HOST_DRIVERS:
            view = self._import(aligned_copy(source), held, element)
            if view is not None:
                return view
        device = self._context.config.device
        return device.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
            device=device, buffer=np.ascontiguousarray(source), element_type=element)

    def _import(self, array: np.ndarray, held: list, element=None):
        """A HAL buffer view over `array`'s own memory (appended to `held`, which the
        caller keeps alive while IREE uses it), or None where IREE refuses it. A
        read-only array goes through a writable alias (IREE's import asks for one): the
        caller imports it only for an argument the module does not write."""
        memory = array if array.flags.writeable else _writable_alias(array)
        try:
            buffer = self._context.config.device.allocator.import_host_allocation(
                memory, memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
                allowed_usage=int(rt.BufferUsage.DEFAULT))
        except (RuntimeError, ValueError):
            return None
        held.append(array)
        return rt.HalBufferView(buffer, array.shape,
                                _element_type(array.dtype) if element is None else element)

    def host_view(self, array: np.ndarray):
        """The HAL buffer view a call passes for C-contiguous, 64-byte aligned `array`:
        its own memory (None where it cannot be). For tests and tools."""
        self._functions(next(iter(self.signatures)), ())
        if self.driver not in HOST_DRIVERS or self._why_copied(-1, array, set(), ()):
            return None
        return self._import(array, [])

    def _pass(self, function: str, arguments, tied, held: list) -> list:
        """What the call gets for each argument: a buffer view over the caller's array
        where the module may use it in place, else over a copy (`_copy`). Every host
        array imported is appended to `held`: IREE's import does not keep it alive."""
        specs, consumed = self.signatures[function], self.consumed(function)
        aliases = self.result_aliases(function, tied) if self.driver in HOST_DRIVERS \
            else frozenset()
        updated = {a for _, a in tied}
        self._updating = {a: arguments[a] for a in updated}
        passed = []
        for i, (array, spec) in enumerate(zip(arguments, specs)):
            if spec.element == BF16:
                passed.append(self._copy(i, array, "bf16: rounded from f32, passed as bf16 "
                                                   "bits", held, bf16=True))
                continue
            if not array.size:
                passed.append(array)      # no bytes to copy
                continue
            why = self._why_copied(i, array, updated, consumed, aliases)
            view = None if why is not None else self._import(array, held)
            if view is None:
                view = self._copy(i, array, why or "IREE did not import it", held)
            passed.append(view)
        return passed

    def call(self, function: str, *arrays, tied=()) -> list[np.ndarray]:
        """Results as numpy arrays (views of the module's output buffers). `tied`:
        (result, argument) pairs whose result is that argument updated, returned as the
        caller's array (module docstring). `copies` lists what the call copied."""
        if function not in self.signatures:
            raise InputError(f"no public function @{function}; the module has "
                             f"{', '.join('@' + f for f in self.signatures)}")
        arguments = self.check_arguments(function, arrays)
        check_writable(function, tied, arrays)
        entry = self._entry(function, arguments)
        self.copies = []
        held: list[np.ndarray] = []
        with self._stage(f"calling @{function}", function, arguments):
            passed = self._pass(function, arguments, tied, held)
            results = entry(*passed)
            if not isinstance(results, (tuple, list)):
                results = [results]
            results = [_owned(np.asarray(r.to_host() if hasattr(r, "to_host") else r), held)
                       for r in results]
        tied_results = {r for r, _ in tied}
        for r, result in enumerate(results):
            written = [i for i, a in enumerate(arrays) if r not in tied_results
                       and isinstance(a, np.ndarray) and np.may_share_memory(result, a)]
            if written:
                raise StageError(f"calling @{function}", f"result {r} was computed in the "
                                 f"memory of argument {written[0]}, which the call must not "
                                 f"write: an int8attn bug (runtime.module.result_aliases)",
                                 None)
        for r, a in tied:
            target = arrays[a] if isinstance(arrays[a], np.ndarray) else arguments[a]
            if _host_memory(results[r]) == _host_memory(target):
                results[r] = target
            elif target.flags.writeable and target.shape == results[r].shape:
                self.copies.append(Copy(a, "back", target.nbytes, "it was copied in"))
                np.copyto(target, results[r])
                results[r] = target
        return results


@dataclass(frozen=True)
class Copy:
    """A copy of caller memory one call made: argument `argument` copied in (`direction`
    "in") or its updated result copied back into it ("back"), `nbytes` bytes, and why
    it could not be used in place."""

    argument: int
    direction: str
    nbytes: int
    why: str


def _owned(result: np.ndarray, held: list) -> np.ndarray:
    """`result`, or where it lies in the memory of an array the call imported (a cache
    updated in place, an argument returned as it is), the same elements as a view of
    that array: the view keeps the memory alive, IREE's mapping of it does not."""
    for array in held:
        start = result.ctypes.data - array.ctypes.data
        if result.size and 0 <= start and start + result.nbytes <= array.nbytes:
            flat = array.reshape(-1).view(np.uint8)
            return flat[start:start + result.nbytes].view(result.dtype).reshape(result.shape)
    return result


def _element_type(dtype: np.dtype):
    from iree.runtime.array_interop import map_dtype_to_element_type

    return map_dtype_to_element_type(np.dtype(dtype))


def _writable_alias(array: np.ndarray):
    """A writable buffer over read-only `array`'s memory, keeping `array` alive."""
    alias = (ctypes.c_char * array.nbytes).from_address(array.ctypes.data)
    alias.owner = array
    return alias


def _may_alias(argument: str, result: str) -> bool:
    """Whether a result of tensor type `result` (as the ABI declaration writes it, e.g.
    "1x8x64xf32") may be computed in the buffer of an argument of type `argument`."""
    if argument == result:
        return True
    *a_dims, a_element = argument.split("x")
    *r_dims, r_element = result.split("x")
    if a_element != r_element or "?" in a_dims or "?" in r_dims:
        return False
    return math.prod(int(d) for d in a_dims) == math.prod(int(d) for d in r_dims)
