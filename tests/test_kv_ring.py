"""The prefill's K/V ring in LDS (cuda: cp.async; kernels/kv_ring.py, `KVRing`).

The ring changes where a tile's K and V come from, not what is computed: the kernel
with it gives the bits of the kernel without it (dense and chunked, both numerics,
with a ragged last tile and a history). Its copies are split over the threads by
`fragments.tile_copies`, which covers every chunk; a head dim whose split is not
linear in the thread bits reads the cache directly. The simulator's LDS hazards hold
the ring's barrier discipline: a ring of one stage, refilled while it is read, is
refused.
"""

import dataclasses

import numpy as np
import pytest
from iree.compiler import ir

from conftest import first_loop_body, seeded_rng
from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.fragments import TileRing, tile_copies
from int8attn.kernels import kv_ring
from int8attn.kernels.shapes import PagedPrefillShape, PrefillShape
from int8attn.kernels.kv_ring import KVRing
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.target_spec import target_spec
from int8attn.simulator import SimulationError
from int8attn.simulator.prefill import run_paged_prefill_kernels, run_prefill_kernels
from int8attn.support.ir import new_context
from test_paged import paged_batch
from test_prefill import prefill_inputs

CUDA = target_spec("cuda")
NO_RING = dataclasses.replace(CUDA, prefill_kv_ring=False)


def _with_and_without_ring(shape, run, inputs, **options) -> list[np.ndarray]:
    """The kernel for `shape` run (by `run`, on `inputs`) with the ring, then without."""
    outs = []
    for spec in (CUDA, NO_RING):
        with new_context(), ir.Location.unknown():
            built = build_prefill_kernels(shape, spec, **options)
            outs.append(run(built.module, built.layout, *inputs))
    return outs


@pytest.mark.parametrize("rows, cols, chunk", [(64, 128, 16), (128, 64, 16), (64, 64, 16),
                                               (64, 32, 16), (64, 1, 1), (256, 64, 16)])
def test_the_copies_cover_every_chunk_once_per_slot(rows, cols, chunk):
    threads = np.arange(128)
    slots = tile_copies(rows, cols, 128, chunk)
    chunks = [(int(r), int(c)) for rm, cm in slots for r, c in zip(rm(threads), cm(threads))]
    expected = {(r, c) for r in range(rows) for c in range(0, cols, chunk)}
    assert set(chunks) == expected
    if len(expected) >= 128:            # no repeats where the threads suffice
        assert len(chunks) == len(expected)
    for rm, cm in slots:                # one slot of consecutive threads: consecutive chunks
        flat = rm(threads) * cols + cm(threads)
        if len(expected) >= 128:
            assert (np.diff(flat[:32]) == chunk).all() or cols == chunk


def test_a_split_that_is_not_linear_is_refused():
    with pytest.raises(ValueError, match="not linear"):
        tile_copies(64, 96, 128, 16)
    with pytest.raises(ValueError, match="whole"):
        tile_copies(64, 100, 128, 16)


def test_the_ring_rule_turns_stages_and_stops_at_the_last_tile():
    from int8attn.fragments import NUMPY_OPS
    ring = TileRing(2)
    tiles = np.arange(7)
    assert (ring.stage(NUMPY_OPS, tiles) == tiles % 2).all()
    assert list(ring.following(NUMPY_OPS, tiles, 7)) == [1, 2, 3, 4, 5, 6, 6]


def _module_text(shape, spec):
    with new_context(), ir.Location.unknown():
        return str(build_prefill_kernels(shape, spec, numerics=ONE_TERM_NUMERICS).module)


