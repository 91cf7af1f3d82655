"""Workgroups that meet through global memory: atomics and release/acquire fences.

The simulator runs every workgroup in lockstep, so a kernel whose workgroups read
each other's global stores would always see them, fenced or not. `GlobalOrder`
holds what the hardware would need instead (the PTX and AMDGPU memory models, as
a kernel uses them: stores, a barrier, one thread's release fence and atomic; the
reader's atomic, acquire fence, barrier): every global store's workgroup and
clock, and each workgroup's last release and acquire fence. A load of an element
another workgroup stored is an error unless that workgroup released it (a release
fence after the store) and the reader acquired after that (an acquire fence
later still). A barrier makes a fence count for the whole workgroup, as the
kernels use it.

Atomic read-modify-writes of one op land in a random order of the threads that
issue them (the machine's `rng`, from a seed the caller gives): which workgroup
arrives last is not the grid's order.
"""

from __future__ import annotations

import numpy as np

from .memory import SimulationError

# Sync scopes that order the accesses of every workgroup of a dispatch (LLVM's:
# the default is the system's; NVPTX's "device", AMDGPU's "agent").
DISPATCH_SCOPES = {None, "", "device", "agent", "system"}


class GlobalOrder:
    """Release / acquire clocks per workgroup, stores' writers per global buffer."""

    def __init__(self, groups: int):
        self.clock = 0
        self.released = np.full(groups, -1, np.int64)
        self.acquired = np.full(groups, -1, np.int64)
        self.writers: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # by binding

    def tick(self) -> None:
        self.clock += 1

    def fence(self, groups: np.ndarray, ordering: str, scope: str | None) -> None:
        if scope not in DISPATCH_SCOPES:
            raise SimulationError(f"a fence of sync scope {scope!r} does not order "
                                  f"accesses between workgroups (use the device's)")
        if ordering in ("release", "acq_rel", "seq_cst"):
            self.released[groups] = self.clock
        if ordering in ("acquire", "acq_rel", "seq_cst"):
            self.acquired[groups] = self.clock

    def stored(self, binding: int, size: int, where: np.ndarray, groups: np.ndarray) -> None:
        group, clock = self.writers.setdefault(
            binding, (np.full(size, -1, np.int64), np.full(size, -1, np.int64)))
        group[where], clock[where] = groups, self.clock

    def check_load(self, binding: int, where: np.ndarray, groups: np.ndarray, shape) -> None:
        """`where`: the flat addresses the active threads of workgroups `groups` read."""
        if binding not in self.writers:
            return
        group, clock = self.writers[binding]
        writer, written = group[where], clock[where]
        other = (writer >= 0) & (writer != groups)
        if not other.any():
            return
        writer, written, groups = writer[other], written[other], groups[other]
        if (self.released[writer] <= written).any():
            raise SimulationError(f"a workgroup reads global memory {shape} that another "
                                  f"stored with no release fence after the store")
        if (self.acquired[groups] <= self.released[writer]).any():
            raise SimulationError(f"a workgroup reads global memory {shape} that another "
                                  f"released, with no acquire fence after that release")


def atomic_add(buffer: np.ndarray, where: np.ndarray, value: np.ndarray,
               rng: np.random.Generator) -> np.ndarray:
    """Each (address, addend) applied in a random order; returns the value each
    thread saw before its own add."""
    order = rng.permutation(where.size)
    where, value = where[order], value[order]
    by_address = np.argsort(where, kind="stable")
    sorted_where, sorted_value = where[by_address], value[by_address]
    starts = np.r_[True, sorted_where[1:] != sorted_where[:-1]]
    running = np.cumsum(sorted_value)
    base = np.maximum.accumulate(np.where(starts, np.arange(where.size), 0))
    before_in_run = running - sorted_value - (running[base] - sorted_value[base])
    seen = np.empty_like(value)
    seen[by_address] = buffer[sorted_where] + before_in_run
    np.add.at(buffer, where, value)
    result = np.empty_like(seen)
    result[order] = seen
    return result
