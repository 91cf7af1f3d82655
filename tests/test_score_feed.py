"""The register feed from QK's scores to PV's A operand (fragments/score_feed.py),
and the conversions through the round bias the lane kernels use.

The feed is checked against the instructions' lane tables directly (not the linear
layouts it is derived from): every A register of every PV MMAC, on every lane, must
hold the (row, token) of the score element the feed names, with QK's tokens in the
feed's order; the W scale groups (the tokens each MMAC consumes) must not move.
"""

import struct

import numpy as np
import pytest

from int8attn.contract.constants import EXACT_BIAS_RANGE, ROUND_BIAS, ROUND_BIAS_BITS
from int8attn.fragments import (DecodeKernelLayout, bf16_pv_model, fragment_model,
                                score_feed)


def _token_order(feed, tokens):
    return feed.order.apply(token=np.arange(tokens))["token"]


def _check_feed(qk, pv, feed):
    a, c = pv.instruction.a.coords, qk.instruction.c.coords   # [lane, slot] -> (row, col)
    n = qk.instruction.n
    order = _token_order(feed, qk.wave_tokens)
    groups = pv.wave_token_groups                               # [mmac, k] -> token
    for mmac in range(pv.mmacs_per_wave):
        for register in range(pv.instruction.a.slots):
            slot, block = feed.element(register, mmac)
            score_row = c[:, slot, 0]
            score_token = order[block * n + c[:, slot, 1]]
            np.testing.assert_array_equal(score_row, a[:, register, 0])
            np.testing.assert_array_equal(score_token, groups[mmac, a[:, register, 1]])


@pytest.mark.parametrize("target", ["cuda", "gfx936"])
def test_each_a_register_takes_the_score_of_its_row_and_token(target):
    model = fragment_model(target)
    feed = score_feed(model, model)
    assert feed is not None
    assert sorted(_token_order(feed, model.wave_tokens)) == list(range(model.wave_tokens))
    _check_feed(model, model, feed)


def test_the_bf16_twin_is_fed_too():
    qk, pv = fragment_model("cuda"), bf16_pv_model("cuda")
    feed = score_feed(qk, pv)
    assert feed is not None
    _check_feed(qk, pv, feed)


def test_gfx942_has_no_feed():
    # MFMA's C holds a row per register (rows 4(l/16)+i), A a row per lane (l % 16).
    model = fragment_model("gfx942")
    assert score_feed(model, model) is None


@pytest.mark.parametrize("target", ["cuda", "gfx936"])
def test_the_feed_keeps_the_w_scale_groups(target):
    model = fragment_model(target)
    feed = score_feed(model, model)
    layout = DecodeKernelLayout(model, feed.order)
    tokens, groups = layout.element_tokens(), layout.element_groups()
    for mmac in range(model.mmacs_per_wave):
        # the tokens of the elements in group `mmac` are the MMAC's own set, on every lane
        members = groups == mmac
        assert set(tokens[members].tolist()) == set(model.wave_token_groups[mmac].tolist())
        for register in range(model.instruction.a.slots):
            slot, block = feed.element(register, mmac)
            assert (groups[:, layout.element(block, slot)] == mmac).all()
    # QK loads, for B column c of block n, the token the feed puts there
    order = _token_order(feed, model.wave_tokens)
    lanes = np.arange(model.instruction.wave_size)
    for block in range(layout.blocks):
        expected = order[block * model.instruction.n + layout.b_col()(lanes)]
        np.testing.assert_array_equal(layout.b_token(block)(lanes), expected)


def test_without_a_feed_the_layout_is_unchanged():
    model = fragment_model("cuda")
    plain, ordered = DecodeKernelLayout(model), DecodeKernelLayout(model, None)
    np.testing.assert_array_equal(plain.element_tokens(), ordered.element_tokens())
    lanes = np.arange(32)
    for block in range(plain.blocks):
        np.testing.assert_array_equal(plain.b_token(block)(lanes),
                                      plain.b_col()(lanes) + block * model.instruction.n)


def test_the_round_bias_bits_are_exact_over_the_whole_range():
    n = np.arange(-EXACT_BIAS_RANGE, EXACT_BIAS_RANGE + 1, dtype=np.int64)
    as_float = (n + ROUND_BIAS_BITS).astype(np.int32).view(np.float32)
    np.testing.assert_array_equal(as_float.astype(np.float64) - ROUND_BIAS, n)
    # and back: the biased sum of an integer-valued f32 has those bits
    biased = (n.astype(np.float32) + np.float32(ROUND_BIAS)).view(np.int32)
    np.testing.assert_array_equal(biased.astype(np.int64) - ROUND_BIAS_BITS, n)
    assert struct.unpack("<I", struct.pack("<f", ROUND_BIAS))[0] == ROUND_BIAS_BITS


def test_rounding_through_the_bias_is_roundeven(seed=2512):
    rng = np.random.default_rng(seed)
    print(f"random inputs: numpy default_rng seed {seed}")
    x = np.concatenate([rng.uniform(-127, 127, 100000).astype(np.float32),
                        np.arange(-127, 128, 0.5, dtype=np.float32)])   # every tie
    bits = (x + np.float32(ROUND_BIAS)).view(np.int32).astype(np.int64) - ROUND_BIAS_BITS
    np.testing.assert_array_equal(bits, np.rint(x).astype(np.int64))
    # the low byte is the two's-complement level already (what the kernels pack)
    low = ((x + np.float32(ROUND_BIAS)).view(np.int32) & 0xFF).astype(np.uint8).view(np.int8)
    np.testing.assert_array_equal(low, np.rint(x).astype(np.int8))


def test_the_prefill_occupancy_cap_only_where_the_grid_fills_it():
    from int8attn.kernels.target_spec import target_spec

    cuda = target_spec("cuda")
    wanted, sms = cuda.prefill_workgroups_per_sm, cuda.measured_sms
    assert wanted and sms
    cap = {cuda.occupancy_attribute: f"{wanted} : i32"}
    assert cuda.prefill_attributes(wanted * sms) == cap
    assert cuda.prefill_attributes(wanted * sms - 1) == {}
    assert cuda.prefill_attributes(None) == cap            # a pool's grid: run-time B
    assert target_spec("gfx942").prefill_attributes(10 ** 6) == {}   # nothing measured
