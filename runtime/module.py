"""A compiled module loaded into the IREE runtime, called on numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import iree.runtime as rt

# MLIR element type -> numpy dtype accepted at the module boundary.
NUMPY_DTYPES = {"f32": np.float32, "f16": np.float16, "i8": np.int8, "i32": np.int32,
                "i64": np.int64, "f64": np.float64}


class InputError(ValueError):
    """An argument that does not match the function's signature."""


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    element: str

    def describe(self) -> str:
        return "tensor<" + "x".join(map(str, self.shape)) + f"x{self.element}>"


class LoadedModule:
    """One vmfb in its own runtime context on `driver` (default: local-task CPU)."""

    def __init__(self, vmfb: bytes, signatures: dict[str, list[TensorSpec]],
                 driver: str = "local-task"):
        self._context = rt.SystemContext(config=rt.Config(driver))
        self._vm_module = rt.VmModule.copy_buffer(self._context.instance, vmfb)
        self._context.add_vm_module(self._vm_module)
        self.signatures = signatures

    def check_arguments(self, function: str, arrays) -> list[np.ndarray]:
        specs = self.signatures[function]
        if len(arrays) != len(specs):
            raise InputError(f"@{function} takes {len(specs)} arguments "
                             f"({', '.join(s.describe() for s in specs)}), got {len(arrays)}")
        checked = []
        for i, (array, spec) in enumerate(zip(arrays, specs)):
            array = np.asarray(array)
            dtype = NUMPY_DTYPES.get(spec.element)
            if dtype is None:
                raise InputError(f"argument {i} of @{function} has element type "
                                 f"{spec.element}, which the runner cannot pass from numpy")
            if array.dtype != dtype:
                raise InputError(f"argument {i} (arg{i}) of @{function} must be {np.dtype(dtype)} "
                                 f"for {spec.describe()}, got {array.dtype}")
            if tuple(array.shape) != spec.shape:
                raise InputError(f"argument {i} (arg{i}) of @{function} must have shape "
                                 f"{list(spec.shape)} for {spec.describe()}, got "
                                 f"{list(array.shape)}")
            checked.append(np.ascontiguousarray(array))
        return checked

    def time_calls(self, function: str, arrays, iterations: int = 20, warmup: int = 3) -> list[float]:
        """Seconds per call with the arguments already on the device."""
        import time

        config = self._context.config
        device_args = [rt.asdevicearray(config.device, a)
                       for a in self.check_arguments(function, arrays)]
        entry = self._context.modules.module[function]
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
        results = self._context.modules.module[function](*arguments)
        if not isinstance(results, (tuple, list)):
            results = [results]
        return [np.asarray(r.to_host() if hasattr(r, "to_host") else r) for r in results]
