"""How far INT8 results may be from the references, per output element."""

from __future__ import annotations

import numpy as np

from ..contract.numerics import Numerics
from ..fragments import FragmentModel, pv_model_named
from ..contract.constants import DIGIT_BASE
from .common import (F32, group_rows, quantization_inverse, quantize,
                     quantize_digits, quantize_q, quantize_w, visible, w_residual)
from .fragment import blocks_for

# Two f32 implementations of the contract (different exp, summation order)
# give W values a few ulps apart; an element whose W*127/max lies this close
# to a .5 tie (in units of one quantization step) may round either way.
TIE_WINDOW = 2e-4
# Likewise for pv=bf16: a W whose f32 bits lie within this many f32 ulps of a
# bf16 rounding midpoint may round to either neighbour.
BF16_TIE_ULPS = 32


def _groups(st, model, fragments: FragmentModel | None):
    return (fragments or pv_model_named(model)).token_groups(st.w.shape[-1])


def _last_term(w_groups, numerics: Numerics):
    """The values the last INT8 term of W quantizes, its levels per step and its scale:
    W itself (one term; as digits, on DIGIT_BASE times finer steps), or the residual
    (two terms, signed: 127 levels)."""
    w_quant = numerics.w_quant
    levels = 255 if w_quant == "u8" else 127
    if numerics.w_terms == 1:
        return w_groups, levels, quantize_w(w_groups, w_quant)[1]
    if numerics.w_digits:
        return w_groups, levels * DIGIT_BASE, quantize_digits(w_groups, numerics.unsigned_w)[1][1]
    first = quantize_w(w_groups, w_quant)
    residual = w_residual(w_groups, *first, w_quant)
    return residual, 127, quantize(residual)[1]


def w_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                               model: str = "gfx936", fragments=None,
                               numerics: Numerics = Numerics(), **block_sizes):
    """Hard bound and standard deviation of INT8 PV minus f32 PV.

    They differ only by the W rounding term sum_n omega_n sum_i eW_i Vq_i with
    |eW_i| <= sW/2 (sW of the group consuming token i). The bound puts every
    |eW| at sW/2 with the worst signs; the standard deviation takes eW uniform
    in [-sW/2, sW/2]. A group whose max a is below QUANTIZE_MIN_ABSMAX is set to
    zero (|eW| <= a): that deterministic part is added to both. Shaped like q.
    sW is a/127 (w-quant s8) or a/255 (u8: the offset compensation is exact).
    With two-term W the error is the second term's rounding of the residual
    r = W - level1*sW1: the same, with sW = max|r|/127 and a = max|r| (the first
    term's rounding is carried exactly into r). `numerics` is the module's variant
    (its q-terms sets the W values); `block_sizes` as for `blocks_for`.
    """
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, numerics=numerics,
                    **block_sizes)
    groups = _groups(st, model, fragments)
    values, _, sw = _last_term(st.w[..., groups], numerics)           # sw: [B,Hkv,R,N,G]
    amax = np.abs(values.astype(np.float64)).max(axis=-1)
    flushed = quantization_inverse(amax) == 0
    v_groups = st.v_blocks[:, :, :, groups, :].astype(np.float64)     # [B,Hkv,N,G,K,D]
    sw = np.where(flushed, 0, sw).astype(np.float64)
    worst = np.einsum("bhrng,bhngkd->bhrnd", sw / 2, np.abs(v_groups))
    variance = np.einsum("bhrng,bhngkd->bhrnd", sw * sw / 12, v_groups * v_groups)
    zeroed = np.einsum("bhrng,bhngkd->bhrnd", np.where(flushed, amax, 0), np.abs(v_groups))
    bound = np.einsum("bhrn,bhrnd->bhrd", st.omega, worst + zeroed)
    sigma = np.sqrt(np.einsum("bhrn,bhrnd->bhrd", st.omega ** 2, variance)) + \
        np.einsum("bhrn,bhrnd->bhrd", st.omega, zeroed)
    return bound.reshape(q.shape), sigma.reshape(q.shape)


