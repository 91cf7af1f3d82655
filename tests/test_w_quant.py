"""Unsigned W (`w_quant="u8"`, docs/design.md §2c) on the tensor-level (cpu) pipeline.

- The quantize rule: u = clamp(rne(W*255/a), 0, 255) stored as u - 128, sW = a/255;
  a group's largest W is exact, a zero W is u = 0, a skipped group (tiny, zero) gives
  u = 0 everywhere and, with the +128 * sum Vq compensation, contributes exactly 0.
- Compiled decode, prefill and paged decode with u8 match the fragment-level reference
  with u8 (tests/accuracy.py: FRAGMENT_TOL * max|V| plus that contract's rounding-tie
  slack) and the exact reference within the u8 W-rounding bounds (|eW| <= sW/2 with
  sW = a/255) plus the INT8-QK bounds.
- The step is a/255 instead of a/127, so INT8 PV vs f32 PV falls about 2x: the compiled
  u8 module's error vs the compiled f32-PV module is asserted below MAX_RATIO = 0.65 of
  the s8 module's, on decode S = 1000 and prefill Sq = 64 (measured, seed 21: 0.56 and
  0.38).
- The verifier's column-sum checks are lit tests (verify-scale-groups-invalid.mlir);
  kernel targets refuse u8 (tests/test_targets.py's REFUSED table).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import int8attn
from accuracy import check_against_references
from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.graph import attention_graph
from test_paged import LENGTHS, paged_batch, paged_graph

MAX_RATIO = 0.65
# W signed or unsigned, q and W in one term each (one-term numerics): the variant under test alone.
W_QUANT = {"s8": ONE_TERM_NUMERICS, "u8": Numerics(q_terms=1, w_quant="u8", w_terms=1)}
# (B, Hq, Hkv, S, Sq, D); Sq is ignored for decode.
SHAPES = {"decode": (1, 8, 2, 1000, 1, 64), "prefill": (1, 4, 2, 300, 64, 64)}


@lru_cache(maxsize=None)
def _compiled(mode, pv, w_quant):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = SHAPES[mode]
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=query_tokens)
    return int8attn.compile(source, filename=f"{mode}.mlir", pv=pv, numerics=W_QUANT[w_quant],
                            cache=False)


def _inputs(seed, mode):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = SHAPES[mode]
    rng = seeded_rng(seed)
    q_shape = (batch, q_heads, head_dim) if mode == "decode" else \
        (batch, q_heads, query_tokens, head_dim)
    q = rng.standard_normal(q_shape).astype(np.float32)
    k, k_scale = ref.quantize_cache(
        rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    v, v_scale = ref.quantize_cache(
        rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    return q, k, k_scale, v, v_scale


def test_unsigned_rule_on_one_group():
    w = np.array([[0.0, 1.0, 0.5, 0.25, 1 / 510, 3 / 510]], np.float32)
    wq, sw = ref.quantize_w(w, "u8")
    assert sw[0] == np.float32(1) / np.float32(255)
    # u = 0, 255, 128 (127.5 rounds to even), 64 (63.75), 0 (0.5 -> even), 2 (1.5 -> even)
    np.testing.assert_array_equal(wq[0].astype(int) + ref.W_OFFSET, [0, 255, 128, 64, 0, 2])
    tiny, scale = ref.quantize_w(np.full((1, 4), 2.0 ** -120, np.float32), "u8")
    assert (tiny.astype(int) + ref.W_OFFSET == 0).all() and scale[0] > 0
    nan_q, nan_s = ref.quantize_w(np.array([[1.0, np.nan]], np.float32), "u8")
    assert (nan_q.astype(int) + ref.W_OFFSET == 0).all() and np.isnan(nan_s[0])


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_unsigned_w_matches_the_fragment_reference(mode):
    args = _inputs(13, mode)
    scale = SHAPES[mode][-1] ** -0.5
    out = _compiled(mode, "int8", "u8")(*args)
    errors = check_against_references(out, args, scale, numerics=W_QUANT["u8"])
    print(f"{mode} w_quant=u8: {errors}")
    # The two contracts differ, so a module that ignored w_quant would fail above.
    signed = ref.fragment_attention(*args, scale, numerics=W_QUANT["s8"])
    unsigned = ref.fragment_attention(*args, scale, numerics=W_QUANT["u8"])
    assert np.abs(signed - unsigned).max() > 10 * np.abs(out - unsigned).max()


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_unsigned_w_halves_the_pv_error(mode):
    args = _inputs(21, mode)
    f32 = _compiled(mode, "f32", "s8")(*args)
    err = {w: float(np.abs(_compiled(mode, "int8", w)(*args) - f32).max()) for w in ("s8", "u8")}
    print(f"{mode}: INT8 PV vs f32 PV max abs {err['s8']:.3e} (s8) -> {err['u8']:.3e} (u8), "
          f"ratio {err['u8'] / err['s8']:.2f}")
    assert err["u8"] <= MAX_RATIO * err["s8"], err


def test_paged_unsigned_w_matches_the_fragment_reference():
    q_heads, kv_heads, head_dim, block_size = 4, 2, 32, 16
    arrays = paged_batch(seeded_rng(6), LENGTHS[:6], q_heads, kv_heads, head_dim, block_size)
    scale = head_dim ** -0.5
    graph = int8attn.compile(paged_graph(q_heads, kv_heads, head_dim, block_size),
                             numerics=W_QUANT["u8"], cache=False)
    out = graph(*arrays)
    q, k, ks, v, vs, tables, lens = arrays
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *ref.sequence_cache(k, ks, v, vs, tables, lens, b))
        check_against_references(out[b:b + 1], dense, scale, numerics=W_QUANT["u8"])


def test_unsigned_w_keeps_nan_zero_and_tiny_rows_to_themselves():
    # A NaN query row poisons only its row (W NaN -> scale NaN, u = 0, acc = 0,
    # 0 * NaN); zero and tiny rows give uniform attention like the reference.
    args = list(_inputs(3, "decode"))
    q = args[0].copy()
    q[0, 0, 5] = np.nan
    q[0, 1] = 0
    q[0, 2] = 2.0 ** -120
    args[0] = q
    scale = SHAPES["decode"][-1] ** -0.5
    out = _compiled("decode", "int8", "u8")(*args)
    fragment = ref.fragment_attention(*args, scale, numerics=W_QUANT["u8"])
    assert np.isnan(out[0, 0]).all() and np.isnan(fragment[0, 0]).all()
    assert np.isfinite(out[0, 1:]).all()
    assert np.abs(out[0, 1:] - fragment[0, 1:]).max() <= 1e-4
