"""The lane-level paged decode kernels (gfx936, gfx942, cuda) in the simulator.

One generated kernel module per (target, head shape, block size) serves every
batch: ragged lengths on both sides of block and partition edges, shuffled
block tables, unused table slots holding garbage and unread pool slots holding
NaN scales. Every sequence is checked against both references with the
target's own fragment model (tests/accuracy.py).
"""

from dataclasses import replace

import numpy as np
import pytest

from accuracy import check_against_references
from int8attn.contract.numerics import Numerics
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from conftest import seeded_rng
from int8attn.kernels.target_spec import target_spec
from int8attn.kernels.decode import build_decode_kernels, paged_access
from int8attn.kernels.shapes import PagedShape
from int8attn.reference import sequence_cache
from int8attn.simulator.decode import run_paged_kernels, simulate_paged
from int8attn.simulator.interpreter import SimulationError
from int8attn.support.ir import new_context
from iree.compiler import ir
from test_paged import LENGTHS, counted_compiles, paged_batch  # noqa: F401 (fixture)


def packed_and_unpacked(target, q_heads, kv_heads, head_dim, numerics, arrays, mma, field,
                        scale=0.125):
    """([output, MMA count] without, then with the second terms packed into padding rows
    (`field`: DecodeTuning.pack_q_terms or pack_w_terms)) of the paged kernels."""
    shape = PagedShape(kv_heads, q_heads // kv_heads, head_dim, 16, scale)
    spec = target_spec(target)
    outs, counts = [], []
    with new_context(), ir.Location.unknown():
        for pack in (False, True):
            tuning = replace(spec.default_tuning(head_dim), **{field: pack})
            built = build_decode_kernels(paged_access(shape, spec), spec, numerics=numerics,
                                         tuning=tuning)
            counts.append(str(built.module).count(mma))
            outs.append(run_paged_kernels(built.module, built.layout, *arrays))
    return outs, counts


def _kernels(target, q_heads, kv_heads, head_dim, block_size, scale):
    spec = target_spec(target)
    shape = PagedShape(kv_heads, q_heads // kv_heads, head_dim, block_size, scale)
    built = build_decode_kernels(paged_access(shape, spec), spec)
    return built.module, built.layout


def _check(out, arrays, scale, target, numerics: Numerics = KERNEL_TARGET_NUMERICS):
    q, k, ks, v, vs, tables, lens = arrays
    assert out.shape == q.shape
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b))
        check_against_references(out[b:b + 1], dense, scale, model=target, numerics=numerics)


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("q_heads, kv_heads, head_dim, block_size", [
    (8, 2, 64, 16), (4, 4, 64, 32), (16, 2, 128, 16)], ids=["gqa4_d64_bs16", "gqa1_d64_bs32",
                                                          "gqa8_d128_bs16"])
def test_one_kernel_module_serves_ragged_batches(target, q_heads, kv_heads, head_dim,
                                                 block_size):
    scale = float(np.float32(head_dim ** -0.5))
    seed = 70 + q_heads + head_dim + block_size
    rng = seeded_rng(seed)
    with new_context(), ir.Location.unknown():
        module, layout = _kernels(target, q_heads, kv_heads, head_dim, block_size, scale)
        for lengths in (LENGTHS, [3, 700], [256] * 3 + [5]):
            arrays = paged_batch(rng, lengths, q_heads, kv_heads, head_dim, block_size)
            out = run_paged_kernels(module, layout, *arrays)
            _check(out, arrays, np.float32(scale), target)
            print(f"{target} seed {seed} lengths {lengths}: every sequence within both "
                  f"references")


def test_unused_table_slots_are_never_read():
    # Garbage (out-of-range ids) past each sequence's used slots: the simulator
    # raises on any out-of-bounds load, and the output does not change.
    rng = seeded_rng(81)
    arrays = paged_batch(rng, [20, 1, 300], 4, 2, 64, 16)
    with new_context(), ir.Location.unknown():
        module, layout = _kernels("gfx936", 4, 2, 64, 16, 0.125)
        out = run_paged_kernels(module, layout, *arrays)
        tables = arrays[5]
        tables[0, 2:] = -7
        tables[1, 1:] = 10 ** 9
        assert np.array_equal(run_paged_kernels(module, layout, *arrays), out)
        # ...while a used slot with a bad id is read (the driver's checks refuse it first).
        tables[2, 0] = 10 ** 9
        with pytest.raises(SimulationError, match="out of bounds"):
            run_paged_kernels(module, layout, *arrays)


