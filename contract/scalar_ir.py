"""The quantization contract (docs/design.md §2) as scalar f32 IR, one definition.

    a   = max_j |x_j|                       absmax_step / absmax_merge (NaN propagates)
    s   = a == inf ? NaN : a / 127          quantize_scale   (a NaN gives NaN / 127 = NaN)
    inv = (a >= 2^-118 and a < inf) ? 127 / a : 0                        quantize_inverse
    q   = fptosi(inv == 0 ? 0 : roundeven(clamp(x * inv, -127, 127)))    quantize_value
          (= clamp(roundeven(x * inv)); roundeven as y + 1.5*2^23 - 1.5*2^23; the
          lane kernels take the integer from the bits of y + 1.5*2^23: `to_int`)

Where x is quantized against its own row's absmax (`own_absmax`, all but contiguous (wrong)
W groups on request), only the lower bound of the clamp is built: the upper one is implied. Every
x of the row has |x| <= a, and inv = fl(L / a) <= (L / a)(1 + 2^-24) for the levels L
(127, 255), so fl(x * inv) <= fl(L (1 + 2^-24)) <= L + ulp(L), which rounds to L (ulp(L)
< 1/2). The lower one is implied as well (x >= -a; W >= 0 for unsigned W), but where the
backend contracts (IREE's llvm-cpu on x86 does) something must stay between the multiply
and the rounding add, or they fuse into an FMA, which rounds the exact product instead:
there the lower bound's max is built. The lane kernels (their conversions through the
bias, `bias_bits`) build neither bound: NVPTX and AMDGPU contract no multiply and add
the IR does not mark contractable (NVPTX writes both with .rn, which ptxas may not fuse;
tests/test_ptx_mix.py checks the prefill's PTX).

A zero or tiny row (a < QUANTIZE_MIN_ABSMAX) gives q = 0, s = a/127; a row holding
NaN or Inf gives q = 0, s = NaN; fptosi never sees a NaN or an out-of-range value.

Unsigned W (w-quant=u8, docs/design.md §2c), for W >= 0 (a = max|W| = max W):

    s   = a == inf ? NaN : a / 255                      quantize_scale(..., unsigned=True)
    inv = (a >= 2^-118 and a < inf) ? 255 / a : 0       quantize_inverse(..., unsigned=True)
    Wq  = fptosi(inv == 0 ? 0 : clamp(roundeven(W * inv), 0, 255)) - 128   (as s8)
                                                        quantize_unsigned_value
    acc = sum Wq*Vq + 128 * sum Vq  (int32, over one MMAC's tokens)   unsigned_offset

so a skipped group (u = 0) contributes exactly 0 and the MMAC stays s8 x s8.

Two-term W (w-terms=2, docs/design.md §2c): a second, signed INT8 term of each group
quantizes what the first left over, with the signed rule above:

    r   = fma(-f32(level), sW1, W)     level = Wq (s8) or Wq + 128 (u8)   w_residual
    Wq2, sW2 = quantize(r) over the same group; acc2 = sum Wq2*Vq (int32, same MMAC set)

the residual rounded once, as q's second term (q_residual).

PV's sums into O (docs/design.md §2), per term of W, one FMA per MMAC group:

    o = +0;  o = fma(f32(acc_g), sW_g, o)  for the groups in order      accumulate_pv

(each product and its add rounded once, as reference.pv_chain; a backend must not be
left to choose whether it fuses them).

The scores are in log2 units (docs/design.md §2): each query row's scale is taken
times c = softmax_scale * log2 e once (`score_row_scale`), and the softmax is exp2
(`exp2`, where the hardware's is not used).

Every compiler consumer builds the contract from these functions: lower-quantize
inside its linalg.generic bodies, the lane-level kernels on the per-lane
scalars of a row or W group. The numpy reference (reference/common.py) stays the
independent statement of the same rules; both read contract/constants.py.

Each function builds its ops at the current insertion point and location. The
constants come from one `QuantizeConstants`, built once where it dominates every use
(`quantize_constants()`, or with the caller's own constant builder, e.g. a kernel's
cached `Lanes.f32`). The max reductions must be NaN-propagating (`arith.maximumf`,
never `maxnumf`): a NaN anywhere in a row has to reach its absmax, and from there
its scale. Only ordered compare predicates (oeq, oge, olt) are used.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from iree.compiler import ir
from iree.compiler.dialects import arith, math

from .elementary import divide_by_reciprocal, exp2, levels_over, reciprocal  # noqa: F401
from .constants import (EXACT_BIAS_RANGE, MAX_W_V_PRODUCT, QMAX,  # noqa: F401
                        QUANTIZE_MIN_ABSMAX, ROUND_BIAS, ROUND_BIAS_BITS, UMAX, DIGIT_BASE,
                        DIGIT_ROUND_BIAS, LEVEL_BYTE, W_OFFSET)

class QuantizeConstants(NamedTuple):
    qmax: ir.Value        # 127
    qmin: ir.Value        # -127
    zero: ir.Value
    inf: ir.Value
    nan: ir.Value
    min_absmax: ir.Value  # QUANTIZE_MIN_ABSMAX = 2^-118
    round_bias: ir.Value  # ROUND_BIAS = 1.5 * 2^23
    umax: ir.Value | None = None   # 255, built only for unsigned W
    # The i32 bits of ROUND_BIAS, built only where the caller converts through the bias
    # (`to_int`, `exact_f32`); None: fptosi / sitofp.
    bias_bits: ir.Value | None = None


def _f32(value: float) -> ir.Value:
    return arith.constant(ir.F32Type.get(), float(value))


def quantize_constants(f32: Callable[[float], ir.Value] = _f32, unsigned: bool = False,
                       i32: Callable[[int], ir.Value] | None = None) -> QuantizeConstants:
    """The contract's f32 constants, made with `f32` (default: arith.constant here);
    `unsigned` adds 255 for unsigned W; `i32` (an i32 constant builder) the bias's
    bits, for the conversions through the bias (`to_int`, `exact_f32`)."""
    return QuantizeConstants(f32(QMAX), f32(-QMAX), f32(0.0), f32(float("inf")),
                             f32(float("nan")), f32(QUANTIZE_MIN_ABSMAX), f32(ROUND_BIAS),
                             f32(UMAX) if unsigned else None,
                             i32(ROUND_BIAS_BITS) if i32 is not None else None)


def absmax_step(acc: ir.Value, x: ir.Value) -> ir.Value:
    """One element into a running absmax: max(acc, |x|), NaN-propagating."""
    return arith.maximumf(acc, math.absf(x))


def absmax_merge(a: ir.Value, b: ir.Value) -> ir.Value:
    """Two partial absmaxes (e.g. across lanes) into one, NaN-propagating."""
    return arith.maximumf(a, b)


def balanced(values: list[ir.Value], combine: Callable) -> ir.Value:
    """`combine` over `values` as a balanced tree: log2(n) dependent steps where a
    chain takes n - 1. Only for an order-free combine (`arith.maximumf`: exact, and
    NaN-propagating in any order); a sum's rounding depends on its order."""
    level = list(values)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
    return level[0]


