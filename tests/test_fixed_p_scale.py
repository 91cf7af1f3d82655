"""reference.fixed_p_scale_attention: the prefill with p quantized on the fixed scale
1/127 (the comparison point of benchmarks/prefill_p_scale.py)."""

import numpy as np

from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS


def _inputs(seed, q_heads=4, kv_heads=2, tokens=150, query_tokens=70, head_dim=64):
    rng = seeded_rng(seed)
    q = rng.standard_normal((1, q_heads, query_tokens, head_dim), dtype=np.float32)
    k, ks = ref.quantize_cache(rng.standard_normal((1, kv_heads, tokens, head_dim),
                                                   dtype=np.float32))
    v, vs = ref.quantize_cache(rng.standard_normal((1, kv_heads, tokens, head_dim),
                                                   dtype=np.float32) * 3)
    return q, k, ks, v, vs


def test_p_of_one_is_exact_on_the_fixed_scale():
    # q = 0: every visible score is 0, p = 1 = 127/127, so only V's rounding remains and
    # the fixed-P output is the f32-PV reference's, bit for bit.
    q, k, ks, v, vs = _inputs(7101)
    q[:] = 0
    fixed = ref.fixed_p_scale_attention(q, k, ks, v, vs, 0.125, numerics=ONE_TERM_NUMERICS)
    f32 = ref.fragment_attention(q, k, ks, v, vs, 0.125, pv="f32", numerics=ONE_TERM_NUMERICS)
    np.testing.assert_array_equal(fixed, f32)


def test_the_error_of_p_is_at_most_half_a_level_per_token():
    """|O_fixed - O_f32| <= (0.5/127) * sum over visible tokens |sV Vq| / l with l >= 1
    (the row's maximum contributes exp(0) = 1 to l): a wrong sV, a scale other than
    1/127 or a lost tile breaks it; the fixed scale must also be visibly coarser than the
    per-MMAC dynamic one with two-term W."""
    q, k, ks, v, vs = _inputs(7102)
    for numerics in (ONE_TERM_NUMERICS, DIGIT_NUMERICS):
        fixed = ref.fixed_p_scale_attention(q, k, ks, v, vs, 0.125, numerics=numerics)
        f32 = ref.fragment_attention(q, k, ks, v, vs, 0.125, pv="f32", numerics=numerics)
        dynamic = ref.fragment_attention(q, k, ks, v, vs, 0.125, model="cuda",
                                         numerics=numerics)
        v_abs = np.abs(v.astype(np.float64) * vs[..., None])          # [B,Hkv,S,D]
        tokens, query_tokens = k.shape[2], q.shape[2]
        history = tokens - query_tokens
        seen = np.cumsum(v_abs, axis=2)[:, :, history:history + query_tokens]  # [B,Hkv,Sq,D]
        bound = np.repeat(seen, q.shape[1] // k.shape[1], axis=1) * (0.5 / 127) + 1e-6
        diff = np.abs(fixed.astype(np.float64) - f32)
        assert (diff <= bound).all(), float((diff - bound).max())
        assert diff.max() > 1e-4                                      # it does quantize
        if numerics is DIGIT_NUMERICS:     # W in two digits: far finer than 1/127
            assert np.abs(dynamic - f32).max() < diff.max() / 4
