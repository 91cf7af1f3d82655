"""PagedDecoder and PagedCache are atomic: a refused prefill or step changes nothing.

Every failure (a bad q, k or v, an unknown, released or repeated sequence id, a
pool without room, a failure in the runtime after the write) must be a named
error that leaves the cache as it was: the same tables, lengths, free list and
next id, and the same bytes in every cache array. A retry with good inputs must
then give what a twin decoder that never failed gives, bit for bit, and both
references (tests/accuracy.py). The inputs come from fixed, printed seeds.
"""

import numpy as np
import pytest

import int8attn
from accuracy import check_against_references
from conftest import seeded_rng
from int8attn.driver.paged_decode import (PagedCache, PagedDecoder, PoolExhausted,
                                          UnknownSequence, paged_decode_graph)
from int8attn.reference import paged_cache_write, sequence_cache
from int8attn.runtime.module import InputError

HQ, HKV, D, BS = 4, 2, 32, 16
PROMPTS = (20, 3)
BLOCKS = 6                 # 2 + 1 held by the prompts, 3 free


@pytest.fixture(scope="module")
def graph():
    return int8attn.compile(paged_decode_graph(HQ, HKV, D, BS), filename="decode.mlir")


def _rows(rng, count, heads=HKV):
    return rng.standard_normal((count, heads, D)).astype(np.float32)


def _decoder(graph):
    """A decoder holding the prompts (same seed: twins hold the same bytes)."""
    rng = seeded_rng(2111)
    decoder = PagedDecoder(graph, PagedCache(BLOCKS, HKV, BS, D, seed=4))
    for length in PROMPTS:
        decoder.prefill(_rows(rng, length), _rows(rng, length))
    return decoder


def _state(cache):
    return ({s: list(t) for s, t in cache.tables.items()}, dict(cache.lengths), list(cache.free),
            cache.next_sequence, [a.copy() for a in cache.arrays])


def _assert_unchanged(cache, before):
    after = _state(cache)
    assert after[:4] == before[:4], "the bookkeeping changed"
    for name, a, b in zip(("k_cache", "k_scale", "v_cache", "v_scale"), after[4], before[4]):
        assert np.array_equal(a, b, equal_nan=True), f"{name} changed"


def _step(rng, sequences, q_rows=None, q_heads=HQ, k_heads=HKV, k_tokens=None):
    count = len(sequences)
    q = rng.standard_normal((count if q_rows is None else q_rows, q_heads, D)).astype(np.float32)
    return q, _rows(rng, count if k_tokens is None else k_tokens, k_heads), _rows(rng, count)


def _nan_keys(rng, sequences):
    q, k, v = _step(rng, sequences)
    k[1, 0, 3] = np.nan
    return q, k, v