def reduce(values: list[ir.Value], combine: Callable) -> ir.Value:
    """`combine` over a lane's `values`: a max as a `balanced` tree (the same value in
    any order), anything else (a sum) in the values' order. (The references sum by
    numpy's pairwise rule, so either order is within their tolerance; balanced row sums
    made the prefill slower: benchmarks/results/2026-12-05-h100-prefill-reciprocal/.)"""
    if combine is arith.maximumf:
        return balanced(values, combine)
    total = values[0]
    for x in values[1:]:
        total = combine(total, x)
    return total


def absmax(values: list[ir.Value], c: QuantizeConstants) -> ir.Value:
    """max_j |x_j| of a lane's elements (0 for none), by `balanced`: the value of
    `absmax_step` from 0 over them in any order (every |x| is >= +0)."""
    if not values:
        return c.zero
    return balanced([math.absf(x) for x in values], absmax_merge)


def quantize_scale(amax: ir.Value, c: QuantizeConstants, unsigned: bool = False,
                   tiny_exact: bool = True) -> ir.Value:
    """s = a / 127 (a / 255 unsigned), NaN when the row held NaN (a is NaN) or Inf.

    With `tiny_exact` False (a kernel whose s multiplies only its own row's levels,
    never stored), the quotient is a multiply by y = RN(1/L) and one FMA correction,
    q0 = a y, r = fma(-L, q0, a), s = fma(r, y, q0): correctly rounded wherever a / L
    is normal (r is then exact, a multiple of ulp(q0)), which every quantizable a
    (>= 2^-118) gives, for every mantissa (tests/test_quantize_contract.py); below the
    threshold, where every level is 0 and no output can see s, it may be an ulp off.
    Three instructions where the checked division takes eleven."""
    is_inf = arith.cmpf(arith.CmpFPredicate.OEQ, amax, c.inf)
    levels = UMAX if unsigned else QMAX
    if tiny_exact:
        quotient = arith.divf(amax, c.umax if unsigned else c.qmax)
    else:
        quotient = divide_by_reciprocal(amax, _f32(levels), _f32(float(
            np.float32(1.0) / np.float32(levels))))
    return arith.select(is_inf, c.nan, quotient)


