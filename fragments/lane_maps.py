"""Lane maps: per-lane quantities of the lane-level kernels, as data.

`LaneMap` is the form the kernels emit a per-lane index in (shifts, masks and
multiplies of the lane or thread id); `xor_reduction_offsets` and
`element_classes` group a lane's elements by a key; the `thread_*` helpers split
a tile over a workgroup's threads.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LaneMap:
    """value(lane) = offset + sum over runs of ((lane >> lo) & (2**width - 1)) * scale.

    Every per-lane index of the kernels (an operand row, a token, an LDS
    offset) is one of these, fitted from a fragment table; the kernel
    generator only turns runs into shifts, masks and multiplies.
    """

    offset: int
    runs: tuple[tuple[int, int, int], ...]  # (lo_bit, width, scale)

    @staticmethod
    def fit(table) -> "LaneMap":
        table = [int(v) for v in table]
        bits = (len(table) - 1).bit_length()
        if len(table) != 1 << bits:
            raise ValueError(f"a lane table needs a power-of-two length, got {len(table)}")
        offset = table[0]
        basis = [table[1 << b] - offset for b in range(bits)]
        for lane, value in enumerate(table):
            if value != offset + sum(basis[b] for b in range(bits) if lane >> b & 1):
                raise ValueError(f"lane table is not linear in the lane bits: {table}")
        runs: list[tuple[int, int, int]] = []
        for b, scale in enumerate(basis):
            if scale == 0:
                continue
            if runs and runs[-1][0] + runs[-1][1] == b and runs[-1][2] << runs[-1][1] == scale:
                lo, width, first = runs[-1]
                runs[-1] = (lo, width + 1, first)
            else:
                runs.append((b, 1, scale))
        return LaneMap(offset, tuple(runs))

    def __call__(self, lane):
        lane = np.asarray(lane)
        value = np.full(lane.shape, self.offset, dtype=np.int64)
        for lo, width, scale in self.runs:
            value = value + ((lane >> lo) & ((1 << width) - 1)) * scale
        return value

    def alignment(self) -> int:
        """The largest power of two dividing every value (a constant 0: any)."""
        return power_of_two_divisor(math.gcd(self.offset, *(s for _, _, s in self.runs)))

    def shifted(self, amount: int) -> "LaneMap":
        return LaneMap(self.offset + amount, self.runs)


def power_of_two_divisor(value: int) -> int:
    """The largest power of two dividing `value` (0: any, as 2**30)."""
    return value & -value if value else 1 << 30


def xor_reduction_offsets(keys: np.ndarray) -> tuple[int, ...]:
    """Lane xor offsets that never change `keys[lane, element]` (reduce over them)."""
    lanes = keys.shape[0]
    offsets = []
    for b in range((lanes - 1).bit_length()):
        partner = np.arange(lanes) ^ (1 << b)
        if np.array_equal(keys[partner], keys):
            offsets.append(1 << b)
    return tuple(offsets)


def element_classes(keys: np.ndarray) -> list[list[int]]:
    """Partition a lane's elements into classes with equal keys on every lane."""
    classes: list[list[int]] = []
    for e in range(keys.shape[1]):
        for members in classes:
            same = keys[:, members[0]] == keys[:, e]
            if same.all():
                members.append(e)
                break
            if same.any():
                raise ValueError("element keys coincide on some lanes only")
        else:
            classes.append([e])
    return classes



def thread_distribution(rows, cols: int, threads: int) -> tuple[int, list[tuple[LaneMap, LaneMap]]]:
    """Row-major split of a rows x cols tile over threads: per slot u, (row, col) maps.

    `rows` is a count, or the row indices the tile's rows stand for (e.g. the
    padding rows of an MMAC tile)."""
    row_ids = np.arange(rows) if isinstance(rows, int) else np.asarray(rows, dtype=np.int64)
    total = len(row_ids) * cols
    if total % threads:
        raise ValueError(f"{len(row_ids)}x{cols} does not split over {threads} threads")
    per = total // threads
    thread = np.arange(threads)
    maps = []
    for u in range(per):
        element = thread * per + u
        maps.append((LaneMap.fit(row_ids[element // cols]), LaneMap.fit(element % cols)))
    return per, maps


def thread_groups(group_threads: int, groups: int) -> tuple[LaneMap, LaneMap]:
    """(member, group) of each thread of `groups` consecutive groups of `group_threads`."""
    thread = np.arange(group_threads * groups)
    return LaneMap.fit(thread % group_threads), LaneMap.fit(thread // group_threads)


def thread_runs(rows, cols: int, threads: int,
                longest: int) -> tuple[int, list[tuple[LaneMap, LaneMap, int]]]:
    """`thread_distribution`'s slots as runs of consecutive columns of one row, each
    at most `longest` long (one vector access): (row, first column, length) per run,
    in slot order. A run ends where any thread's next slot starts a new row."""
    per, slots = thread_distribution(rows, cols, threads)
    element = np.arange(threads) * per
    runs: list[tuple[LaneMap, LaneMap, int]] = []
    length = 0
    for u in range(per):
        if u and length < longest and not ((element + u) % cols == 0).any():
            length += 1
            continue
        if length:
            runs.append((*slots[u - length], length))
        length = 1
    runs.append((*slots[per - length], length))
    return per, runs


def tile_copies(rows: int, cols: int, threads: int,
                chunk: int) -> list[tuple[LaneMap, LaneMap]]:
    """A workgroup's copy of a rows x cols tile in chunks of `chunk` consecutive
    columns, for asynchronous copies: per slot u, the (row, first column) maps of
    the thread id; slot u of thread t takes chunk u * threads + t, so that one slot
    of consecutive threads reads consecutive chunks. A tile of fewer chunks than
    threads is copied by every thread, chunk t mod chunks (the repeats write the same
    bytes). Raises ValueError where the chunks do not split evenly over the threads
    or the maps are not linear in the thread bits (e.g. 6 chunks a row)."""
    if cols % chunk:
        raise ValueError(f"{cols} columns are not whole {chunk}-column chunks")
    per_row = cols // chunk
    chunks = rows * per_row
    if chunks % threads and threads % chunks:
        raise ValueError(f"{chunks} chunks do not split over {threads} threads")
    thread = np.arange(threads)
    return [(LaneMap.fit(c // per_row), LaneMap.fit(c % per_row * chunk))
            for c in (u * threads + thread % chunks
                      for u in range(max(1, chunks // threads)))]
