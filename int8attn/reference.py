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

from dataclasses import dataclass

import numpy as np

from int8attn.fragments import FragmentModel, fragment_model

__all__ = ["quantize", "quantize_cache", "exact_attention", "fragment_attention",
           "round_to_bf16", "w_quantization_error_scale", "qk_quantization_error_scale",
           "rounding_tie_slack",
           "PV_MODES"]

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


@dataclass(frozen=True)
class _DecodeWeights:
    w: np.ndarray          # [B,Hkv,R,N,T] f32: W = P * sV per partition
    v_blocks: np.ndarray   # [B,Hkv,N,T,D] int8
    m: np.ndarray          # [B,Hkv,R,N] partition max
    l: np.ndarray          # [B,Hkv,R,N] partition sum


def _decode_weights(q, k, k_scale, v, v_scale, softmax_scale, partition_tokens) -> _DecodeWeights:
    """Steps 1-4 of the decode contract: INT8 QK, partitions, softmax, W = P*sV."""
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
    return _DecodeWeights(w, v_blocks, m, l)


def _merge_weights(m, l) -> np.ndarray:
    """Step 7's partition weights e^(m_p - M) * l_p."""
    return (np.exp(m - m.max(axis=-1, keepdims=True)) * l).astype(_F32)


def fragment_attention(q, k, k_scale, v, v_scale, softmax_scale: float, *, pv: str = "int8",
                       target: str = "gfx936", partition_tokens: int = 256,
                       fragments: FragmentModel | None = None) -> np.ndarray:
    """The decode contract in f32 with the target's fragment-derived W groups.

    `fragments` overrides the target's model (e.g. another V-load scheme).
    """
    if pv not in PV_MODES:
        raise ValueError(f"pv must be one of {PV_MODES}, got {pv!r}")
    st = _decode_weights(q, k, k_scale, v, v_scale, softmax_scale, partition_tokens)
    if pv == "int8":
        groups = (fragments or fragment_model(target)).token_groups(partition_tokens)
        partial = _int8_pv(st.w, st.v_blocks, groups)
    else:
        w_used = round_to_bf16(st.w) if pv == "bf16" else st.w
        partial = np.einsum("bhrnt,bhntd->bhrnd", w_used, st.v_blocks.astype(_F32)).astype(_F32)
    weight = _merge_weights(st.m, st.l)
    numerator = np.einsum("bhrn,bhrnd->bhrd", weight, partial).astype(_F32)
    out = numerator / weight.sum(axis=-1, dtype=_F32)[..., None]
    return out.reshape(q.shape).astype(_F32)


def w_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                               target: str = "gfx936", partition_tokens: int = 256):
    """How far INT8 PV may be from f32 PV, per output element.

    The two differ only by the W rounding term sum_p w_p sum_i eW_i Vq_i with
    |eW_i| <= sW/2 (sW of the group consuming token i). Returns the hard bound
    (every |eW| at sW/2, worst signs) and the standard deviation under the
    usual model of eW uniform in [-sW/2, sW/2], both shaped like q.
    """
    st = _decode_weights(q, k, k_scale, v, v_scale, softmax_scale, partition_tokens)
    groups = fragment_model(target).token_groups(partition_tokens)
    _, sw = quantize(st.w[..., groups])                          # [B,Hkv,R,N,G]
    v_groups = st.v_blocks[:, :, :, groups, :].astype(np.float64)  # [B,Hkv,N,G,K,D]
    weight = _merge_weights(st.m, st.l).astype(np.float64)
    omega = weight / weight.sum(axis=-1, keepdims=True)
    sw = sw.astype(np.float64)
    worst = np.einsum("bhrng,bhngkd->bhrnd", sw / 2, np.abs(v_groups))
    variance = np.einsum("bhrng,bhngkd->bhrnd", sw * sw / 12, v_groups * v_groups)
    bound = np.einsum("bhrn,bhrnd->bhrd", omega, worst)
    sigma = np.sqrt(np.einsum("bhrn,bhrnd->bhrd", omega * omega, variance))
    return bound.reshape(q.shape), sigma.reshape(q.shape)


def qk_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float) -> np.ndarray:
    """Standard deviation of the INT8-QK error in the output, shaped like q.

    Quantizing a query row perturbs each score by d_i = scale * sum_d eQ_d K_id
    with eQ uniform in [-sQ/2, sQ/2], so sd(d_i) = scale * sQ * |K_i| / sqrt(12).
    To first order the output moves by sum_i P_i d_i (V_i - O), whose standard
    deviation this returns (exact softmax P and output O on the dequantized cache).
    """
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    qg = _grouped_query(np.asarray(q, dtype=np.float64), k.shape[1])
    _, sq = quantize(qg.astype(_F32))
    scale = float(_F32(softmax_scale))
    scores = np.einsum("bhrd,bhsd->bhrs", qg, k_deq) * scale
    p = np.exp(scores - scores.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhrs,bhsd->bhrd", p, v_deq)
    score_sd = scale * sq[..., None].astype(np.float64) * \
        np.sqrt((k_deq * k_deq).sum(axis=-1) / 12)[:, :, None, :]
    a = (p * score_sd) ** 2                                    # [B,Hkv,R,S]
    # sum_i a_i (V_i - O)^2 without materializing [B,Hkv,R,S,D]
    variance = (np.einsum("bhrs,bhsd->bhrd", a, v_deq * v_deq)
                - 2 * out * np.einsum("bhrs,bhsd->bhrd", a, v_deq)
                + out * out * a.sum(axis=-1)[..., None])
    return np.sqrt(np.maximum(variance, 0)).reshape(q.shape)


# Two f32 implementations of the contract (different exp, summation order)
# give W values a few ulps apart; an element whose W*127/max lies this close
# to a .5 tie (in units of one quantization step) may round either way.
TIE_WINDOW = 2e-4


def rounding_tie_slack(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                       target: str = "gfx936", partition_tokens: int = 256,
                       fragments: FragmentModel | None = None) -> np.ndarray:
    """Per output: how much W elements sitting on a rounding tie may move it.

    A tie that rounds the other way changes Wq by 1, so the output by
    w_p * sW * |Vq|. Returns the sum of those over all tie elements (usually
    zero), shaped like q: the fragment-level comparison allows exactly that.
    """
    st = _decode_weights(q, k, k_scale, v, v_scale, softmax_scale, partition_tokens)
    groups = (fragments or fragment_model(target)).token_groups(partition_tokens)
    w_groups = st.w[..., groups]
    amax = np.abs(w_groups).max(axis=-1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax == 0, 0, _F32(127) / amax).astype(_F32)
    steps = w_groups * inverse[..., None]
    ties = np.abs(steps - np.floor(steps) - 0.5) < TIE_WINDOW
    v_groups = np.abs(st.v_blocks[:, :, :, groups, :].astype(np.float64))
    per_block = np.einsum("bhrngk,bhngkd->bhrnd", ties * (amax / 127)[..., None], v_groups)
    weight = _merge_weights(st.m, st.l).astype(np.float64)
    omega = weight / weight.sum(axis=-1, keepdims=True)
    return np.einsum("bhrn,bhrnd->bhrd", omega, per_block).reshape(q.shape)
