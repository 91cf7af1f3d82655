"""Compiled decode modules against both references.

One-term numerics (one-term Q, s8 W in one term: ONE_TERM_NUMERICS, which these tests
pass to the references), and the pipeline's defaults (two-term Q, u8 W in
two terms) on the
issue-13 targets: Gaussian decode 4K/8K/16K, 32 query rows, INT8 PV vs f32 PV
<= 7e-4 and vs exact <= 1e-3 max abs (tests/accuracy.py's tolerances as well).

Tolerances:
- vs the fragment-level reference (the same contract in numpy, same groups):
  5e-5 absolute. The two differ only by f32 rounding (exp, summation order),
  plus, for the rare W element that sits on a .5 rounding tie and may round
  either way, exactly the change one step of it makes (`rounding_tie_slack`).
- INT8 PV vs f32 PV (the compiled baseline): they differ only by W
  quantization. Every element is within the hard bound sum_p w_p sum_i
  (sW/2)|Vq_i|, and within 6 standard deviations of the uniform-rounding
  model (`w_quantization_error_scale`).
- vs the exact f32 reference: within 6 standard deviations of the combined
  INT8-QK (`qk_quantization_error_scale`) and W-quantization error.
"""

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import compiled_decode, decode_inputs
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.pipelines import PipelineOptions

DEFAULTS = PipelineOptions().numerics
SEED = ONE_TERM_NUMERICS

FRAGMENT_TOL = 5e-5
SIGMAS = 6.0
FLOAT_SLACK = 2e-6  # f32 rounding between module and references


def _check_decode(seed, shape, pv="int8"):
    batch, q_heads, kv_heads, tokens, head_dim = shape
    args = decode_inputs(seed, *shape)
    scale = head_dim ** -0.5
    out = compiled_decode(*shape, pv=pv)(*args)
    fragment = ref.fragment_attention(*args, scale, pv=pv, numerics=SEED)
    exact = ref.exact_attention(*args, scale)
    slack = ref.rounding_tie_slack(*args, scale, numerics=SEED) if pv == "int8" else 0
    frag_err = np.abs(out - fragment)
    assert (frag_err <= FRAGMENT_TOL + slack).all(), \
        f"vs fragment reference {frag_err.max():.3e} (seed {seed})"
    sd_qk = ref.qk_quantization_error_scale(*args, scale, numerics=SEED)
    bound, sd_w = ref.w_quantization_error_scale(*args, scale, numerics=SEED)
    sd_total = np.sqrt(sd_qk ** 2 + (sd_w ** 2 if pv == "int8" else 0))
    exact_err = np.abs(out - exact)
    worst = (exact_err / (SIGMAS * sd_total + FLOAT_SLACK)).max()
    assert worst <= 1, f"vs exact: an element is {worst * SIGMAS:.2f} sd away (seed {seed})"
    return out, args, bound, sd_w


@pytest.mark.parametrize("tokens", [4096, 8192, 16384])
def test_decode_gqa_d128_int8_against_f32_pv(tokens):
    shape = (1, 32, 8, tokens, 128)
    out, args, bound, sd_w = _check_decode(tokens, shape)
    f32_pv = compiled_decode(*shape, pv="f32")(*args)
    diff = np.abs(out - f32_pv)
    assert (diff <= bound * (1 + 1e-4) + FLOAT_SLACK).all(), "beyond the hard W-rounding bound"
    assert (diff <= SIGMAS * sd_w + FLOAT_SLACK).all(), \
        f"beyond {SIGMAS} sd of W rounding: max {(diff / sd_w).max():.2f} sd"
    print(f"S={tokens}: int8 vs f32 PV max abs {diff.max():.3e}, rms {np.sqrt((diff**2).mean()):.3e}")


