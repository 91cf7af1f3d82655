"""Exact attention: float64 on the dequantized cache, unquantized Q."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .common import F32, group_rows, row_chunks, visible

# Bytes per (row, token) held at once: f64 scores, their masked copy, exp.
_BYTES_PER_SCORE = 3 * 8


def exact_attention(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                    progress: Callable[[str], None] | None = None) -> np.ndarray:
    """Decode ([B,Hq,D]) or causal prefill ([B,Hq,Sq,D]) attention, as f32.

    Works through the query rows in chunks (common.row_chunks), calling
    `progress` with a short line after each.
    """
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = group_rows(np.asarray(q), k.shape[1])                    # [B,Hkv,R,D]
    batch, kv_heads, tokens = k.shape[0], k.shape[1], k.shape[2]
    out = np.empty(rows.shape, dtype=F32)
    for chunk in row_chunks(rows.shape[2], batch * kv_heads * tokens * _BYTES_PER_SCORE,
                            progress, "exact reference", batch * kv_heads):
        out[:, :, chunk] = _exact_rows(rows[:, :, chunk], k_deq, v_deq, softmax_scale,
                                       visible(q.shape, kv_heads, tokens, chunk))
    return out.reshape(q.shape)


def _exact_rows(rows, k_deq, v_deq, softmax_scale, seen) -> np.ndarray:
    rows = np.ascontiguousarray(rows, dtype=np.float64)
    scores = np.einsum("bhrd,bhsd->bhrs", rows, k_deq) * float(F32(softmax_scale))
    scores = np.where(seen, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhrs,bhsd->bhrd", p, v_deq).astype(F32)
