"""Shared-memory operand layouts of the warpgroup MMA: (byte offset) <-> (row, k).

`wgmma.mma_async` reads an operand from shared memory through a matrix
descriptor: a start address, a swizzle mode and two strides. 8-bit operands are
K-major: `row` is M (for A) or N (for B), `k` the byte along K. Sources: PTX ISA
section 9.7.15.5.1.2 "Shared Memory Matrix Layout" and the matrix-descriptor format
(leading-byte offset: between core matrices along K; stride-byte offset:
between core matrices along M/N); CUTLASS cute/arch/mma_sm90_desc.hpp and
cute/atom/mma_traits_sm90_gmma.hpp (make_gmma_desc<Major::K>, the canonical
K-major layouts, in 16-byte units):

- no swizzle (INTERLEAVE), ((8,m),(T,2)):((1T,SBO),(1,LBO)): core matrices of 8
  rows x 16 bytes, each 128 contiguous bytes (row r at 16 r); core matrices
  along K are LBO apart, 8-row groups SBO apart.
- 128-byte swizzle (B128), Swizzle<3,4,3> o ((8,m),(T,2)):((8T,SBO),(1,T)):
  rows of 128 bytes, 8-row groups SBO apart (1024 when dense); K runs along the
  row; address bits 4-6 are XORed with bits 7-9, i.e. 16-byte chunk c of row r
  is stored at chunk c ^ (r % 8) (a 1024-byte-aligned tile).

With power-of-two strides both are XOR-linear, so a tile is a `LinearLayout`.
Swapping LBO and SBO gives a different layout, not an alias (a test says so).
"""

from __future__ import annotations

from typing import Literal, get_args

from .linear_layout import LinearLayout

Swizzle = Literal["none", "128B"]
SWIZZLES: tuple[str, ...] = get_args(Swizzle)
SWIZZLE_ROW_BYTES = {"128B": 128}      # the row width of a swizzle atom
CORE_ROWS, CORE_BYTES = 8, 16          # a core matrix: 8 rows x 16 bytes


def _power_of_two(value: int, what: str, least: int = 1) -> int:
    if value < least or value & (value - 1):
        raise ValueError(f"{what} = {value}: needs a power of two >= {least}")
    return value.bit_length() - 1


def kmajor_offsets(swizzle: Swizzle, rows: int, k_bytes: int, lbo: int | None = None,
                   sbo: int | None = None) -> LinearLayout:
    """(row, k) -> offset: the byte, from a 1024-byte-aligned tile start, at which a
    K-major tile of `rows` x `k_bytes` holds each element, under a descriptor with
    this swizzle and strides (LBO: next core matrix along K, unused by 128B; SBO:
    next 8-row group, 1024 by default for 128B). Refuses strides that overlap."""
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle '{swizzle}' is not one of {', '.join(SWIZZLES)}")
    row_bits = _power_of_two(rows, "rows", CORE_ROWS)
    k_bits = _power_of_two(k_bytes, "k_bytes", CORE_BYTES)
    groups = row_bits - 3
    if swizzle == "none":
        if k_bytes > CORE_BYTES and lbo is None or rows > CORE_ROWS and sbo is None:
            raise ValueError("a no-swizzle tile needs lbo (when k_bytes > 16) and sbo "
                             "(when rows > 8)")
        lbo_bit = _power_of_two(lbo, "lbo", CORE_BYTES) if k_bytes > CORE_BYTES else 0
        sbo_bit = _power_of_two(sbo, "sbo", CORE_BYTES) if rows > CORE_ROWS else 0
        k = [1 << i for i in range(4)] + [1 << (lbo_bit + i) for i in range(k_bits - 4)]
        row = [CORE_BYTES << i for i in range(3)] + [1 << (sbo_bit + i) for i in range(groups)]
    else:
        width = SWIZZLE_ROW_BYTES[swizzle]
        if k_bytes > width:
            raise ValueError(f"a {swizzle}-swizzled K-major tile holds at most {width} "
                             f"bytes of K per row, not {k_bytes}")
        sbo_bit = _power_of_two(CORE_ROWS * width if sbo is None else sbo, "sbo", CORE_BYTES)
        k = [1 << i for i in range(k_bits)]
        # row bit i: 128 << i, and the XOR flips chunk bit i (16 << i)
        row = [(width << i) ^ (CORE_BYTES << i) for i in range(3)] + [
            1 << (sbo_bit + i) for i in range(groups)]
    span = 1 << max(v.bit_length() for v in k + row)
    layout = LinearLayout({"row": [{"offset": v} for v in row],
                           "k": [{"offset": v} for v in k]}, [("offset", span)])
    if not layout.is_injective():
        raise ValueError(f"{swizzle} K-major tile of {rows} x {k_bytes} bytes: lbo={lbo} "
                         f"and sbo={sbo} put two elements on one byte")
    return layout


def kmajor_layout(swizzle: Swizzle, rows: int, k_bytes: int, lbo: int | None = None,
                  sbo: int | None = None) -> LinearLayout:
    """offset -> (row, k) of a tile that fills its bytes (the inverse of
    `kmajor_offsets`); a tile whose strides leave gaps has no such layout."""
    offsets = kmajor_offsets(swizzle, rows, k_bytes, lbo, sbo)
    if not offsets.is_surjective():
        raise ValueError(f"{swizzle} K-major tile of {rows} x {k_bytes} bytes with "
                         f"lbo={lbo}, sbo={sbo} leaves gaps in its "
                         f"{offsets.out_size('offset')} bytes: use kmajor_offsets")
    return offsets.invert().transpose_outs(("row", "k"))
