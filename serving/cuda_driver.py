"""The CUDA driver API through ctypes: load a PTX module, launch its kernels on a stream.

The serving path launches the kernels IREE compiled for a graph directly on the
caller's CUDA stream (torch's current stream), so a call is ordered behind the
work already queued there and its result is ready for the next op on that stream
with no host wait, and a CUDA graph can capture it. Only the driver library
(`libcuda.so.1`, part of every NVIDIA driver) is needed; no CUDA toolkit.

Modules load into the device's primary context, the one PyTorch (the runtime
API) uses, so pointers from torch tensors are valid in them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
STATIC_SHARED_LIMIT = 48 * 1024   # above this a kernel must opt in to dynamic shared memory


class CudaError(RuntimeError):
    """A CUDA driver call that failed, named with the driver's own error string."""


_library = None


def library() -> ctypes.CDLL:
    global _library
    if _library is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise CudaError(f"the CUDA driver library libcuda.so.1 could not be loaded "
                            f"({error}); the cuda serving path needs an NVIDIA driver") from None
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuLaunchKernel.argtypes = [
            ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
            ctypes.c_uint, ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
            ctypes.c_void_p]
        _check(lib, lib.cuInit(0), "cuInit")
        _library = lib
    return _library


def _check(lib, status: int, what: str) -> None:
    if status:
        text = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(text))
        detail = text.value.decode() if text.value else f"error {status}"
        raise CudaError(f"{what} failed: {detail}")


def check(status: int, what: str) -> None:
    _check(library(), status, what)


def primary_context(device: int) -> ctypes.c_void_p:
    """The device's primary context (retained once per process, as the runtime API does)."""
    lib = library()
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    check(lib.cuDeviceGet(ctypes.byref(handle), device), f"cuDeviceGet({device})")
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), handle),
          f"cuDevicePrimaryCtxRetain({device})")
    return context


def make_current(context: ctypes.c_void_p) -> None:
    lib, current = library(), ctypes.c_void_p()
    check(lib.cuCtxGetCurrent(ctypes.byref(current)), "cuCtxGetCurrent")
    if current.value != context.value:
        check(lib.cuCtxSetCurrent(context), "cuCtxSetCurrent")


@dataclass
class Kernel:
    """One loaded entry point, its workgroup size and dynamic shared memory."""

    name: str
    handle: ctypes.c_void_p
    threads: int
    shared_bytes: int


class PtxModule:
    """A PTX module loaded (JIT-compiled by the driver) into one device's context."""

    def __init__(self, ptx: str, device: int):
        lib = library()
        self.device = device
        self.context = primary_context(device)
        make_current(self.context)
        self.handle = ctypes.c_void_p()
        image = ptx.encode() + b"\0"
        check(lib.cuModuleLoadData(ctypes.byref(self.handle), image),
              f"loading the PTX module on cuda:{device} (cuModuleLoadData)")
        self._image = image

    def kernel(self, name: str, threads: int, shared_bytes: int) -> Kernel:
        lib, handle = library(), ctypes.c_void_p()
        check(lib.cuModuleGetFunction(ctypes.byref(handle), self.handle, name.encode()),
              f"finding kernel {name!r} in the PTX module (cuModuleGetFunction)")
        if shared_bytes > STATIC_SHARED_LIMIT:
            check(lib.cuFuncSetAttribute(handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         shared_bytes),
                  f"allowing {name} {shared_bytes} bytes of shared memory")
        return Kernel(name, handle, threads, shared_bytes)


class Launch:
    """A kernel's parameter block, built once and refilled per call: `pointers`
    binding addresses, then each index push constant as two 32-bit words (low,
    high), the order IREE's CUDA HAL passes them in."""

    def __init__(self, kernel: Kernel, bindings: int, constants: int):
        self.kernel = kernel
        self.pointers = [ctypes.c_uint64() for _ in range(bindings)]
        self.words = [ctypes.c_uint32() for _ in range(2 * constants)]
        slots = self.pointers + self.words
        self.params = (ctypes.c_void_p * len(slots))(
            *[ctypes.cast(ctypes.byref(s), ctypes.c_void_p) for s in slots])

    def __call__(self, grid, pointers, constants, stream: int) -> None:
        for slot, address in zip(self.pointers, pointers):
            slot.value = address
        for i, value in enumerate(constants):
            self.words[2 * i].value = value & 0xFFFFFFFF
            self.words[2 * i + 1].value = value >> 32
        x, y, z = grid
        if x == 0 or y == 0 or z == 0:
            return   # a dispatch of no workgroups runs nothing (an empty batch)
        k = self.kernel
        status = library().cuLaunchKernel(k.handle, x, y, z, k.threads, 1, 1, k.shared_bytes,
                                          stream, self.params, None)
        if status:
            check(status, f"launching {k.name} on grid {grid}")