def test_the_tile_loop_reads_k_and_v_from_the_ring():
    shape = PrefillShape(1, 2, 4, 300, 300, 128, 0.125)
    text = _module_text(shape, CUDA)
    body = first_loop_body(text)
    assert body.count("nvgpu.device_async_copy") == KVRing.copy_count(64, 128, 128)
    assert body.count("gpu.barrier") == 1 and "nvgpu.device_async_wait" in body
    # every vector load of the loop reads LDS (the ring), none the cache's bindings
    loads = [line for line in body.splitlines() if "vector.load" in line]
    assert loads and all("#gpu.address_space<workgroup>" in line for line in loads)
    assert "nvgpu.device_async_copy" not in _module_text(shape, NO_RING)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "chunked"])
def test_a_pooled_tiles_copies_are_issued_after_qk(paged):
    # The chunked prefill's copy addresses are block ids loaded from the table: its
    # copies wait for them after QK's MMAs; a dense tile's go out right after the
    # barrier. Both wait for the copies at the bottom of the tile.
    shape = (PagedPrefillShape(4, 2, 300, 128, 16, 0.125) if paged
             else PrefillShape(1, 8, 4, 300, 300, 128, 0.125))
    body = first_loop_body(_module_text(shape, CUDA))
    first_copy = body.index("nvgpu.device_async_copy")
    first_mma = body.index("nvgpu.mma.sync")
    assert (first_copy > first_mma) == paged
    assert body.count("nvgpu.device_async_copy") == KVRing.copy_count(64, 128, 128)
    assert body.rindex("nvgpu.device_async_wait") > body.rindex("nvgpu.device_async_copy")


def test_the_chunked_prefills_table_slots_are_32_bit():
    # The slots a tile reads from the block table, and their clamp to the last used
    # one, are i32 like the table: in `index` (64-bit on cuda) each clamp was a pair of
    # compares and selects (1,060 -> 1,040 SASS per tile, one-term numerics).
    shape = PagedPrefillShape(4, 2, 300, 128, 16, 0.125)
    body = first_loop_body(_module_text(shape, CUDA))
    clamps = [line for line in body.splitlines() if "arith.minui" in line]
    slot_clamps = [line for line in clamps if line.rstrip().endswith(": i32")]
    assert len(slot_clamps) >= 4, clamps     # the tile's 4 blocks at least
    table_loads = [line for line in body.splitlines()
                   if "memref.load" in line and "xi32" in line]
    assert table_loads, "the loop reads no block ids"


def test_a_head_dim_without_a_linear_split_reads_the_cache():
    # D 96: 6 chunks a K row, not linear in the thread bits; the kernel still builds
    text = _module_text(PrefillShape(1, 2, 4, 130, 70, 96, 0.125), CUDA)
    assert "nvgpu.device_async_copy" not in text


@pytest.mark.parametrize("numerics", [ONE_TERM_NUMERICS, KERNEL_TARGET_NUMERICS], ids=["seed", "kernel"])
@pytest.mark.parametrize("shape", [(1, 8, 2, 200, 37, 64), (2, 4, 4, 129, 129, 32)],
                         ids=["history", "sq_is_s_b2"])