def quantize_inverse(amax: ir.Value, c: QuantizeConstants, unsigned: bool = False,
                     approximate: Callable[[ir.Value], ir.Value] | None = None) -> ir.Value:
    """127 / a (255 / a unsigned), or 0 where the row quantizes to zero (a tiny,
    zero, NaN or Inf). The quotient is the correctly rounded division: `arith.divf`,
    or, given the hardware's `approximate` reciprocal, `levels_over`."""
    quantizable = arith.andi(arith.cmpf(arith.CmpFPredicate.OGE, amax, c.min_absmax),
                             arith.cmpf(arith.CmpFPredicate.OLT, amax, c.inf))
    levels = c.umax if unsigned else c.qmax
    quotient = (arith.divf(levels, amax) if approximate is None
                else levels_over(levels, amax, approximate))
    return arith.select(quantizable, quotient, c.zero)


def round_even(x: ir.Value, c: QuantizeConstants) -> ir.Value:
    """roundeven(x) for the bounded x * inv of the contract (see ROUND_BIAS)."""
    return arith.subf(arith.addf(x, c.round_bias), c.round_bias)


def to_int(clamped: ir.Value, inverse: ir.Value, c: QuantizeConstants,
           width: int, fine: bool = False) -> ir.Value:
    """The i`width` roundeven(clamped) (clamped to a level range within 2^22), 0 where
    the group's `inverse` is 0: fptosi of `round_even`; or, with `c.bias_bits`, the
    bits of the biased sum: 1.5*2^23 + n has the bits ROUND_BIAS_BITS + n (an add, where
    the GPUs convert at a quarter of their f32 rate). The bias's bits end in a zero
    byte, so the low byte is n's: an i8 is exactly the level, an i32 (`width` 32) is
    the level in its low byte and the bias's bits above it (`LEVEL_BYTE`). An i32 also
    skips the zero of a skipped group: clamped is x * 0 there, so its level is 0 for
    finite x, and for a non-finite group (NaN's bits) its scale is NaN, which every
    product of the group's sum then carries: a consumer of i32 levels multiplies each
    group's sum by that group's scale (an MMA whose K is one group) and keeps them from
    every other reader (the digits and the unsigned levels are made from one, the
    cache write takes i8s). With `fine`, roundeven(clamped * DIGIT_BASE) (the digits'
    levels): through the bias 1.5*2^15 (DIGIT_ROUND_BIAS, bits ending in a zero byte
    too), whose sums step by 1/DIGIT_BASE, or fptosi of the exactly scaled value."""
    int_type = ir.IntegerType.get_signless(width)
    i32 = ir.IntegerType.get_signless(32)
    if c.bias_bits is None:
        scaled = arith.mulf(clamped, _f32(DIGIT_BASE)) if fine else clamped   # exact
        steps = round_even(scaled, c)
        skipped = arith.cmpf(arith.CmpFPredicate.OEQ, inverse, c.zero)
        return arith.fptosi(int_type, arith.select(skipped, c.zero, steps))
    if width != LEVEL_BYTE:
        skipped = arith.cmpf(arith.CmpFPredicate.OEQ, inverse, c.zero)
        clamped = arith.select(skipped, c.zero, clamped)
    biased = arith.addf(clamped, _f32(DIGIT_ROUND_BIAS) if fine else c.round_bias)
    return _narrow(arith.bitcast(i32, biased), width)


def through_bias(bound: int, c: QuantizeConstants) -> bool:
    """Does an i32 sum with |sum| <= bound cross to f32 through the bias's bits (a
    lane kernel's constants, bound <= 2^22)? Then its MMAs may start from
    ROUND_BIAS_BITS instead of 0 (`exact_f32(..., biased=True)`)."""
    return c.bias_bits is not None and bound <= EXACT_BIAS_RANGE


def exact_f32(value: ir.Value, bound: int, c: QuantizeConstants,
              biased: bool = False) -> ir.Value:
    """f32 of an i32 sum with |value| <= bound: sitofp; or, where `through_bias`,
    `to_int` backwards (the bits ROUND_BIAS_BITS + value are the f32 1.5*2^23 + value,
    exactly; less the bias, exactly value). `biased`: `value` already holds
    ROUND_BIAS_BITS + the sum (its MMA started from it). Bitwise sitofp's."""
    f32 = ir.F32Type.get()
    if not through_bias(bound, c):
        return arith.sitofp(f32, value)
    bits = value if biased else arith.addi(value, c.bias_bits)
    return arith.subf(arith.bitcast(f32, bits), c.round_bias)


