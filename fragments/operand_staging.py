"""Where an A tile staged in LDS puts its elements: row-major, or in register order.

The lane kernels write A tiles into LDS element by element and read them back as
MMA operands: the quantized query rows (QK's A, rows x head dim, one operand per K
step; the prefill's 64 rows are one tile per wave) and the decode's W (PV's A, rows x
wave tokens, one operand per PV MMAC).
Row-major, a lane reads its operand as the instruction's A runs, one load each;
where the operand is several runs (cuda's m16n8k32: a0..a3 are rows g and g + 8
of two K halves) the loads land in registers in load order, and the backend
copies every operand into the register quad the MMA reads (4 MOVs per mma.sync on
sm_90: about 250 of a decode partition's 2,000 SASS instructions).

In register order, element (row, col) of the tile sits at byte
(operand * lanes + lane) * slots + slot, for the lane and A slot that hold it in
that operand: each lane's operand is one aligned load of whole registers, in the
order the MMA takes them, and a wave's load is contiguous (no bank conflict). The
LDS array keeps the tile's [rows, cols] shape; `place` says where each element
goes, and `loads` what each lane reads for an operand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .instructions import MatrixInstruction
from .lane_maps import LaneMap


class StagingNotLinear(ValueError):
    """A writer's places are not a lane map: the kernel stages the tile row-major."""


def _fit_where(values: np.ndarray, known: np.ndarray) -> LaneMap:
    """A lane map equal to `values` wherever `known` (elsewhere free): each bit's
    scale from a known thread whose other bits' scales are found already."""
    if not known[0]:
        raise StagingNotLinear("thread 0 does not write")
    bits = (len(values) - 1).bit_length()
    scales: dict[int, int] = {}
    for t in np.flatnonzero(known):
        unknown = [b for b in range(bits) if t >> b & 1 and b not in scales]
        if len(unknown) == 1:
            rest = sum(scales[b] for b in range(bits) if t >> b & 1 and b in scales)
            scales[unknown[0]] = int(values[t] - values[0]) - rest
    table = np.full(len(values), int(values[0]), dtype=np.int64)
    for b, scale in scales.items():
        table += (np.arange(len(values)) >> b & 1) * scale
    if not np.array_equal(table[known], values[known]):
        raise StagingNotLinear("a writer's places in register order are not linear in "
                               "its thread bits")
    return LaneMap.fit(table)


@dataclass(frozen=True, eq=False)
class OperandStaging:
    """An A tile [rows, cols] in an LDS array of the same shape (module docstring).

    `cols_of[o, k]` is the tile column behind K slot k of operand o (QK: the head-dim
    index at K step o; PV: the wave token of MMAC o's K slot). `where` is None for
    row-major, else int [rows, cols, 2]: the LDS (row, col) of each element."""

    instruction: MatrixInstruction
    cols_of: np.ndarray
    where: np.ndarray | None = None

    @staticmethod
    def row_major(instruction: MatrixInstruction, cols_of: np.ndarray) -> "OperandStaging":
        return OperandStaging(instruction, np.asarray(cols_of, dtype=np.int64))

    @staticmethod
    def register_order(instruction: MatrixInstruction,
                       cols_of: np.ndarray) -> "OperandStaging":
        """Register order where it holds (module docstring), else row-major: the tile
        must be the instruction's M rows, its columns whole operands of a lane, and
        the lane maps of writers and readers linear (power-of-two sizes)."""
        cols_of = np.asarray(cols_of, dtype=np.int64)
        a = instruction.a
        operands, cols = cols_of.shape[0], cols_of.size
        slots = a.slots
        if cols % slots or cols & (cols - 1) or operands & (operands - 1):
            return OperandStaging.row_major(instruction, cols_of)
        where = np.full((instruction.m, cols, 2), -1, dtype=np.int64)
        for o in range(operands):
            for lane in range(a.lanes):
                for slot in range(slots):
                    row, k = a.coords[lane, slot]
                    byte = (o * a.lanes + lane) * slots + slot
                    where[row, cols_of[o, k]] = divmod(byte, cols)
        if (where < 0).any():
            raise ValueError("the A operands do not cover the tile")
        try:       # writers and readers emit it through lane maps: it must be linear
            LaneMap.fit((where[:, :, 0] * cols + where[:, :, 1]).ravel())
        except ValueError:
            return OperandStaging.row_major(instruction, cols_of)
        return OperandStaging(instruction, cols_of, where)

    @property
    def in_register_order(self) -> bool:
        return self.where is not None

    def place(self, rows: LaneMap, cols: LaneMap, threads: int, row_shift: int = 0,
              writes: np.ndarray | None = None) -> tuple[LaneMap, LaneMap]:
        """LDS (row, col) of the element (rows(t) + row_shift, cols(t)) that thread or
        lane t writes, as lane maps of t. `writes` [threads] (None: all): the threads
        that store (the others run the map under a guard; their values are free). A
        row past the tile's M continues as further tiles of M rows. Raises
        `StagingNotLinear` where no lane map gives every writer its place."""
        if self.where is None:
            return rows.shifted(row_shift), cols
        t, m = np.arange(threads), self.instruction.m
        tile, row = np.divmod(rows(t) + row_shift, m)
        at = self.where[row, cols(t)]
        writes = np.ones(threads, dtype=bool) if writes is None else np.asarray(writes)
        return _fit_where(tile * m + at[:, 0], writes), _fit_where(at[:, 1], writes)

    def loads(self, operand: int) -> list[tuple[LaneMap, LaneMap, int]]:
        """(LDS row, first LDS col, length) of each load of a lane's operand `operand`,
        in register order: the runs of slots that sit in consecutive bytes of one LDS
        row on every lane."""
        a = self.instruction.a
        rows, cols = a.coords[:, :, 0], self.cols_of[operand][a.coords[:, :, 1]]
        if self.where is not None:
            rows, cols = self.where[rows, cols, 0], self.where[rows, cols, 1]
        starts = [0] + [s for s in range(1, a.slots)
                        if not ((rows[:, s] == rows[:, s - 1]) &
                                (cols[:, s] == cols[:, s - 1] + 1)).all()]
        bounds = starts + [a.slots]
        return [(LaneMap.fit(rows[:, first]), LaneMap.fit(cols[:, first]), end - first)
                for first, end in zip(bounds, bounds[1:])]
