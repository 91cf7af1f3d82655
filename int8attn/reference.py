"""Numpy references for int8attn's numerics contract (DESIGN.md section 2).

`exact_attention` is the accuracy yardstick: float64 attention on the
dequantized cache with unquantized Q, returned as f32.

`fragment_attention` is the contract itself, step by step in f32: INT8 QK,
256-token partitions, W = P*sV, W quantized per group of tokens that one MMAC
consumes -- read from the fragment model, like the compiler -- int32 sums per
group, rescale, log-sum-exp merge. It is the one reference implementation of
the contract; the compiled modules must match it to float rounding.
"""

from __future__ import annotations

import numpy as np

from int8attn.fragments import fragment_model

__all__ = ["quantize", "quantize_cache", "exact_attention", "fragment_attention",
           "round_to_bf16", "PV_MODES"]

PV_MODES = ("int8", "bf16", "f32")
_F32 = np.float32


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row (last axis): q = clamp(rne(x*127/a)), s = a/127."""
    x = np.asarray(x, dtype=_F32)
    amax = np.max(np.abs(x), axis=-1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax == 0, _F32(0), _F32(127) / amax).astype(_F32)
    q = np.clip(np.rint(x * inverse[..., None]), -127, 127).astype(np.int8)
    return q, (amax / _F32(127)).astype(_F32)


def quantize_cache(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float cache [B, H, S, D] as int8 with one scale per token."""
    return quantize(x)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round f32 to the nearest bf16 (ties to even), returned as f32."""
    bits = np.asarray(x, dtype=_F32).view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    return rounded.astype(np.uint32).view(_F32)


def _grouped_query(q: np.ndarray, kv_heads: int) -> np.ndarray:
    batch, q_heads, head_dim = q.shape
    return q.reshape(batch, kv_heads, q_heads // kv_heads, head_dim)


def exact_attention(q, k, k_scale, v, v_scale, softmax_scale: float) -> np.ndarray:
    """Decode attention in float64 on the dequantized cache, unquantized Q."""
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    qg = _grouped_query(np.asarray(q, dtype=np.float64), k.shape[1])
    scores = np.einsum("bhrd,bhsd->bhrs", qg, k_deq) * float(np.float32(softmax_scale))
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhrs,bhsd->bhrd", p, v_deq)
    return out.reshape(q.shape).astype(_F32)


def _pad_tokens(x: np.ndarray, axis: int, size: int, value) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths, constant_values=value)


def _int8_pv(w, v_blocks, groups) -> np.ndarray:
    """sum_g f32(sum_k Wq*Vq) * sW over the fragment model's token groups."""
    w_groups = w[..., groups]                       # [B,Hkv,R,N,G,K]
    wq, sw = quantize(w_groups)
    v_groups = v_blocks[:, :, :, groups, :]         # [B,Hkv,N,G,K,D]
    acc = np.einsum("bhrngk,bhngkd->bhrngd", wq.astype(np.int64), v_groups.astype(np.int64))
    assert np.abs(acc).max(initial=0) < 2**31, "int32 accumulator overflow"
    out = np.zeros(acc.shape[:4] + acc.shape[5:], dtype=_F32)
    for g in range(acc.shape[4]):                   # groups in order, like the IR
        out += acc[:, :, :, :, g, :].astype(_F32) * sw[:, :, :, :, g, None]
    return out


def fragment_attention(q, k, k_scale, v, v_scale, softmax_scale: float, *, pv: str = "int8",
                       target: str = "gfx936", partition_tokens: int = 256) -> np.ndarray:
    """The decode contract in f32 with the target's fragment-derived W groups."""
    if pv not in PV_MODES:
        raise ValueError(f"pv must be one of {PV_MODES}, got {pv!r}")
    batch, kv_heads, tokens, head_dim = k.shape
    qg = _grouped_query(np.asarray(q, dtype=_F32), kv_heads)
    qq, sq = quantize(qg)
    acc = np.einsum("bhrd,bhsd->bhrs", qq.astype(np.int32), k.astype(np.int32))
    scores = ((acc.astype(_F32) * sq[..., None]) * k_scale[:, :, None, :]) * _F32(softmax_scale)

    blocks = -(-tokens // partition_tokens)
    padded = blocks * partition_tokens
    rows = qg.shape[2]
    scores = _pad_tokens(scores, 3, padded, -np.inf).reshape(
        batch, kv_heads, rows, blocks, partition_tokens)
    v_blocks = _pad_tokens(v, 2, padded, 0).reshape(
        batch, kv_heads, blocks, partition_tokens, head_dim)
    vs_blocks = _pad_tokens(v_scale, 2, padded, 0).reshape(
        batch, kv_heads, blocks, partition_tokens).astype(_F32)

    m = scores.max(axis=-1)
    e = np.exp(scores - m[..., None]).astype(_F32)
    l = e.sum(axis=-1, dtype=_F32)
    p = e / l[..., None]
    w = (p * vs_blocks[:, :, None, :, :]).astype(_F32)

    if pv == "int8":
        groups = fragment_model(target).token_groups(partition_tokens)
        partial = _int8_pv(w, v_blocks, groups)
    else:
        w_used = round_to_bf16(w) if pv == "bf16" else w
        partial = np.einsum("bhrnt,bhntd->bhrnd", w_used, v_blocks.astype(_F32)).astype(_F32)

    m_all = m.max(axis=-1)
    weight = (np.exp(m - m_all[..., None]) * l).astype(_F32)
    numerator = np.einsum("bhrn,bhrnd->bhrd", weight, partial).astype(_F32)
    out = numerator / weight.sum(axis=-1, dtype=_F32)[..., None]
    return out.reshape(q.shape).astype(_F32)
