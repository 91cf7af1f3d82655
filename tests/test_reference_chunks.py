"""The references work through query rows in chunks: same numbers, bounded memory.

Every output row depends only on its own row's computation, so the chunk size
(common.CHUNK_BYTES, forced tiny here) must not change a single bit.
"""

import re
import tracemalloc

import numpy as np
import pytest

from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.reference import common

UNCHUNKED = 1 << 62
SEED = ref.ONE_TERM_NUMERICS                   # the numerics these tests were written with


def _fragment(*args, **kwargs):
    return ref.fragment_attention(*args, numerics=SEED, **kwargs)


def _inputs(seed, q_shape, kv_heads, tokens, *, nan_row=False):
    rng = seeded_rng(seed)
    batch, head_dim = q_shape[0], q_shape[-1]
    q = (rng.standard_normal(q_shape) * 3).astype(np.float32)
    if nan_row:
        q.reshape(-1, head_dim)[1] = np.nan
    caches = [ref.quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim))
                                 .astype(np.float32)) for _ in range(2)]
    (k, k_scale), (v, v_scale) = caches
    return q, k, k_scale, v, v_scale


def _all_references(args, scale):
    out = {"exact": ref.exact_attention(*args, scale)}
    for pv in ref.PV_MODES:
        out[pv] = _fragment(*args, scale, pv=pv)
    out["contiguous"] = _fragment(*args, scale, scale_groups="contiguous")
    out["cuda"] = _fragment(*args, scale, model="cuda")
    return out


CASES = {  # q shape, kv heads, tokens
    "decode": ((2, 8, 64), 2, 300),
    "decode-mqa": ((3, 4, 32), 1, 513),
    "prefill": ((2, 4, 7, 64), 2, 200),
    "prefill-one-query": ((1, 4, 1, 64), 2, 65),
    "prefill-all-new": ((1, 2, 33, 32), 1, 33),
}


@pytest.mark.parametrize("budget", [1, 100_000, 400_000])   # one row per chunk; a few, a remainder
@pytest.mark.parametrize("case", sorted(CASES))
def test_chunked_references_equal_unchunked_bitwise(monkeypatch, case, budget):
    q_shape, kv_heads, tokens = CASES[case]
    args = _inputs(len(case), q_shape, kv_heads, tokens, nan_row=True)
    scale = q_shape[-1] ** -0.5
    monkeypatch.setattr(common, "CHUNK_BYTES", UNCHUNKED)
    whole = _all_references(args, scale)
    monkeypatch.setattr(common, "CHUNK_BYTES", budget)
    chunked = _all_references(args, scale)
    for name in whole:
        assert np.array_equal(whole[name], chunked[name], equal_nan=True), name
        assert np.isnan(chunked[name].reshape(-1, q_shape[-1])[1]).all(), name