def _clamp(y: ir.Value, bottom: ir.Value, top: ir.Value | None, own_absmax: bool,
           c: QuantizeConstants) -> ir.Value:
    """clamp(y, bottom, top), the bounds left out that are implied (x against its own
    row's absmax) and need not keep the multiply and the rounding add apart: all of
    them in the lane kernels (`c.bias_bits`), whose backends do not contract (module
    docstring)."""
    if own_absmax and c.bias_bits is not None:
        return y
    low = arith.maximumf(y, bottom)
    return low if own_absmax else arith.minimumf(low, top)


def quantize_value(x: ir.Value, inverse: ir.Value, c: QuantizeConstants,
                   width: int = 8, own_absmax: bool = True) -> ir.Value:
    """i8 of x against its row's `quantize_inverse`: 0 where the inverse is 0. With
    `width` 32 an i32 whose low byte is the i8 (`LEVEL_BYTE`), for a caller that packs
    four into a word itself; `own_absmax` False where the inverse is another row's
    (contiguous (wrong) W groups, on request): then the clamp is whole."""
    clamped = _clamp(arith.mulf(x, inverse), c.qmin, c.qmax, own_absmax, c)
    return to_int(clamped, inverse, c, width)


def quantize_unsigned_value(w: ir.Value, inverse: ir.Value, c: QuantizeConstants,
                            width: int = 8, own_absmax: bool = True) -> ir.Value:
    """The s8 `u - 128` of W against its group's unsigned `quantize_inverse`:
    u = clamp(roundeven(W * inv), 0, 255), u = 0 where the inverse is 0 (`width` and
    `own_absmax` as for `quantize_value`)."""
    clamped = _clamp(arith.mulf(w, inverse), c.zero, c.umax, own_absmax, c)
    u = to_int(clamped, inverse, c, 32)
    i32 = ir.IntegerType.get_signless(32)
    return _narrow(arith.subi(u, arith.constant(i32, W_OFFSET)), width)


def _narrow(value: ir.Value, width: int) -> ir.Value:
    """An i32 holding a level in its low byte as i`width` (32: as it is, `LEVEL_BYTE`)."""
    return value if width == 32 else arith.trunci(ir.IntegerType.get_signless(width), value)


def quantize_digits(w: ir.Value, inverse: ir.Value, c: QuantizeConstants,
                    unsigned: bool = False, width: int = 8) -> tuple[ir.Value, ir.Value]:
    """Two-term W as digits (reference.quantize_w_digits): the i8 (high, low) of
    t = clamp(roundeven((W * inv) * BASE)) on the first term's levels times BASE
    (t = 0 where `inverse`, the group's `quantize_inverse`, is 0), high = (t + BASE/2)
    >> log2(BASE) stored as the first term stores its level, low = t - high * BASE
    (`width` as for `quantize_value`)."""
    i32 = ir.IntegerType.get_signless(32)
    levels = UMAX if unsigned else QMAX
    # W * inv on the first term's levels, then rounded on BASE-times finer ones
    # (`to_int(fine=True)`; inv * BASE would overflow for a < 2^-112).
    bottom = c.zero if unsigned else _f32(-levels)
    # the digits are always of W's own group: the bounds implied (module docstring)
    clamped = _clamp(arith.mulf(w, inverse), bottom, None, True, c)
    t = to_int(clamped, inverse, c, 32, fine=True)
    half, shift = (arith.constant(i32, v) for v in (DIGIT_BASE // 2,
                                                     DIGIT_BASE.bit_length() - 1))
    high = arith.shrsi(arith.addi(t, half), shift)
    # low = t - high * BASE: high * BASE ends in a zero byte, so low's byte is t's
    low = t
    if unsigned:
        high = arith.subi(high, arith.constant(i32, W_OFFSET))
    return _narrow(high, width), _narrow(low, width)


def join_digits(high: ir.Value, low: ir.Value) -> ir.Value:
    """The int32 sum of W's digits' MMAC sums: high * BASE + low (exact: < 2^31)."""
    i32 = ir.IntegerType.get_signless(32)
    shift = arith.constant(i32, DIGIT_BASE.bit_length() - 1)
    return arith.addi(arith.shli(high, shift), low)


