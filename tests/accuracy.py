"""A compiled module's output against both references, with derived tolerances.

Tolerances scale with the largest dequantized value |V| (outputs are convex
combinations of V rows), so the same check holds for caches of any magnitude;
for a standard-normal cache (max |V| ~ 4) they are the 5e-5 and 2e-6 of
test_numerics.py.

- vs the fragment-level reference: FRAGMENT_TOL * max|V| plus the exact
  effect of W elements on a rounding tie (`rounding_tie_slack`).
- vs the exact reference, always: the hard bounds of W rounding (int8/bf16)
  and of INT8 QK (`qk_quantization_error_bound`), plus f32 rounding.
- vs the exact reference, statistically: 6 sd of the first-order INT8-QK and
  W-rounding models, plus the hard bound on what the first-order QK model
  leaves out (its second-order remainder) and the tie slack.
"""

from __future__ import annotations

import numpy as np

from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics

FRAGMENT_TOL = 1.25e-5  # x max|V|
FLOAT_SLACK = 5e-7      # x max|V|: f32 rounding of module and references
SIGMAS = 6.0
# What the INT8-QK bounds and the bf16 rounding model are evaluated with, whatever the
# module's variant: one-term Q (its bounds still hold for two terms, docstring below).
ONE_TERM_Q = ONE_TERM_NUMERICS


def pv_rounding_scale(args, scale, pv, numerics: Numerics, model="gfx936", **block_sizes):
    """(hard bound, sd) of the pv's W rounding vs f32 PV (int8: of `numerics`' W, in the
    groups of `model`)."""
    if pv == "int8":
        return ref.w_quantization_error_scale(*args, scale, numerics=numerics, model=model,
                                              **block_sizes)
    if pv == "bf16":
        return ref.bf16_rounding_error_scale(*args, scale, numerics=ONE_TERM_Q, **block_sizes)
    return np.zeros(args[0].shape), np.zeros(args[0].shape)


def check_against_references(out, args, scale, pv="int8", numerics: Numerics = Numerics(),
                             model="gfx936", **block_sizes) -> dict[str, float]:
    """Assert every tolerance above; return the measured errors (relative to max|V|).

    `numerics` is the module's variant, default the contract's `Numerics()` (the cpu
    pipeline's). With q-terms 2 the one-term INT8-QK bounds still hold (the two-term
    Q error is smaller: |q - Qq1*s1 - Qq2*s2| <= s2/2 <= s1/254), so they stay as they
    are (ONE_TERM_Q). With w-quant u8 the W rounding bounds use its step sW = a/255;
    with w-terms 2 the second term's step max|r|/127 (r the first term's residual).
    `model` names the W groups (a chained model's too); `block_sizes` (partition_tokens,
    tile_tokens) are the module's.
    """
    q, k, k_scale, v, v_scale = args
    value_scale = float(np.abs(v.astype(np.float64) * v_scale[..., None]).max())
    assert np.isfinite(out).all(), "non-finite output for finite inputs"
    fragment = ref.fragment_attention(*args, scale, pv=pv, numerics=numerics, model=model,
                                      **block_sizes)
    exact = ref.exact_attention(*args, scale).astype(np.float64)
    ties = ref.rounding_tie_slack(*args, scale, pv=pv, numerics=numerics, model=model,
                                  **block_sizes)
    frag_err = np.abs(out.astype(np.float64) - fragment)
    frag_tol = FRAGMENT_TOL * value_scale + ties
    assert (frag_err <= frag_tol).all(), \
        f"vs fragment reference: {(frag_err - frag_tol).max():.3e} beyond tolerance"

    exact_err = np.abs(out - exact)
    slack = FLOAT_SLACK * value_scale
    w_bound, w_sd = pv_rounding_scale(args, scale, pv, numerics, model, **block_sizes)
    qk_hard, qk_beyond_first_order = ref.qk_quantization_error_bound(*args, scale,
                                                                     numerics=ONE_TERM_Q)
    hard = w_bound * (1 + 1e-4) + qk_hard + frag_tol + slack
    assert (exact_err <= hard).all(), f"vs exact: beyond the hard bound by {(exact_err - hard).max():.3e}"
    qk_sd = ref.qk_quantization_error_scale(*args, scale, numerics=ONE_TERM_Q)
    statistical = SIGMAS * np.sqrt(qk_sd ** 2 + w_sd ** 2) + qk_beyond_first_order + ties + slack
    worst = float(np.max(exact_err / np.where(statistical > 0, statistical, np.inf),
                         initial=0.0, where=exact_err > 0))
    assert (exact_err <= statistical).all(), \
        f"vs exact: {worst:.2f} x the statistical tolerance ({SIGMAS} sd + remainder)"
    unit = value_scale or 1.0
    return {"fragment": float(frag_err.max()) / unit, "exact": float(exact_err.max()) / unit,
            "exact_vs_tolerance": worst}


def attention_inputs(rng, shape, mode, key_outliers=False):
    """(q, k, k_scale, v, v_scale) of a dense graph of `shape` (B, Hq, Hkv, S, Sq, D):
    Gaussian q, keys and values, the cache quantized per token; `key_outliers` scales 4
    of each KV head's channels by 30-60 before the keys are quantized, as LLM keys have."""
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    q_shape = (batch, q_heads, head_dim) if mode == "decode" else \
        (batch, q_heads, query_tokens, head_dim)
    q = rng.standard_normal(q_shape).astype(np.float32)
    keys = rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32)
    if key_outliers:
        for h in range(kv_heads):
            channels = rng.choice(head_dim, 4, replace=False)
            keys[:, h, :, channels] *= rng.uniform(30, 60, 4).astype(np.float32)[:, None, None]
    k, k_scale = ref.quantize_cache(keys)
    v, v_scale = ref.quantize_cache(
        rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    return q, k, k_scale, v, v_scale
