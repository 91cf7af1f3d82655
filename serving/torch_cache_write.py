"""The cache write in torch ops: what PagedInt8Cache writes through where no cache_write
package was compiled (a cuda PagedAttention loaded from packages saved without it)."""

from __future__ import annotations

from ..contract.constants import QUANTIZE_MIN_ABSMAX
from ..fragments.cache_layout import EVERY, CacheLayout
from .tensors import torch_module

torch = torch_module()


def torch_cache_write(k_new, v_new, blocks, offsets, k_cache, k_scale, v_cache, v_scale,
                      skip=None):
    """`cache_write` in torch ops: token i's rows quantized per KV head by the contract's
    rule (docs/design.md §2: s = a/127, q = clamp(rne(x * (127/a))); a tiny or zero row
    q = 0, its subnormal scale flushed to 0 as the kernels do) and stored at
    (blocks[i], offsets[i]), in place: bit for bit what the kernel writes
    (tests/test_transformers_attention.py). The cache's fallback where no cache_write
    package was compiled. Rows must be finite (the cache checks when validating).
    `skip` (a 1-element bool tensor, e.g. the device-side checks' verdict): where True,
    every addressed slot gets back what it held (the written rows only are read), so a
    bad call changes nothing without a host sync."""
    layout = CacheLayout.paged(k_cache.shape[2])
    for new, cache, scale, index in ((k_new, k_cache, k_scale, layout.k_index),
                                     (v_new, v_cache, v_scale, layout.v_index)):
        amax = new.abs().amax(-1)                               # NaN-propagating
        ok = (amax >= QUANTIZE_MIN_ABSMAX) & (amax < float("inf"))
        inverse = torch.where(ok, 127 / torch.where(ok, amax, 1), 0)
        levels = torch.round(new * inverse[..., None]).clamp(-127, 127)
        q = torch.where(ok[..., None], levels, 0).to(torch.int8)
        s = torch.where(amax == float("inf"), float("nan"), amax / 127)
        s = torch.where(s < torch.finfo(torch.float32).tiny, 0, s)   # as the kernels flush
        rows, scale_rows = index(blocks, EVERY, offsets, EVERY), \
            layout.scale_index(blocks, EVERY, offsets)
        if skip is not None:
            q = torch.where(skip, cache[rows], q)
            s = torch.where(skip, scale[scale_rows], s)
        cache[rows] = q
        scale[scale_rows] = s
