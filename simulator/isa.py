"""Matrix-instruction semantics, written directly from the ISA lane tables.

Deliberately independent of `int8attn.fragments`: the simulator checks the
compiler's fragment model, so it must not share it. Each function takes the
per-lane operands of whole waves ([waves, 64, ...]) and returns the per-lane
result, D = A x B + C in int32.
"""

from __future__ import annotations

import numpy as np

LANES = np.arange(64)


def _gather_a_b(a: np.ndarray, b: np.ndarray):
    """A[16x32], B[32x16] of each wave from 8 int8 per lane (gfx936 = gfx942 here)."""
    waves = a.shape[0]
    mat_a = np.zeros((waves, 16, 32), dtype=np.int64)
    mat_b = np.zeros((waves, 32, 16), dtype=np.int64)
    for j in range(8):
        # lane l holds A[l % 16][8 * (l / 16) + j] and B[8 * (l / 16) + j][l % 16]
        mat_a[:, LANES % 16, 8 * (LANES // 16) + j] = a[:, :, j]
        mat_b[:, 8 * (LANES // 16) + j, LANES % 16] = b[:, :, j]
    return mat_a, mat_b


def _c_coordinates(target: str, i: int):
    if target == "gfx936":      # v_mmac_i32_16x16x32_i8, "jump" layout: C[l%16][l/16 + 4i]
        return LANES % 16, LANES // 16 + 4 * i
    if target == "gfx942":      # v_mfma_i32_16x16x32_i8: C[4(l/16) + i][l%16]
        return 4 * (LANES // 16) + i, LANES % 16
    raise ValueError(f"no ISA table for {target}")


def matrix_16x16x32_i8(target: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a, b: int8 [waves, 64, 8]; c: int32 [waves, 64, 4] -> int32 [waves, 64, 4]."""
    mat_a, mat_b = _gather_a_b(a.astype(np.int64), b.astype(np.int64))
    mat_c = np.zeros((a.shape[0], 16, 16), dtype=np.int64)
    for i in range(4):
        rows, cols = _c_coordinates(target, i)
        mat_c[:, rows, cols] = c[:, :, i]
    mat_d = (np.einsum("wmk,wkn->wmn", mat_a, mat_b) + mat_c).astype(np.int32)
    out = np.empty_like(c)
    for i in range(4):
        rows, cols = _c_coordinates(target, i)
        out[:, :, i] = mat_d[:, rows, cols]
    return out
