"""Matrix instructions as lane tables: which element each (lane, register slot) holds.

The tables are enumerated from the MMA atoms' linear layouts (fragments/mma_atoms.py,
the one source); consumers that walk lanes and slots (the fragment model, the
kernels' register plans) read them here. tests/test_mma_atoms.py checks them
against tables written from the ISA text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .mma_atoms import (GFX936_MMAC_ATOM, GFX942_MFMA_32X32X16_ATOM, GFX942_MFMA_ATOM,
                        SM80_MMA_BF16_ATOM, SM80_MMA_S8_ATOM, MmaAtom)


@dataclass(frozen=True, eq=False)
class OperandLayout:
    """Which matrix element each (lane, register slot) of one operand holds."""

    name: str
    coords: np.ndarray  # int64 [lanes, slots, 2]: (row, col)

    @staticmethod
    def from_table(name: str, lanes: int, slots: int,
                   element: Callable[[int, int], tuple[int, int]]) -> "OperandLayout":
        table = np.array([[element(lane, slot) for slot in range(slots)]
                          for lane in range(lanes)], dtype=np.int64)
        return OperandLayout(name, table)

    @property
    def lanes(self) -> int:
        return self.coords.shape[0]

    @property
    def slots(self) -> int:
        return self.coords.shape[1]

    def element(self, lane: int, slot: int) -> tuple[int, int]:
        row, col = self.coords[lane, slot]
        return int(row), int(col)

    def runs(self, axis: int) -> list[tuple[int, int]]:
        """(first slot, length) of the slot runs that are consecutive along `axis`
        (the other coordinate fixed) on every lane: one vector load each."""
        coords = self.coords
        other = 1 - axis
        starts = [0]
        for slot in range(1, self.slots):
            step = coords[:, slot] - coords[:, slot - 1]
            if not ((step[:, axis] == 1) & (step[:, other] == 0)).all():
                starts.append(slot)
        bounds = starts + [self.slots]
        return [(a, b - a) for a, b in zip(bounds, bounds[1:])]

    def lane_groups(self, axis: int) -> np.ndarray:
        """int [lanes]: rank of each lane's set of `axis` coordinates (lanes that
        hold the same K rows of B form one group), ordered by the smallest."""
        keys = [tuple(sorted(set(self.coords[l, :, axis].tolist()))) for l in range(self.lanes)]
        order = {key: rank for rank, key in enumerate(sorted(set(keys)))}
        return np.array([order[key] for key in keys], dtype=np.int64)

    def owner(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Inverse map: matrix element (row, col) -> (lane, slot)."""
        return {self.element(l, s): (l, s)
                for l in range(self.lanes) for s in range(self.slots)}


@dataclass(frozen=True, eq=False)
class MatrixInstruction:
    """An int8 x int8 -> int32 matrix instruction: C[MxN] += A[MxK] * B[KxN].

    `a_vector`, `b_vector`, `c_vector` are the operand register shapes the
    instruction's IR op takes (e.g. vector<8xi8>, or vector<4x4xi8> for PTX).
    """

    name: str
    intrinsic: str
    m: int
    n: int
    k: int
    wave_size: int
    a: OperandLayout
    b: OperandLayout
    c: OperandLayout
    a_vector: tuple[int, ...] = (8,)
    b_vector: tuple[int, ...] = (8,)
    c_vector: tuple[int, ...] = (4,)


def _from_atom(atom: MmaAtom) -> MatrixInstruction:
    """The lane tables of a warp/wave atom, enumerated from its linear layouts."""
    def table(name: str) -> OperandLayout:
        layout = atom.layout(name)
        return OperandLayout(name.upper(), layout.table(["lane", "register"], ["row", "col"]))
    return MatrixInstruction(
        name=atom.name, intrinsic=atom.intrinsic, m=atom.m, n=atom.n, k=atom.k,
        wave_size=atom.scope.threads, a=table("a"), b=table("b"), c=table("c"),
        a_vector=atom.a.vector, b_vector=atom.b.vector, c_vector=atom.c.vector)


GFX936_MMAC = _from_atom(GFX936_MMAC_ATOM)
GFX942_MFMA = _from_atom(GFX942_MFMA_ATOM)
GFX942_MFMA_32X32X16 = _from_atom(GFX942_MFMA_32X32X16_ATOM)
SM80_MMA_S8 = _from_atom(SM80_MMA_S8_ATOM)
# The BF16-PV baseline's instruction.
SM80_MMA_BF16 = _from_atom(SM80_MMA_BF16_ATOM)
