"""Legal edge cases of `int8attn.paged_attention`, against both references (issue 21).

An empty batch (no sequences) reads nothing and returns q's empty [0, Hq, (Sq,) D];
a graph with static B, NB and MB compiles and matches; a sequence of length 1 and
one of exactly MB * BS tokens (its whole table, at a block and at a partition
edge); blocks shared by two sequences, or listed twice in one table: the
contract allows it (the op only reads the pool; a block's tokens are whatever
it holds), as vLLM's prefix caching does. Each on the cpu pipeline and in the
lane simulator of every kernel target, every sequence against both references
of the executor's numerics (tests/accuracy.py); the inputs come from fixed,
printed seeds.
"""

import numpy as np
import pytest

import int8attn
from conftest import seeded_rng
from int8attn import cli
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.driver.paged_decode import paged_attention_graph
from test_paged import check_every_sequence, paged_batch

HEADS = (4, 2, 32, 16)                    # Hq, Hkv, D, BS
QUERY_TOKENS = 5
SCALE = np.float32(HEADS[2] ** -0.5)
EXECUTORS = ("cpu", "gfx936", "gfx942", "cuda")


def _compile(target, **shape):
    return int8attn.compile(paged_attention_graph(*HEADS, **shape), filename="paged.mlir",
                            target=target, simulate=target != "cpu")


def _check(out, arrays, target):
    contract = {} if target == "cpu" else dict(model=target, numerics=KERNEL_TARGET_NUMERICS)
    check_every_sequence(out, arrays, SCALE, **contract)


@pytest.fixture(scope="module", params=EXECUTORS)
def executor(request):
    """(target, the decode graph, the chunked-prefill graph), compiled once per target."""
    target = request.param
    return target, _compile(target), _compile(target, query_tokens=QUERY_TOKENS)


@pytest.mark.parametrize("chunk", [None, QUERY_TOKENS], ids=["decode", "prefill"])
def test_an_empty_batch_returns_an_empty_result(executor, chunk, tmp_path):
    target, decode, prefill = executor
    arrays = paged_batch(seeded_rng(2121), [20, 7], *HEADS, query_tokens=chunk)
    for slots in (arrays[5].shape[1], 0):               # [0, MB] and [0, 0] tables
        empty = [arrays[0][:0], *arrays[1:5], arrays[5][:0, :slots], arrays[6][:0]]
        out = (decode if chunk is None else prefill)(*empty)
        assert out.shape == empty[0].shape and out.dtype == np.float32, (target, slots)
    path, npz, result = tmp_path / "paged.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_attention_graph(*HEADS, query_tokens=chunk))
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(empty)})
    simulate = [] if target == "cpu" else ["--target", target, "--simulate"]
    assert cli.main(["run", str(path), "--inputs", str(npz), "--output", str(result),
                     *simulate]) == 0
    with np.load(result) as saved:
        assert saved["result0"].shape == empty[0].shape


@pytest.mark.parametrize("chunk", [None, QUERY_TOKENS], ids=["decode", "prefill"])
def test_a_static_batch_pool_and_table_width(chunk):
    """B = 3, NB = 12, MB = 4 in the graph's types (lower-paged-attention keeps them)."""
    for target in EXECUTORS:
        graph = _compile(target, batch=3, blocks=12, slots=4, query_tokens=chunk)
        # needed blocks 2 + 1 + 2 and 7 spare: NB = 12; MB = 2 + 2 = 4
        arrays = paged_batch(seeded_rng(2122), [32, QUERY_TOKENS, 17], *HEADS, spare_blocks=7,
                             query_tokens=chunk)
        assert arrays[1].shape[0] == 12 and arrays[5].shape == (3, 4)
        _check(graph(*arrays), arrays, target)


def _whole_table(rng, lengths, chunk=None):
    """A batch whose table width is exactly the longest sequence's blocks (its length
    is MB * BS when it is a whole number of blocks)."""
    arrays = paged_batch(rng, lengths, *HEADS, query_tokens=chunk)
    width = -(-max(lengths) // HEADS[3])
    arrays[5] = np.ascontiguousarray(arrays[5][:, :width])
    return arrays


def test_length_one_and_a_length_of_the_whole_table(executor):
    target, decode, prefill = executor
    rng = seeded_rng(2123)
    # MB * BS at a block edge, at a partition edge, one block; B = 1 of length 1
    for lengths in ([1, 64, 48, 1], [256, 1], [16], [1]):
        arrays = _whole_table(rng, lengths)
        _check(decode(*arrays), arrays, target)
    for lengths in ([QUERY_TOKENS, 64], [80, QUERY_TOKENS, 16]):
        arrays = _whole_table(rng, lengths, QUERY_TOKENS)
        _check(prefill(*arrays), arrays, target)


def test_blocks_shared_by_two_sequences(executor):
    """Sequence 1 shares sequence 0's first two blocks (a common 32-token prefix);
    sequence 2 lists one block in two slots. Each matches the references on the
    cache its own table gathers."""
    target, decode, prefill = executor
    rng = seeded_rng(2124)
    for graph, chunk in ((decode, None), (prefill, QUERY_TOKENS)):
        arrays = paged_batch(rng, [40, 45, 30], *HEADS, query_tokens=chunk)
        tables = arrays[5]
        tables[1, :2] = tables[0, :2]     # tokens 0..31 of both: every slot read by both
        tables[2, 1] = tables[2, 0]       # tokens 16..29 repeat tokens 0..13
        _check(graph(*arrays), arrays, target)
