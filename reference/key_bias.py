"""Conditioned K cache (docs/design.md §2c): a per-KV-head channel bias subtracted
from every key before it is quantized.

    k_cache, k_scale = quantize(k - bias[h])        bias: f32 [Hkv, D]

Exact for attention: for a query row q of KV head h, q . (k_i - b) = q . k_i - q . b,
the same shift for every token i of that row, and softmax ignores a shift shared by
all the tokens it normalizes over (the causal prefix in prefill, a partition in
decode, whose log-sum-exp merge is shift-invariant too). What changes is only the
quantization: LLM keys carry channels with a large offset shared by all tokens
(additive outliers), which set every token's absmax, so every other channel of
every token gets few levels; with the offset subtracted the per-token scales
follow what is left. `channel_bias` is one choice of b (the mean key per
channel); any fixed b is exact, a good one shrinks the scales.

`int8attn.cache_write` takes the same bias as an optional last operand (the
paged cache); `quantize_keys` is the dense cache's helper, and both follow
`subtract_bias` below (one f32 subtraction, then the contract's quantize).
"""

from __future__ import annotations

import numpy as np

from .common import F32, quantize


def channel_bias(keys: np.ndarray) -> np.ndarray:
    """The mean float key of each (KV head, channel): f32 [Hkv, D] from keys
    [B, Hkv, S, D] (or [T, Hkv, D], new tokens)."""
    keys = np.asarray(keys, dtype=np.float64)
    axes = (0, 2) if keys.ndim == 4 else (0,)
    return keys.mean(axis=axes).astype(F32)


def subtract_bias(keys: np.ndarray, bias: np.ndarray | None, head_axis: int) -> np.ndarray:
    """f32 keys minus bias[h] on every key of KV head h (`head_axis` of `keys`)."""
    keys = np.asarray(keys, dtype=F32)
    if bias is None:
        return keys
    bias = np.asarray(bias, dtype=F32)
    if bias.shape != (keys.shape[head_axis], keys.shape[-1]):
        raise ValueError(f"key bias must be [Hkv, D] = [{keys.shape[head_axis]}, "
                         f"{keys.shape[-1]}], got {list(bias.shape)}")
    shape = [1] * keys.ndim
    shape[head_axis], shape[-1] = bias.shape
    return (keys - bias.reshape(shape)).astype(F32)


def quantize_keys(keys: np.ndarray, bias: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray]:
    """A dense float K [B, Hkv, S, D] as the INT8 cache (Kq, sK) of `attention`,
    with the channel bias [Hkv, D] subtracted first (None: plain quantize_cache)."""
    return quantize(subtract_bias(keys, bias, head_axis=1))
