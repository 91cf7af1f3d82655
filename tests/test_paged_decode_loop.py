"""A decode loop on the paged INT8 cache, end to end on the IREE CPU runtime.

One module holding @write (int8attn.cache_write) and @attend
(int8attn.paged_attention) is compiled once; sequences of different lengths
are prefilled into a pool whose blocks come from a shuffled free list, then
every decode step writes each sequence's new token (one @write call), grows
its length by one and attends (one @attend call). After every write the cache
equals the numpy quantization of the written tokens bit for bit (and nothing
else changed); every step matches both references for every sequence
(tests/accuracy.py); the lengths cross block (16) and partition (256) edges.

In place (docs/python-api.md, *Writing in place*): @write updates the caller's numpy
arrays without copying them, so its cost does not grow with the pool. On the
2-core CPU this was written on (T = 16 new tokens, 8 KV heads, D = 128, BS = 16,
medians of 30 calls, range over three runs):

    NB      pool       in place         copying (unaligned arrays: copy in + out)
    64      2.1 MiB    0.41-0.59 ms     0.72-0.82 ms
    4096    132 MiB    0.34-0.40 ms     91-100 ms
"""

import time

import numpy as np
import pytest

import int8attn
import int8attn.api as api
from accuracy import check_against_references
from conftest import REPO, seeded_rng
from int8attn import cli
from int8attn.driver.paged_decode import PagedCache, PagedDecoder, paged_decode_graph
from int8attn.reference import paged_cache_write, sequence_cache
from int8attn.runtime import aligned_copy
from int8attn.runtime.module import InputError

HQ, HKV, D, BS = 8, 2, 64, 16
PROMPTS = [15, 1, 255, 40]
STEPS = 3


@pytest.fixture(scope="module")
def decode_graph():
    """The two-function module, compiled once (counted), and the compile count."""
    calls = []
    real = api.compile_stages

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    api.compile_stages = counting
    try:
        graph = int8attn.compile(paged_decode_graph(HQ, HKV, D, BS), cache=False)
        yield graph, calls
    finally:
        api.compile_stages = real


def _tokens(rng, count):
    return [rng.standard_normal((count, HKV, D)).astype(np.float32) for _ in range(2)]


def _assert_same(actual, expected):
    for name, a, e in zip(("k_cache", "k_scale", "v_cache", "v_scale"), actual, expected):
        assert np.array_equal(a, e, equal_nan=True), f"{name} differs from the numpy write"


def test_decode_loop_matches_both_references_at_every_step(decode_graph):
    graph, compiles = decode_graph
    rng = seeded_rng(11)
    cache = PagedCache(64, HKV, BS, D, seed=5)
    decoder = PagedDecoder(graph, cache)
    sequences = []
    for length in PROMPTS:
        k, v = _tokens(rng, length)
        before = [a.copy() for a in cache.arrays]
        sequence = decoder.prefill(k, v)
        slots = cache.slots(sequence, np.arange(length))
        _assert_same(cache.arrays, paged_cache_write(k, v, slots, *before))
        sequences.append(sequence)
    assert len({b for s in sequences for b in cache.tables[s]}) == sum(
        len(cache.tables[s]) for s in sequences)
    scale = np.float32(D ** -0.5)
    for step in range(STEPS):
        q = rng.standard_normal((len(sequences), HQ, D)).astype(np.float32)
        k_new, v_new = _tokens(rng, len(sequences))
        before = [a.copy() for a in cache.arrays]
        out = decoder.step(q, k_new, v_new, sequences)
        tables, lens = decoder.last_batch
        assert lens.tolist() == [n + step + 1 for n in PROMPTS]
        slots = np.array([cache.slots(s, [n - 1])[0] for s, n in zip(sequences, lens)],
                         np.int32)
        _assert_same(cache.arrays, paged_cache_write(k_new, v_new, slots, *before))
        for b in range(len(sequences)):
            dense = (q[b:b + 1], *sequence_cache(*cache.arrays, tables, lens, b))
            check_against_references(out[b:b + 1], dense, scale)
    assert len(compiles) == 1, "one compiled module serves every write and every step"