# case -> (the failing call, exception, message)
FAILURES = {
    "q of the wrong batch": (lambda d, r: d.step(*_step(r, [0, 1], q_rows=1), [0, 1]),
                             InputError, "@attend: q has 1 sequences, block_tables 2 and "
                             "context_lens 2; they must agree"),
    "q of the wrong heads": (lambda d, r: d.step(*_step(r, [0, 1], q_heads=2), [0, 1]),
                             InputError, "argument 0 (q, arg0) of @attend must have shape "
                             "[?, 4, 32]"),
    "k of the wrong head dim": (lambda d, r: d.step(r.standard_normal((2, 4, D)).astype(
        np.float32), _rows(r, 2)[..., :16], _rows(r, 2), [0, 1]),
        InputError, "argument 0 (k_new, arg0) of @write must have shape [?, 2, 32]"),
    "k of the wrong KV heads": (lambda d, r: d.step(*_step(r, [0, 1], k_heads=1), [0, 1]),
                                InputError, "argument 0 (k_new, arg0) of @write must have shape"),
    "fewer k rows than sequences": (lambda d, r: d.step(*_step(r, [0, 1], k_tokens=1), [0, 1]),
                                    InputError, "@write: k_new has 1 new tokens, v_new 2 and "
                                    "slot_mapping 2; they must agree"),
    "a NaN key": (lambda d, r: d.step(*_nan_keys(r, [0, 1]), [0, 1]), InputError,
                  "argument 0 (k_new, arg0) of @write: token 1 (slot"),
    "an unknown sequence": (lambda d, r: d.step(*_step(r, [0, 7]), [0, 7]), UnknownSequence,
                            "sequence 7 is not in the cache (never added); it holds sequences "
                            "[0, 1]: use an id that prefill or add_sequence returned"),
    "a sequence named twice": (lambda d, r: d.step(*_step(r, [1, 1]), [1, 1]), InputError,
                               "sequence 1 appears 2 times in one batch; a step gives each "
                               "sequence one token: name it once"),
    "a prefill whose k and v differ": (lambda d, r: d.prefill(_rows(r, 5), _rows(r, 4)),
                                       InputError, "@write: k_new has 5 new tokens, v_new 4 and "
                                       "slot_mapping 5"),
    "a prefill the pool cannot hold": (lambda d, r: d.prefill(_rows(r, 49), _rows(r, 49)),
                                       PoolExhausted, "sequences [2] need 4 more blocks; 3 are "
                                       "free: release a finished sequence or give the cache "
                                       "more blocks"),
    "a prefill of an Inf value": (lambda d, r: d.prefill(_rows(r, 3), np.full((3, HKV, D), np.inf,
                                                                             np.float32)),
                                  InputError, "argument 1 (v_new, arg1) of @write: token 0"),
    "a prefill of the wrong head dim": (lambda d, r: d.prefill(_rows(r, 3)[..., :16],
                                                               _rows(r, 3)[..., :16]),
                                        InputError, "argument 0 (k_new, arg0) of @write must "
                                        "have shape [?, 2, 32]"),
    "a True for a sequence id": (lambda d, r: d.step(*_step(r, [1]), [True]), UnknownSequence,
                                 "sequence True is not a sequence id: ids are the integers "
                                 "prefill or add_sequence returned"),
    "a float sequence id": (lambda d, r: d.step(*_step(r, [1]), [1.0]), UnknownSequence,
                            "sequence 1.0 is not a sequence id"),
    "releasing an unknown sequence": (lambda d, r: d.cache.release(5), UnknownSequence,
                                      "sequence 5 is not in the cache (never added)"),
    "a batch of an unknown sequence": (lambda d, r: d.cache.batch([0, 9]), UnknownSequence,
                                       "sequence 9 is not in the cache"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_a_failure_changes_nothing_and_a_retry_gives_the_reference(case, graph):
    call, error, message = FAILURES[case]
    decoder, twin = _decoder(graph), _decoder(graph)
    before = _state(decoder.cache)
    with pytest.raises(error) as raised:
        call(decoder, seeded_rng(2112))
    assert message in str(raised.value), str(raised.value)
    _assert_unchanged(decoder.cache, before)
    _retry_matches_the_twin(decoder, twin)


def _retry_matches_the_twin(decoder, twin):
    """A prefill and two steps on both: the same bytes, both references at every step."""
    rng = seeded_rng(2113)
    k, v = _rows(rng, 30), _rows(rng, 30)
    assert decoder.prefill(k, v) == twin.prefill(k, v) == 2
    for _ in range(2):
        q, k_new, v_new = _step(rng, [0, 1, 2])
        before = [a.copy() for a in decoder.cache.arrays]
        out = decoder.step(q, k_new, v_new, [2, 0, 1])
        assert np.array_equal(out, twin.step(q, k_new, v_new, [2, 0, 1]))
        tables, lens = decoder.last_batch
        slots = np.array([decoder.cache.slots(s, [n - 1])[0] for s, n in zip([2, 0, 1], lens)],
                         np.int32)
        for a, e in zip(decoder.cache.arrays, paged_cache_write(k_new, v_new, slots, *before)):
            assert np.array_equal(a, e, equal_nan=True)
        for b in range(3):
            dense = (q[b:b + 1], *sequence_cache(*decoder.cache.arrays, tables, lens, b))
            check_against_references(out[b:b + 1], dense, np.float32(D ** -0.5))
    assert _state(decoder.cache)[:4] == _state(twin.cache)[:4]


def test_a_released_sequence_is_named_and_its_id_never_reused(graph):
    decoder = _decoder(graph)
    decoder.cache.release(0)
    before = _state(decoder.cache)
    for call in (lambda: decoder.cache.release(0), lambda: decoder.cache.append(0, 1),
                 lambda: decoder.step(*_step(seeded_rng(2114), [0]), [0])):
        with pytest.raises(UnknownSequence, match=r"sequence 0 is not in the cache \(released\)"
                                                  r"; it holds sequences \[1\]"):
            call()
        _assert_unchanged(decoder.cache, before)
    rng = seeded_rng(2115)
    assert decoder.prefill(_rows(rng, 2), _rows(rng, 2)) == 2, "a released id came back"
    assert sorted(decoder.cache.tables) == [1, 2]


def test_a_step_the_pool_cannot_hold_changes_nothing(graph):
    """Two sequences at a block edge, one free block: the step needs two, refused as a
    whole (not after the first sequence took the block); one alone then fits."""
    rng = seeded_rng(2116)
    decoder = PagedDecoder(graph, PagedCache(4, HKV, BS, D, seed=6))
    for length in (32, 16):
        decoder.prefill(_rows(rng, length), _rows(rng, length))
    before = _state(decoder.cache)
    with pytest.raises(PoolExhausted, match=r"sequences \[0, 1\] need 2 more blocks; 1 are free"):
        decoder.step(*_step(rng, [0, 1]), [0, 1])
    _assert_unchanged(decoder.cache, before)
    out = decoder.step(*_step(rng, [1]), [1])
    assert out.shape == (1, HQ, D) and decoder.cache.lengths == {0: 32, 1: 17}


def test_a_runtime_failure_after_the_write_rolls_the_step_back(graph):
    """@attend failing inside the runtime (after @write stored the tokens): the lengths,
    tables and free list are restored, and the retry writes the same slots."""
    decoder, twin = _decoder(graph), _decoder(graph)
    before = _state(decoder.cache)

    class FailingAttend:
        def entry(self, function):
            return graph.entry(function)

        def __call__(self, *arrays, function):
            if function == "attend":
                raise RuntimeError("the device went away")
            return graph(*arrays, function=function)

    decoder.graph = FailingAttend()
    with pytest.raises(RuntimeError, match="the device went away"):
        decoder.step(*_step(seeded_rng(2117), [0, 1]), [0, 1])
    assert _state(decoder.cache)[:4] == before[:4]
    decoder.graph = graph
    _retry_matches_the_twin(decoder, twin)


def test_an_empty_step_writes_nothing_and_returns_an_empty_batch(graph):
    decoder = _decoder(graph)
    before = _state(decoder.cache)
    out = decoder.step(*_step(seeded_rng(2118), []), [])
    assert out.shape == (0, HQ, D) and out.dtype == np.float32
    _assert_unchanged(decoder.cache, before)
    tables, lens = decoder.cache.batch([])
    assert tables.shape == (0, 0) and lens.shape == (0,)


@pytest.mark.parametrize("bias_in_graph", [False, True], ids=["bias_given", "bias_missing"])
def test_a_k_bias_the_graph_does_not_take_is_refused_at_construction(bias_in_graph, graph):
    # named when the decoder is made, not as an argument count at the first write
    compiled = (int8attn.compile(paged_decode_graph(HQ, HKV, D, BS, k_bias=True))
                if bias_in_graph else graph)
    bias = None if bias_in_graph else np.zeros((HKV, D), np.float32)
    with pytest.raises(InputError, match=f"@write takes {8 if bias_in_graph else 7} arguments, "
                                         f"but the decoder was given {'no' if bias_in_graph else 'a'} "
                                         f"k_bias: build the graph "
                                         f"{'without' if bias_in_graph else 'with'} one"):
        PagedDecoder(compiled, PagedCache(BLOCKS, HKV, BS, D), k_bias=bias)
