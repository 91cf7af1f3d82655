"""The numpy references implement the contract of docs/design.md §2."""

import numpy as np

from conftest import decode_inputs, seeded_rng
from int8attn import reference as ref


def test_quantize_rounds_to_nearest_even_and_clamps():
    x = np.array([[127.0, 0.5, 1.5, -2.5, -127.0, 63.5]], dtype=np.float32)
    q, s = ref.quantize(x)
    assert s.tolist() == [1.0]
    assert q.tolist() == [[127, 0, 2, -2, -127, 64]]


def test_quantize_of_zeros_is_zero_not_nan():
    q, s = ref.quantize(np.zeros((2, 8), dtype=np.float32))
    assert not q.any() and not s.any()


def test_quantize_error_is_within_half_a_step():
    x = seeded_rng(1).standard_normal((64, 128)).astype(np.float32)
    q, s = ref.quantize(x)
    assert np.abs(q).max() == 127
    assert (np.abs(q * s[:, None] - x) <= s[:, None] / 2 * (1 + 1e-6)).all()


def test_round_to_bf16():
    x = np.array([1.0, 1.00390625, 1.005859375, 1.0 + 2 ** -8 + 2 ** -9, -3.0e-5], dtype=np.float32)
    out = ref.round_to_bf16(x)
    # 1+2^-8 is a tie between 1 and 1+2^-7: to even (1.0); just above rounds up.
    assert out[:4].tolist() == [1.0, 1.0, 1.0078125, 1.0078125]
    assert (out.view(np.uint32) & 0xFFFF == 0).all()
    assert abs(out[4] - x[4]) <= abs(x[4]) * 2 ** -8


def test_fragment_reference_with_f32_pv_equals_exact_up_to_qk_quantization():
    args = decode_inputs(3, 1, 4, 2, 300, 64)
    scale = 0.125
    f32_pv = ref.fragment_attention(*args, scale, pv="f32", numerics=ref.ONE_TERM_NUMERICS)
    exact = ref.exact_attention(*args, scale)
    sd = ref.qk_quantization_error_scale(*args, scale, numerics=ref.ONE_TERM_NUMERICS)
    assert (np.abs(f32_pv - exact) <= 6 * sd + 1e-6).all()


def test_exact_attention_is_softmax_weighted_v():
    # A one-hot softmax (one dominant key) returns that token's value.
    rng = seeded_rng(4)
    k = np.zeros((1, 1, 5, 8), dtype=np.int8)
    k[0, 0, 3] = 127
    k_scale = np.ones((1, 1, 5), dtype=np.float32)
    v = rng.integers(-127, 128, (1, 1, 5, 8)).astype(np.int8)
    v_scale = np.full((1, 1, 5), 0.01, dtype=np.float32)
    q = np.ones((1, 1, 8), dtype=np.float32)
    out = ref.exact_attention(q, k, k_scale, v, v_scale, 1.0)
    np.testing.assert_allclose(out[0, 0], v[0, 0, 3] * 0.01, atol=1e-6)
