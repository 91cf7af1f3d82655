"""wgmma.mma_async m64nNk32 .s32 with .s8/.u8 operands: one warpgroup, in numpy.

Written from the PTX ISA text, independently of `int8attn.fragments` (which it
checks): section 9.7.15.5.1.1.3 "Matrix Fragments for wgmma.mma_async.m64nNk32"
(Figures 152 and 153) for the register fragments, section 9.7.15.5.1.2 "Shared Memory
Matrix Layout" and the matrix-descriptor format for shared-memory operands.

Thread t = 32 w + l of the warpgroup (w: its warp in the group, l: its lane),
g = l / 4, q = l % 4; warp w holds rows 16 w .. 16 w + 15:
- A in registers, 4 x .b32 of 4 bytes (a0..a15): byte 4 r + j is
  A[16 w + g + 8 (r % 2)][16 (r / 2) + 4 q + j].
- D, N/2 x .s32 (d0..): register 4 j + i is D[16 w + g + 8 (i / 2)][8 j + 2 q + i % 2].
- A (M x K) and B (K x N) in shared memory, K-major (row: m of A, n of B; k the
  byte along K), at byte address
    no swizzle: start + 16 (row % 8) + SBO (row / 8) + (k % 16) + LBO (k / 16)
    128B:       swizzle(start + 128 (row % 8) + SBO (row / 8) + k), where
                swizzle(x) = x ^ (((x >> 7) & 7) << 4) (base offset 0: the pattern
                repeats every 1024 bytes of the address).
The instruction is synchronous here: fence / commit / wait order it in a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

THREADS = 128
VALID_N = (8, 16, 24, 32) + tuple(range(48, 257, 16))     # .s32 accumulator
SIGNED = {"s8": np.int8, "u8": np.uint8}


@dataclass(frozen=True)
class Descriptor:
    """The fields of a shared-memory matrix descriptor, in bytes."""

    start: int
    lbo: int
    sbo: int
    swizzle: str = "none"          # "none" | "128B"


def _thread():
    t = np.arange(THREADS)
    return t // 32, (t % 32) // 4, t % 4                  # w, g, q


def a_register_element(byte: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, k) per thread of A register byte `byte` (0..15)."""
    w, g, q = _thread()
    r, j = divmod(byte, 4)
    return 16 * w + g + 8 * (r % 2), 16 * (r // 2) + 4 * q + j


def d_register_element(register: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) per thread of D register `register` (0..N/2 - 1)."""
    w, g, q = _thread()
    j, i = divmod(register, 4)
    return 16 * w + g + 8 * (i // 2), 8 * j + 2 * q + i % 2


def smem_address(desc: Descriptor, row: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The byte address the descriptor gives element (row, k) of a K-major operand."""
    if desc.swizzle == "none":
        return desc.start + 16 * (row % 8) + desc.sbo * (row // 8) + k % 16 + desc.lbo * (k // 16)
    if desc.swizzle == "128B":
        plain = desc.start + 128 * (row % 8) + desc.sbo * (row // 8) + k
        return plain ^ (((plain >> 7) & 7) << 4)
    raise ValueError(f"unknown swizzle mode '{desc.swizzle}' (none, 128B)")


def read_operand(smem: np.ndarray, desc: Descriptor, rows: int, dtype: str) -> np.ndarray:
    """[rows, 32] of `dtype` read from the bytes `smem` (uint8) through `desc`."""
    row, k = np.meshgrid(np.arange(rows), np.arange(32), indexing="ij")
    address = smem_address(desc, row, k)
    if address.min() < 0 or address.max() >= smem.size:
        raise ValueError(f"the descriptor reads bytes {address.min()}..{address.max()} "
                         f"outside the {smem.size}-byte shared memory")
    return smem.view(np.uint8)[address].view(SIGNED[dtype])


def wgmma_m64nNk32(n: int, c: np.ndarray, b: tuple[np.ndarray, Descriptor],
                   a: np.ndarray | tuple[np.ndarray, Descriptor], a_type: str = "s8",
                   b_type: str = "s8") -> np.ndarray:
    """D registers int32 [128, n/2] = A x B + C of one warpgroup. `c`: int32 [128, n/2];
    `b`: (shared-memory bytes, descriptor); `a`: A registers [128, 16] (RS, bytes of
    `a_type`) or (shared-memory bytes, descriptor) (SS). Products wrap as the
    hardware's int32 accumulator does."""
    if n not in VALID_N:
        raise ValueError(f"wgmma m64nNk32 .s32 has no N = {n} (valid: {VALID_N})")
    if c.shape != (THREADS, n // 2):
        raise ValueError(f"C registers {c.shape}, expected {(THREADS, n // 2)}")
    if isinstance(a, tuple):
        mat_a = read_operand(*a, rows=64, dtype=a_type).astype(np.int64)
    else:
        if a.shape != (THREADS, 16):
            raise ValueError(f"A registers {a.shape}, expected {(THREADS, 16)}")
        mat_a = np.zeros((64, 32), np.int64)
        for byte in range(16):
            mat_a[a_register_element(byte)] = a[:, byte].view(SIGNED[a_type])
    mat_b = read_operand(*b, rows=n, dtype=b_type).astype(np.int64).T       # [32, n]
    mat_c = np.zeros((64, n), np.int64)
    for register in range(n // 2):
        mat_c[d_register_element(register)] = c[:, register]
    d = (mat_a @ mat_b + mat_c).astype(np.int32)
    return np.stack([d[d_register_element(r)] for r in range(n // 2)], axis=1)
