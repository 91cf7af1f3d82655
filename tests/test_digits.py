"""Second terms as digits (q-second / w-second "digit", docs/design.md §2c): the rule.

A value is quantized once on DIGIT_BASE (256) times finer levels than its first term,
t = clamp(roundeven((x * inv) * 256)), and split into a high INT8 digit (the first
term) and a low one (scale s1 / 256). Checked here on the numpy reference:
- the digits are INT8 (high in the first term's range, low in [-128, 127]) and join
  back to t exactly; x ~ t * s1 / 256 within s1 / 512 (plus f32 rounding);
- as accurate as the scaled second term (within a few percent, both ways);
- zero, tiny, NaN and Inf rows follow the contract (zero digits, NaN scale);
- QK and PV with digits join the two integer sums before one conversion, and differ
  from the scaled contract by about one fine step (so a kernel mixing the two is caught);
- the options: digits need two terms, the cpu pipeline refuses them.
"""

import numpy as np
import pytest

from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.contract.constants import DIGIT_BASE, LOG2_E, QMAX, UMAX, W_OFFSET, score_scale
from int8attn.contract.numerics import DIGIT_NUMERICS, Numerics
from int8attn.reference.common import int8_scores, quantize_digits

SCALED = Numerics(q_terms=2, w_quant="s8", w_terms=2)
DIGITS = Numerics(q_terms=2, w_quant="s8", w_terms=2, q_second="digit", w_second="digit")


@pytest.mark.parametrize("unsigned", [False, True], ids=["signed", "unsigned"])
def test_digits_join_to_one_rounding_within_half_a_fine_step(unsigned):
    seed = 401 + unsigned
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    rows = rng.standard_normal((300, 64)).astype(np.float32) * rng.uniform(1e-3, 50, (300, 1))
    rows = np.abs(rows).astype(np.float32) if unsigned else rows.astype(np.float32)
    (high, s1), (low, s2) = quantize_digits(rows, unsigned)
    levels = UMAX if unsigned else QMAX
    level = high.astype(np.int64) + (W_OFFSET if unsigned else 0)
    assert level.min() >= (0 if unsigned else -levels) and level.max() <= levels
    assert low.min() >= -128 and low.max() <= 127
    assert np.array_equal(s2, (s1 * np.float32(1 / DIGIT_BASE)).astype(np.float32))
    t = level * DIGIT_BASE + low
    amax = np.abs(rows).max(axis=-1, keepdims=True).astype(np.float64)
    expected = np.clip(np.rint(rows * (np.float32(levels) / amax.astype(np.float32))
                               * np.float32(DIGIT_BASE)), -levels * DIGIT_BASE,
                       levels * DIGIT_BASE)
    assert np.array_equal(t, expected)               # one rounding, joined exactly
    error = np.abs(t * s2[:, None].astype(np.float64) - rows) / amax
    # half a fine step, plus the f32 rounding of x * inv (|.| < 2^16 after the exact * 256: an ulp is
    # at most 2^-8 of a step)
    bound = 1 / (2 * levels * DIGIT_BASE) * (1 + 2 ** -7)
    assert error.max() <= bound
    # the scaled second term is as accurate, within a few percent
    terms = ref.quantize_w_terms(rows, Numerics(w_quant="u8" if unsigned else "s8"))
    scaled = sum(ref.common.w_levels(wq, "u8" if unsigned and i == 0 else "s8") *
                 s[:, None].astype(np.float64) for i, (wq, s) in enumerate(terms))
    scaled_error = np.abs(scaled - rows) / amax
    print(f"max error / absmax: digits {error.max():.3e}, scaled {scaled_error.max():.3e}")
    assert 0.9 < error.max() / scaled_error.max() < 1.1


def test_zero_tiny_and_non_finite_rows_follow_the_contract():
    rows = np.array([[0.0] * 4, [1e-38, -1e-38, 0, 0], [1.0, np.nan, 2, 3],
                     [np.inf, 1, 2, 3]], np.float32)
    (high, s1), (low, s2) = quantize_digits(rows)
    assert not high.any() and not low.any()
    assert np.isnan(s1[2:]).all() and np.isnan(s2[2:]).all()
    assert np.isfinite(s1[:2]).all()


