"""Two INT8 digits' MMA sums joined as integers (`DecodeTuning.digits_join_i32`, the
decode's; `TargetSpec.prefill_digits_join_i32`, the prefill's).

A digit pair's sums (two-term Q or W as digits) reach f32 either each through the round
bias's bits and one FMA, high * BASE + low, or as one int32 shift-add and one
conversion, the MMAs then starting from 0. Both round the same exact value once, so
the kernels' outputs are the same bits, on every target, for decode and prefill, for
s8 and u8 W (whose column sums share the accumulator) and with the digits in the MMA
tile's padding rows or in a second MMA. Each output is also checked against both
references. cuda's prefill joins as integers, every other kernel through the bias
(timed on the H200: kernels/target_spec.py).
"""

import numpy as np
import pytest
from iree.compiler import ir

from accuracy import check_against_references
from conftest import seeded_rng
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.kernels.decode import build_decode_kernels, dense_access
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.shapes import DenseShape, PrefillShape
from int8attn.kernels.spec_fields import with_changes
from int8attn.kernels.target_spec import target_spec
from int8attn.simulator.decode import run_dense_kernels
from int8attn.simulator.prefill import run_prefill_kernels
from int8attn.support.ir import new_context
from test_prefill import prefill_inputs

TARGETS = ["gfx936", "gfx942", "cuda"]
SCALE = 0.125
U8_W = KERNEL_TARGET_NUMERICS.updated(w_quant="u8")


def _decode_inputs(seed, batch, q_heads, kv_heads, tokens, dim):
    # K and V levels over the whole int8 range: the digit sums near their bound
    rng = seeded_rng(seed)
    q = (3 * rng.standard_normal((batch, q_heads, dim))).astype(np.float32)
    k = rng.integers(-127, 128, (batch, kv_heads, tokens, dim), dtype=np.int8)
    v = rng.integers(-127, 128, (batch, kv_heads, tokens, dim), dtype=np.int8)
    ks = rng.uniform(0.002, 0.02, (batch, kv_heads, tokens)).astype(np.float32)
    vs = rng.uniform(0.002, 0.02, (batch, kv_heads, tokens)).astype(np.float32)
    return q, k, ks, v, vs


def _both_joins(target, build, run):
    """(outputs, module texts) of `build(spec)` run by `run`, joined through the bias
    and as integers."""
    outs, texts = [], []
    for in_i32 in (False, True):
        spec = with_changes(target_spec(target), {"digits_join_i32": in_i32,
                                                  "prefill_digits_join_i32": in_i32})
        with new_context(), ir.Location.unknown():
            built = build(spec)
            texts.append(str(built.module))
            outs.append(run(built))
    return outs, texts


@pytest.mark.parametrize("numerics", [KERNEL_TARGET_NUMERICS, U8_W], ids=["s8", "u8"])
@pytest.mark.parametrize("q_heads", [4, 16], ids=["gqa2", "gqa8"])
@pytest.mark.parametrize("target", TARGETS)
def test_the_decode_joins_give_the_same_bits(target, q_heads, numerics):
    # GQA 2 puts the low digits in the padding rows of the A tile where the target
    # can, GQA 8 leaves none on gfx942 (a second MMA)
    args = _decode_inputs(4100 + q_heads, 2, q_heads, 2, 300, 64)
    shape = DenseShape(2, 2, q_heads // 2, 300, 64, SCALE)
    outs, texts = _both_joins(
        target,
        lambda spec: build_decode_kernels(dense_access(shape, spec), spec, numerics=numerics),
        lambda built: run_dense_kernels(built.module, built.layout, *args, seed=1))
    np.testing.assert_array_equal(outs[0], outs[1])
    check_against_references(outs[1], args, SCALE, numerics=numerics,
                             model=target)
    # joined as integers: no sum crosses through the bias's bits, each join converts
    assert texts[1].count("arith.sitofp") > texts[0].count("arith.sitofp")


@pytest.mark.parametrize("target", TARGETS)
def test_the_prefill_joins_give_the_same_bits(target):
    shape = (1, 8, 2, 200, 70, 64)
    args = prefill_inputs(4200, *shape)
    b, hq, hkv, s, sq, d = shape
    prefill = PrefillShape(b, hkv, hq // hkv, s, sq, d, SCALE)
    outs, texts = _both_joins(
        target, lambda spec: build_prefill_kernels(prefill, spec, numerics=KERNEL_TARGET_NUMERICS),
        lambda built: run_prefill_kernels(built.module, built.layout, *args))
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])
    assert texts[1].count("arith.sitofp") > texts[0].count("arith.sitofp")


def test_the_schedules_command_takes_the_join_and_refuses_what_it_cannot_read(capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import paged_schedules

    for fields in (["digits_join_i32=1"], ["digit_join=True"], ["q_terms=two"],
                   ["w_quant=x"], ["merge_chunks=2", "merge_chunks=4"], ["merge_unroll=0"],
                   ["--head-dim", "1024"]):
        with pytest.raises(SystemExit):
            paged_schedules.main(["/nonexistent/dir", *fields])
    err = capsys.readouterr().err
    assert "digits_join_i32 takes True or False, not '1'" in err
    assert "'digit_join' is no field of DecodeTuning" in err
    assert "q_terms takes an integer, not 'two'" in err
    assert "numerics w_quant='x': expected one of s8, u8" in err
    assert "merge_chunks is given twice" in err
    assert "merge_unroll=0: each is a count, at least 1" in err
    assert "a head dim of 1024 could overflow" in err
    assert "Traceback" not in err


def test_cuda_joins_the_prefill_as_integers_and_the_decode_through_the_bias():
    # the H200's timings (benchmarks/results/2026-12-05-h200-prefill-digit-join/README.md) choose per kernel
    cuda = target_spec("cuda")
    assert cuda.prefill_digits_join_i32 and not cuda.default_tuning(128).digits_join_i32
    for target in ("gfx936", "gfx942"):
        spec = target_spec(target)
        assert not spec.prefill_digits_join_i32 and not spec.tuning.digits_join_i32