def join_digits_f32(high: ir.Value, low: ir.Value, bound: int, c: QuantizeConstants,
                    biased: bool = False, in_i32: bool = False) -> ir.Value:
    """f32 of `join_digits` for digit sums |high|, |low| <= bound: sitofp of the int32
    join (always with `in_i32`: a shift-add and one conversion, the sums unbiased); or,
    where `through_bias`, fma(f32(high), BASE, f32(low)), each sum through the bias's
    bits (`biased` as for `exact_f32`). One rounding of the same exact value either
    way: bitwise the same."""
    if in_i32 or not through_bias(bound, c):
        assert not biased, "an integer join takes the sums as they are"
        return arith.sitofp(ir.F32Type.get(), join_digits(high, low))
    return math.fma(exact_f32(high, bound, c, biased), _f32(DIGIT_BASE),
                    exact_f32(low, bound, c, biased))


def digit_scale(scale: ir.Value) -> ir.Value:
    """The low digit's scale, sW1 / BASE (exact: a power of two)."""
    return arith.mulf(scale, _f32(1.0 / DIGIT_BASE))


def unsigned_offset(acc: ir.Value, column_sum: ir.Value) -> ir.Value:
    """acc + 128 * column_sum (i32): the MMAC's sum of Wq*Vq, compensated to sum u*Vq."""
    i32 = ir.IntegerType.get_signless(32)
    return arith.addi(acc, arith.muli(column_sum, arith.constant(i32, W_OFFSET)))


def w_level(wq: ir.Value, unsigned: bool) -> ir.Value:
    """The integer (i32) a stored Wq (an i8, or an i32 holding it in its low byte,
    `LEVEL_BYTE`) stands for: Wq (s8), or u = Wq + 128 (u8)."""
    i32 = ir.IntegerType.get_signless(32)
    if wq.type == i32:
        wq = arith.trunci(ir.IntegerType.get_signless(8), wq)
    level = arith.extsi(i32, wq)
    return arith.addi(level, arith.constant(i32, W_OFFSET)) if unsigned else level


def w_residual(w: ir.Value, wq: ir.Value, scale: ir.Value, unsigned: bool) -> ir.Value:
    """What the second INT8 term of W quantizes: W - f32(level)*sW1 rounded once
    (the first term's level from `w_level`), as reference.w_residual states it."""
    return q_residual(w, w_level(wq, unsigned), scale)


def accumulate_pv(total: ir.Value, value: ir.Value, scale: ir.Value) -> ir.Value:
    """One MMAC group's f32 sum `value`, times its W scale, into the running O
    `total` (+0 before the first group): fma(value, scale, total), rounded once."""
    return math.fma(value, scale, total)


def causal_last_key(query_token: ir.Value, history: int | ir.Value,
                    index: Callable[[int], ir.Value]) -> ir.Value:
    """The last key (0..S-1) new query token `query_token` (0..Sq-1, the last Sq of S)
    sees under the causal prefill mask (docs/design.md §2): history + query_token,
    history = S - Sq (an int, or an index value for a paged sequence's own length).
    `index` makes an index constant."""
    return arith.addi(query_token, index(history) if isinstance(history, int) else history)


def causal_visible(token: ir.Value, query_token: ir.Value, history: int | ir.Value,
                   index: Callable[[int], ir.Value]) -> ir.Value:
    """The causal prefill mask: key `token` is visible to `query_token` iff
    token <= `causal_last_key`."""
    return arith.cmpi(arith.CmpIPredicate.ule, token,
                      causal_last_key(query_token, history, index))


def q_residual(x: ir.Value, qq: ir.Value, scale: ir.Value) -> ir.Value:
    """What the second INT8 term of q quantizes: x - f32(Qq1)*s1, rounded once
    (fma(-f32(Qq1), s1, x)), as reference.quantize_q states it."""
    return math.fma(arith.negf(arith.sitofp(ir.F32Type.get(), qq)), scale, x)


def score_terms(sums: list[ir.Value], scales: list[ir.Value]) -> ir.Value:
    """The QK terms of a score before sK: f32(acc1) * s1, or with two terms
    fma(f32(acc1), s1, f32(acc2) * s2) -- the second product rounded, the first
    product and the sum rounded once (reference.int8_scores). The FMA is the contract's
    because LLVM contracts a multiply feeding an add on every CPU with FMA (the cpu
    pipeline at x86-64-v3 and up), which at large softmax scales moved scores in log2
    units past the fragment tolerance; written out, every backend computes it."""
    if len(sums) == 1:
        return arith.mulf(sums[0], scales[0])
    first, second = zip(sums, scales)
    return math.fma(first[0], first[1], arith.mulf(*second))


def score_row_scale(sq: ir.Value, c: ir.Value) -> ir.Value:
    """A query row's (or term's) score scale sQ * c, rounded once, c = `score_scale`
    (softmax_scale * log2 e): the score is then (f32(acc) * (sQ * c)) * sK, in log2
    units, as reference.int8_scores states it."""
    return arith.mulf(sq, c)
