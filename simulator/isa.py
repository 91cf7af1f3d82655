"""Matrix-instruction semantics, written directly from the ISA lane tables (and PTX's).

Deliberately independent of `int8attn.fragments`: the simulator checks the
compiler's fragment model, so it must not share it. `matrix_instruction`
takes the per-lane operands of whole waves ([waves, lanes, ...]) and returns
the per-lane result, D = A x B + C in int32.
"""

from __future__ import annotations

import numpy as np

L64 = np.arange(64)
L32 = np.arange(32)


def _amd_a_b(j):
    # v_mmac / v_mfma 16x16x32 i8: lane l holds A[l%16][8(l/16)+j], B[8(l/16)+j][l%16]
    return (L64 % 16, 8 * (L64 // 16) + j), (8 * (L64 // 16) + j, L64 % 16)


def _mfma_32x32x16_a_b(j):
    # v_mfma_i32_32x32x16_i8 (CDNA3): 64 lanes of 8 bytes cover 32 rows (A) / columns (B)
    # times 16 k: lane l holds A[l%32][8(l/32)+j], B[8(l/32)+j][l%32] (AMD's matrix
    # instruction calculator: lane = 32 * (k / 8) + row, byte k % 8)
    return (L64 % 32, 8 * (L64 // 32) + j), (8 * (L64 // 32) + j, L64 % 32)


def _mfma_32x32x16_c(i):
    # 32-bit C/D of a 32x32 MFMA: "multi-rows" of 4 rows (registers) x 32 columns (lanes),
    # two per register (lanes 0-31, 32-63), then 4 registers further: element (row, col)
    # is in register 4(row/8) + row%4, lane 32((row/4) % 2) + col. Inverted per register:
    return 8 * (i // 4) + 4 * (L64 // 32) + i % 4, L64 % 32


def _ptx_a(s):
    # mma.m16n8k32.s8 A: a_r byte j: row g + 8(r%2), k 16(r/2) + 4t + j
    r, j = divmod(s, 4)
    return L32 // 4 + 8 * (r % 2), 16 * (r // 2) + 4 * (L32 % 4) + j


def _ptx_b(s):
    # B: b_r byte j: k 16r + 4t + j, column g
    r, j = divmod(s, 4)
    return 16 * r + 4 * (L32 % 4) + j, L32 // 4


def _ptx_bf16_a(s):
    # mma.m16n8k16.bf16 A: a_r element j: row g + 8(r%2), k 8(r/2) + 2t + j
    r, j = divmod(s, 2)
    return L32 // 4 + 8 * (r % 2), 8 * (r // 2) + 2 * (L32 % 4) + j


def _ptx_bf16_b(s):
    # B: b_r element j: k 8r + 2t + j, column g
    r, j = divmod(s, 2)
    return 8 * r + 2 * (L32 % 4) + j, L32 // 4


_PTX_C = lambda i: (L32 // 4 + 8 * (i // 2), 2 * (L32 % 4) + i % 2)

TABLES = {
    "gfx936": dict(mnk=(16, 16, 32), a=lambda s: _amd_a_b(s)[0], b=lambda s: _amd_a_b(s)[1],
                   # v_mmac "jump" layout: C[l%16][l/16 + 4i]
                   c=lambda i: (L64 % 16, L64 // 16 + 4 * i)),
    "gfx942": dict(mnk=(16, 16, 32), a=lambda s: _amd_a_b(s)[0], b=lambda s: _amd_a_b(s)[1],
                   # v_mfma: C[4(l/16) + i][l%16]
                   c=lambda i: (4 * (L64 // 16) + i, L64 % 16)),
    # the 32x32x16 shape of the same target (amdgpu.mfma 32x32x16)
    "gfx942-32x32x16": dict(mnk=(32, 32, 16), target="gfx942",
                            a=lambda s: _mfma_32x32x16_a_b(s)[0],
                            b=lambda s: _mfma_32x32x16_a_b(s)[1], c=_mfma_32x32x16_c),
    "cuda": dict(mnk=(16, 8, 32), a=_ptx_a, b=_ptx_b,
                 # c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
                 c=_PTX_C),
    # bf16 operands, f32 accumulate (the BF16-PV baseline)
    "cuda-bf16": dict(mnk=(16, 8, 16), a=_ptx_bf16_a, b=_ptx_bf16_b, c=_PTX_C, float=True),
}


def table_for(target: str, mnk: tuple[int, int, int]) -> str:
    """The TABLES key of `target`'s instruction of shape (m, n, k); KeyError if none."""
    for name, table in TABLES.items():
        if table.get("target", name) == target and table["mnk"] == tuple(mnk):
            return name
    raise KeyError(f"no ISA table for a {target} instruction of shape {tuple(mnk)}")


def matrix_instruction(target: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a, b: int8 [waves, lanes, slots]; c: int32 [waves, lanes, registers] (flattened).
    `target` is a TABLES key (`table_for` finds one by target and shape)."""
    if target not in TABLES:
        raise ValueError(f"no ISA table for {target}")
    table = TABLES[target]
    m, n, k = table["mnk"]
    waves = a.shape[0]
    wide = np.float64 if table.get("float") else np.int64
    mat_a = np.zeros((waves, m, k), dtype=wide)
    mat_b = np.zeros((waves, k, n), dtype=wide)
    mat_c = np.zeros((waves, m, n), dtype=wide)
    for s in range(a.shape[2]):
        mat_a[(slice(None),) + table["a"](s)] = a[:, :, s]
    for s in range(b.shape[2]):
        mat_b[(slice(None),) + table["b"](s)] = b[:, :, s]
    for i in range(c.shape[2]):
        mat_c[(slice(None),) + table["c"](i)] = c[:, :, i]
    result = np.float32 if table.get("float") else np.int32
    mat_d = (np.einsum("wmk,wkn->wmn", mat_a, mat_b) + mat_c).astype(result)
    out = np.empty(c.shape, dtype=result)
    for i in range(c.shape[2]):
        out[:, :, i] = mat_d[(slice(None),) + table["c"](i)]
    return out
