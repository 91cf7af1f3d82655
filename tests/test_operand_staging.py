"""The A tiles staged in LDS (fragments/operand_staging.py): what each lane reads back
is the operand the instruction's lane table says, in row-major and in register order;
register order makes every operand one load; writers' maps land where `where` says."""

import numpy as np
import pytest

from int8attn.fragments import (DecodeKernelLayout, LaneMap, OperandStaging,
                                bf16_pv_model, fragment_model, pv_model_named, pv_model_names)


def _operands(layout: DecodeKernelLayout, head_dim: int | None):
    """(instruction, cols_of) of QK's Q tile (head_dim given) or PV's W tile."""
    if head_dim is None:
        return layout.instruction, layout.model.wave_token_groups
    return layout.instruction, layout.qk_head_dim_order(head_dim)


def _read_back(staging: OperandStaging, tile: np.ndarray, operand: int) -> np.ndarray:
    """[lanes, slots]: each lane's operand as its loads read it from `tile`, the LDS
    array (same shape as the A tile)."""
    lanes = np.arange(staging.instruction.a.lanes)
    pieces = [tile[row(lanes)[:, None], col(lanes)[:, None] + np.arange(n)]
              for row, col, n in staging.loads(operand)]
    return np.concatenate(pieces, axis=1)


def _stage(staging: OperandStaging, tile: np.ndarray) -> np.ndarray:
    """The LDS array after every element (row, col) of `tile` is written where the
    staging places it."""
    if staging.where is None:
        return tile.copy()
    lds = np.full_like(tile, -1)
    rows, cols = np.indices(tile.shape)
    lds[staging.where[rows, cols, 0], staging.where[rows, cols, 1]] = tile
    return lds


def _assert_each_lane_reads_its_operands(staging: OperandStaging) -> None:
    """A tile of distinct values, staged: every lane's loads give, slot by slot, the
    element (row, cols_of[o, k]) its A lane table names, for every operand o."""
    inst, cols_of = staging.instruction, staging.cols_of
    tile = np.arange(inst.m * cols_of.size).reshape(inst.m, cols_of.size)
    lds = _stage(staging, tile)
    coords = inst.a.coords
    for o in range(cols_of.shape[0]):
        expected = tile[coords[:, :, 0], cols_of[o][coords[:, :, 1]]]
        assert np.array_equal(_read_back(staging, lds, o), expected)


CASES = ([(target, d) for target in ("gfx936", "gfx942", "cuda")
          for d in (32, 64, 96, 128, 256)]
         + [(target, None) for target in ("gfx936", "gfx942", "cuda")])


@pytest.mark.parametrize("target, head_dim", CASES)
@pytest.mark.parametrize("register_order", [False, True])
def test_each_lane_reads_back_its_operand(target, head_dim, register_order):
    layout = DecodeKernelLayout(fragment_model(target))
    inst, cols_of = _operands(layout, head_dim)
    make = OperandStaging.register_order if register_order else OperandStaging.row_major
    _assert_each_lane_reads_its_operands(make(inst, cols_of))


@pytest.mark.parametrize("target, head_dim", CASES)
def test_register_order_is_one_whole_load_per_operand_where_it_holds(target, head_dim):
    layout = DecodeKernelLayout(fragment_model(target))
    inst, cols_of = _operands(layout, head_dim)
    staging = OperandStaging.register_order(inst, cols_of)
    power_of_two = head_dim is None or not head_dim & (head_dim - 1)
    assert staging.in_register_order == power_of_two
    if not power_of_two:       # D 96: three K steps are not linear in the lane bits
        return
    lanes = np.arange(inst.a.lanes)
    bytes_ = inst.a.slots
    for o in range(cols_of.shape[0]):
        (row, col, n), = staging.loads(o)
        assert n == bytes_
        flat = row(lanes) * cols_of.size + col(lanes)
        # lane l of operand o at (o * lanes + l) * slots: the wave's read is contiguous
        assert np.array_equal(flat, (o * inst.a.lanes + lanes) * bytes_)


