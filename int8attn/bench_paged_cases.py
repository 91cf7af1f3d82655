"""The paged bench's cases and their data (`int8attn.bench_paged` runs them): uniform
batches, a ragged batch, one long sequence and a batch shaped like a real K cache, each a
pool holding exactly its sequences' blocks in shuffled order, and the bytes a call must
read from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .fragments.cache_layout import CacheLayout

PV = ("int8", "bf16")

# The key-outlier family: lengths uniform in [1, 9999] in one batch, KEY_CHANNELS key
# channels per KV head KEY_GAIN times the others (as LLM keys have them), q times
# Q_GAIN, the float K and V quantized per token into the pool.
KEY_OUTLIERS = "key-outliers"
KEY_OUTLIER_MAX_LENGTH, KEY_CHANNELS, KEY_GAIN, Q_GAIN = 9999, 4, 8.0, 1.5


@dataclass(frozen=True)
class PagedCase:
    """One batch of sequence lengths, run through every prepared folder's modules
    (`variants`: the PV precisions), each sequence checked; padded torch SDPA beside.
    `data`: "gaussian" (int8 K and V, scales around 1/127) or KEY_OUTLIERS."""
    name: str
    lengths: tuple[int, ...]
    variants: tuple[str, ...] = PV
    data: str = "gaussian"


def cases(batch: int, contexts, mean: int, seed: int, pvs=PV) -> list[PagedCase]:
    """Uniform batches, the ragged batch, one long sequence."""
    rng = np.random.default_rng(seed)
    pvs = tuple(pvs)
    out = [PagedCase(f"uniform {c}", (c,) * batch, pvs) for c in contexts]
    out.append(PagedCase(f"ragged mean {mean} (uniform [1, {2 * mean - 1}])",
                         tuple(rng.integers(1, 2 * mean, batch).tolist()), pvs))
    out.append(PagedCase(f"B=1 {max(contexts)}", (max(contexts),), pvs))
    out.append(PagedCase(f"key outliers, ragged [1, {KEY_OUTLIER_MAX_LENGTH}]",
                         tuple(rng.integers(1, KEY_OUTLIER_MAX_LENGTH + 1, batch).tolist()),
                         pvs, KEY_OUTLIERS))
    return out


def batch_arrays(rng, lengths, q_heads, kv_heads, head_dim, block_size, data="gaussian"):
    """q and a pool holding exactly the sequences' blocks, in shuffled order; the
    cache's values by `data` (`PagedCase`)."""
    layout = CacheLayout.paged(block_size)
    needed = [layout.blocks_needed(n) for n in lengths]
    pool = sum(needed)
    order = rng.permutation(pool).astype(np.int32)
    tables = np.zeros((len(lengths), max(needed)), np.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    k_shape, shape, v_shape, _ = layout.shapes(pool, kv_heads, head_dim)
    if data == KEY_OUTLIERS:
        k, k_scale, v, v_scale = _key_outlier_pool(rng, layout, pool, kv_heads, head_dim)
        q = Q_GAIN * rng.standard_normal((len(lengths), q_heads, head_dim), dtype=np.float32)
        return [q, k, k_scale, v, v_scale, tables, np.array(lengths, np.int32)]
    k = rng.integers(-127, 128, k_shape, dtype=np.int8)
    v = rng.integers(-127, 128, v_shape, dtype=np.int8)
    k_scale = rng.uniform(0.5, 1.5, shape).astype(np.float32) / 127
    v_scale = rng.uniform(0.5, 1.5, shape).astype(np.float32) / 127
    q = rng.standard_normal((len(lengths), q_heads, head_dim), dtype=np.float32)
    return [q, k, k_scale, v, v_scale, tables, np.array(lengths, np.int32)]


def _key_outlier_pool(rng, layout: CacheLayout, pool: int, kv_heads: int, head_dim: int):
    """Float K (KEY_CHANNELS channels per KV head times KEY_GAIN) and V, Gaussian,
    quantized per token into the pool's layout: (k, k_scale, v, v_scale)."""
    from .reference import quantize_cache

    tokens = (pool, kv_heads, layout.block_size, head_dim)     # [block, head, offset, d]
    keys = rng.standard_normal(tokens, dtype=np.float32)
    for h in range(kv_heads):
        keys[:, h, :, rng.choice(head_dim, KEY_CHANNELS, replace=False)] *= KEY_GAIN
    k, k_scale = quantize_cache(keys)
    v, v_scale = quantize_cache(rng.standard_normal(tokens, dtype=np.float32))
    if layout.v_token_innermost:
        v = np.ascontiguousarray(np.swapaxes(v, -1, -2))
    return k, k_scale, v, v_scale


def bytes_read(arrays) -> int:
    q, k, k_scale, v, v_scale, tables, lengths = arrays
    _, kv_heads, block_size, head_dim = k.shape
    tokens = int(lengths.astype(np.int64).sum())
    per_token = kv_heads * (2 * head_dim + 2 * 4)
    slots = sum(CacheLayout.paged(block_size).blocks_needed(int(n)) for n in lengths) * 4
    return tokens * per_token + slots + q.nbytes + q.nbytes  # + the output