def test_a_load_claiming_more_alignment_than_it_has_is_refused():
    # The K and V loads carry the alignment the fragment model proves (16 bytes here),
    # which the backend trusts; the simulator checks each claim on every lane. Claiming
    # twice as much is caught: some lane's load starts 16 bytes past a 32-byte line.
    rng = seeded_rng(96)
    arrays = paged_batch(rng, [70, 5], 4, 2, 64, 16)
    with new_context(), ir.Location.unknown():
        module, layout = _kernels("cuda", 4, 2, 64, 16, 0.125)
        claims = []

        def claim(op):
            if op.name == "vector.load" and "alignment" in op.attributes:
                claims.append(op)
            return ir.WalkResult.ADVANCE

        module.walk(claim)
        assert claims and {ir.IntegerAttr(op.attributes["alignment"]).value
                           for op in claims} == {16}
        run_paged_kernels(module, layout, *arrays)
        for op in claims:
            op.attributes["alignment"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 32)
        with pytest.raises(SimulationError, match="needing 32-byte alignment"):
            run_paged_kernels(module, layout, *arrays)


def test_the_kernel_refuses_a_block_size_the_v_loads_straddle():
    shape = PagedShape(2, 4, 64, 8, 0.125)
    with new_context(), ir.Location.unknown(), pytest.raises(ValueError, match="block size 8"):
        paged_access(shape, target_spec("cuda"))


@pytest.mark.parametrize("tuning", [dict(v_early=True), dict(v_first=True), dict(v_per_tile=True),
                                    dict(v_async=True),
                                    dict(a_register_order=False), dict(merge_unroll=1),
                                    dict(workgroups_per_sm=6), dict(merge_chunks=2),
                                    dict(merge_chunks=4, merge_unroll=3)])
def test_schedule_choices_do_not_change_a_bit(tuning):
    # DecodeTuning moves loads, places Q and W in LDS, caps registers and splits the
    # merge's columns over workgroups; the arithmetic stays the same.
    from int8attn.kernels.decode import DecodeTuning

    rng = seeded_rng(83)
    arrays = paged_batch(rng, [300, 17], 8, 2, 64, 16)
    shape = PagedShape(2, 4, 64, 16, 0.125)
    spec = target_spec("cuda")
    with new_context(), ir.Location.unknown():
        outs = []
        for choice in (DecodeTuning(), DecodeTuning(**tuning)):
            built = build_decode_kernels(paged_access(shape, spec), spec, tuning=choice)
            outs.append(run_paged_kernels(built.module, built.layout, *arrays))
    assert np.array_equal(outs[0], outs[1])


def test_v_async_reads_v_only_after_the_wait(monkeypatch):
    # The simulator lands async copies at the wait of their group and refuses a read
    # of their elements before it (simulator/memory.py, `_Hazards`).
    from int8attn.kernels.decode import DecodeTuning
    from int8attn.kernels.lanes import Lanes

    rng = seeded_rng(85)
    arrays = paged_batch(rng, [300, 17], 8, 2, 64, 16)
    shape = PagedShape(2, 4, 64, 16, 0.125)
    spec = target_spec("cuda")
    with new_context(), ir.Location.unknown():
        built = build_decode_kernels(paged_access(shape, spec), spec,
                                     tuning=DecodeTuning(v_async=True))
        out = run_paged_kernels(built.module, built.layout, *arrays)
    q, k, ks, v, vs, tables, lens = arrays
    dense = (q[:1], *sequence_cache(k, ks, v, vs, tables, lens, 0))
    from int8attn.reference import fragment_attention
    expected = fragment_attention(*dense, 0.125, model="cuda", numerics=KERNEL_TARGET_NUMERICS)
    np.testing.assert_allclose(out[:1], expected, atol=1e-5)
    monkeypatch.setattr(Lanes, "async_wait", lambda self, group: None)
    with new_context(), ir.Location.unknown():
        built = build_decode_kernels(paged_access(shape, spec), spec,
                                     tuning=DecodeTuning(v_async=True))
        with pytest.raises(SimulationError, match="has not landed"):
            run_paged_kernels(built.module, built.layout, *arrays)


@pytest.mark.parametrize("target", ["gfx936", "gfx942"])
def test_v_async_is_refused_where_there_is_no_async_copy(target):
    from int8attn.kernels.decode import DecodeTuning

    spec = target_spec(target)
    shape = PagedShape(2, 4, 64, 16, 0.125)
    with new_context(), ir.Location.unknown(), pytest.raises(ValueError, match="v_async"):
        build_decode_kernels(paged_access(shape, spec), spec, tuning=DecodeTuning(v_async=True))


