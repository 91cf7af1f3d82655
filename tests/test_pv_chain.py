"""PV's groups into O as a chain of FMAs (docs/design.md §2), the same bits everywhere.

`reference.pv_chain` states the rule (o = +0, then o = fma(f32(acc_g), sW_g, o) per
group); `reference.common.fma_f32` is its exactly rounded f32 FMA, checked here
against rational arithmetic. The cpu pipeline's rescale (pv-to-mmac) is compiled for
each x86-64 level and must give the reference's bits, on data where a rounded product
then a rounded add would not (so a backend that split the FMA, or a lowering that
built two ops, fails). The lane kernels' chain is checked by the kernel tests (both
references) through the simulator, whose fma is `fma_f32`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from conftest import X86_LEVELS, require_runnable, seeded_rng
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS
from int8attn.fragments import fragment_model
from int8attn.passes import LowerMMACTiles, PVToMMAC
from int8attn.pipelines.manager import UpstreamPass, run_passes
from int8attn.reference.common import fma_f32, pv_chain
from int8attn.runtime import LoadedModule
from int8attn.runtime.module import TensorSpec
from int8attn.support.ir import new_context, parse_module

F32 = np.float32


def rounded_exactly(a: F32, b: F32, c: F32) -> F32:
    """fl(a*b + c) from rational arithmetic: the nearest f32, ties to even."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    guess = F32(float(exact))
    around = [np.nextafter(guess, F32(-np.inf)), guess, np.nextafter(guess, F32(np.inf))]
    return min(around, key=lambda y: (abs(Fraction(float(y)) - exact),
                                      int(F32(y).view(np.uint32)) & 1))


def test_fma_f32_rounds_once():
    rng = seeded_rng(9101)
    n = 3000
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(F32)
    # c cancels most of a*b: the sum's low bits are the product's
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(n) * 1e-6)).astype(F32)
    # the exact value a hair past an f32 tie, where rounding through float64 first
    # lands on the tie and then rounds to even: the wrong way
    one = F32(1 + 2.0 ** -12)
    a = np.r_[a, one, one, -one, F32(2.0 ** -75)]
    b = np.r_[b, one, one, one, F32(2.0 ** -75)]
    c = np.r_[c, F32(2.0 ** -80), F32(-2.0 ** -80), F32(-2.0 ** -80), F32(2.0 ** -149)]
    got = fma_f32(a, b, c)
    want = np.array([rounded_exactly(*t) for t in zip(a, b, c)], F32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    through_f64 = (a.astype(np.float64) * b + c).astype(F32)
    assert (through_f64 != want).any(), "no case here needs the round-to-odd step"
    assert got[-4] == F32(1 + 2.0 ** -11 + 2.0 ** -23)


def test_fma_f32_special_values():
    nan, inf = F32(np.nan), F32(np.inf)
    got = fma_f32(np.array([inf, F32(3e38), F32(-0.0), nan, inf]),
                  np.array([F32(1), F32(10), F32(1), F32(1), F32(0)]),
                  np.array([F32(1), -inf, F32(0), F32(1), F32(1)]))
    assert got[0] == inf and got[1] == -inf and np.isnan(got[3]) and np.isnan(got[4])
    assert got[2] == 0 and not np.signbit(got[2])        # -0 + +0 = +0


GROUPS = fragment_model("gfx936").token_groups(64)      # two MMAC groups of 32 tokens
ROWS, HEAD_DIM = 4, 16


def grouped_pv_module() -> str:
    g, k = GROUPS.shape
    table = ", ".join("array<i64: " + ", ".join(map(str, row)) + ">" for row in GROUPS)
    wq = f"tensor<1x1x{ROWS}x1x{g}x{k}xi8>"
    sw = f"tensor<1x1x{ROWS}x1x{g}xf32>"
    v = f"tensor<1x1x1x64x{HEAD_DIM}xi8>"
    out = f"tensor<1x1x{ROWS}x1x{HEAD_DIM}xf32>"
    return f"""func.func @pv(%wq: {wq}, %sw: {sw}, %v: {v}, %o: {out}) -> {out} {{
  %r = "int8attn.grouped_pv"(%wq, %sw, %v, %o) {{groups = [{table}]}} : ({wq}, {sw}, {v}, {out}) -> {out}
  return %r : {out}
}}
"""


def lowered_pv() -> str:
    with new_context():
        module = parse_module(grouped_pv_module(), "pv.mlir")
        run_passes(module, [PVToMMAC(fragment_model="gfx936"), LowerMMACTiles(),
                            UpstreamPass("canonicalize")])
        return str(module)


@pytest.mark.parametrize("target_cpu", sorted(X86_LEVELS))
def test_cpu_rescale_is_the_reference_chain_bitwise(target_cpu):
    vmfb, _ = iree_compile(lowered_pv(), TARGETS["cpu"], target_cpu=target_cpu)
    require_runnable(target_cpu)
    rng = seeded_rng(9102)
    g, k = GROUPS.shape
    wq = rng.integers(-127, 128, (1, 1, ROWS, 1, g, k)).astype(np.int8)
    v = rng.integers(-128, 128, (1, 1, 1, 64, HEAD_DIM)).astype(np.int8)
    # scales with full 24-bit mantissas: products that are rarely exact
    sw = (rng.uniform(0.5, 1.0, (1, 1, ROWS, 1, g)) * 2.0 ** -7).astype(F32)
    # the running O the groups go on from (a prefill tile's alpha o)
    start = (rng.standard_normal((1, 1, ROWS, 1, HEAD_DIM)) * 100).astype(F32)
    signature = [TensorSpec(x.shape, "f32" if x.dtype == F32 else "i8")
                 for x in (wq, sw, v, start)]
    out = LoadedModule(vmfb, {"pv": signature}).call("pv", wq, sw, v, start)[0]
    sums = [np.einsum("bhrnk,bhnkd->bhrnd", wq[..., j, :].astype(np.int64),
                      v[:, :, :, GROUPS[j]].astype(np.int64)) for j in range(g)]
    scales = [sw[..., j, None] for j in range(g)]
    want = pv_chain(sums, scales, start)
    assert np.array_equal(np.asarray(out).view(np.uint32), want.view(np.uint32)), (
        f"max difference {np.abs(out - want).max()} (--target-cpu {target_cpu})")
    two_roundings = start + sum((acc.astype(F32) * s).astype(F32) for acc, s in zip(sums, scales))
    assert (two_roundings != want).any(), "the data cannot tell an FMA from a multiply-add"
