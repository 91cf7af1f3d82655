"""The prefill bench's data and checks (`int8attn.bench_prefill` runs them): a case's
random Q and quantized K/V cache, the same cache as a paged pool of BLOCK_SIZE-token
blocks in shuffled order, the causal work, the output checked against the fragment
reference on three CHECK_TOKENS-token slices of the query tokens, and torch SDPA's
time on the same data in bf16."""

from __future__ import annotations

import numpy as np

from .bench_harness import Timer, map_forked
from .contract.numerics import Numerics

BLOCK_SIZE = 16
CHECK_TOKENS = 64


def inputs(seed: int, batch, q_heads, kv_heads, tokens, query_tokens, head_dim):
    from .reference import quantize_cache

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_heads, query_tokens, head_dim), dtype=np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim),
                                                    dtype=np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim),
                                                    dtype=np.float32))
    return q, k, k_scale, v, v_scale


def block_pool(rng, k, k_scale, v, v_scale, block_size: int = BLOCK_SIZE):
    """The dense cache [B, Hkv, S, D] as a paged pool: each sequence's blocks at
    shuffled pool rows (the rest of a last block zero), every token stored where the
    cache layout's rules put it; (k_cache, k_scale, v_cache, v_scale, block_tables,
    context_lens)."""
    from .fragments.cache_layout import EVERY, CacheLayout

    batch, kv_heads, tokens, head_dim = k.shape
    layout = CacheLayout.paged(block_size)
    per_sequence = int(layout.blocks_needed(tokens))
    tables = rng.permutation(batch * per_sequence).astype(np.int32).reshape(batch, -1)
    pool = [np.zeros(shape, x.dtype) for shape, x in
            zip(layout.shapes(batch * per_sequence, kv_heads, head_dim), (k, k_scale, v, v_scale))]
    for b in range(batch):
        blocks, offsets = layout.sequence_addresses(tables[b], tokens)
        for cache, index, dense in zip(
                pool, (layout.k_index(blocks, EVERY, offsets, EVERY),
                       layout.scale_index(blocks, EVERY, offsets),
                       layout.v_index(blocks, EVERY, offsets, EVERY),
                       layout.scale_index(blocks, EVERY, offsets)),
                (k, k_scale, v, v_scale)):
            cache[index] = np.swapaxes(dense[b], 0, 1)        # [S, Hkv(, D)]
    return (*pool, tables, np.full(batch, tokens, np.int32))


def causal_pairs(tokens: int, query_tokens: int) -> int:
    """Visible (query, key) pairs: query t sees S - Sq + t + 1 keys."""
    history = tokens - query_tokens
    return query_tokens * (history + 1) + query_tokens * (query_tokens - 1) // 2


def check_slices(out, arrays, scale, pv, numerics: Numerics,
                 chain: int = 1) -> tuple[float, bool]:
    """(max abs vs the fragment reference of `numerics` and W groups of `chain` MMACs,
    within 5e-5 + tie slack) on the first, a middle and the last CHECK_TOKENS query
    tokens (a slice per worker process)."""
    from .fragments import fragment_model

    model = fragment_model("cuda").chained(chain).name
    from .reference import fragment_attention, rounding_tie_slack

    q, k, ks, v, vs = arrays
    tokens, query_tokens = k.shape[2], q.shape[2]
    width = min(CHECK_TOKENS, query_tokens)
    starts = sorted({0, (query_tokens - width) // 2, query_tokens - width})

    def one(start):
        end = start + width
        # Query tokens [start, end) are the last ones of a sequence that ends at
        # their last token's position.
        seen = tokens - query_tokens + end
        part = (q[:, :, start:end], k[:, :, :seen], ks[:, :, :seen], v[:, :, :seen],
                vs[:, :, :seen])
        expected = fragment_attention(*part, scale, model=model, pv=pv, numerics=numerics)
        slack = rounding_tie_slack(*part, scale, model=model, pv=pv, numerics=numerics)
        err = np.abs(out[:, :, start:end] - expected)
        return float(err.max()), bool((err <= 5e-5 + slack).all())

    results = map_forked(one, starts)
    return max(r[0] for r in results), all(r[1] for r in results)


def sdpa_seconds(arrays, timer: Timer, backend: str | None = None):
    """torch SDPA, bf16, causal aligned to the sequence's end (the new tokens last);
    `backend` (an SDPBackend name, e.g. FLASH_ATTENTION): that backend only, else
    torch's choice."""
    try:
        import torch
    except ImportError:
        return None
    q, k, ks, v, vs = arrays
    dev = torch.device("cuda")
    dequant = lambda c, s: (torch.from_numpy(c).to(dev).float() *
                            torch.from_numpy(s).to(dev)[..., None]).to(torch.bfloat16)
    kf, vf = dequant(k, ks), dequant(v, vs)
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)
    scale = q.shape[-1] ** -0.5
    if q.shape[2] == k.shape[2]:
        call = lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kf, vf, is_causal=True, scale=scale, enable_gqa=True)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q.shape[2], k.shape[2])
        groups = q.shape[1] // k.shape[1]
        kf, vf = kf.repeat_interleave(groups, 1), vf.repeat_interleave(groups, 1)
        call = lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kf, vf, attn_mask=mask, scale=scale)
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen, default = getattr(SDPBackend, backend), call

        def call():
            with sdpa_kernel(chosen):
                return default()
    return timer.events(call)
