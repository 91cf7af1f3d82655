"""The contract's divisions and exp2 (docs/design.md §2) as f32 IR. The divisions
are correctly rounded where the contract uses them, by fewer instructions than a
checked division (which tests its operands' range and branches to a slow path):

    y = reciprocal(d)                     RN(1/d), once per divisor
    q = divide_by_reciprocal(x, d, y)     x / d from y: one multiply, two FMAs
    q = levels_over(L, a, approximate)    L / a for a W group's inverse, from the
                                          hardware's approximate reciprocal
    e = exp2(x)                           2^x within 2 ulps, where no hardware exp2 is used

`scalar_ir` re-exports them; the kernels call them as `contract.<name>`.
"""

from __future__ import annotations

from typing import Callable

from iree.compiler import ir
from iree.compiler.dialects import arith, math

from .constants import LN_2


def _f32(value: float) -> ir.Value:
    return arith.constant(ir.F32Type.get(), float(value))


def divide_by_reciprocal(x: ir.Value, divisor: ir.Value, y: ir.Value) -> ir.Value:
    """x / divisor by y = RN(1/divisor) and one FMA correction: q0 = x y,
    r = fma(-divisor, q0, x), q = fma(r, y, q0). Correctly rounded wherever the
    residual r is exact (Markstein's theorem), which it is unless it falls below the
    subnormal grid: x >= 2^-102 for every divisor of at most 2^10 (checked over 1.7e8
    pairs, benchmarks/results/2026-12-05-nogpu-sass-mix/); below that, an ulp at most.
    Three f32 instructions where a checked division issues about ten; y is computed once per
    divisor (a constant, or `reciprocal` of a row's sum)."""
    q0 = arith.mulf(x, y)
    return math.fma(math.fma(arith.negf(divisor), q0, x), y, q0)


def reciprocal(divisor: ir.Value) -> ir.Value:
    """y = RN(1 / divisor): the correctly rounded division, once per divisor."""
    return arith.divf(_f32(1.0), divisor)


# A divisor from here up is scaled by 2^-64 before its reciprocal (`levels_over`).
LARGE_DIVISOR = 2.0 ** 64


def levels_over(levels: ir.Value, a: ir.Value,
                approximate: Callable[[ir.Value], ir.Value]) -> ir.Value:
    """L / a correctly rounded for the quantizable a (2^-118 <= a < 2^128) and L = 127
    or 255, from a reciprocal `approximate` within 1 ulp whose subnormals may flush
    (PTX's rcp.approx.ftz): one Newton step y = fma(y0, fma(-a, y0, 1), y0), then
    `divide_by_reciprocal`. An a >= 2^64 is scaled by 2^-64 first and the quotient
    after (both exact: the quotient stays normal), so y0 stays far from the
    subnormals. No range check and no branch, where a checked division tests its
    operands and branches to a slow path (a warp's four W groups then reduce and
    divide one after the other). Bitwise `arith.divf` for every such a and y0 within
    1 ulp of 1/a (tests/test_levels_over.py); rcp.approx.ftz.f32 is within 1 ulp for
    every x it gets here, checked on hardware by benchmarks/rcp_approx_ulps.py
    (benchmarks/results/2026-12-05-h100-rcp-approx-ulps/)."""
    large = arith.cmpf(arith.CmpFPredicate.OGE, a, _f32(LARGE_DIVISOR))
    k = arith.select(large, _f32(1.0 / LARGE_DIVISOR), _f32(1.0))
    scaled = arith.mulf(a, k)
    y0 = approximate(scaled)
    y = math.fma(y0, math.fma(arith.negf(scaled), y0, _f32(1.0)), y0)
    return arith.mulf(divide_by_reciprocal(levels, scaled, y), k)


def exp2(x: ir.Value) -> ir.Value:
    """2^x for the softmax's x = s - m <= 0 (or NaN, -inf): within 2 ulps wherever 2^x
    is normal, +0 for x < -126.5 (tests/test_exp2_contract.py): 2^n * exp(f ln 2) with
    n = roundeven(x) clamped to [-127, 128] and f = x - n (exact; |f| <= 1/2 but where
    n is clamped), 2^n built from its bits and 2^-127 as +0. The exponent f ln 2 is
    rounded relative to |f| <= 1/2 only: IREE's math.exp2 of x itself lost 56 ulps at
    x = -126 on llvm-cpu, and on ROCm became a device-library call. A kernel whose
    hardware has an exp2 takes that instead (`TargetSpec.exp2`)."""
    f32, i32 = ir.F32Type.get(), ir.IntegerType.get_signless(32)
    n = arith.minimumf(arith.maximumf(math.roundeven(x), _f32(-127.0)), _f32(128.0))
    fraction = math.exp(arith.mulf(arith.subf(x, n), _f32(LN_2)))
    # NaN x: any n will do (the fraction is NaN); fptosi of a NaN is poison
    number = arith.cmpf(arith.CmpFPredicate.OEQ, n, n)
    exponent = arith.fptosi(i32, arith.select(number, n, _f32(0.0)))
    bits = arith.shli(arith.addi(exponent, arith.constant(i32, 127)), arith.constant(i32, 23))
    return arith.mulf(fraction, arith.bitcast(f32, bits))
