"""Pieces of the contract shared by the references."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from ..contract.constants import (  # noqa: F401  (the references' names)
    PV_MODES, Q_TERMS, QMAX, QUANTIZE_MIN_ABSMAX, UMAX, DIGIT_BASE, W_OFFSET, W_QUANTS,
    W_TERMS, PVKind,
    QTerms, WQuant, WTerms, score_scale)
from ..contract.numerics import ONE_TERM_NUMERICS, Numerics  # noqa: F401
from ..support.bf16 import round_to_bf16  # noqa: F401  (the references' name)

F32 = np.float32
# About how many bytes of intermediates the references hold at once: they work
# through the query rows in chunks of this size, so their memory stays near
# that of the inputs and outputs. Every row's result depends only on that row,
# so the chunking changes no number.
CHUNK_BYTES = 256 * 2**20


def quantization_inverse(amax: np.ndarray, levels: float = QMAX) -> np.ndarray:
    """127/a (`levels`/a: UMAX for unsigned W), or 0 where the row quantizes to zero
    (a tiny, zero, NaN or Inf): the numpy twin of contract.scalar_ir.quantize_inverse."""
    amax = np.asarray(amax, dtype=F32)
    quantizable = (amax >= F32(QUANTIZE_MIN_ABSMAX)) & (amax < np.inf)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        return np.where(quantizable, F32(levels) / amax, F32(0)).astype(F32)


def quantize_with(x: np.ndarray, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x quantized against `amax` (their own absmax, or contiguous (wrong) W groups')."""
    inverse = quantization_inverse(amax)
    with np.errstate(invalid="ignore"):
        steps = np.clip(np.rint(x * inverse[..., None]), -QMAX, QMAX)
        q = np.where(inverse[..., None] == 0, 0, steps).astype(np.int8)
        scale = np.where(amax == np.inf, np.nan, amax / F32(QMAX)).astype(F32)
    return q, scale