def rounding_tie_slack(q, k, k_scale, v, v_scale, softmax_scale: float, *, pv: str = "int8",
                       model: str = "gfx936", fragments=None,
                       numerics: Numerics = Numerics(), **block_sizes) -> np.ndarray:
    """Per output: how much W elements sitting on a rounding tie may move it.

    pv=int8: a tie that rounds the other way changes Wq by 1, so the output by
    omega_n * sW * |Vq| (sW = a/127, or a/255 with w-quant u8). pv=bf16: a W next to a
    bf16 midpoint moves by one bf16 ulp (<= 2^-7 |W|). pv=f32 has no rounding of W.
    Returns the sum over all tie elements (usually zero), shaped like q: the
    fragment-level comparison allows exactly that. `numerics` is the module's variant
    (its q-terms sets the W values); `block_sizes` as for `blocks_for` (partition_tokens,
    tile_tokens).

    Two-term W: the same few-ulp differences of W, TIE_WINDOW first-term steps
    sW1 wide, are TIE_WINDOW * sW1 / sW2 (~ 0.05) steps of the second term, whose
    elements within that of a tie may move by sW2 each; a first-term tie flips
    level1 by 1, which the residual absorbs: both sides' W~ stay within sW2/2 <=
    sW1/254 of W, so such a group's elements may differ by sW1/254 each. As digits
    W is rounded once, on steps sW1/BASE: the same window is BASE times as many of
    them, and a tie moves the element by one fine step.
    """
    if pv == "f32":
        return np.zeros(q.shape)
    w_quant, w_terms = numerics.w_quant, numerics.w_terms
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, numerics=numerics,
                    **block_sizes)
    if pv == "bf16":
        low_bits = (st.w.view(np.uint32) & 0xFFFF).astype(np.int64)
        near = np.abs(low_bits - 0x8000) <= BF16_TIE_ULPS
        moves = near * np.abs(st.w.astype(np.float64)) * 2.0 ** -7
        tokens = np.arange(st.w.shape[-1])
        return _output_moves(moves, st.omega, st.v_blocks, tokens).reshape(q.shape)
    groups = _groups(st, model, fragments)
    w_groups = st.w[..., groups]
    amax = np.abs(w_groups).max(axis=-1)
    levels = 255 if w_quant == "u8" else 127
    steps = w_groups * (quantization_inverse(amax) * F32(levels / 127))[..., None]
    ties = np.abs(steps - np.floor(steps) - 0.5) < TIE_WINDOW
    step1 = (amax / levels).astype(np.float64)
    if w_terms == 1:
        moves = ties * step1[..., None]
    elif numerics.w_digits:
        fine = steps.astype(np.float64) * DIGIT_BASE
        ties = np.abs(fine - np.floor(fine) - 0.5) < TIE_WINDOW * DIGIT_BASE
        moves = ties * (step1 / DIGIT_BASE)[..., None]
    else:
        residual, _, sw2 = _last_term(w_groups, numerics)
        amax2 = np.abs(residual).max(axis=-1)
        steps2 = residual.astype(np.float64) * quantization_inverse(amax2)[..., None]
        sw2 = sw2.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            window = np.where(sw2 > 0, TIE_WINDOW * step1 / sw2, 0)
        ties2 = np.abs(steps2 - np.floor(steps2) - 0.5) < window[..., None]
        flipped = ties.any(axis=-1, keepdims=True)
        moves = ties2 * sw2[..., None] + flipped * (step1 / 254)[..., None]
    return _output_moves(moves, st.omega, st.v_blocks, groups).reshape(q.shape)


def _output_moves(moves, omega, v_blocks, tokens) -> np.ndarray:
    """sum over blocks n and their elements e of omega [b,h,r,n] * moves [b,h,r,n,*e]
    * |V| of the element's token (`tokens[*e]`, an index into the block's tokens of
    v_blocks [b,h,n,t,d]), as [b,h,r,d] in float64. Only the elements near a tie move:
    where they are few (one-term W), they are summed one by one."""
    flat = moves.reshape(moves.shape[:4] + (-1,))
    if np.count_nonzero(flat) * 16 > flat.size:
        v_rows = np.abs(v_blocks[:, :, :, tokens.reshape(-1)].astype(np.float64))
        per_block = np.einsum("bhrne,bhned->bhrnd", flat, v_rows)
        return np.einsum("bhrn,bhrnd->bhrd", omega, per_block)
    b, h, r, n, e = np.nonzero(flat)
    out = np.zeros(omega.shape[:3] + v_blocks.shape[-1:])
    weight = flat[b, h, r, n, e] * omega[b, h, r, n]
    v_rows = np.abs(v_blocks[b, h, n, tokens.reshape(-1)[e]].astype(np.float64))
    np.add.at(out, (b, h, r), weight[:, None] * v_rows)
    return out


def bf16_rounding_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                              numerics: Numerics = Numerics(), **block_sizes):
    """Hard bound and standard deviation of BF16 PV minus f32 PV, shaped like q.

    bf16 keeps 8 significant bits: |W - bf16(W)| <= 2^-8 |W|, uniform in that
    interval for the standard deviation. `numerics` is the module's variant (its
    q-terms sets the W values).
    """
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, numerics=numerics,
                    **block_sizes)
    half_ulp = np.abs(st.w.astype(np.float64)) * 2.0 ** -8
    v_blocks = st.v_blocks.astype(np.float64)
    worst = np.einsum("bhrnt,bhntd->bhrnd", half_ulp, np.abs(v_blocks))
    variance = np.einsum("bhrnt,bhntd->bhrnd", half_ulp ** 2 / 3, v_blocks ** 2)
    bound = np.einsum("bhrn,bhrnd->bhrd", st.omega, worst)
    sigma = np.sqrt(np.einsum("bhrn,bhrnd->bhrd", st.omega ** 2, variance))
    return bound.reshape(q.shape), sigma.reshape(q.shape)