def test_cuda_row_major_reads_four_runs_and_register_order_one():
    # What the change is for: m16n8k32's a0..a3 are rows g and g + 8 of two K halves.
    layout = DecodeKernelLayout(fragment_model("cuda"))
    inst, cols_of = _operands(layout, 128)
    assert len(OperandStaging.row_major(inst, cols_of).loads(0)) == 4
    assert len(OperandStaging.register_order(inst, cols_of).loads(0)) == 1


@pytest.mark.parametrize("name", pv_model_names() + ("bf16:cuda",))
def test_every_pv_atom_reads_back_its_operand(name):
    # the INT8 atoms, and the BF16-PV twin's (its W staged the same way)
    kind, _, target = name.partition(":")
    model = bf16_pv_model(target) if kind == "bf16" else pv_model_named(name)
    layout = DecodeKernelLayout(model)
    inst, cols_of = _operands(layout, None)
    _assert_each_lane_reads_its_operands(OperandStaging.register_order(inst, cols_of))


def test_a_writers_maps_land_where_the_staging_places_its_elements():
    # A writer gives (row, col) lane maps of its threads; `place` turns them into the
    # LDS (row, col) maps. A row shifted past M (a packed second term's threads that
    # do not store) continues as the next tile of M rows, keeping the maps linear.
    layout = DecodeKernelLayout(fragment_model("cuda"))
    inst, cols_of = _operands(layout, 128)
    staging = OperandStaging.register_order(inst, cols_of)
    threads = np.arange(256)
    rows, cols = LaneMap.fit(threads // 16), LaneMap.fit(threads % 16 * 8 + 3)
    for shift in (0, 8):
        row_at, col_at = staging.place(rows, cols, 256, shift)
        r = threads // 16 + shift
        expected = staging.where[r % 16, threads % 16 * 8 + 3]
        assert np.array_equal(col_at(threads), expected[:, 1])
        assert np.array_equal(row_at(threads), r // 16 * 16 + expected[:, 0])
    # row-major: the writer's own maps, the row shifted
    plain = OperandStaging.row_major(inst, cols_of)
    row_at, col_at = plain.place(rows, cols, 256, 8)
    assert np.array_equal(row_at(threads), threads // 16 + 8) and col_at == cols


def test_a_writer_map_is_fitted_on_the_threads_that_store_only():
    # A packed second term: the threads of rows >= live store nothing, and their
    # shifted rows (past the tile, with carries) need not fit the map.
    from int8attn.fragments import StagingNotLinear
    from int8attn.fragments.operand_staging import _fit_where

    threads = np.arange(64)
    values = threads * 3 + 5
    values[40:] = 7                                  # free: not stored
    known = threads < 40
    fitted = _fit_where(values, known)
    assert np.array_equal(fitted(threads)[known], values[known])
    with pytest.raises(StagingNotLinear, match="not linear"):
        _fit_where(values, threads < 41)             # thread 40 stores the wrong value
    with pytest.raises(StagingNotLinear, match="thread 0"):
        _fit_where(values, threads > 0)


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
def test_register_order_reads_take_the_fewest_lds_wavefronts(target):
    # A wave reads each operand as one contiguous run of lanes x slots bytes: the
    # fewest wavefronts there are (bytes / 128; fragments/lds_tile.py's bank model).
    # Row-major puts the rows of one operand D bytes apart, on the same banks.
    from int8attn.fragments.lds_tile import lds_wavefronts

    layout = DecodeKernelLayout(fragment_model(target))
    inst = layout.instruction
    lanes = np.arange(inst.a.lanes)
    for head_dim in (64, 128, None):
        _, cols_of = _operands(layout, head_dim)
        costs = {}
        for make in (OperandStaging.row_major, OperandStaging.register_order):
            staging = make(inst, cols_of)
            costs[make] = sum(lds_wavefronts(row(lanes) * cols_of.size + col(lanes), n)
                              for o in range(cols_of.shape[0])
                              for row, col, n in staging.loads(o))
        fewest = cols_of.size * inst.m // 128
        assert costs[OperandStaging.register_order] == fewest
        assert costs[OperandStaging.row_major] > fewest