@pytest.mark.parametrize("head_dim, pv, workgroups", [
    (32, "int8", 8), (64, "int8", 8), (96, "int8", 8), (128, "int8", 8), (256, "int8", 4),
    (512, "int8", 4), (64, "bf16", 7), (128, "bf16", 6), (256, "bf16", 4)])
def test_the_cuda_occupancy_hint_follows_the_head_dim(head_dim, pv, workgroups):
    # A lane's registers grow with D: the partition kernel asks the backend for
    # the measured workgroups per SM of its head dim and PV (kernels/target_spec.py),
    # and only the partition kernel carries the hint.
    spec = target_spec("cuda")
    with new_context(), ir.Location.unknown():
        shape = PagedShape(2, 4, head_dim, 16, 0.125)
        text = str(build_decode_kernels(paged_access(shape, spec), spec, pv=pv).module)
    assert text.count("nvvm.minctasm") == 1
    assert f"nvvm.minctasm = {workgroups} : i32" in text


def test_the_driver_compiles_one_kernel_module_for_every_batch(counted_compiles):
    import int8attn
    from test_paged import check_every_sequence, paged_graph

    before = len(counted_compiles)
    graph = int8attn.compile(paged_graph(8, 2, 64, 16), target="cuda", simulate=True)
    rng = seeded_rng(84)
    for lengths in ([1, 255, 257], [600], [16, 17, 31, 32, 33]):
        arrays = paged_batch(rng, lengths, 8, 2, 64, 16)
        out = graph(*arrays)
        q, k, ks, v, vs, tables, lens = arrays
        for b in range(len(lengths)):
            dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b))
            check_against_references(out[b:b + 1], dense, np.float32(0.125), model="cuda",
                                     numerics=KERNEL_TARGET_NUMERICS)
    assert len(counted_compiles) - before == 1


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("splits, chunks", [(2, 1), (4, 1), (16, 4), (16, 8)])
def test_a_split_merge_matches_both_references(target, splits, chunks):
    # Thread groups over every splits-th partition, combined through LDS: a
    # different summation order, so checked against the references, not bits;
    # the head dim over `chunks` workgroups per (KV head, sequence).
    from int8attn.kernels.decode import DecodeTuning

    seed = 85 + splits + chunks
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 257, 1000, 2100, 3000], 8, 2, 64, 16)
    shape = PagedShape(2, 4, 64, 16, 0.125)
    spec = target_spec(target)
    with new_context(), ir.Location.unknown():
        built = build_decode_kernels(paged_access(shape, spec), spec,
                                     tuning=DecodeTuning(merge_splits=splits, merge_unroll=2,
                                                  merge_chunks=chunks))
        out = run_paged_kernels(built.module, built.layout, *arrays)
    _check(out, arrays, np.float32(0.125), target)


@pytest.mark.parametrize("tuning, message", [
    (dict(merge_chunks=3), "3 merge chunks must divide the head dim 64"),
    (dict(merge_chunks=8), "merge workgroup of 16 threads: it must be whole waves of 32"),
    (dict(merge_splits=16), "merge workgroup of 2048 threads: .* at most 1024")])
def test_a_merge_split_the_kernel_cannot_run_is_refused(tuning, message):
    from int8attn.kernels.decode import DecodeTuning

    spec = target_spec("cuda")
    with new_context(), ir.Location.unknown(), pytest.raises(ValueError, match=message):
        build_decode_kernels(paged_access(PagedShape(2, 4, 64, 16, 0.125), spec), spec,
                             tuning=DecodeTuning(**tuning))


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("q_terms, w_quant", [(2, "s8"), (1, "u8"), (2, "u8")])
@pytest.mark.parametrize("q_heads", [8, 32])
def test_every_numerics_variant_in_every_kernel(target, q_terms, w_quant, q_heads):
    # Two-term Q is a second QK MMAC per step; unsigned W adds 128 * sum Vq, taken
    # from all-ones padding rows of the A tile where the C layout puts them in the
    # same lane (cuda, <= 8 rows), else from one more MMAC with A all ones
    # (gfx936, and every target at 16 rows per KV head).
    seed = 90 + q_terms + len(w_quant) + q_heads
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 200, 700], q_heads, 2, 64, 16)
    numerics = Numerics(q_terms=q_terms, w_quant=w_quant, w_terms=1)
    out = simulate_paged(*arrays, 0.125, target=target, numerics=numerics)
    _check(out, arrays, np.float32(0.125), target, numerics)