@pytest.mark.parametrize("unsigned", [False, True], ids=["signed", "unsigned"])
def test_tiny_but_quantizable_rows_get_the_levels_of_any_scale(unsigned):
    # An absmax in [2^-118, 2^-112) is quantized (above the tiny threshold), but
    # inv * 256 overflows f32 there: the rule scales x * inv by 256 instead, so such a
    # row gets the digits of the same row 2^100 times larger, and its scales 2^-100
    # times those (powers of two scale exactly).
    seed = 405 + unsigned
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    exponents = rng.uniform(-118, -112, (64, 1))
    rows = (rng.uniform(-1, 1, (64, 16)) * 2.0 ** exponents).astype(np.float32)
    rows[:, 0] = (2.0 ** exponents[:, 0]).astype(np.float32)    # the absmax, exactly
    rows = np.abs(rows) if unsigned else rows
    (high, s1), (low, s2) = quantize_digits(rows, unsigned)
    (big_high, big_s1), (big_low, big_s2) = quantize_digits(rows * np.float32(2.0 ** 100),
                                                            unsigned)
    assert np.array_equal(high, big_high) and np.array_equal(low, big_low)
    assert np.array_equal(s1, big_s1 * np.float32(2.0 ** -100))
    assert np.abs(high.astype(int) + (W_OFFSET if unsigned else 0)).max() == \
        (UMAX if unsigned else QMAX)        # the absmax element takes the top level


def test_qk_with_digits_joins_the_sums_before_one_conversion():
    seed = 405
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    k = rng.integers(-127, 128, (1, 2, 100, 64)).astype(np.int8)
    k_scale = rng.uniform(0.005, 0.02, (1, 2, 100)).astype(np.float32)
    got = int8_scores(q, k, k_scale, 0.125, numerics=DIGITS)
    (high, _), (low, s2) = quantize_digits(ref.common.group_rows(q, 2))
    keys = np.swapaxes(k, -1, -2).astype(np.int64)
    joined = (high.astype(np.int64) @ keys) * DIGIT_BASE + low.astype(np.int64) @ keys
    c = np.float32(score_scale(0.125))      # the scores are in log2 units
    expected = (joined.astype(np.float32) * (s2 * c)[..., None]) * k_scale[:, :, None, :]
    assert np.array_equal(got, expected.astype(np.float32))
    scaled = int8_scores(q, k, k_scale, 0.125, numerics=SCALED)
    one_term = int8_scores(q, k, k_scale, 0.125, numerics=ref.ONE_TERM_NUMERICS)
    exact = (ref.common.group_rows(q, 2).astype(np.float64) @
             (k * k_scale[..., None]).astype(np.float64).swapaxes(-1, -2)) * 0.125 * LOG2_E
    # both second terms are ~250x finer than one term, and they round differently
    errors = [np.abs(scores - exact).max() for scores in (got, scaled, one_term)]
    print(f"scores vs exact: digits {errors[0]:.2e}, scaled {errors[1]:.2e}, one term "
          f"{errors[2]:.2e}")
    assert max(errors[:2]) < errors[2] / 30
    assert np.abs(got - scaled).max() > 0


def test_the_attention_references_tell_the_two_second_terms_apart():
    seed = 406
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    q = rng.standard_normal((1, 8, 64)).astype(np.float32)
    k, ks = ref.quantize_cache(rng.standard_normal((1, 2, 300, 64)).astype(np.float32))
    v, vs = ref.quantize_cache(rng.standard_normal((1, 2, 300, 64)).astype(np.float32))
    exact = ref.exact_attention(q, k, ks, v, vs, 0.125)
    err = {}
    for name, numerics in (("digits", DIGITS), ("scaled", SCALED),
                           ("one term", Numerics(q_terms=1, w_quant="s8", w_terms=1))):
        err[name] = np.abs(ref.fragment_attention(q, k, ks, v, vs, 0.125, model="cuda",
                                                  numerics=numerics) - exact).max()
    print({name: f"{e:.2e}" for name, e in err.items()})
    assert err["digits"] < err["one term"] / 30 and err["scaled"] < err["one term"] / 30
    assert 0.5 < err["digits"] / err["scaled"] < 2


def test_digits_need_two_terms():
    for field, terms in (("q_second", "q_terms"), ("w_second", "w_terms")):
        with pytest.raises(ValueError, match=f"{field[0]}-second digit .* needs "
                                             f"{field[0]}-terms 2 \\(got 1\\)"):
            Numerics(**{field: "digit", terms: 1})
    assert DIGIT_NUMERICS.q_digits and DIGIT_NUMERICS.w_digits
    assert not Numerics().q_digits and not Numerics().w_digits
    assert DIGITS.describe() == "q-terms 2, w-quant s8, w-terms 2, w-second digit, q-second digit"
