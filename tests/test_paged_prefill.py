"""Chunked prefill over the paged cache: `paged_attention` with q [B, Hq, Sq, D].

Each sequence's last Sq tokens are its queries, causal over the tokens before
them (history len_b - Sq), read through its block table: the dense prefill
contract of that sequence (reference.paged runs the dense references on each
sequence's gathered cache). One compiled module serves every batch. Checked on
the cpu pipeline (its defaults) and in the prefill kernel of gfx936 / gfx942 /
cuda (simulated; the kernel targets' numerics), every sequence against both
references (tests/accuracy.py), over ragged lengths at the edges of blocks and
tiles, shuffled tables, garbage in unused table slots and NaN scales in every
pool slot no sequence reads.
"""

import numpy as np
import pytest
from iree.compiler import ir

from conftest import seeded_rng
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.driver.paged_decode import paged_attention_graph
from int8attn.kernels.target_spec import target_spec
from int8attn.kernels.shapes import PagedPrefillShape
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.runtime.module import InputError
from int8attn.simulator.prefill import run_paged_prefill_kernels
from int8attn.support.ir import new_context
from test_paged import check_every_sequence, paged_batch

HEADS = (8, 2, 64)             # Hq, Hkv, D
QUERY_TOKENS = 37
BATCHES = ([37, 38, 63, 64, 65, 300], [37] * 2 + [129], [1000])


def test_the_cpu_pipeline_matches_both_references():
    import int8attn

    scale = np.float32(HEADS[2] ** -0.5)
    graph = int8attn.compile(paged_attention_graph(*HEADS, 16, query_tokens=QUERY_TOKENS),
                             filename="paged_prefill.mlir", cache=False)
    rng = seeded_rng(401)
    for lengths in BATCHES:
        arrays = paged_batch(rng, lengths, *HEADS, 16, query_tokens=QUERY_TOKENS)
        check_every_sequence(graph(*arrays), arrays, scale)
        print(f"cpu, lengths {lengths}: every sequence within both references")


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_one_kernel_module_serves_ragged_batches(target, block_size):
    scale = float(np.float32(HEADS[2] ** -0.5))
    shape = PagedPrefillShape(HEADS[1], HEADS[0] // HEADS[1], QUERY_TOKENS, HEADS[2],
                              block_size, scale)
    rng = seeded_rng(402 + block_size)
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(shape, target_spec(target))
        for lengths in BATCHES:
            arrays = paged_batch(rng, lengths, *HEADS, block_size, query_tokens=QUERY_TOKENS)
            out = run_paged_prefill_kernels(built.module, built.layout, *arrays)
            check_every_sequence(out, arrays, np.float32(scale), model=target,
                                 numerics=KERNEL_TARGET_NUMERICS)


def test_the_driver_runs_the_kernel_on_the_pool():
    import int8attn

    graph = int8attn.compile(paged_attention_graph(*HEADS, 16, query_tokens=QUERY_TOKENS),
                             filename="paged_prefill.mlir", target="cuda", simulate=True)
    layout = dict(graph.kernel_layout)
    (abi,) = layout.pop("abi")
    assert layout == {"function": "paged", "mode": "paged", "kernel": "prefill",
                      "rows_per_workgroup": 64, "tile_tokens": 64}
    # the kernel's calling convention (kernels/abi.py): the seven inputs, the index sizes,
    # one workgroup per (64 packed rows, KV head, sequence)
    assert abi["kernel"] == "prefill_attention" and abi["constants"] == ["B", "NB", "MB"]
    assert abi["inputs"][0] == "q" and len(abi["inputs"]) == 7
    assert abi["grid"][1:] == [HEADS[1], "B"]
    arrays = paged_batch(seeded_rng(403), [40, 200], *HEADS, 16, query_tokens=QUERY_TOKENS)
    check_every_sequence(graph(*arrays), arrays, np.float32(HEADS[2] ** -0.5), model="cuda",
                         numerics=KERNEL_TARGET_NUMERICS)


def test_a_sequence_shorter_than_its_chunk_is_refused():
    import int8attn

    graph = int8attn.compile(paged_attention_graph(*HEADS, 16, query_tokens=QUERY_TOKENS),
                             filename="paged_prefill.mlir", cache=False)
    arrays = paged_batch(seeded_rng(404), [40, 36], *HEADS, 16, query_tokens=QUERY_TOKENS)
    with pytest.raises(InputError, match=r"context_lens.*sequence 1 has length 36, outside "
                                         r"\[37, \d+\] \(its 37 new query tokens are the last"):
        graph(*arrays)
