"""Where a tile staged in LDS puts its bytes: a swizzle chosen by the loads' banks.

LDS serves a warp's access in wavefronts: 32 banks of 4 bytes, and a phase of
128 / width lanes (8 lanes for 16-byte loads) is one wavefront when no bank holds
two of the phase's distinct words, else as many as the fullest bank holds.
`lds_wavefronts` counts them for a warp's byte addresses. A K tile [tokens, D]
read as QK's B operand puts each phase's lanes on few tokens whose rows start in
the same bank (rows of 128 bytes and more), so `k_tile_swizzle` XORs one token bit
into one byte bit at or above the load width, the pair the lane maps of the K loads
(`DecodeKernelLayout.b_token`, `qk_b_loads`) give the fewest wavefronts, as a
`LinearLayout` (token, byte) -> byte that the copies into the tile and the loads
from it both emit.
"""

from __future__ import annotations

import numpy as np

from .kernel_layout import DecodeKernelLayout
from .linear_layout import LinearLayout

LDS_BANKS = 32
LDS_BANK_BYTES = 4


def lds_wavefronts(addresses: np.ndarray, width: int) -> int:
    """Wavefronts of one warp's LDS access of `width` bytes at each lane's byte
    address (`addresses`, [lanes]); lanes reading one word share it."""
    per_phase = max(1, LDS_BANKS * LDS_BANK_BYTES // width)
    words = addresses[:, None] // LDS_BANK_BYTES + np.arange(width // LDS_BANK_BYTES)
    total = 0
    for start in range(0, len(addresses), per_phase):
        distinct = np.unique(words[start:start + per_phase])
        total += int(np.bincount(distinct % LDS_BANKS).max())
    return total


def _swizzle(tokens: int, head_dim: int, token_bit: int | None,
             byte_bit: int | None) -> LinearLayout:
    """(token, byte) -> byte: the identity on bytes, plus token bit `token_bit` XORed
    into byte bit `byte_bit` (None: no swizzle)."""
    byte_bases = [{"byte": 1 << b} for b in range(head_dim.bit_length() - 1)]
    token_bases = [{"byte": 1 << byte_bit} if b == token_bit else {"byte": 0}
                   for b in range(tokens.bit_length() - 1)]
    return LinearLayout({"token": token_bases, "byte": byte_bases},
                        outs=[("byte", head_dim)])


def k_tile_wavefronts(layout: DecodeKernelLayout, head_dim: int,
                      swizzle: LinearLayout) -> int:
    """LDS wavefronts of a wave's K loads (every QK block, every load) from a K tile
    [wave tokens, head_dim] stored through `swizzle`."""
    lanes = np.arange(layout.instruction.wave_size)
    width = layout.qk_b_width(head_dim)
    total = 0
    for block in range(layout.blocks):
        token = layout.b_token(block)(lanes)
        for first in layout.qk_b_loads(head_dim):
            byte = swizzle.apply(token=token, byte=first(lanes))["byte"]
            total += lds_wavefronts(token * head_dim + byte, width)
    return total


def k_tile_swizzle(layout: DecodeKernelLayout, head_dim: int) -> LinearLayout:
    """The K tile's (token, byte) -> byte in LDS: the identity, or the one-bit XOR
    (a token bit into a byte bit at or above the load width, so that every load
    stays whole and aligned) with the fewest K-load wavefronts; the identity on a
    tie. Needs a power-of-two head dim (else: the identity)."""
    tokens = layout.model.wave_tokens
    identity = _swizzle(tokens, head_dim, None, None)
    if head_dim & (head_dim - 1):
        return identity
    width = layout.qk_b_width(head_dim)
    candidates = [identity] + [
        _swizzle(tokens, head_dim, t, b)
        for t in range(tokens.bit_length() - 1)
        for b in range(width.bit_length() - 1, head_dim.bit_length() - 1)]
    costs = [k_tile_wavefronts(layout, head_dim, s) for s in candidates]
    return candidates[costs.index(min(costs))]