def test_bench_prepares_one_paged_module_per_pv(tmp_path):
    # The half of `int8attn bench --mode paged` that needs no GPU: one module per
    # PV precision (whatever the batch), its PTX, and the numerics the check uses.
    import json

    from int8attn import cli

    assert cli.main(["bench", "--mode", "paged", "--numerics", "defaults", "--q-heads", "8",
                     "--kv-heads", "2", "--head-dim", "64", "--prepare-only",
                     str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "paged.json").read_text())
    assert meta == dict(q_heads=8, kv_heads=2, head_dim=64, block_size=16, q_terms=2,
                        w_quant="u8", w_terms=2, w_second="scaled", q_second="scaled")
    for pv, workgroups in (("int8", 8), ("bf16", 7)):        # per SM at D = 64
        assert (tmp_path / f"paged_{pv}.vmfb").stat().st_size > 0
        ptx = (tmp_path / f"paged_{pv}.ptx").read_text()
        assert f".minnctapersm {workgroups}" in ptx and "mma.sync.aligned.m16n8k32" in ptx


@pytest.mark.parametrize("target, q_heads, kv_heads, head_dim, mma", [
    ("cuda", 8, 2, 64, "nvgpu.mma.sync"),       # rows g and g+8 share a lane: shift 8
    ("gfx942", 4, 2, 128, "amdgpu.mfma"),       # 2 rows: rows r and r+2 share a lane
])
@pytest.mark.parametrize("numerics", [Numerics(q_terms=2, w_quant="u8", w_terms=1),
                                      KERNEL_TARGET_NUMERICS], ids=["scaled", "digits"])
def test_two_term_q_in_the_padding_rows_is_bitwise_the_two_mma_form(target, q_heads, kv_heads,
                                                                    head_dim, mma, numerics):
    # The second Q term sits in the A tile's padding rows (DecodeKernelLayout.term_rows):
    # one QK MMA per K step instead of two, the same integer sums, the same result.
    seed = 97
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 300, 700], q_heads, kv_heads, head_dim, 16)
    outs, counts = packed_and_unpacked(target, q_heads, kv_heads, head_dim, numerics, arrays,
                                       mma, "pack_q_terms")
    spec = target_spec(target)
    assert np.array_equal(outs[0], outs[1])
    steps, blocks = head_dim // spec.model.instruction.k, 64 // spec.model.instruction.n
    assert counts[0] - counts[1] == steps * blocks
    _check(outs[1], arrays, np.float32(0.125), target, numerics)


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("q_heads", [6, 10, 14])
def test_a_gqa_group_that_is_no_power_of_two_runs_on_every_target(target, q_heads):
    # 3, 5 and 7 query heads per KV head (Qwen2's 28/4, Qwen2.5's 40/8): the partial
    # outputs' rows are the next power of two, so every thread's rows stay a lane map
    # (3 rows of 128 over 128 threads were not, and the build failed).
    seed = 120 + q_heads
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 255, 600], q_heads, 2, 64, 16)
    out = simulate_paged(*arrays, 0.125, target=target)
    _check(out, arrays, np.float32(0.125), target)


def test_a_shape_whose_writers_have_no_register_order_map_is_staged_row_major(monkeypatch):
    # Q and W go to LDS in the MMA's register order only where every writer's places
    # are a lane map (fragments/operand_staging.py); elsewhere the kernel is built
    # row-major, the same module as with `a_register_order=False`.
    from int8attn.fragments import OperandStaging, StagingNotLinear

    spec = target_spec("cuda")
    shape = PagedShape(2, 4, 64, 16, 0.125)

    def refuse(self, *args, **kwargs):
        if self.in_register_order:
            raise StagingNotLinear("no lane map")
        return place(self, *args, **kwargs)

    with new_context(), ir.Location.unknown():
        tuning = replace(spec.default_tuning(64), a_register_order=False)
        row_major = str(build_decode_kernels(paged_access(shape, spec), spec,
                                             tuning=tuning).module)
        register_order = str(build_decode_kernels(paged_access(shape, spec), spec).module)
        place = OperandStaging.place
        monkeypatch.setattr(OperandStaging, "place", refuse)
        fallen_back = str(build_decode_kernels(paged_access(shape, spec), spec).module)
    assert fallen_back == row_major != register_order


def test_one_v_schedule_at_a_time():
    from int8attn.kernels.decode import DecodeTuning

    shape = PagedShape(2, 4, 64, 16, 0.125)
    spec = target_spec("cuda")
    with new_context(), ir.Location.unknown(), pytest.raises(
            ValueError, match="v_first and v_async are set: choose one"):
        build_decode_kernels(paged_access(shape, spec), spec,
                             tuning=DecodeTuning(v_first=True, v_async=True))
