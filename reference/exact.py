"""Exact attention: float64 on the dequantized cache, unquantized Q."""

from __future__ import annotations

import numpy as np

from int8attn.reference.common import F32, group_rows, visible


def exact_attention(q, k, k_scale, v, v_scale, softmax_scale: float) -> np.ndarray:
    """Decode ([B,Hq,D]) or causal prefill ([B,Hq,Sq,D]) attention, as f32."""
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = group_rows(np.asarray(q, dtype=np.float64), k.shape[1])
    scores = np.einsum("bhrd,bhsd->bhrs", rows, k_deq) * float(F32(softmax_scale))
    scores = np.where(visible(q.shape, k.shape[1], k.shape[2]), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhrs,bhsd->bhrd", p, v_deq)
    return out.reshape(q.shape).astype(F32)