def test_write_updates_the_callers_arrays_and_skips_negative_slots(decode_graph):
    graph, _ = decode_graph
    rng = seeded_rng(12)
    caches = PagedCache(8, HKV, BS, D, seed=1).arrays
    before = [a.copy() for a in caches]
    k, v = _tokens(rng, 4)
    slots = np.array([5, -1, 127, 16], np.int32)
    results = graph(k, v, slots, *caches, function="write")
    assert all(r is a for r, a in zip(results, caches)), "not the caller's arrays"
    _assert_same(caches, paged_cache_write(k, v, slots, *before))
    assert np.isnan(caches[1][0, :, 6]).all()            # untouched slots keep what they held
    # Arrays the runtime cannot pass by reference (not 64-byte aligned) are updated too.
    unaligned = [_shifted(a) for a in before]
    results = graph(k, v, slots, *unaligned, function="write")
    assert all(r is a for r, a in zip(results, unaligned))
    _assert_same(unaligned, paged_cache_write(k, v, slots, *before))


def _shifted(array):
    """A copy of `array` whose data starts 16 bytes past a 64-byte edge."""
    raw = np.zeros(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + 16
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _pool(blocks: int, aligned: bool):
    caches = [np.zeros((blocks, 8, BS, 128), np.int8), np.zeros((blocks, 8, BS), np.float32),
              np.zeros((blocks, 8, 128, BS), np.int8), np.zeros((blocks, 8, BS), np.float32)]
    return [aligned_copy(c) if aligned else _shifted(c) for c in caches]


def _median_call(graph, blocks, aligned, rng, calls=15):
    caches = _pool(blocks, aligned)
    k, v = (rng.standard_normal((16, 8, 128)).astype(np.float32) for _ in range(2))
    slots = rng.choice(blocks * BS, 16, replace=False).astype(np.int32)
    graph(k, v, slots, *caches, function="write")
    seconds = []
    for _ in range(calls):
        start = time.perf_counter()
        graph(k, v, slots, *caches, function="write")
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def test_write_cost_does_not_grow_with_the_pool():
    """T = 16 tokens into pools of 64 and 4096 blocks (examples/paged_decode.mlir):
    in place the time per call stays flat; the copying fallback grows with NB."""
    graph = int8attn.compile((REPO / "examples" / "paged_decode.mlir").read_text())
    rng = seeded_rng(13)
    small = _median_call(graph, 64, True, rng)
    large = _median_call(graph, 4096, True, rng)
    copying = _median_call(graph, 4096, False, rng, calls=5)
    print(f"in place: NB 64 {small * 1e3:.2f} ms, NB 4096 {large * 1e3:.2f} ms; "
          f"copying NB 4096 {copying * 1e3:.1f} ms")
    assert large < 2 * small + 1e-3, (small, large)
    assert copying > 10 * large, (large, copying)


def test_the_example_runs(capsys):
    import runpy

    example = runpy.run_path(str(REPO / "examples" / "paged_decode.py"))
    assert example["main"](["--steps", "2", "--blocks", "128"]) == 0
    out = capsys.readouterr().out
    assert "step 1: lengths [39, 252, 3, 602]" in out and "FAILED" not in out
    assert out.count("cache == numpy quantization: True") == 4


def _bad(arrays, index, value):
    out = [a.copy() for a in arrays]
    out[index] = value(out[index])
    return out


REFUSED = {
    "slot past the pool": (lambda s: np.array([3, 128, 4], np.int32), 2,
                           "argument 2 (slot_mapping, arg2) of @write: token 1 writes slot "
                           "128, outside the pool's slots [0, 128) (8 blocks of 16 tokens; a "
                           "negative slot skips its token)"),
    "tokens disagree": (lambda v: v[:2], 1,
                        "@write: k_new has 3 new tokens, v_new 2 and slot_mapping 3; they "
                        "must agree"),
    "two tokens, one slot": (lambda s: np.array([40, -1, 40], np.int32), 2,
                             "argument 2 (slot_mapping, arg2) of @write: tokens 0 and 2 both "
                             "write slot 40 (block 2, offset 8); which one the cache would "
                             "hold is ambiguous"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_writes_are_named_and_write_nothing(case, decode_graph, tmp_path, capsys):
    graph, _ = decode_graph
    rng = seeded_rng(14)
    k, v = _tokens(rng, 3)
    arrays = [k, v, np.array([3, 9, 4], np.int32), *PagedCache(8, HKV, BS, D, seed=2).arrays]
    change, index, message = REFUSED[case]
    bad = _bad(arrays, index, change)
    before = [a.copy() for a in bad[3:]]
    with pytest.raises(InputError) as error:
        graph(*bad, function="write")
    assert message in str(error.value), str(error.value)
    _assert_same(bad[3:], before)
    path, npz, out = tmp_path / "decode.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_decode_graph(HQ, HKV, D, BS))
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(bad)})
    assert cli.main(["run", str(path), "--function", "write", "--inputs", str(npz),
                     "--output", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


CHAINED_WRITES = """
func.func @twice(%k1: tensor<?x2x64xf32>, %v1: tensor<?x2x64xf32>, %s1: tensor<?xi32>,
                 %k2: tensor<?x2x64xf32>, %v2: tensor<?x2x64xf32>, %s2: tensor<?xi32>,
                 %kc: tensor<?x2x16x64xi8>, %ks: tensor<?x2x16xf32>,
                 %vc: tensor<?x2x64x16xi8>, %vs: tensor<?x2x16xf32>)
    -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) {
  %a:4 = "int8attn.cache_write"(%k1, %v1, %s1, %kc, %ks, %vc, %vs) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  %b:4 = "int8attn.cache_write"(%k2, %v2, %s2, %a#0, %a#1, %a#2, %a#3) {block_size = 16 : i64} : (tensor<?x2x64xf32>, tensor<?x2x64xf32>, tensor<?xi32>, tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>) -> (tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>)
  return %b#0, %b#1, %b#2, %b#3 : tensor<?x2x16x64xi8>, tensor<?x2x16xf32>, tensor<?x2x64x16xi8>, tensor<?x2x16xf32>
}
"""


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
def test_chained_writes_return_both_and_leave_the_callers_arrays(aligned):
    # the returned write reads the first one's results, not the arguments: value semantics
    # (new arrays, both writes applied), the same however the caller's arrays are laid out
    rng = seeded_rng(6100)
    nb = 4
    pool = [np.zeros((nb, 2, 16, 64), np.int8), rng.uniform(0.01, 0.02, (nb, 2, 16)).astype(
        np.float32), np.zeros((nb, 2, 64, 16), np.int8), rng.uniform(0.01, 0.02, (nb, 2, 16))
        .astype(np.float32)]
    pool = [aligned_copy(a) if aligned else np.array(a, copy=True) for a in pool]
    before = [a.copy() for a in pool]
    first = (*[rng.standard_normal((3, 2, 64)).astype(np.float32) for _ in range(2)],
             np.array([0, 17, 40], np.int32))
    second = (*[rng.standard_normal((2, 2, 64)).astype(np.float32) for _ in range(2)],
              np.array([17, 63], np.int32))       # 17: over the first write's token
    graph = int8attn.compile(CHAINED_WRITES, cache=False)
    out = graph(*first, *second, *pool)
    expected = paged_cache_write(*second, *paged_cache_write(*first, *before))
    for got, want, mine, kept in zip(out, expected, pool, before):
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(mine, kept)


def test_a_torch_cache_is_updated_in_place_contiguous_or_not(decode_graph):
    # a contiguous tensor is passed by reference; a strided one is copied in, and the
    # written cache copied back into the tensor's own memory (it was left untouched)
    import torch

    graph, _ = decode_graph
    rng = seeded_rng(6300)
    k, v = (rng.standard_normal((3, HKV, D)).astype(np.float32) for _ in range(2))
    slots = np.array([0, 17, 40], np.int32)
    nb = 4
    kc = torch.zeros((2 * nb, HKV, BS, D), dtype=torch.int8)[::2]           # every 2nd block
    ks = torch.zeros((nb, HKV, BS))
    vc = torch.zeros((nb, HKV, BS, D), dtype=torch.int8).transpose(2, 3)  # [NB, Hkv, D, BS]
    vs = torch.zeros((nb, HKV, BS))
    expected = paged_cache_write(k, v, slots, *(np.zeros(tuple(t.shape), t.numpy().dtype)
                                                for t in (kc, ks, vc, vs)))
    graph(k, v, slots, kc, ks, vc, vs, function="write")
    for tensor, want in zip((kc, ks, vc, vs), expected):
        np.testing.assert_array_equal(tensor.numpy(), want)