def test_exact_matches_the_unchunked_formula(monkeypatch):
    """The float64 exact reference as it was written before chunking, bit for bit."""
    q, k, k_scale, v, v_scale = _inputs(11, (2, 4, 9, 64), 2, 150)
    k_deq = k.astype(np.float64) * k_scale[..., None]
    v_deq = v.astype(np.float64) * v_scale[..., None]
    rows = q.astype(np.float64).reshape(2, 2, -1, 64)
    scores = np.einsum("bhrd,bhsd->bhrs", rows, k_deq) * float(np.float32(0.125))
    scores = np.where(common.visible(q.shape, 2, 150), scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    expected = np.einsum("bhrs,bhsd->bhrd", p, v_deq).reshape(q.shape).astype(np.float32)
    monkeypatch.setattr(common, "CHUNK_BYTES", 1)
    assert np.array_equal(ref.exact_attention(q, k, k_scale, v, v_scale, 0.125), expected)


@pytest.mark.parametrize("head_dim", [64, 1100])   # f32 sums; f64 beyond 2^24
def test_int8_sums_are_exact_integer_sums(head_dim):
    """QK and PV sums through BLAS / int32 equal int64 sums, at extreme values."""
    rng = seeded_rng(12)
    qq = rng.choice(np.array([-127, 127, 5], np.int8), (2, 3, 5, head_dim))
    k = rng.choice(np.array([-128, 127, -3], np.int8), (2, 3, 70, head_dim))
    expected = np.einsum("bhrd,bhsd->bhrs", qq.astype(np.int64), k.astype(np.int64))
    got = common.exact_int_matmul(qq, np.swapaxes(k, -1, -2))
    assert np.array_equal(got, expected)
    assert np.array_equal(got.astype(np.float32), expected.astype(np.float32))

    w = rng.random((1, 2, 3, 2, 64)).astype(np.float32)
    w[..., ::7] = 0
    v_blocks = rng.choice(np.array([-128, 127, 1], np.int8), (1, 2, 2, 64, 16))
    groups = np.arange(64).reshape(2, 32)[:, ::-1]
    wq, sw = ref.quantize(w[..., groups])
    acc = np.einsum("bhrngk,bhngkd->bhrngd", wq.astype(np.int64),
                    v_blocks[:, :, :, groups, :].astype(np.int64))
    # the exact sums, rescaled by the contract's chain (its fma: tests/test_pv_chain.py)
    expected_pv = common.pv_chain([acc[:, :, :, :, g] for g in range(2)],
                                  [sw[:, :, :, :, g, None] for g in range(2)])
    assert np.array_equal(common.int8_pv(w, v_blocks, groups, numerics=SEED), expected_pv)


def _counts(messages, what):
    pattern = re.compile(rf"{what} reference: rows (\d+)/(\d+)$")
    matches = [pattern.match(m) for m in messages]
    assert all(matches), messages
    return [(int(m.group(1)), int(m.group(2))) for m in matches]


@pytest.mark.parametrize("q_shape,kv_heads,tokens", [((2, 4, 10, 32), 2, 80), ((3, 8, 64), 2, 300)])
def test_progress_is_called_per_chunk_with_monotone_counts(monkeypatch, q_shape, kv_heads, tokens):
    args = _inputs(13, q_shape, kv_heads, tokens)
    q_rows = int(np.prod(q_shape[:-1]))
    monkeypatch.setattr(common, "CHUNK_BYTES", 30_000)
    for what, run in (("exact", ref.exact_attention), ("fragment", _fragment)):
        messages = []
        run(*args, 0.125, progress=messages.append)
        counts = _counts(messages, what)
        done = [c for c, _ in counts]
        assert len(counts) >= 2 and all(total == q_rows for _, total in counts)
        assert done == sorted(set(done)) and done[-1] == q_rows


def test_references_pass_progress_through():
    from int8attn.driver.graph import AttentionCall, FunctionInfo, references
    from int8attn.runtime.module import TensorSpec

    args = _inputs(14, (1, 4, 6, 32), 2, 40)
    specs = tuple(TensorSpec(a.shape, "f32" if a.dtype == np.float32 else "i8") for a in args)
    info = FunctionInfo("prefill", specs, (specs[0],),
                        AttentionCall((0, 1, 2, 3, 4), "prefill", 0.125, 0))
    messages = []
    refs = references(info, list(args), pv="int8", model="gfx936", numerics=SEED,
                      progress=messages.append)
    assert _counts([m for m in messages if m.startswith("exact")], "exact")[-1] == (24, 24)
    assert _counts([m for m in messages if m.startswith("fragment")], "fragment")[-1] == (24, 24)
    assert np.array_equal(refs["fragment"], _fragment(*args, 0.125))


def test_reference_memory_stays_near_the_problem_size(monkeypatch):
    """S = Sq = 1024, D = 64, Hq = 8, Hkv = 2: inputs + output are 4.3 MiB.

    Peak traced allocation (tracemalloc, inputs allocated before) measured when
    this test was written: before chunking, exact 140 MiB (33x) and fragment
    395 MiB (93x), both growing with Sq * S. Chunked with a budget of 4 MiB:
    exact 6.9 MiB (1.6x), fragment 5.7 MiB (1.3x).
    """
    q, k, k_scale, v, v_scale = args = _inputs(15, (1, 8, 1024, 64), 2, 1024)
    io_bytes = sum(a.nbytes for a in args) + q.nbytes
    monkeypatch.setattr(common, "CHUNK_BYTES", 4 << 20)
    for run in (ref.exact_attention, _fragment):
        tracemalloc.start()
        try:
            run(*args, 0.125)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 4 * io_bytes, f"{run.__name__}: peak {peak / 2**20:.1f} MiB"
