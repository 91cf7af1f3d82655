"""benchmarks/ptx_mix.py: the cuda kernels' instructions per MMA, from their PTX.

The counting on a small hand-written PTX body, then properties of the compiled
prefill kernels that a regression would break: the tiles seen whole carry no causal
mask, and the chunked prefill's tile loop is the dense one's but for two block-table
loads (its K and V loads stay 16-byte vector loads, which NVPTX emits only where the
loads state their alignment).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import ptx_mix  # noqa: E402

PTX = """\
.visible .entry prefill_attention(
\t.param .u64 .ptr .align 16 prefill_attention_param_0
)
{
\tmov.b32 \t%r1, 0;
$L__BB0_1:
\tld.global.nc.v4.b32 \t{%r2, %r3, %r4, %r5}, [%rd1];
\tmma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32
\t\t{%r6, %r7, %r8, %r9},
\t\t{%r2, %r3, %r4, %r5},
\t\t{%r2, %r3},
\t\t{%r6, %r7, %r8, %r9};
\tmul.rn.f32 \t%r10, %r6, %r7;
\t@%p1 selp.f32 \t%r11, %r10, 0f00000000, %p2;
\tsetp.lt.u32 \t%p1, %r1, 4;
\t@%p1 bra \t$L__BB0_1;
\tret;
}
"""


def test_the_counting_reads_opcodes_loops_and_classes():
    lines = ptx_mix.entry_lines(PTX, "prefill_attention")
    ((first, last),) = ptx_mix.loops(lines)
    ops = ptx_mix.opcodes(lines[first:last + 1])
    assert ops == ["ld.global.nc.v4.b32", "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.s8.s32",
                   "mul.rn.f32", "selp.f32", "setp.lt.u32", "bra"]
    assert ptx_mix.classify(ops) == {"mma": 1, "global loads": 1, "f32 mul/add/fma": 1,
                                     "selects, compares": 2, "other": 1}


def test_a_loop_is_one_region_however_many_branches_go_back():
    # a body with a branch in it (the prefill's rescale under alpha != 1) can jump back
    # to its header from two places: one loop, to the last of them; branches forward
    # and to no label are no loops
    branches = [(0, 5), (0, 9), (None, 3), (12, 10), (2, 4), (11, 11)]
    assert ptx_mix.back_edges(branches) == [(0, 9), (2, 4), (11, 11)]


def test_the_command_refuses_unknown_kernels():
    with pytest.raises(SystemExit):
        ptx_mix.main(["--kernels", "prefil"])


def test_the_numerics_are_named_as_int8attn_bench_names_them(capsys):
    import argparse

    from int8attn.bench_numerics import CHOICES
    from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS

    assert set(ptx_mix.NUMERICS) <= set(CHOICES)
    assert ptx_mix.NUMERICS == {"one-term": ONE_TERM_NUMERICS, "digits": DIGIT_NUMERICS}
    parser = argparse.ArgumentParser()
    # the old labels are read as the new ones, with a note
    assert ptx_mix.check_selection(parser, "decode", "seed,kernel") == (
        ["decode"], ["one-term", "digits"])
    assert "--numerics seed is deprecated" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ptx_mix.check_selection(parser, "decode", "defaults")
    assert "unknown defaults" in capsys.readouterr().err


@pytest.fixture(scope="module")
def prefill_ptx():
    return {kernel: ptx_mix.compile_ptx(kernel, "one-term", "int8")
            for kernel in ("prefill", "paged-prefill")}


@pytest.fixture(scope="module")
def prefill_loops(prefill_ptx):
    rows = {kernel: ptx_mix.measure(kernel, "one-term", "int8", compiled)
            for kernel, compiled in prefill_ptx.items()}
    return {kernel: {r["region"]: r["classes"] for r in found} for kernel, found in rows.items()}


def test_no_rounding_add_is_contracted_with_its_multiply(prefill_ptx):
    # The lane kernels round x * inv through the bias 1.5 * 2^23 with no clamp between
    # the multiply and the add (contract/scalar_ir.py): that is the contract only while
    # the add rounds the rounded product. NVPTX keeps them apart where the IR does not
    # mark them contractable, writing both with an explicit .rn, which ptxas may not
    # fuse either (PTX ISA, mul/add); an fma on the bias would round the exact product.
    ptx, _ = prefill_ptx["prefill"]
    bias = "0f4B400000"
    adds = [line for line in ptx.splitlines() if bias in line and line.split()[0].startswith("add")]
    assert len(adds) >= 32          # a tile's W levels, at least
    assert all(line.split()[0] == "add.rn.f32" for line in adds)
    assert not [line for line in ptx.splitlines()
                if line.split() and line.split()[0].startswith("fma") and bias in line]


def test_the_tiles_seen_whole_carry_no_mask(prefill_loops):
    whole, masked = prefill_loops["prefill"]["tile loop 1"], prefill_loops["prefill"]["tile loop 2"]
    assert whole["mma"] == masked["mma"] == 64
    # the mask's compares and selects (-inf scores, zero p and W): 2 per element and more
    assert masked["selects, compares"] - whole["selects, compares"] >= 64


def test_the_chunked_prefill_reads_the_tiles_as_the_dense_one(prefill_loops):
    for region in ("tile loop 1", "tile loop 2"):
        dense = prefill_loops["prefill"][region]
        paged = prefill_loops["paged-prefill"][region]
        assert paged["mma"] == dense["mma"] == 64
        # cuda stages the tiles in LDS (kv_ring.KVRing): the same asynchronous copies
        # (K, V, the scales), the paged ones' sources through the block ids of the
        # blocks a thread's chunks touch: one table load per copy slot of K and V and
        # per scale slot at most (a thread's chunks of one block share one table slot,
        # PagedRules.tile_address), no other global load
        assert paged["async copies"] == dense["async copies"] > 0
        assert dense.get("global loads", 0) == 0
        assert 0 < paged["global loads"] <= 10
        assert abs(sum(paged.values()) - sum(dense.values())) < 0.05 * sum(dense.values())


def test_the_paged_decode_reads_one_block_id_per_block_of_a_lane():
    # The partition's block ids are staged in LDS once; a lane then reads the id of each
    # block its wave's tokens touch (a wave view: the wave's part of the table slot plus
    # the lane's), not one per token (18 more LDS loads than the dense decode before).
    dense, = ptx_mix.measure("decode", "one-term", "int8")
    paged, = ptx_mix.measure("paged-decode", "one-term", "int8")
    dense, paged = dense["classes"], paged["classes"]
    assert paged["mma"] == dense["mma"] == 64
    assert paged["LDS"] - dense["LDS"] <= 8
    assert paged["global loads"] <= dense["global loads"] + 4
