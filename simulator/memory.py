"""The lane simulator's memory model and element types.

`_Memory` is a memref view: a flat buffer, a shape and row-major strides,
global or one region per workgroup (LDS). It turns each thread's indices into
linear addresses, refusing out-of-bounds accesses of active threads, and
reports a race when threads store different values to one address in the same
op. `DTYPES` maps IR element types to numpy's; `SimulationError` is what the
simulator raises for anything the kernel may not do.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

# bf16 values live in f32 arrays, rounded where the IR truncates to bf16.
DTYPES = {"i1": np.bool_, "i8": np.int8, "i32": np.int32, "i64": np.int64, "index": np.int64,
          "f32": np.float32, "bf16": np.float32}


class SimulationError(RuntimeError):
    pass


class _Memory:
    """A memref view: flat buffer, shape, row-major strides, per-workgroup or global."""

    def __init__(self, buffer: np.ndarray, shape, per_workgroup_size: int = 0,
                 element_bytes: int = 0):
        self.buffer, self.shape = buffer, tuple(shape)
        self.element_bytes = element_bytes or buffer.dtype.itemsize
        self.strides = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        self.per_workgroup_size = per_workgroup_size

    def addresses(self, indices, machine, count: int = 1) -> np.ndarray:
        """Linear addresses per thread; threads outside the active mask (an
        scf.if branch or loop they do not run) address element 0 unchecked."""
        linear = np.zeros(machine.thread_count, dtype=np.int64)
        active = machine.active
        last = len(self.shape) - 1
        for axis, (index, stride, extent) in enumerate(zip(indices, self.strides, self.shape)):
            index = np.broadcast_to(index, (machine.thread_count,))
            if active is not None:
                index = np.where(active, index, 0)
            if (index < 0).any() or (index + (count if axis == last else 1) > extent).any():
                raise SimulationError(f"index out of bounds for memref of shape {self.shape}: "
                                      f"{int(index.min())}..{int(index.max())} vs {extent}")
            linear = linear + index * stride
        if self.per_workgroup_size:
            linear = linear + machine.workgroup_index * self.per_workgroup_size
        return linear[:, None] + np.arange(count) if count > 1 else linear

    def check_alignment(self, indices, machine, alignment: int) -> None:
        """A load that claims `alignment` bytes: every active thread's byte offset in
        the buffer is a multiple of it (the buffer's base is, as IREE's bindings are
        16-byte aligned)."""
        offsets = self.addresses(indices, machine) * self.element_bytes
        if machine.active is not None:
            offsets = offsets[machine.active]
        wrong = offsets % alignment != 0
        if wrong.any():
            raise SimulationError(f"a load claims {alignment}-byte alignment, but reads "
                                  f"byte {int(offsets[wrong][0])} of memref {self.shape}")

    def load(self, indices, machine, count: int = 1) -> np.ndarray:
        return self.buffer[self.addresses(indices, machine, count)]

    def store(self, value, indices, machine, count: int = 1) -> None:
        where = self.addresses(indices, machine, count)
        value = np.broadcast_to(value, (machine.thread_count,) + ((count,) if count > 1 else ()))
        if machine.active is not None:
            where, value = where[machine.active], value[machine.active]
        where, value = where.ravel(), value.ravel()
        order = np.argsort(where, kind="stable")
        same = where[order][1:] == where[order][:-1]
        clash = same & ~_equal(value[order][1:], value[order][:-1])
        if clash.any():
            raise SimulationError(f"race: threads store different values to one address of "
                                  f"memref {self.shape} in the same op")
        self.buffer[where] = value


def _equal(a, b):
    return (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b


def _element(t: ir.Type) -> str:
    return str(t.element_type) if isinstance(t, (ir.VectorType, ir.MemRefType)) else str(t)
