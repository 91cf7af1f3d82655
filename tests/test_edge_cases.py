"""Numerics edge cases, each against both references (tolerances: tests/accuracy.py).

Each test prints its measured errors relative to max|V| (`pytest -s`).
"""

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import compiled_attention, seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.runtime import InputError

DECODE = (1, 4, 2, 300, 1, 64)      # B, Hq, Hkv, S, Sq, D
PREFILL = (1, 4, 2, 150, 37, 64)
# compiled_attention's modules have the pipeline's numerics (`Numerics()`, which
# check_against_references assumes); three direct reference calls below were written
# against one-term numerics (the references' old default) and keep it: their margins (a
# one-hot softmax, the s8 one-term W bound, a NaN row) hold for either.
SEED_ONLY_HERE = ONE_TERM_NUMERICS


def make_inputs(seed, mode, shape):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    rng = seeded_rng(seed)
    q_shape = (batch, q_heads) + ((query_tokens,) if mode == "prefill" else ()) + (head_dim,)
    q = rng.standard_normal(q_shape).astype(np.float32)
    cache = (batch, kv_heads, tokens, head_dim)
    k, k_scale = ref.quantize_cache(rng.standard_normal(cache).astype(np.float32))
    v, v_scale = ref.quantize_cache(rng.standard_normal(cache).astype(np.float32))
    return [q, k, k_scale, v, v_scale]


def check(label, mode, shape, args, pv="int8"):
    out = compiled_attention(mode, shape, pv)(*args)
    errors = check_against_references(out, args, shape[-1] ** -0.5, pv)
    print(f"{label} ({mode} {shape}, pv={pv}): vs fragment {errors['fragment']:.2e}, "
          f"vs exact {errors['exact']:.2e} (x max|V|)")
    return out


@pytest.mark.parametrize("mode, shape", [("decode", DECODE), ("prefill", PREFILL)])
def test_zero_v_rows_and_whole_zero_w_groups(mode, shape):
    args = make_inputs(40, mode, shape)
    v, v_scale = args[3].copy(), args[4].copy()
    zero = np.zeros(shape[3], dtype=bool)
    zero[64:128] = True                                   # a whole wave: both MMAC groups
    zero[seeded_rng(41).random(shape[3]) < 0.2] = True    # and scattered tokens
    v[:, :, zero], v_scale[:, :, zero] = 0, 0
    check("zero V rows", mode, shape, args[:3] + [v, v_scale])
    all_zero = compiled_attention(mode, shape)(*args[:3], np.zeros_like(v), np.zeros_like(v_scale))
    assert not all_zero.any() and not np.signbit(all_zero).any()


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_a_single_token_returns_its_value(mode):
    shape = (2, 4, 1, 1, 1, 32)
    args = make_inputs(42, mode, shape)
    out = check("S = 1", mode, shape, args)
    v_deq = args[3] * args[4][..., None]                  # [B, 1, 1, D]
    expected = np.broadcast_to(v_deq if mode == "prefill" else v_deq[:, :, 0], out.shape)
    assert np.allclose(out, expected, rtol=2e-7, atol=0)


@pytest.mark.parametrize("mode, tokens", [("decode", 15), ("decode", 33), ("decode", 255),
                                          ("decode", 257), ("prefill", 31), ("prefill", 65)])
def test_contexts_off_the_16_32_64_256_boundaries(mode, tokens):
    # 15, 31, 33 are shorter than one 64-token wave; 255/257 straddle a partition.
    shape = (1, 4, 2, tokens, min(tokens, 9), 32)
    check(f"S = {tokens}", mode, shape, make_inputs(tokens, mode, shape))


@pytest.mark.parametrize("which, factor", [("v_scale", 1e-30), ("v_scale", 1e20),
                                           ("k_scale", 1e-30)])
def test_very_small_and_very_large_scales(which, factor):
    args = make_inputs(43, "decode", DECODE)
    index = {"k_scale": 2, "v_scale": 4}[which]
    args[index] = (args[index] * np.float32(factor)).astype(np.float32)
    out = check(f"{which} x {factor:g}", "decode", DECODE, args)
    assert np.abs(out).max() > 0


@pytest.mark.parametrize("power", [-60, 66])
def test_scaling_v_scale_by_a_power_of_two_scales_the_output_exactly(power):
    args = make_inputs(44, "decode", DECODE)
    graph = compiled_attention("decode", DECODE)
    scaled = args[:4] + [np.ldexp(args[4], power).astype(np.float32)]
    assert np.array_equal(graph(*scaled), np.ldexp(graph(*args), power))


