"""A W group's inverse L / a from the hardware's reciprocal (contract.levels_over): for
every quantizable a (2^-118 <= a < 2^128), L = 127 or 255, and a first reciprocal y0
anywhere within one ulp of 1/a (PTX's rcp.approx.ftz.f32 promises 1 ulp), the result
is the correctly rounded quotient, bitwise what a checked division gives.

Checked on a numpy emulation with the exactly rounded f32 fma (reference.common.fma_f32),
for every mantissa at one binade, at the binades around the scaling and the range's
ends, and on random a over the whole range; and on the scalar IR in the lane simulator,
its reciprocal made an ulp wrong on purpose. The premise on the hardware (PTX's
rcp.approx.ftz.f32 within one ulp for every such a) is `benchmarks/rcp_approx_ulps.py`'s,
run on an H100 over every f32 of the domain (benchmarks/results/2026-12-05-h100-rcp-approx-ulps/rows.json)."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from iree.compiler import ir
from iree.compiler.dialects import arith, memref

from conftest import seeded_rng, simulate_workgroup
from int8attn.contract import scalar_ir as contract
from int8attn.contract.constants import QUANTIZE_MIN_ABSMAX
from int8attn.contract.elementary import LARGE_DIVISOR
from int8attn.reference.common import fma_f32
from test_divide_by_reciprocal import correctly_rounded

F32 = np.float32
LEVELS = (127.0, 255.0)
STEPS = (-1, 0, 1)       # y0 as RN(1/a) moved by this many ulps


def step(x: np.ndarray, ulps: int) -> np.ndarray:
    """x moved `ulps` ulps (positive x)."""
    return (x.view(np.int32) + np.int32(ulps)).view(F32)


def emulated(levels: float, a: np.ndarray, ulps: int) -> np.ndarray:
    """levels_over in numpy, its y0 `ulps` ulps from RN(1/a')."""
    k = np.where(a >= F32(LARGE_DIVISOR), F32(1 / LARGE_DIVISOR), F32(1)).astype(F32)
    scaled = (a * k).astype(F32)
    y0 = step((F32(1) / scaled).astype(F32), ulps)
    y = fma_f32(y0, fma_f32(-scaled, y0, F32(1)), y0)
    q0 = (F32(levels) * y).astype(F32)
    return (fma_f32(fma_f32(-scaled, q0, F32(levels)), y, q0) * k).astype(F32)


def binade(exponent: int) -> np.ndarray:
    """Every f32 in [2^exponent, 2^(exponent + 1))."""
    mantissas = np.arange(1 << 23, dtype=np.int32)
    return (mantissas | np.int32((exponent + 127) << 23)).view(F32)


def assert_correctly_rounded(a: np.ndarray) -> None:
    for levels in LEVELS:
        want = correctly_rounded(np.full_like(a, levels), a)
        for ulps in STEPS:
            got = emulated(levels, a, ulps)
            wrong = np.flatnonzero(got.view(np.int32) != want.view(np.int32))
            assert not wrong.size, (f"{levels} / a, y0 {ulps:+d} ulp: {wrong.size} wrong, "
                                    f"first a = {a[wrong[0]]!r}")


def test_every_mantissa_of_one_binade():
    assert_correctly_rounded(binade(0))


@pytest.mark.parametrize("exponent", [-118, 63, 64, 127])
def test_the_binades_at_the_scaling_and_the_ends(exponent):
    # 2^-118: the smallest quantizable a; 2^63 / 2^64: either side of the scaling;
    # 2^127: the largest finite a, whose unscaled reciprocal would be subnormal
    a = binade(exponent)[::7]
    assert_correctly_rounded(a)


def test_random_a_over_the_whole_range():
    seed = 151
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    low = F32(QUANTIZE_MIN_ABSMAX).view(np.int32)
    high = F32(np.finfo(F32).max).view(np.int32)
    a = rng.integers(low, high, size=1_000_000, endpoint=True).astype(np.int32).view(F32)
    assert_correctly_rounded(a)


def test_without_the_scaling_the_largest_a_go_wrong():
    # what the scaling is for: the same steps on the unscaled a of the top binade,
    # whose 1/a is subnormal and flushes (ftz), lose the quotient
    a = binade(127)[::4099]
    y0 = F32(1) / a
    y0 = np.where(y0 < F32(2.0 ** -126), F32(0), y0)
    y = fma_f32(y0, fma_f32(-a, y0, F32(1)), y0)
    q0 = (F32(127) * y).astype(F32)
    unscaled = fma_f32(fma_f32(-a, q0, F32(127)), y, q0)
    want = correctly_rounded(np.full_like(a, 127), a)
    assert (unscaled != want).all()
    assert np.array_equal(emulated(127.0, a, 0), want)


@pytest.mark.parametrize("ulps", STEPS)
def test_the_contract_ir_gives_the_checked_division(ulps):
    # the scalar IR in the lane simulator, its reciprocal RN(1/x) moved `ulps` ulps:
    # bitwise arith.divf for every a
    seed = 152 + ulps
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    threads, width = 64, 32
    exponents = rng.uniform(-118, 128, threads * width)
    a = np.exp2(exponents).astype(F32).reshape(threads, width)
    a[0, :4] = [QUANTIZE_MIN_ABSMAX, LARGE_DIVISOR, np.nextafter(F32(LARGE_DIVISOR), F32(0)),
                np.finfo(F32).max]
    fast, checked = np.zeros_like(a), np.zeros_like(a)

    def approximate(x):
        i32 = ir.IntegerType.get_signless(32)
        exact = arith.divf(arith.constant(ir.F32Type.get(), 1.0), x)
        moved = arith.addi(arith.bitcast(i32, exact), arith.constant(i32, ulps))
        return arith.bitcast(ir.F32Type.get(), moved)

    def body(lanes, views):
        values, fast_out, checked_out = views
        levels = arith.constant(ir.F32Type.get(), 127.0)
        for j in range(width):
            at = [lanes.thread, lanes.index(j)]
            x = memref.load(values, at)
            memref.store(contract.levels_over(levels, x, approximate), fast_out, at)
            memref.store(arith.divf(levels, x), checked_out, at)

    simulate_workgroup("levels_over", [a, fast, checked], threads, body)
    assert np.array_equal(fast.view(np.int32), checked.view(np.int32))
    assert np.array_equal(checked, correctly_rounded(np.full_like(a, 127), a))


def test_the_hardware_check_says_what_it_needs():
    # benchmarks/rcp_approx_ulps.py: a usage error for exponents outside the normal
    # range, a message (no traceback) where there is no GPU, torch or triton (the GPUs
    # hidden, so that a machine with one refuses too)
    script = Path(__file__).parents[1] / "benchmarks" / "rcp_approx_ulps.py"
    bad = subprocess.run([sys.executable, str(script), "--low-exponent", "5",
                          "--high-exponent", "2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "-126 <= low < high <= 127" in bad.stderr
    no_gpu = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    missing = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             env=no_gpu)
    assert missing.returncode == 2 and "rcp_approx_ulps needs" in missing.stderr
    assert "Traceback" not in missing.stderr
