"""The fragment model derives the MMAC token sets from layouts + load scheme."""

import numpy as np
import pytest

from int8attn.fragments import (GFX936_MMAC, GFX942_MFMA, FRAGMENT_MODELS, format_token_set,
                                fragment_model)

INTERLEAVED = ("{0-7,16-23,32-39,48-55}", "{8-15,24-31,40-47,56-63}")


def test_16_byte_v_loads_give_the_seeds_interleaved_sets():
    model = fragment_model("gfx936")
    assert model.v_load.bytes_per_lane == 16
    assert tuple(format_token_set(g) for g in model.wave_token_groups) == INTERLEAVED


def test_8_byte_v_loads_give_contiguous_sets():
    model = fragment_model("gfx936").with_v_load(8)
    assert [format_token_set(g) for g in model.wave_token_groups] == ["{0-31}", "{32-63}"]


def test_k_slot_order_follows_the_b_layout():
    # K slot 8r + j of MMAC t is token 16r + 8t + j (docs/design.md §4).
    groups = fragment_model("gfx936").wave_token_groups
    assert groups[0, :10].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 16, 17]
    assert groups[1, 8:12].tolist() == [24, 25, 26, 27]
    assert groups[1, 31] == 63


def test_partition_groups_repeat_per_wave():
    model = fragment_model("gfx936")
    groups = model.token_groups(256)
    assert groups.shape == (8, 32)
    assert format_token_set(groups[2]) == "{64-71,80-87,96-103,112-119}"
    assert format_token_set(groups[7]) == "{200-207,216-223,232-239,248-255}"
    assert sorted(groups.ravel().tolist()) == list(range(256))
    owner = model.group_of_token(256)
    for g, tokens in enumerate(groups):
        assert set(owner[tokens]) == {g}


def test_blocks_must_be_whole_waves():
    with pytest.raises(ValueError, match="whole number of 64-token waves"):
        fragment_model("gfx936").token_groups(100)


def test_a_load_scheme_that_misses_tokens_is_rejected():
    with pytest.raises(ValueError, match="does not cover"):
        fragment_model("gfx936").with_v_load(32).wave_token_groups


def test_operand_tables_match_the_isa_lane_tables():
    # Spot checks written from docs/design.md §3, lane by lane.
    a, b, c = GFX936_MMAC.a, GFX936_MMAC.b, GFX936_MMAC.c
    assert a.element(17, 3) == (1, 11)           # A[l%16][8*(l/16)+j]
    assert b.element(50, 7) == (31, 2)           # B[8*(l/16)+j][l%16]
    assert c.element(21, 2) == (5, 9)            # gfx936 jump layout C[l%16][(l/16)+4i]
    assert GFX942_MFMA.c.element(21, 2) == (6, 5)  # MFMA C[4*(l/16)+i][l%16]
    for layout, (rows, cols) in ((a, (16, 32)), (b, (32, 16)), (c, (16, 16))):
        owner = layout.owner()
        assert len(owner) == rows * cols, f"{layout.name} covers each element once"
        assert set(owner) == {(r, col) for r in range(rows) for col in range(cols)}


def test_gfx936_and_gfx942_share_a_and_b_but_not_c():
    assert np.array_equal(GFX936_MMAC.a.coords, GFX942_MFMA.a.coords)
    assert np.array_equal(GFX936_MMAC.b.coords, GFX942_MFMA.b.coords)
    assert not np.array_equal(GFX936_MMAC.c.coords, GFX942_MFMA.c.coords)
    assert set(FRAGMENT_MODELS) >= {"gfx936", "gfx942"}


def test_unknown_target_names_the_known_ones():
    with pytest.raises(KeyError, match="known models: cuda, gfx936, gfx942"):
        fragment_model("gfx1100")