def _q_error(rows, numerics: Numerics) -> tuple[np.ndarray, np.ndarray]:
    """Per query row: (the step sQ whose rounding is q's error, the largest |eQ_d|).

    One term: eQ = q - Qq1*s1, |eQ| <= s1/2. As digits: |eQ| <= s1/(2*BASE). Two
    scaled terms (docs/design.md §2c): the first
    term's rounding is carried into the residual r = q - Qq1*s1, so eQ = r - Qq2*s2,
    |eQ| <= s2/2, plus the f32 rounding of r (<= 2^-24 |r| <= 2^-25 s1). A row that
    quantizes to zero (absmax below QUANTIZE_MIN_ABSMAX) is off by its absmax.
    """
    q_terms = numerics.q_terms
    rows = np.asarray(rows, dtype=F32)
    terms = quantize_q(rows, q_terms, numerics.q_second)
    if numerics.q_digits:      # one rounding on steps s1 / BASE
        amax = np.abs(rows).max(axis=-1).astype(np.float64)
        step = terms[1][1].astype(np.float64)
        return step, np.where((quantization_inverse(amax) == 0) & np.isfinite(amax), amax,
                              step / 2)
    values = rows if q_terms == 1 else rows.astype(np.float64) - \
        terms[0][0].astype(np.float64) * terms[0][1].astype(np.float64)[..., None]
    amax = np.abs(values).max(axis=-1).astype(np.float64)
    step = terms[-1][1].astype(np.float64)
    largest = np.where((quantization_inverse(amax) == 0) & np.isfinite(amax), amax, step / 2)
    if q_terms == 2:
        largest = largest + terms[0][1].astype(np.float64) * 2.0 ** -25
    return step, largest


def qk_quantization_error_scale(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                                numerics: Numerics = Numerics()) -> np.ndarray:
    """Standard deviation of the INT8-QK error in the output, shaped like q.

    Quantizing a query row perturbs each score by d_i = scale * sum_d eQ_d K_id
    with eQ uniform in [-sQ/2, sQ/2], so sd(d_i) = scale * sQ * |K_i| / sqrt(12).
    To first order the output moves by sum_i P_i d_i (V_i - O), whose standard
    deviation this returns (exact softmax P and output O on the dequantized cache).
    `numerics.q_terms=2`: sQ is the second term's step s2 (`_q_error`); W's variant
    plays no part.
    """
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = group_rows(np.asarray(q, dtype=np.float64), k.shape[1])
    sq, _ = _q_error(rows, numerics)
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


def qk_quantization_error_bound(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                                numerics: Numerics = Numerics()):
    """Hard bounds on the INT8-QK error in the output, shaped like q.

    Each score moves by |d_i| <= delta_i = scale * sK_i * max|eQ| * sum_d |Kq_id|
    (plus f32 rounding of the score), max|eQ| = sQ/2 for one term (`_q_error`
    for two: `numerics.q_terms`). With delta the row's largest, every
    softmax weight changes by a factor within e^(+-2 delta), so the output moves
    by at most (e^(2 delta) - 1) * h, h the half range of the visible V_d.
    Returns (that bound, the part of it beyond the first-order term of
    `qk_quantization_error_scale`: (2 delta^2 e^(2 delta) + e^(2 delta) - 1 - 2 delta) * h).
    The score error grows with softmax_scale, and exponentially so in the bound:
    the softmax turns a score error d into a relative weight error e^d - 1.
    """
    k64 = k.astype(np.float64)
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = group_rows(np.asarray(q, dtype=F32), k.shape[1])
    _, largest = _q_error(rows, numerics)
    scale = float(F32(softmax_scale))
    k_deq = k64 * k_scale[..., None]
    scores = np.abs(np.einsum("bhrd,bhsd->bhrs", rows.astype(np.float64), k_deq)) * scale
    per_token = scale * k_scale.astype(np.float64)[:, :, None, :] * \
        largest[..., None] * np.abs(k64).sum(axis=-1)[:, :, None, :]
    per_token = per_token * (1 + 1e-5) + 1e-6 * scores
    seen = visible(q.shape, k.shape[1], k.shape[2])                 # [R or 1, S]
    delta = np.where(seen, per_token, 0).max(axis=-1)[..., None]     # [B,Hkv,R,1]
    half_range = _visible_half_range(v_deq, seen)                    # [B,Hkv,R,D]
    with np.errstate(over="ignore", invalid="ignore"):
        growth = np.expm1(2 * delta)
        remainder = 2 * delta ** 2 * np.exp(2 * delta) + growth - 2 * delta
        hard, beyond = growth * half_range, remainder * half_range
    hard = np.where(half_range == 0, 0, hard)
    beyond = np.where(half_range == 0, 0, beyond)
    return hard.reshape(q.shape), beyond.reshape(q.shape)


def _visible_half_range(v_deq: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """(max - min)/2 of V_d over each row's visible tokens: [B,Hkv,R,D]."""
    # Visible sets are prefixes (all tokens, or causal): use running extrema.
    highest = np.maximum.accumulate(v_deq, axis=2)
    lowest = np.minimum.accumulate(v_deq, axis=2)
    last = seen.shape[1] - 1 - np.argmax(seen[:, ::-1], axis=1)     # last visible token
    return (highest[:, :, last] - lowest[:, :, last]) / 2
