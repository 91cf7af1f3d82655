"""References for decode over the paged cache (docs/design.md §2b), sequence by sequence.

Sequence b attends to its tokens 0 .. len_b - 1 exactly as a dense decode
over those tokens: its K and V are gathered through its block table (token t
in block `block_tables[b, t // BS]`, slot `t % BS`: the paged `CacheLayout`,
fragments/cache_layout.py) into a dense [1, Hkv, len_b, D] cache, and the dense
references run on that. Table slots past a sequence's length are not read.

`paged_cache_write` is `int8attn.cache_write`: each new token's rows quantized
with the contract's `quantize` and stored at its slot (a negative slot skips it).
One latitude, stated here once: a scale below 2^-126 (f32's smallest normal) may be
stored as +0. Only a tiny row has one (max|row| < 127 * 2^-126 < 2^-118, so its levels
are all 0 and no attention result can tell the two apart), and IREE's CPU runtime
flushes that subnormal quotient to zero where the kernel targets store it.
`same_written_caches` is the comparison that allows it (bit for bit otherwise).
"""

from __future__ import annotations

import numpy as np

from ..contract.numerics import Numerics
from ..fragments.cache_layout import EVERY, CacheLayout
from .common import quantize
from .key_bias import subtract_bias
from .exact import exact_attention
from .fragment import fragment_attention


def sequence_slots(block_tables, context_lens, b: int, block_size: int):
    """(block, offset) of each of sequence b's tokens 0 .. len_b - 1 (docs/design.md §2b)."""
    return CacheLayout.paged(block_size).sequence_addresses(block_tables[b], context_lens[b])


def sequence_cache(k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, b: int):
    """Sequence b's dense (k [1,Hkv,len,D], k_scale [1,Hkv,len], v, v_scale)."""
    layout = CacheLayout.paged(k_cache.shape[2])
    blocks, offsets = layout.sequence_addresses(block_tables[b], context_lens[b])
    # [len, Hkv, D] and [len, Hkv] rows -> [1, Hkv, len, D] and [1, Hkv, len]
    rows = layout.token_rows(k_cache, k_scale, v_cache, v_scale, blocks, offsets)
    return tuple(np.ascontiguousarray(np.swapaxes(x, 0, 1)[None]) for x in rows)


def _per_sequence(attend, q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens):
    out = np.empty(q.shape, np.float32)
    for b in range(q.shape[0]):
        cache = sequence_cache(k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, b)
        out[b] = attend(q[b:b + 1], *cache)[0]
    return out


def exact_paged_attention(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens,
                          softmax_scale: float) -> np.ndarray:
    """Float attention of every sequence on its dequantized cache, unquantized q."""
    return _per_sequence(lambda *a: exact_attention(*a, softmax_scale), q, k_cache, k_scale,
                         v_cache, v_scale, block_tables, context_lens)


def fragment_paged_attention(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens,
                             softmax_scale: float, *, numerics: Numerics = Numerics(),
                             **contract) -> np.ndarray:
    """The numerics contract of every sequence (partitions over its own length);
    `numerics` and `contract` as for `fragment_attention` (pv, model, partition_tokens, ...)."""
    return _per_sequence(lambda *a: fragment_attention(*a, softmax_scale, numerics=numerics,
                                                       **contract), q,
                         k_cache, k_scale, v_cache, v_scale, block_tables, context_lens)


def paged_cache_write(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale,
                      k_bias=None):
    """The caches with tokens i written at slot_mapping[i] (copies; the inputs are kept):
    per KV head, (Kq, sK) = quantize(k_new[i, h] - k_bias[h]) at k_cache[s // BS, h, s % BS, :]
    and k_scale[s // BS, h, s % BS] (no bias: k_new as it is; key_bias.py); V likewise,
    token-innermost (v_cache[s // BS, h, :, s % BS]). A token whose slot is negative is
    skipped (vLLM's padding). A scale below 2^-126 (a tiny row's, whose levels are all
    0) is returned as the contract's a/127; a target may store +0 instead (module
    docstring, `same_written_caches`)."""
    k_cache, k_scale, v_cache, v_scale = (np.array(a, copy=True) for a in
                                          (k_cache, k_scale, v_cache, v_scale))
    layout = CacheLayout.paged(k_cache.shape[2])
    kq, ks = quantize(subtract_bias(k_new, k_bias, head_axis=1))   # [T, Hkv, D], [T, Hkv]
    vq, vs = quantize(np.asarray(v_new, np.float32))
    slots = np.asarray(slot_mapping)
    for i in np.flatnonzero(layout.kept(slots)):
        block, offset = (int(x) for x in layout.split_slots(slots[i]))
        k_cache[layout.k_index(block, EVERY, offset, EVERY)] = kq[i]
        k_scale[layout.scale_index(block, EVERY, offset)] = ks[i]
        v_cache[layout.v_index(block, EVERY, offset, EVERY)] = vq[i]
        v_scale[layout.scale_index(block, EVERY, offset)] = vs[i]
    return k_cache, k_scale, v_cache, v_scale


# f32's smallest normal: a scale below it may be stored as +0 (module docstring).
SMALLEST_NORMAL = np.float32(2.0 ** -126)


def flushed_scales_equal(got, expected) -> np.ndarray:
    """Elementwise: the scales are equal bit for bit (NaN as NaN), or `expected` is a
    positive subnormal (a tiny row's a/127) and `got` is +0 (the flush the contract
    allows); `got` subnormal where `expected` is +0 is not allowed."""
    got, expected = np.asarray(got, np.float32), np.asarray(expected, np.float32)
    same = got.view(np.uint32) == expected.view(np.uint32)
    same |= np.isnan(got) & np.isnan(expected)
    flushed = ((expected > 0) & (expected < SMALLEST_NORMAL)
               & (got.view(np.uint32) == np.uint32(0)))
    return same | flushed


def same_written_caches(got, expected) -> bool:
    """Caches (k_cache, k_scale, v_cache, v_scale) as `paged_cache_write` defines them:
    the levels bit for bit, the scales bit for bit but for a subnormal scale stored as
    +0 (`flushed_scales_equal`)."""
    got, expected = list(got), list(expected)
    if len(got) != 4 or len(expected) != 4:
        raise ValueError("expected (k_cache, k_scale, v_cache, v_scale) twice")
    for index, (a, b) in enumerate(zip(got, expected)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if index in (1, 3):
            if not flushed_scales_equal(a, b).all():
                return False
        elif not np.array_equal(a, b):
            return False
    return True