@pytest.mark.parametrize("tokens", [4096, 8192, 16384])
def test_decode_defaults_meet_the_issue_13_targets(tokens):
    shape = (1, 32, 8, tokens, 128)
    args = decode_inputs(tokens, *shape)
    out = compiled_decode(*shape, numerics=DEFAULTS)(*args)
    check_against_references(out, args, 128 ** -0.5)
    vs_f32 = np.abs(out - compiled_decode(*shape, pv="f32", numerics=DEFAULTS)(*args)).max()
    vs_exact = np.abs(out - ref.exact_attention(*args, 128 ** -0.5)).max()
    print(f"S={tokens} defaults {DEFAULTS}: int8 vs f32 PV {vs_f32:.3e}, vs exact {vs_exact:.3e}")
    assert vs_f32 <= 7e-4 and vs_exact <= 1e-3, (vs_f32, vs_exact)


@pytest.mark.parametrize("shape", [
    (1, 8, 2, 1000, 64),     # D=64, ragged
    (1, 8, 8, 4097, 64),     # one token into the 17th partition, MHA
    (3, 4, 1, 777, 128),     # batch > 1, MQA
    (2, 16, 4, 1, 128),      # a single token
    (1, 4, 4, 63, 64),       # shorter than one wave
])
def test_decode_shapes(shape):
    _check_decode(sum(shape), shape)


@pytest.mark.parametrize("pv", ["bf16", "f32"])
def test_baselines_run_through_the_same_pipeline(pv):
    shape = (2, 8, 2, 1000, 64)
    _check_decode(11, shape, pv=pv)


def test_bf16_baseline_rounds_w():
    # pv=bf16 must differ from pv=f32 (W really rounded) by about bf16's precision.
    shape = (2, 8, 2, 1000, 64)
    args = decode_inputs(12, *shape)
    bf16 = compiled_decode(*shape, pv="bf16")(*args)
    f32 = compiled_decode(*shape, pv="f32")(*args)
    diff = np.abs(bf16 - f32).max()
    assert 1e-6 < diff < 2e-3, diff


def test_outputs_are_bitwise_deterministic():
    shape = (1, 8, 2, 1000, 64)
    args = decode_inputs(5, *shape)
    graph = compiled_decode(*shape)
    first = graph(*args)
    assert all(np.array_equal(first, graph(*args)) for _ in range(3))


def test_groups_matter_numerically():
    # The compiled module follows the interleaved groups: the contract evaluated
    # with the 8-byte-load (contiguous) groups is a different, farther result.
    from int8attn.fragments import fragment_model

    shape = (1, 8, 2, 1024, 64)
    args = decode_inputs(21, *shape)
    scale = 64 ** -0.5
    out = compiled_decode(*shape)(*args)
    contiguous = fragment_model("gfx936").with_v_load(8)
    other = ref.fragment_attention(*args, scale, fragments=contiguous, numerics=SEED)
    same = ref.fragment_attention(*args, scale, numerics=SEED)
    assert np.abs(out - same).max() <= FRAGMENT_TOL
    assert np.abs(out - other).max() > 10 * np.abs(out - same).max()


@pytest.mark.parametrize("density", [0.002, 0.5], ids=["few ties", "many"])
def test_the_tie_slack_sums_every_moving_element(density):
    # The slack's sum over the moving W elements (summed one by one where they are
    # few, by einsum where they are many) is sum omega * move * |V of its token|.
    from conftest import seeded_rng
    from int8attn.reference.error_model import _output_moves

    rng = seeded_rng(8100)
    b, h, r, n, g, k, t, d = 2, 3, 4, 5, 2, 8, 16, 6
    moves = rng.random((b, h, r, n, g, k)) * (rng.random((b, h, r, n, g, k)) < density)
    moves[0, 1, 2, 3, 1, 5] = 0.75         # at least one element moves
    omega = rng.random((b, h, r, n))
    v_blocks = rng.integers(-127, 128, (b, h, n, t, d)).astype(np.int8)
    tokens = rng.permutation(t).reshape(g, k)
    want = np.zeros((b, h, r, d))
    for i in np.ndindex(b, h, r, n, g, k):
        token = tokens[i[4], i[5]]
        want[i[:3]] += omega[i[:4]] * moves[i] * np.abs(v_blocks[i[0], i[1], i[3], token])
    np.testing.assert_allclose(_output_moves(moves, omega, v_blocks, tokens), want,
                               rtol=1e-12, atol=0)
