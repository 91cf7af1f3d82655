"""Causal prefill with history: compiled modules against both references.

One-term numerics (one-term Q, s8 W: ONE_TERM_NUMERICS; the pipeline's
defaults are checked in test_w_quant.py and test_q_terms.py). Tolerances as in
test_numerics.py: 5e-5 (plus exact rounding-tie slack) vs the
fragment-level reference; INT8 PV vs f32 PV within the hard W-rounding bound
and 6 sd of the rounding model; vs exact within 6 sd of INT8-QK + W rounding.
"""

from functools import lru_cache

import numpy as np
import pytest

from conftest import ONE_TERM_NUMERICS, seeded_rng
from int8attn import reference as ref

FRAGMENT_TOL = 5e-5
SIGMAS = 6.0
FLOAT_SLACK = 2e-6


@lru_cache(maxsize=None)
def compiled_prefill(batch, q_heads, kv_heads, tokens, query_tokens, head_dim, pv="int8"):
    import int8attn
    from int8attn.driver.graph import prefill_graph

    source = prefill_graph(batch, q_heads, kv_heads, tokens, query_tokens, head_dim)
    return int8attn.compile(source, filename="prefill.mlir", pv=pv, cache=False,
                            numerics=ONE_TERM_NUMERICS)


def prefill_inputs(seed, batch, q_heads, kv_heads, tokens, query_tokens, head_dim):
    rng = seeded_rng(seed)
    q = rng.standard_normal((batch, q_heads, query_tokens, head_dim)).astype(np.float32)
    k, k_scale = ref.quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    v, v_scale = ref.quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    return q, k, k_scale, v, v_scale


CASES = [
    (1, 8, 2, 4096, 1, 128),      # one new token on a 4K history
    (1, 8, 2, 4096, 37, 64),      # Sq not a multiple of anything
    (1, 8, 2, 2048, 128, 128),
    (1, 8, 2, 1000, 1000, 64),    # Sq = S: no history, S not a multiple of 16/32/64
    (2, 4, 1, 77, 77, 128),       # batch > 1
    (1, 4, 1, 1, 1, 64),          # S = 1
]


@pytest.mark.parametrize("shape", CASES, ids=lambda s: "B{}_Hq{}_Hkv{}_S{}_Sq{}_D{}".format(*s))
def test_prefill_against_references(shape):
    seed = sum(shape)
    args = prefill_inputs(seed, *shape)
    scale = shape[-1] ** -0.5
    out = compiled_prefill(*shape)(*args)
    assert np.isfinite(out).all()
    fragment = ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS)
    slack = ref.rounding_tie_slack(*args, scale, numerics=ONE_TERM_NUMERICS)
    frag_err = np.abs(out - fragment)
    assert (frag_err <= FRAGMENT_TOL + slack).all(), f"vs fragment {frag_err.max():.3e}"

    f32_pv = compiled_prefill(*shape, pv="f32")(*args)
    bound, sd_w = ref.w_quantization_error_scale(*args, scale, numerics=ONE_TERM_NUMERICS)
    diff = np.abs(out - f32_pv)
    assert (diff <= bound * (1 + 1e-4) + FLOAT_SLACK).all(), "beyond the hard W-rounding bound"
    assert (diff <= SIGMAS * sd_w + FLOAT_SLACK).all(), f"{(diff / sd_w).max():.2f} sd"

    sd_qk = ref.qk_quantization_error_scale(*args, scale, numerics=ONE_TERM_NUMERICS)
    exact_err = np.abs(out - ref.exact_attention(*args, scale))
    worst = (exact_err / (SIGMAS * np.sqrt(sd_qk ** 2 + sd_w ** 2) + FLOAT_SLACK)).max()
    assert worst <= 1, f"vs exact: {worst * SIGMAS:.2f} sd"
    print(f"prefill {shape}: int8 vs f32 PV max abs {diff.max():.3e}, vs fragment "
          f"{frag_err.max():.3e}")


def test_prefill_baselines():
    shape = (1, 8, 2, 300, 37, 64)
    args = prefill_inputs(7, *shape)
    scale = 0.125
    for pv in ("bf16", "f32"):
        out = compiled_prefill(*shape, pv=pv)(*args)
        expected = ref.fragment_attention(*args, scale, pv=pv, numerics=ONE_TERM_NUMERICS)
        assert np.abs(out - expected).max() <= FRAGMENT_TOL


def test_query_rows_see_only_their_past():
    # Changing the last token changes only the last query's output.
    shape = (1, 4, 1, 200, 3, 64)
    args = list(prefill_inputs(8, *shape))
    graph = compiled_prefill(*shape)
    before = graph(*args)
    args[3] = args[3].copy()
    args[3][0, 0, -1] = -args[3][0, 0, -1]
    args[3][0, 0, -1, 0] = 127
    after = graph(*args)
    assert np.array_equal(before[:, :, :2], after[:, :, :2])
    assert not np.array_equal(before[:, :, 2], after[:, :, 2])


def test_rows_with_fully_masked_leading_tiles():
    # Rows 0 and 1 see nothing in the first two tiles (-inf scores): the
    # m' = -inf guard keeps them NaN-free and equal to the contract.
    import int8attn

    rows, tokens, head_dim = 4, 300, 64
    source = f"""
func.func @tail(%s: tensor<1x1x{rows}x{tokens}xf32>, %v: tensor<1x1x{tokens}x{head_dim}xi8>,
                %vs: tensor<1x1x{tokens}xf32>) -> tensor<1x1x{rows}x{head_dim}xf32> {{
  %o = "int8attn.softmax_pv"(%s, %v, %vs) {{mode = "prefill", query_tokens = {rows} : i64}}
      : (tensor<1x1x{rows}x{tokens}xf32>, tensor<1x1x{tokens}x{head_dim}xi8>,
         tensor<1x1x{tokens}xf32>) -> tensor<1x1x{rows}x{head_dim}xf32>
  return %o : tensor<1x1x{rows}x{head_dim}xf32>
}}"""
    rng = seeded_rng(9)
    scores = rng.standard_normal((1, 1, rows, tokens)).astype(np.float32) * 2
    scores[0, 0, :2, :128] = -np.inf
    history = tokens - rows                     # row r is the query at history + r
    for r in range(rows):
        scores[0, 0, r, history + r + 1:] = -np.inf
    v, v_scale = ref.quantize_cache(rng.standard_normal((1, 1, tokens, head_dim)).astype(np.float32))
    out = int8attn.compile(source, cache=False, numerics=ONE_TERM_NUMERICS)(scores, v, v_scale)
    assert np.isfinite(out).all()
    expected = ref.fragment_softmax_pv(scores, v, v_scale, "prefill", numerics=ONE_TERM_NUMERICS)
    assert np.abs(out - expected).max() <= FRAGMENT_TOL
    # ... and equal to attention over the visible tokens only, up to quantization
    # (softmax_pv's scores are in log2 units: its softmax is exp2).
    seen = slice(128, history + 1)
    p = np.exp2(scores[0, 0, 0, seen] - scores[0, 0, 0, seen].max())
    exact = (p / p.sum()) @ (v[0, 0, seen] * v_scale[0, 0, seen, None])
    assert np.abs(out[0, 0, 0] - exact).max() < 5e-3