def quantize_unsigned_with(w: np.ndarray, amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned W (w-quant=u8): `u = clamp(rne(W*(255/a)), 0, 255)`, returned as the
    s8 `u - 128`, scale `a/255` (NaN where `a` is Inf or NaN). Where `a` is tiny,
    zero, NaN or Inf, u = 0 (Wq = -128): with the +128 * sum Vq compensation the
    group contributes exactly 0 (times its NaN scale, if any)."""
    amax = np.asarray(amax, dtype=F32)
    inverse = quantization_inverse(amax, UMAX)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        steps = np.clip(np.rint(w * inverse[..., None]), 0, UMAX)
        u = np.where(inverse[..., None] == 0, 0, steps)
        scale = np.where(amax == np.inf, np.nan, amax / F32(UMAX)).astype(F32)
    return (u - W_OFFSET).astype(np.int8), scale


def quantize_w(w: np.ndarray, w_quant: str = "s8",
               amax: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """W groups (last axis) quantized as `w_quant`; `amax` defaults to each group's
    max|W| (= max W, W >= 0); another one gives contiguous (wrong) W groups."""
    if w_quant not in W_QUANTS:
        raise ValueError(f"w quant must be one of {W_QUANTS}, got {w_quant!r}")
    w = np.asarray(w, dtype=F32)
    amax = np.max(np.abs(w), axis=-1) if amax is None else amax
    return quantize_unsigned_with(w, amax) if w_quant == "u8" else quantize_with(w, amax)


def quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 per row (last axis), dialects/int8attn.py's quantize."""
    x = np.asarray(x, dtype=F32)
    return quantize_with(x, np.max(np.abs(x), axis=-1))


def quantize_q(x: np.ndarray, terms: int = 1,
               second: str = "scaled") -> list[tuple[np.ndarray, np.ndarray]]:
    """q rows as `terms` INT8 terms [(Qq1, s1), ...] (docs/design.md §2c).

    `Qq1, s1 = quantize(x)`; with two terms, `Qq2, s2 = quantize(x - Qq1*s1)`,
    the f32 residual quantized by the same rule (a NaN/Inf row's NaN scale makes
    the residual NaN, so the second term is NaN too; a tiny row stays zero).
    The residual is rounded once, as a fused multiply-add `fma(-Qq1, s1, x)`
    (the compiler emits math.fma; `fma_f32` here). With `second`
    "digit", the two terms are the digits of one rounding (`quantize_digits`).
    """
    if terms not in Q_TERMS:
        raise ValueError(f"q terms must be one of {Q_TERMS}, got {terms!r}")
    x = np.asarray(x, dtype=F32)
    if terms == 2 and second == "digit":
        return quantize_digits(x)
    first = quantize(x)
    if terms == 1:
        return [first]
    qq, sq = first
    return [first, quantize(fma_f32(-qq.astype(F32), sq[..., None], x))]


def quantize_cache(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A float cache [B, H, S, D] as int8 with one scale per token."""
    return quantize(x)


def group_rows(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """[B,Hq,D] -> [B,Hkv,G,D];  [B,Hq,Sq,D] -> [B,Hkv,G*Sq,D] (head-major rows)."""
    batch, head_dim = q.shape[0], q.shape[-1]
    return q.reshape(batch, kv_heads, -1, head_dim)


def visible(q_shape, kv_heads: int, tokens: int, rows: slice = slice(None)) -> np.ndarray:
    """bool [R, S]: the tokens each grouped row attends to (all, or causal prefill).

    Prefill queries are the last Sq of the S tokens: query s sits at S - Sq + s.
    `rows` picks some of the R grouped rows (head-major: row r is query r % Sq).
    """
    if len(q_shape) == 3:
        return np.ones((1, tokens), dtype=bool)
    query_tokens = q_shape[2]
    grouped = np.arange(q_shape[1] // kv_heads * query_tokens)[rows]
    position = tokens - query_tokens + grouped % query_tokens
    return np.arange(tokens)[None, :] <= position[:, None]


def row_chunks(rows: int, bytes_per_row: int, progress: Callable[[str], None] | None = None,
               what: str = "reference", q_rows_per_row: int = 1) -> Iterator[slice]:
    """Slices of range(rows), each about CHUNK_BYTES of intermediates (at least one row).

    After each chunk, `progress` (if given) gets e.g. "exact reference: rows
    1024/16384", counted in rows of q (`q_rows_per_row` = B*Hkv of them per grouped row).
    An empty range still gives one (empty) chunk, so the work runs as before.
    """
    step = max(1, CHUNK_BYTES // max(1, bytes_per_row))
    for start in range(0, max(rows, 1), step):
        stop = min(rows, start + step)
        yield slice(start, stop)
        if progress is not None:
            progress(f"{what}: rows {stop * q_rows_per_row}/{rows * q_rows_per_row}")


def pad_tokens(x: np.ndarray, axis: int, size: int, value) -> np.ndarray:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths, constant_values=value)


def int8_scores(q, k, k_scale, softmax_scale, rows: slice = slice(None),
                numerics: Numerics = Numerics()) -> np.ndarray:
    """INT8 QK in f32 and log2 units, [B,Hkv,R,S] (the grouped rows `rows`), masked
    tokens -inf.

    `f32(sum Qq1*Kq)*(s1*c) * sK`, or with two terms
    `fma(f32(sum Qq1*Kq), s1*c, f32(sum Qq2*Kq)*(s2*c)) * sK` (the second product
    rounded, then one FMA; c = `score_scale(softmax_scale)`, softmax_scale * log2 e);
    as digits (q-second "digit"),
    `f32(sum Qq1*Kq * BASE + sum Qq2*Kq) * (s2*c) * sK`. The softmax is exp2 of these.
    """
    terms = quantize_q(group_rows(np.asarray(q, dtype=F32), k.shape[1])[:, :, rows],
                       numerics.q_terms, numerics.q_second)
    keys = np.swapaxes(k, -1, -2)
    sums = [exact_int_matmul(qq, keys) for qq, _ in terms]          # the int32 sums
    if numerics.q_digits:
        numerics.check_head_dim(k.shape[-1])
        sums, terms = [sums[0].astype(np.float64) * DIGIT_BASE + sums[1]], terms[1:]
    c = F32(score_scale(softmax_scale))
    values = [acc.astype(F32) for acc in sums]
    scales = [(sq * c).astype(F32)[..., None] for _, sq in terms]
    if len(values) == 1:
        qk = (values[0] * scales[0]).astype(F32)
    else:       # the second product rounded, then one FMA (scalar_ir.score_terms)
        qk = fma_f32(values[0], scales[0], (values[1] * scales[1]).astype(F32))
    scores = qk * k_scale[:, :, None, :]
    return np.where(visible(q.shape, k.shape[1], k.shape[2], rows), scores, -np.inf).astype(F32)


def exact_int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of int8 matrices, exactly as an int32 matmul, as integer-valued floats.

    Every partial sum is an integer of at most K * 128^2: exact in f32 up to
    2^24 (f64 beyond), so BLAS gives the int32 sums, and converting them to f32
    rounds as converting the int32 would.
    """
    dtype = np.float32 if a.shape[-1] * 128 * 128 <= 2**24 else np.float64
    return np.matmul(a.astype(dtype), b.astype(dtype))


def w_levels(wq: np.ndarray, w_quant: str) -> np.ndarray:
    """The integer each Wq stands for: Wq (s8), or u = Wq + 128 (u8), as int32."""
    return wq.astype(np.int32) + (W_OFFSET if w_quant == "u8" else 0)


def w_residual(w: np.ndarray, wq: np.ndarray, sw: np.ndarray, w_quant: str) -> np.ndarray:
    """What the second INT8 term of W quantizes (two-term W, docs/design.md §2c):
    `fma(-f32(level), sW, W)` per group (w [..., G, K], wq [..., G, K], sw [..., G]),
    level = Wq (s8) or Wq + 128 (u8), rounded once to f32 like `quantize_q`'s
    residual (`fma_f32`). A NaN scale gives NaN."""
    return fma_f32(-w_levels(wq, w_quant).astype(F32), sw[..., None], w)


def quantize_w_terms(w_groups: np.ndarray, numerics: Numerics = Numerics(),
                     amax: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """W groups (last axis) as `numerics.w_terms` INT8 terms [(Wq1, sW1), (Wq2, sW2)]:
    the first by `numerics.w_quant` (against `amax`, default the group's own), the second
    always signed: `quantize` on `w_residual` over the same group (w-second "scaled"),
    or the low digit of W on DIGIT_BASE times finer levels (`quantize_digits`).
    W ~ level1*sW1 + Wq2*sW2."""
    if numerics.w_digits:
        return quantize_digits(w_groups, numerics.unsigned_w, amax)
    first = quantize_w(w_groups, numerics.w_quant, amax)
    if numerics.w_terms == 1:
        return [first]
    return [first, quantize(w_residual(w_groups, *first, numerics.w_quant))]


def quantize_digits(x: np.ndarray, unsigned: bool = False,
                    amax: np.ndarray | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """A two-term value as two INT8 digits (second term "digit", docs/design.md §2c):
    one rounding, t = clamp(roundeven((x * inv) * DIGIT_BASE)) on the first term's levels
    times DIGIT_BASE (inv = 127/a, or 255/a unsigned; t = 0 where inv is 0), rows on
    the last axis against `amax` (default their own absmax); high = (t + BASE/2) >>
    log2(BASE) (unsigned: stored as high - 128), low = t - high * BASE in [-128, 127].
    [(high, s1), (low, s1 / BASE)]: x ~ t * s1 / BASE."""
    x = np.asarray(x, dtype=F32)
    amax = np.max(np.abs(x), axis=-1) if amax is None else np.asarray(amax, dtype=F32)
    levels = UMAX if unsigned else QMAX
    inverse = quantization_inverse(amax, levels)
    with np.errstate(invalid="ignore", over="ignore"):
        # (x * inv) * BASE: exact scaling, where inv * BASE overflows for a < 2^-112
        fine = (x * inverse[..., None]) * F32(DIGIT_BASE)
        t = np.clip(np.rint(fine), 0 if unsigned else -levels * DIGIT_BASE,
                    levels * DIGIT_BASE)
        t = np.where(inverse[..., None] == 0, 0, t).astype(np.int32)
        scale = np.where(amax == np.inf, np.nan, amax / F32(levels)).astype(F32)
    high = np.right_shift(t + DIGIT_BASE // 2, DIGIT_BASE.bit_length() - 1)
    low = t - high * DIGIT_BASE
    stored_high = high - W_OFFSET if unsigned else high
    return [(stored_high.astype(np.int8), scale),
            (low.astype(np.int8), (scale * F32(1 / DIGIT_BASE)).astype(F32))]


def _group_sums(wq: np.ndarray, v_group: np.ndarray) -> np.ndarray:
    """The exact int32 sums of one group: [B,Hkv,R,N,K] x [B,Hkv,N,K,D] -> [B,Hkv,R,N,D].
    (An einsum: many small matmuls through a threaded BLAS can be many times slower.)"""
    return np.einsum("bhrnk,bhnkd->bhrnd", np.ascontiguousarray(wq, dtype=np.int32),
                     np.ascontiguousarray(v_group, dtype=np.int32))


def fma_f32(a, b, c) -> np.ndarray:
    """fma(a, b, c) in f32, rounded once, as the hardware's: the product is exact in
    float64; the float64 sum is made round-to-odd (stepped one ulp toward the exact
    value where it was inexact and its last bit even, the error from TwoSum), so that
    rounding it to f32, 29 bits coarser, rounds the exact value once."""
    a, b, c = (np.asarray(x, F32).astype(np.float64) for x in (a, b, c))
    with np.errstate(invalid="ignore", over="ignore"):
        product = a * b
        total = product + c
        part = total - product
        error = (product - (total - part)) + (c - part)
        even = (total.view(np.int64) & 1) == 0
        step = np.isfinite(total) & (error != 0) & even
        total = np.where(step, np.nextafter(total, np.where(error > 0, np.inf, -np.inf)),
                         total)
        return total.astype(F32)


def pv_chain(sums, scales, start: np.ndarray | None = None) -> np.ndarray:
    """O from exact int32 sums and their scales, the contract's chain (docs/design.md §2):
    o = `start` (+0 where None: a decode partition; a prefill tile's α·o), then
    o = fma(f32(acc), sW, o) for each (term, group) in order
    (contract.scalar_ir.accumulate_pv)."""
    out = np.zeros(np.shape(sums[0]), F32) if start is None else np.asarray(start, F32)
    for acc, sw in zip(sums, scales):
        out = fma_f32(acc.astype(F32), sw, out)
    return out


def int8_pv(w, v_blocks, groups, scale_groups=None, numerics: Numerics = Numerics(),
            start: np.ndarray | None = None) -> np.ndarray:
    """`start` plus sum_g f32(sum_k Wq*Vq [+ 128 * sum_k Vq]) * sW over the fragment
    model's groups, as `pv_chain` of `int8_pv_terms`."""
    sums, scales = int8_pv_terms(w, v_blocks, groups, scale_groups, numerics)
    return pv_chain(sums, scales, start)


def int8_pv_terms(w, v_blocks, groups, scale_groups=None,
                  numerics: Numerics = Numerics()) -> tuple[list, list]:
    """(exact int32 sums [B,Hkv,R,N,D], scales [B,Hkv,R,N,1]) of each (term, group)
    in the chain's order: f32(sum_k Wq*Vq [+ 128 * sum_k Vq]) * sW over the fragment
    model's groups.

    `scale_groups` (default `groups`) are the token sets the scales come from;
    `numerics.w_quant="u8"` adds the offset compensation over the group's own tokens.
    `numerics.w_terms=2` adds the second (signed) term's own sum over the same groups:
    O = sum_g f32(acc1_g)*sW1_g + sum_g f32(acc2_g)*sW2_g, the second term's groups
    after the first's in one chain. As digits (w-second "digit") one int32 joins them
    per group: O = sum_g f32(acc1_g * BASE + acc2_g) * sW2_g.
    """
    w_quant = numerics.w_quant
    w_groups = w[..., groups]                       # [B,Hkv,R,N,G,K]
    amax = None if scale_groups is None else np.abs(w[..., scale_groups]).max(axis=-1)
    terms = quantize_w_terms(w_groups, numerics, amax)
    v_groups = v_blocks[:, :, :, groups, :]         # [B,Hkv,N,G,K,D]
    joined = DIGIT_BASE if numerics.w_digits else 1       # digits: high * BASE + low
    assert groups.shape[1] * 256 * 128 * joined < 2**31, "int32 accumulator overflow"
    if w_quant == "u8":                             # W_OFFSET * sum_k Vq, per (group, d)
        offset = W_OFFSET * v_groups.sum(axis=-2, dtype=np.int32)    # [B,Hkv,N,G,D]
    sums = []                                       # per term, per group, its exact int32 sums
    for term, (wq, _) in enumerate(terms):
        sums.append([_group_sums(wq[..., g, :], v_groups[:, :, :, g]) for g in
                     range(groups.shape[0])])
        if term == 0 and w_quant == "u8":
            sums[0] = [acc + offset[:, :, None, :, g] for g, acc in enumerate(sums[0])]
    if numerics.w_digits:
        sums = [[high * DIGIT_BASE + low for high, low in zip(*sums)]]
        terms = terms[1:]
    chain = [(acc, sw[:, :, :, :, g, None]) for (_, sw), term_sums in zip(terms, sums)
             for g, acc in enumerate(term_sums)]
    return [acc for acc, _ in chain], [sw for _, sw in chain]


def float_pv(w, v_blocks, pv: str) -> np.ndarray:
    w_used = round_to_bf16(w) if pv == "bf16" else w
    return np.einsum("bhrnt,bhntd->bhrnd", w_used, v_blocks.astype(F32)).astype(F32)
