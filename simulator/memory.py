"""The lane simulator's memory model and element types.

`_Memory` is a memref view: a flat buffer, a shape and row-major strides,
global or one region per workgroup (LDS). It turns each thread's indices into
linear addresses, refusing out-of-bounds accesses of active threads, and
reports a race when threads store different values to one address in the same
op. LDS also keeps `_Hazards`: who last wrote and read each element in which
barrier interval, so that a thread reading what another wrote, or writing what
another read, with no barrier between, is an error, as is reading an element an
asynchronous copy has not landed in. `DTYPES` maps IR element types to numpy's;
`SimulationError` is what the simulator raises for anything the kernel may not do.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

# bf16 values live in f32 arrays, rounded where the IR truncates to bf16.
DTYPES = {"i1": np.bool_, "i8": np.int8, "i32": np.int32, "i64": np.int64, "index": np.int64,
          "f32": np.float32, "bf16": np.float32}


class SimulationError(RuntimeError):
    pass


def poisoned(shape, dtype) -> np.ndarray:
    """Memory no one has written yet: NaN, or the integer type's minimum."""
    fill = np.nan if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
    return np.full(shape, fill, dtype=dtype)


MANY = -2          # an element read by more than one thread in the interval


class _Hazards:
    """Per LDS element: the thread that last wrote it and the barrier interval
    (`machine.interval`) it did so in, the thread that read it in the latest
    interval (MANY: several), and whether an asynchronous copy to it is in flight.
    Threads are the simulator's thread axis (every workgroup's threads)."""

    def __init__(self, size: int):
        self.writer = np.full(size, -1, np.int64)
        self.written = np.full(size, -1, np.int64)
        self.reader = np.full(size, -1, np.int64)
        self.read = np.full(size, -1, np.int64)
        self.in_flight = np.zeros(size, np.bool_)

    def check_read(self, where, threads, interval: int, shape) -> None:
        if self.in_flight[where].any():
            raise SimulationError(f"a thread reads LDS {shape} that an asynchronous copy "
                                  f"has not landed in (no wait for its group)")
        other = (self.written[where] == interval) & (self.writer[where] != threads)
        if other.any():
            raise SimulationError(f"race: a thread reads LDS {shape} that another thread "
                                  f"wrote with no barrier between")
        order = np.argsort(where, kind="stable")
        where, threads = where[order], threads[order]
        starts = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
        first, low = where[starts], np.minimum.reduceat(threads, starts)
        one = np.where(low == np.maximum.reduceat(threads, starts), low, MANY)
        again = (self.read[first] == interval) & (self.reader[first] != one)
        self.reader[first] = np.where(again, MANY, one)
        self.read[first] = interval

    def check_write(self, where, threads, interval: int, shape) -> None:
        other = (self.read[where] == interval) & (self.reader[where] != threads)
        if other.any():
            raise SimulationError(f"race: a thread writes LDS {shape} that another thread "
                                  f"read with no barrier between")

    def wrote(self, where, threads, interval: int) -> None:
        self.writer[where], self.written[where] = threads, interval
        self.in_flight[where] = False


class _Memory:
    """A memref view: flat buffer, shape, row-major strides, per-workgroup or global."""

    def __init__(self, buffer: np.ndarray, shape, per_workgroup_size: int = 0,
                 element_bytes: int = 0, binding: int | None = None,
                 base_alignment: int = 16):
        self.buffer, self.shape = buffer, tuple(shape)
        self.binding = binding          # global: the kernel argument (GlobalOrder's key)
        # Bytes the first element's address is a multiple of: IREE's bindings 16; an
        # LDS allocation its `alignment` attribute, else its element's size (IREE packs
        # a workgroup's allocations back to back at their alignment).
        self.base_alignment = base_alignment
        self.element_bytes = element_bytes or buffer.dtype.itemsize
        self.strides = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        self.per_workgroup_size = per_workgroup_size
        self.hazards = _Hazards(buffer.size) if per_workgroup_size else None

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
        """An access that needs (or a load that claims) `alignment` bytes: every
        active thread's byte offset in the buffer is a multiple of it (the buffer's
        base is, as IREE's bindings are 16-byte aligned, and its LDS allocations)."""
        if alignment > self.base_alignment:
            raise SimulationError(f"an access needing {alignment}-byte alignment into "
                                  f"memref {self.shape}, whose start is aligned to "
                                  f"{self.base_alignment} bytes only (give its allocation "
                                  f"an alignment attribute)")
        offsets = self.addresses(indices, machine) * self.element_bytes
        if machine.active is not None:
            offsets = offsets[machine.active]
        wrong = offsets % alignment != 0
        if wrong.any():
            raise SimulationError(f"an access needing {alignment}-byte alignment reaches "
                                  f"byte {int(offsets[wrong][0])} of memref {self.shape}")

    def _active(self, where, machine):
        """(addresses, the thread of each) of the active threads, flat."""
        threads = np.broadcast_to(np.arange(machine.thread_count).reshape(
            (-1,) + (1,) * (where.ndim - 1)), where.shape)
        if machine.active is not None:
            where, threads = where[machine.active], threads[machine.active]
        return where.ravel(), threads.ravel()

    def load(self, indices, machine, count: int = 1) -> np.ndarray:
        where = self.addresses(indices, machine, count)
        if self.hazards is not None:
            self.hazards.check_read(*self._active(where, machine), machine.interval,
                                    self.shape)
        elif self.binding is not None:
            addresses, threads = self._active(where, machine)
            machine.order.check_load(self.binding, addresses,
                                     machine.workgroup_index[threads], self.shape)
        return self.buffer[where]

    def start_copy(self, indices, machine, count: int = 1) -> None:
        """An asynchronous copy is issued to these elements: it may land at once, so
        it may not overwrite what another thread read in this interval; until its wait,
        no thread may read them."""
        where, threads = self._active(self.addresses(indices, machine, count), machine)
        self.hazards.check_write(where, threads, machine.interval, self.shape)
        self.hazards.in_flight[where] = True

    def store(self, value, indices, machine, count: int = 1, landing: bool = False) -> None:
        """`landing`: an asynchronous copy's data at its wait (checked at its issue)."""
        where = self.addresses(indices, machine, count)
        value = np.broadcast_to(value, (machine.thread_count,) + ((count,) if count > 1 else ()))
        if machine.active is not None:
            value = value[machine.active]
        where, threads = self._active(where, machine)
        value = value.ravel()
        order = np.argsort(where, kind="stable")
        same = where[order][1:] == where[order][:-1]
        clash = same & ~_equal(value[order][1:], value[order][:-1])
        if clash.any():
            raise SimulationError(f"race: threads store different values to one address of "
                                  f"memref {self.shape} in the same op")
        if self.hazards is not None:
            if not landing:
                self.hazards.check_write(where, threads, machine.interval, self.shape)
            self.hazards.wrote(where, threads, machine.interval)
        elif self.binding is not None:
            machine.order.stored(self.binding, self.buffer.size, where,
                                 machine.workgroup_index[threads])
        self.buffer[where] = value


def _equal(a, b):
    return (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b


def _element(t: ir.Type) -> str:
    return str(t.element_type) if isinstance(t, (ir.VectorType, ir.MemRefType)) else str(t)