def test_the_ring_gives_the_bits_of_direct_loads(shape, numerics):
    seed = 5150 + shape[3]
    args = prefill_inputs(seed, *shape)
    b, hq, hkv, s, sq, d = shape
    prefill = PrefillShape(b, hkv, hq // hkv, s, sq, d, d ** -0.5)
    outs = _with_and_without_ring(prefill, run_prefill_kernels, args, numerics=numerics)
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("bs", [16, 32, 48, 128])
def test_the_chunked_prefills_ring_gives_the_bits_of_direct_loads(bs):
    # The copies' sources through the block table: whole blocks per tile at 16 and
    # 32, a tile inside a block at 128, a tile across three blocks at 48.
    rng = seeded_rng(5201 + bs)
    lengths, (hq, hkv, d) = [37, 100, 300], (8, 2, 64)
    arrays = paged_batch(rng, lengths, hq, hkv, d, bs, query_tokens=37)
    shape = PagedPrefillShape(hkv, hq // hkv, 37, d, bs, d ** -0.5)
    outs = _with_and_without_ring(shape, run_paged_prefill_kernels, arrays)
    assert np.isfinite(outs[0]).all()
    np.testing.assert_array_equal(outs[0], outs[1])


def test_a_ring_refilled_while_it_is_read_is_refused(monkeypatch):
    # One stage for every tile: the next tile's copy lands where this tile is read.
    monkeypatch.setattr(kv_ring, "TileRing", lambda stages: TileRing(1))
    args = prefill_inputs(5300, 1, 8, 2, 200, 37, 64)
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(PrefillShape(1, 2, 4, 200, 37, 64, 0.125), CUDA)
        with pytest.raises(SimulationError, match="has not landed|another thread"):
            run_prefill_kernels(built.module, built.layout, *args)


def test_the_ring_at_d128_gives_the_bits_of_direct_loads():
    # D 128: the K tile is swizzled (a token bit into a byte bit), as are its copies
    shape = (1, 8, 2, 200, 37, 128)
    args = prefill_inputs(5128, *shape)
    prefill = PrefillShape(1, 2, 4, 200, 37, 128, 128 ** -0.5)
    outs = _with_and_without_ring(prefill, run_prefill_kernels, args)
    np.testing.assert_array_equal(outs[0], outs[1])


def _ring_wavefronts(monkeypatch, head_dim: int) -> dict:
    """Per ring buffer: simulated LDS wavefronts of its loads over the ideal (one per
    128 bytes a phase reads), counted on the first workgroup's waves."""
    from int8attn.fragments.lds_tile import lds_wavefronts
    from int8attn.simulator import interpreter

    counts = {}
    load = interpreter.Machine.op_vector_load

    def counting(self, op, operands):
        memory = operands[0]
        if memory.per_workgroup_size and len(memory.shape) == 3:     # the ring's K, V
            width = ir.VectorType(op.result.type).shape[0] * memory.element_bytes
            addresses = memory.addresses(operands[1:], self) * memory.element_bytes
            for wave in range(self.threads // 32):
                lanes = addresses[wave * 32:(wave + 1) * 32]
                total = counts.setdefault(memory.shape, [0, 0])
                total[0] += lds_wavefronts(lanes, width)
                total[1] += 32 * width // 128
        return load(self, op, operands)

    monkeypatch.setattr(interpreter.Machine, "op_vector_load", counting)
    args = prefill_inputs(5129, 1, 4, 1, 64, 64, head_dim)
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(PrefillShape(1, 1, 4, 64, 64, head_dim, 0.125), CUDA)
        run_prefill_kernels(built.module, built.layout, *args)
    return {shape: found / ideal for shape, (found, ideal) in counts.items()}


@pytest.mark.parametrize("head_dim, k_ratio", [(32, 2.0), (64, 1.0), (128, 1.0)])
def test_the_rings_loads_are_free_of_bank_conflicts(monkeypatch, head_dim, k_ratio):
    # Measured on the simulated addresses, independently of the swizzle's derivation.
    # D 32: a phase's 8-byte K loads read four tokens whose 32-byte rows pair up on
    # the same 8 banks, which no permutation inside a row can separate (2-way).
    ratios = _ring_wavefronts(monkeypatch, head_dim)
    assert ratios == {(2, 64, head_dim): k_ratio, (2, head_dim, 64): 1.0}


def test_a_ring_past_the_lds_budget_is_not_built(monkeypatch):
    # D 256: two stages of K and V are 66.5 KB, past the 48 KB a workgroup takes
    # without opting in to more; the kernel reads the cache
    assert KVRing.lds_bytes(64, 256) > CUDA.ring_lds_bytes >= KVRing.lds_bytes(64, 128)
    assert _ring_wavefronts(monkeypatch, 256) == {}


def test_without_the_swizzle_k_loads_conflict_at_d128(monkeypatch):
    from int8attn.fragments.lds_tile import _swizzle
    from int8attn.kernels import kv_ring
    monkeypatch.setattr(kv_ring, "k_tile_swizzle",
                        lambda layout, d: _swizzle(layout.model.wave_tokens, d, None, None))
    assert _ring_wavefronts(monkeypatch, 128)[(2, 64, 128)] == 2.0


def test_the_bank_model_counts_wavefronts():
    from int8attn.fragments.lds_tile import lds_wavefronts
    lanes = np.arange(32)
    assert lds_wavefronts(lanes * 16, 16) == 4            # 4 phases of 8 lanes, 128 B each
    assert lds_wavefronts(lanes * 4, 4) == 1              # one phase of 32 words
    assert lds_wavefronts(np.zeros(32, np.int64), 16) == 4  # one address: broadcast
    assert lds_wavefronts(lanes * 128, 16) == 32          # 8 rows of one phase on 4 banks
    assert lds_wavefronts(lanes * 8, 4) == 2              # two words a bank


def test_the_swizzle_is_derived_from_the_k_loads():
    from int8attn.fragments.lds_tile import _swizzle, k_tile_swizzle, k_tile_wavefronts
    from int8attn.fragments import DecodeKernelLayout
    layout = DecodeKernelLayout(CUDA.model)
    for head_dim, gain in ((64, 1), (128, 2), (256, 2)):
        chosen = k_tile_swizzle(layout, head_dim)
        plain = _swizzle(64, head_dim, None, None)
        assert k_tile_wavefronts(layout, head_dim, plain) == \
            gain * k_tile_wavefronts(layout, head_dim, chosen)
        # a permutation of each row's bytes that keeps every 16-byte load whole
        tokens, bytes_ = np.meshgrid(np.arange(64), np.arange(head_dim), indexing="ij")
        moved = chosen.apply(token=tokens, byte=bytes_)["byte"]
        assert (np.sort(moved, axis=1) == bytes_).all()
        assert (moved % 16 == bytes_ % 16).all()


def test_the_variants_command_refuses_what_is_no_prefill_choice(capsys):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import prefill_variants

    for fields, says in (
            (["prefill_ring=False"], "'prefill_ring' is not a prefill choice"),
            (["prefill_kv_ring=yes"], "prefill_kv_ring takes True or False, not 'yes'"),
            (["prefill_workgroups_per_sm=two"], "takes a non-negative integer, not 'two'"),
            (["reciprocal_intrinsic=llvm.nvvm.rcp"], "reciprocal_intrinsic takes None"),
            (["prefill_digits_join_i32=1"], "takes True or False, not '1'"),
            # the decode's join is no prefill choice
            (["digits_join_i32=True"], "'digits_join_i32' is not a prefill choice"),
            (["prefill_digits_join_i32=True", "--numerics", "exact"], "--numerics")):
        with pytest.raises(SystemExit):
            prefill_variants.main(["/nonexistent/dir", *fields])
        assert says in capsys.readouterr().err


def test_q_read_in_every_tile_gives_the_same_bits():
    # TargetSpec.prefill_q_per_tile: Q's operands from LDS in the tile loop (the ring's
    # barrier keeps the loads there) instead of registers held across it
    shape = (1, 8, 2, 200, 37, 64)
    args = prefill_inputs(5140, *shape)
    prefill = PrefillShape(1, 2, 4, 200, 37, 64, 0.125)
    outs, texts = [], []
    for spec in (dataclasses.replace(CUDA, prefill_q_per_tile=False),
                 dataclasses.replace(CUDA, prefill_q_per_tile=True)):
        with new_context(), ir.Location.unknown():
            built = build_prefill_kernels(prefill, spec)
            text = str(built.module)
            texts.append(first_loop_body(text))
            outs.append(run_prefill_kernels(built.module, built.layout, *args))
    np.testing.assert_array_equal(outs[0], outs[1])
    q_loads = [t.count("memref<64x64xi8, #gpu.address_space<workgroup>>, vector") for t in texts]
    assert q_loads[0] == 0 < q_loads[1]