@pytest.mark.parametrize("tokens, text", [
    ([], "{}"), ([5], "{5}"), ([3, 1, 2], "{1-3}"), ([0, 1, 2, 7, 9, 10], "{0-2,7,9-10}"),
])
def test_format_token_set(tokens, text):
    assert format_token_set(tokens) == text


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 160, 256])
def test_qk_head_dim_order_gives_each_lane_one_contiguous_run(target, head_dim):
    # The order is a bijection of the head dim; every lane of B reads one
    # contiguous run of each token's K row over all steps, in loads of `width`
    # bytes that cover the run exactly (never past it: the last lane's run ends
    # the row); the slots at every step name the bytes its loads hold, and A's
    # runs name the same head-dim index as B for every (step, k).
    from int8attn.fragments import DecodeKernelLayout, fragment_model

    layout = DecodeKernelLayout(fragment_model(target))
    inst = layout.instruction
    order = layout.qk_head_dim_order(head_dim)
    assert sorted(order.ravel().tolist()) == list(range(head_dim))
    width = layout.qk_b_width(head_dim)
    lanes = np.arange(inst.b.lanes)
    firsts = np.stack([f(lanes) for f in layout.qk_b_loads(head_dim)], axis=1)
    held = (firsts[:, :, None] + np.arange(width)).reshape(inst.b.lanes, -1)
    run = head_dim // inst.k * inst.b.slots
    assert held.shape[1] == run
    assert (held == held[:, :1] + np.arange(run)).all()
    for step in range(order.shape[0]):
        positions = np.array(layout.qk_b_slots(head_dim, step))
        assert (held[:, positions] == order[step, inst.b.coords[:, :, 0]]).all()
        a_dims = np.concatenate([d(np.arange(inst.a.lanes))[:, None] + np.arange(n)
                                 for _, d, n in layout.qk_a_runs(head_dim, step)], axis=1)
        assert (a_dims == order[step, inst.a.coords[:, :, 1]]).all()


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 160, 256])
def test_load_alignments_hold_for_every_lane(target, head_dim):
    # The alignment a kernel claims for its K and V cache loads (the backend trusts
    # it): every lane's every load starts at a multiple of it, in rows of the given
    # length; it is the load's width wherever that holds (16 bytes but for D = 32,
    # 96 and 160, whose runs are 8 or 16 bytes, and V rows of a 16-token block).
    from int8attn.fragments import DecodeKernelLayout, fragment_model

    layout = DecodeKernelLayout(fragment_model(target))
    lanes = np.arange(layout.instruction.b.lanes)
    k = layout.k_load_alignment(head_dim)
    starts = np.stack([f(lanes) for f in layout.qk_b_loads(head_dim)])
    assert k == layout.qk_b_width(head_dim) and head_dim % k == 0 and (starts % k == 0).all()
    width = layout.model.v_load.bytes_per_lane
    v_starts = np.stack([layout.v_load_start(u)(lanes) for u in range(layout.v_loads())])
    for row_tokens, want in ((16, 16), (64, width), (4096, width), (8, 8), (24, 8)):
        v = layout.v_load_alignment(row_tokens)
        assert v == min(want, width) and (v_starts % v == 0).all() and row_tokens % v == 0


def test_lane_map_alignment_is_the_largest_power_of_two_dividing_every_value():
    from int8attn.fragments.lane_maps import LaneMap

    rng = np.random.default_rng(7)
    print("seed 7")
    for _ in range(200):
        offset, scales = int(rng.integers(0, 300)), rng.integers(0, 300, 5)
        values = offset + (((np.arange(32)[:, None] >> np.arange(5)) & 1) * scales).sum(1)
        got = LaneMap.fit(values).alignment()
        nonzero = values[values != 0]
        if not nonzero.size:
            assert got >= 1 << 20
            continue
        want = max(1 << b for b in range(20) if (values % (1 << b) == 0).all())
        assert got == want, (offset, scales)


@pytest.mark.parametrize("rows, cols, threads, longest", [
    (4, 128, 128, 4), (4, 32, 32, 4), (16, 64, 64, 4), (16, 128, 128, 4), (2, 4, 2, 4),
    (4, 64, 256, 4), (8, 16, 16, 2)])
def test_thread_runs_are_the_slots_cut_at_row_ends(rows, cols, threads, longest):
    # Every slot of the row-major split exactly once, each run one row's
    # consecutive columns, never longer than asked.
    from int8attn.fragments import thread_distribution, thread_runs

    per, slots = thread_distribution(rows, cols, threads)
    per_runs, runs = thread_runs(rows, cols, threads, longest)
    assert per_runs == per and sum(n for _, _, n in runs) == per
    thread = np.arange(threads)
    u = 0
    for row, col, n in runs:
        assert 1 <= n <= longest
        for e in range(n):
            assert np.array_equal(slots[u + e][0](thread), row(thread))
            assert np.array_equal(slots[u + e][1](thread), col(thread) + e)
        u += n
    # A run ends where some thread's next slot starts a row, not earlier.
    for (_, col, n), (_, next_col, _) in zip(runs, runs[1:]):
        assert n == longest or (next_col(thread) == 0).any()