def test_huge_k_scale_gives_a_one_hot_softmax():
    # Scores ~1e20 apart: every output row is exactly one token's value row.
    args = make_inputs(45, "decode", DECODE)
    args[2] = (args[2] * np.float32(1e20)).astype(np.float32)
    out = compiled_attention("decode", DECODE)(*args)
    fragment = ref.fragment_attention(*args, DECODE[-1] ** -0.5, numerics=SEED_ONLY_HERE)
    assert np.isfinite(out).all() and np.abs(out - fragment).max() <= 1e-6 * np.abs(fragment).max()
    v_deq = (args[3] * args[4][..., None])[0]              # [Hkv, S, D]
    rows = out[0].reshape(2, 2, -1)                        # [Hkv, rows per KV head, D]
    distance = np.abs(rows[:, :, None, :] - v_deq[:, None]).max(axis=-1) \
        / np.abs(v_deq).max(axis=-1)[:, None]
    assert (distance.min(axis=-1) <= 1e-6).all()


@pytest.mark.parametrize("mode, shape", [("decode", DECODE), ("prefill", PREFILL)])
def test_rows_whose_scores_are_all_equal_average_v(mode, shape):
    args = make_inputs(46, mode, shape)
    args[0] = args[0].copy()
    args[0][0, 1] = 0                                     # zero q: every score is 0
    equal_keys = args[:1] + [np.broadcast_to(args[1][:, :, :1], args[1].shape).copy(),
                             np.broadcast_to(args[2][:, :, :1], args[2].shape).copy()] + args[3:]
    for label, case in (("zero q row", args), ("identical keys", equal_keys)):
        out = check(label, mode, shape, case)
        if mode == "decode":
            mean = (case[3] * case[4][..., None]).mean(axis=2)[0, 0]   # head 1 reads KV head 0
            bound, _ = ref.w_quantization_error_scale(*case, shape[-1] ** -0.5,
                                                      numerics=SEED_ONLY_HERE)
            assert (np.abs(out[0, 1] - mean) <= bound[0, 1] * (1 + 1e-4) + 1e-6).all()


@pytest.mark.parametrize("mode, shape", [("decode", DECODE), ("prefill", PREFILL)])
def test_a_single_dominant_token(mode, shape):
    args = make_inputs(47, mode, shape)
    dominant = 100                                        # visible to every prefill row
    q, k, k_scale = np.abs(args[0]), args[1].copy(), args[2].copy()
    k[:, :, dominant] = 127                               # q.k ~ 127 sum|q| for every row
    k_scale[:, :, dominant] = 1.0                         # score gap ~ hundreds: P ~ one-hot
    case = [q, k, k_scale] + args[3:]
    out = check("dominant token", mode, shape, case)
    v_deq = (args[3] * args[4][..., None])[:, :, dominant]           # [B, Hkv, D]
    expected = np.repeat(v_deq, shape[1] // shape[2], axis=1)
    if mode == "prefill":
        expected = np.repeat(expected[:, :, None], shape[4], axis=2)
    assert np.abs(out - expected).max() <= 1e-6 * np.abs(v_deq).max()


@pytest.mark.parametrize("mode, shape", [("decode", DECODE), ("prefill", PREFILL)])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_q_gives_nan_in_exactly_its_rows(mode, shape, bad):
    args = make_inputs(48, mode, shape)
    graph = compiled_attention(mode, shape)
    clean = graph(*args)
    q = args[0].copy()
    row = (0, 2) if mode == "decode" else (0, 2, 5)
    q[row + (7,)] = bad
    out = graph(q, *args[1:])
    nan_rows = np.isnan(out).all(axis=-1)
    expected = np.zeros(nan_rows.shape, dtype=bool)
    expected[row] = True
    assert np.array_equal(nan_rows, expected)
    assert np.array_equal(out[~expected], clean[~expected])          # other rows: bitwise equal
    assert np.isnan(ref.fragment_attention(q, *args[1:], shape[-1] ** -0.5,
                                           numerics=SEED_ONLY_HERE)[row]).all()


@pytest.mark.parametrize("index, name", [(2, "k_scale"), (4, "v_scale")])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -1.0])
def test_nonfinite_or_negative_cache_scales_are_rejected(index, name, bad):
    args = make_inputs(49, "decode", DECODE)
    args[index] = args[index].copy()
    args[index][0, 1, 17] = bad
    with pytest.raises(InputError, match=rf"argument {index} \({name}, arg{index}\) of @attention "
                                         rf"holds .* at \[0, 1, 17\]"):
        compiled_attention("decode", DECODE)(*args)
