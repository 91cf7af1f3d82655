"""A compiled module loaded into the IREE runtime, called on numpy arrays.

A failure inside iree.runtime (a module that does not load, a call that
raises) is a `StageError` naming the stage, with an `iree-run-module` command
line that reproduces it on the saved vmfb and inputs.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import iree.runtime as rt

from int8attn.support.diagnostics import StageError, save_for_repro

# MLIR element type -> numpy dtype accepted at the module boundary.
NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "i32": np.int32,
                "i64": np.int64, "f64": np.float64}


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


def check_signature(function: str, specs, arrays, names=None) -> list[np.ndarray]:
    """Arrays as the function takes them: count, dtype and shape, each named.

    `names` (argument index -> a name such as 'q') makes the messages clearer.
    """
    names = names or {}
    label = lambda i: f"argument {i} (arg{i}{', ' + names[i] if i in names else ''})"
    if len(arrays) != len(specs):
        detail = (", ".join(f"{label(i)}: {specs[i].describe()}"
                            for i in range(len(arrays), len(specs))))
        what = f"missing {detail}" if len(arrays) < len(specs) else \
            f"{len(arrays) - len(specs)} too many"
        raise InputError(f"@{function} takes {len(specs)} arguments, got {len(arrays)}: {what}")
    checked = []
    for i, (array, spec) in enumerate(zip(arrays, specs)):
        array = np.asarray(array)
        dtype = NUMPY_DTYPES.get(spec.element)
        if dtype is None:
            raise InputError(f"{label(i)} of @{function} has element type {spec.element}, "
                             f"which the runner cannot pass from numpy")
        if array.dtype != dtype:
            raise InputError(f"{label(i)} of @{function} must be {np.dtype(dtype)} for "
                             f"{spec.describe()}, got {array.dtype}")
        if not spec.accepts(array.shape):
            expected = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
            raise InputError(f"{label(i)} of @{function} must have shape {expected} "
                             f"for {spec.describe()}, got {list(array.shape)}")
        checked.append(np.ascontiguousarray(array))
    return checked


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
            saved = save_for_repro({"module.vmfb": self.vmfb,
                                    **{f"arg{i}.npy": a for i, a in enumerate(arguments)}})
            command = ["iree-run-module", f"--module={saved / 'module.vmfb'}",
                       f"--device={self.driver}", f"--function={function}"]
            command += [f"--input=@{saved / f'arg{i}.npy'}" for i in range(len(arguments))]
            message = "\n".join(str(error).strip().splitlines()[:6])
            raise StageError(f"IREE runtime ({what})", message, shlex.join(command)) from None

    def check_arguments(self, function: str, arrays) -> list[np.ndarray]:
        return check_signature(function, self.signatures[function], arrays)

    def time_calls(self, function: str, arrays, iterations: int = 20, warmup: int = 3) -> list[float]:
        """Seconds per call with the arguments already on the device."""
        import time

        arguments = self.check_arguments(function, arrays)
        entry = self._functions(function, arguments)[function]
        device_args = [rt.asdevicearray(self._context.config.device, a) for a in arguments]
        for _ in range(warmup):
            entry(*device_args)
        seconds = []
        for _ in range(iterations):
            start = time.perf_counter()
            result = entry(*device_args)
            (result[0] if isinstance(result, (tuple, list)) else result).to_host()
            seconds.append(time.perf_counter() - start)
        return seconds

    def call(self, function: str, *arrays) -> list[np.ndarray]:
        if function not in self.signatures:
            raise InputError(f"no public function @{function}; the module has "
                             f"{', '.join('@' + f for f in self.signatures)}")
        arguments = self.check_arguments(function, arrays)
        entry = self._functions(function, arguments)[function]
        with self._stage(f"calling @{function}", function, arguments):
            results = entry(*arguments)
            if not isinstance(results, (tuple, list)):
                results = [results]
            return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
