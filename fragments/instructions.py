"""Matrix instructions: operand lane layouts as tables, from the ISA lane tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


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


def _wave64_16x16x32(name: str, intrinsic: str,
                     c_element: Callable[[int, int], tuple[int, int]]) -> MatrixInstruction:
    # A and B are shared by gfx936 MMAC and gfx942 MFMA 16x16x32 (docs/design.md §3).
    return MatrixInstruction(
        name=name, intrinsic=intrinsic, m=16, n=16, k=32, wave_size=64,
        a=OperandLayout.from_table("A", 64, 8, lambda l, j: (l % 16, 8 * (l // 16) + j)),
        b=OperandLayout.from_table("B", 64, 8, lambda l, j: (8 * (l // 16) + j, l % 16)),
        c=OperandLayout.from_table("C", 64, 4, c_element),
    )


# gfx936 DCU: C uses the "jump" layout (Hygon CK: kCMLane=16, kCNLane=4).
GFX936_MMAC = _wave64_16x16x32(
    "v_mmac_i32_16x16x32_i8", "llvm.amdgcn.mmac.i32.16x16x32i8",
    lambda l, i: (l % 16, l // 16 + 4 * i))

# gfx942 CDNA3: same A/B, C rows in blocks of four.
GFX942_MFMA = _wave64_16x16x32(
    "v_mfma_i32_16x16x32_i8", "llvm.amdgcn.mfma.i32.16x16x32.i8",
    lambda l, i: (4 * (l // 16) + i, l % 16))

# gfx942 CDNA3, the 32x32 shape: 32 lanes per row (A) / column (B) of K bytes, two
# K halves; C in 16 registers, rows in blocks of four: register i of lane l is
# C[8(i / 4) + 4(l / 32) + i % 4][l % 32]. Source: AMD's matrix instruction calculator
# (github.com/ROCm/amd_matrix_instruction_calculator, matrix_calculator.py at 2ef9189,
# InstCalcGfx9 input/output register algorithms for cdna3 v_mfma_i32_32x32x16_i8), and
# IREE's IREEGPUAttrs.cpp getSingleSubgroupLayout(MFMA_I32_32x32x16_I8) (mfmaLhs32xK(16),
# mfmaRhsKx32(16), mfmaAcc32x32); docs/design.md §3.
GFX942_MFMA_32X32X16 = MatrixInstruction(
    name="v_mfma_i32_32x32x16_i8", intrinsic="llvm.amdgcn.mfma.i32.32x32x16.i8",
    m=32, n=32, k=16, wave_size=64,
    a=OperandLayout.from_table("A", 64, 8, lambda l, j: (l % 32, 8 * (l // 32) + j)),
    b=OperandLayout.from_table("B", 64, 8, lambda l, j: (8 * (l // 32) + j, l % 32)),
    c=OperandLayout.from_table(
        "C", 64, 16, lambda l, i: (8 * (i // 4) + 4 * (l // 32) + i % 4, l % 32)),
    a_vector=(8,), b_vector=(8,), c_vector=(16,))


def _ptx_m16n8k32_a(l: int, s: int) -> tuple[int, int]:
    # registers a0..a3 of 4 bytes: rows {g, g+8, g, g+8}, k {4t.., 4t.., 16+4t.., 16+4t..}
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return g + 8 * (reg % 2), 16 * (reg // 2) + 4 * t + byte


def _ptx_m16n8k32_b(l: int, s: int) -> tuple[int, int]:
    # registers b0, b1 of 4 bytes: k {4t.., 16+4t..}, column g
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return 16 * reg + 4 * t + byte, g


def _ptx_m16n8_c(l: int, i: int) -> tuple[int, int]:
    # c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    g, t = l // 4, l % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def _ptx_m16n8k16_a(l: int, s: int) -> tuple[int, int]:
    # bf16 registers a0..a3 of 2 elements: rows {g, g+8, g, g+8}, k {2t.., 2t.., 2t+8.., 2t+8..}
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return g + 8 * (reg % 2), 8 * (reg // 2) + 2 * t + element


def _ptx_m16n8k16_b(l: int, s: int) -> tuple[int, int]:
    # bf16 registers b0, b1 of 2 elements: k {2t.., 2t+8..}, column g
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return 8 * reg + 2 * t + element, g


# NVIDIA sm_80+: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, 32-lane warps.
SM80_MMA_S8 = MatrixInstruction(
    name="mma.sync.m16n8k32.s8", intrinsic="nvgpu.mma.sync", m=16, n=8, k=32, wave_size=32,
    a=OperandLayout.from_table("A", 32, 16, _ptx_m16n8k32_a),
    b=OperandLayout.from_table("B", 32, 8, _ptx_m16n8k32_b),
    c=OperandLayout.from_table("C", 32, 4, _ptx_m16n8_c),
    a_vector=(4, 4), b_vector=(2, 4), c_vector=(2, 2))

# The BF16-PV baseline's instruction: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32.
SM80_MMA_BF16 = MatrixInstruction(
    name="mma.sync.m16n8k16.bf16", intrinsic="nvgpu.mma.sync", m=16, n=8, k=16, wave_size=32,
    a=OperandLayout.from_table("A", 32, 8, _ptx_m16n8k16_a),
    b=OperandLayout.from_table("B", 32, 4, _ptx_m16n8k16_b),
    c=OperandLayout.from_table("C", 32, 4, _ptx_m16n8_c),
    a_vector=(4, 2), b_vector=(2, 2), c_vector=(2, 2))
