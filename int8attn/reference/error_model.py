"""How far INT8 results may be from the references, per output element."""

from __future__ import annotations

import numpy as np

from int8attn.fragments import FragmentModel, fragment_model
from int8attn.reference.common import F32, group_rows, quantize, visible
from int8attn.reference.fragment import blocks_for

# Two f32 implementations of the contract (different exp, summation order)
# give W values a few ulps apart; an element whose W*127/max lies this close
# to a .5 tie (in units of one quantization step) may round either way.
TIE_WINDOW = 2e-4


def _groups(st, target, fragments: FragmentModel | None):
    return (fragments or fragment_model(target)).token_groups(st.w.shape[-1])


def w_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                               target: str = "gfx936", fragments=None, **block_sizes):
    """Hard bound and standard deviation of INT8 PV minus f32 PV.

    They differ only by the W rounding term sum_n omega_n sum_i eW_i Vq_i with
    |eW_i| <= sW/2 (sW of the group consuming token i). The bound puts every
    |eW| at sW/2 with the worst signs; the standard deviation takes eW uniform
    in [-sW/2, sW/2]. Both shaped like q.
    """
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, **block_sizes)
    groups = _groups(st, target, fragments)
    _, sw = quantize(st.w[..., groups])                                # [B,Hkv,R,N,G]
    v_groups = st.v_blocks[:, :, :, groups, :].astype(np.float64)     # [B,Hkv,N,G,K,D]
    sw = sw.astype(np.float64)
    worst = np.einsum("bhrng,bhngkd->bhrnd", sw / 2, np.abs(v_groups))
    variance = np.einsum("bhrng,bhngkd->bhrnd", sw * sw / 12, v_groups * v_groups)
    bound = np.einsum("bhrn,bhrnd->bhrd", st.omega, worst)
    sigma = np.sqrt(np.einsum("bhrn,bhrnd->bhrd", st.omega ** 2, variance))
    return bound.reshape(q.shape), sigma.reshape(q.shape)


def rounding_tie_slack(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                       target: str = "gfx936", fragments=None, **block_sizes) -> np.ndarray:
    """Per output: how much W elements sitting on a rounding tie may move it.

    A tie that rounds the other way changes Wq by 1, so the output by
    omega_n * sW * |Vq|. Returns the sum over all tie elements (usually zero),
    shaped like q: the fragment-level comparison allows exactly that.
    """
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, **block_sizes)
    groups = _groups(st, target, fragments)
    w_groups = st.w[..., groups]
    amax = np.abs(w_groups).max(axis=-1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax == 0, 0, F32(127) / amax).astype(F32)
    steps = w_groups * inverse[..., None]
    ties = np.abs(steps - np.floor(steps) - 0.5) < TIE_WINDOW
    v_groups = np.abs(st.v_blocks[:, :, :, groups, :].astype(np.float64))
    per_block = np.einsum("bhrngk,bhngkd->bhrnd", ties * (amax / 127)[..., None], v_groups)
    return np.einsum("bhrn,bhrnd->bhrd", st.omega, per_block).reshape(q.shape)


def qk_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float) -> np.ndarray:
    """Standard deviation of the INT8-QK error in the output, shaped like q.

    Quantizing a query row perturbs each score by d_i = scale * sum_d eQ_d K_id
    with eQ uniform in [-sQ/2, sQ/2], so sd(d_i) = scale * sQ * |K_i| / sqrt(12).
    To first order the output moves by sum_i P_i d_i (V_i - O), whose standard
    deviation this returns (exact softmax P and output O on the dequantized cache).
    """
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = group_rows(np.asarray(q, dtype=np.float64), k.shape[1])
    _, sq = quantize(rows.astype(F32))
    scale = float(F32(softmax_scale))
    scores = np.einsum("bhrd,bhsd->bhrs", rows, k_deq) * scale
    scores = np.where(visible(q.shape, k.shape[1], k.shape[2]), scores, -np.inf)
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
