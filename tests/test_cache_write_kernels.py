"""cache_write as a lane kernel (kernels/cache_write.py) on cuda, gfx942 and gfx936, run
in the lane simulator: the pool after the call equals reference.paged_cache_write bit
for bit (levels and scales), with and without k_bias, from f32 or f16 rows; untouched
slots keep their garbage, a negative slot writes nothing; the kernel itself (under the
host's checks) quantizes a NaN or Inf row to q = 0 with a NaN scale and skips a slot
past the pool; the compiled PTX entry matches the kernel's ABI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import seeded_rng

import int8attn
from int8attn.driver.paged_decode import cache_write_graph
from int8attn.reference import paged_cache_write
from int8attn.runtime.module import InputError

HKV, D, BS, NB = 2, 64, 16, 6
TARGETS = ["cuda", "gfx942", "gfx936"]


def pool(rng):
    """Garbage everywhere: random levels, NaN scales (a slot the kernel should have
    written and did not shows as NaN or a wrong level)."""
    return [rng.integers(-127, 128, (NB, HKV, BS, D), dtype=np.int8),
            np.full((NB, HKV, BS), np.nan, np.float32),
            rng.integers(-127, 128, (NB, HKV, D, BS), dtype=np.int8),
            np.full((NB, HKV, BS), np.nan, np.float32)]


def new_rows(rng, tokens):
    """Ragged slots (a random permutation of the pool, token 3 padding) and rows with
    the contract's edge cases: a zero row, a row below 2^-118, a wide dynamic range."""
    slots = rng.permutation(NB * BS)[:tokens].astype(np.int32)
    slots[3] = -1                                          # vLLM's padding: skipped
    k_new = (rng.standard_normal((tokens, HKV, D)) * 3).astype(np.float32)
    v_new = rng.standard_normal((tokens, HKV, D)).astype(np.float32)
    k_new[1] = 0.0                                         # a zero row: q = 0, scale 0
    k_new[4, 1] *= np.float32(1e-38)                       # below 2^-118: q = 0
    v_new[6, 0, :5] = [1e30, -1e30, 3e-45, 0.5, -0.5]      # wide dynamic range
    return k_new, v_new, slots


def bias(rng):
    """A key bias with a few large channels, as conditioned K caches have."""
    b = rng.standard_normal((HKV, D)).astype(np.float32)
    b[:, :4] *= np.float32(40)
    return b


def assert_written(caches, before, expected, slots):
    """The pool equals the reference bit for bit, and a slot no token names is as it was."""
    for got, want in zip(caches, expected):
        assert np.array_equal(got, want, equal_nan=True)
    written = {int(s) for s in slots if 0 <= s < NB * BS}
    for slot in sorted(set(range(NB * BS)) - written):
        block, offset = divmod(slot, BS)
        for got, old, token_major in zip(caches, before, (True, True, False, True)):
            at = (block, slice(None), offset) if token_major else (block, ..., offset)
            assert np.array_equal(got[at], old[at], equal_nan=True), slot


@pytest.mark.parametrize("k_bias", [False, True], ids=["plain", "k_bias"])
@pytest.mark.parametrize("target", TARGETS)
def test_cache_write_kernel_matches_the_reference_bitwise(target, k_bias):
    rng = seeded_rng(2300)
    graph = int8attn.compile(cache_write_graph(HKV, D, BS, k_bias=k_bias), target=target,
                             simulate=True)
    caches = pool(rng)
    k_new, v_new, slots = new_rows(rng, 11)
    extra = (bias(rng),) if k_bias else ()
    expected = paged_cache_write(k_new, v_new, slots, *caches, *extra)
    before = [c.copy() for c in caches]
    written = graph(k_new, v_new, slots, *caches, *extra)
    for caller, got in zip(caches, written):
        assert np.array_equal(caller, got, equal_nan=True)   # the caller's arrays, in place
    assert_written(caches, before, expected, slots)
    block, offset = divmod(int(slots[0]), BS)
    assert not np.array_equal(caches[0][block, :, offset], before[0][block, :, offset])


def test_cache_write_kernel_widens_f16_rows():
    """f16 new rows are widened to f32 before the kernel (the host function), as the
    cpu lowering quantizes them."""
    rng = seeded_rng(2301)
    graph = int8attn.compile(cache_write_graph(HKV, D, BS, new_element="f16"),
                             target="cuda", simulate=True)
    caches = pool(rng)
    k_new, v_new, slots = new_rows(rng, 9)
    v_new[6, 0, :5] = [6e4, -6e4, 6e-8, 0.5, -0.5]         # f16's own range
    k_new, v_new = k_new.astype(np.float16), v_new.astype(np.float16)
    expected = paged_cache_write(k_new, v_new, slots, *caches)
    before = [c.copy() for c in caches]
    graph(k_new, v_new, slots, *caches)
    assert_written(caches, before, expected, slots)


@pytest.mark.parametrize("target", TARGETS)
def test_cache_write_kernel_on_what_the_host_checks_refuse(target):
    """The kernel alone (the host's checks refuse these calls): a NaN key row and an Inf
    value row quantize to q = 0 with a NaN scale, only in their own (token, head); a slot
    past the pool's NB * BS writes nothing anywhere."""
    from int8attn.simulator import simulate_kernel_ir

    rng = seeded_rng(2302)
    graph = int8attn.compile(cache_write_graph(HKV, D, BS, k_bias=True), target=target,
                             simulate=True)
    caches = pool(rng)
    k_new, v_new, slots = new_rows(rng, 8)
    k_new[2, 1, 7] = np.nan
    v_new[5, 0, 30] = np.inf
    slots[6] = NB * BS + 3                  # past the pool: divides into block NB
    b = bias(rng)
    expected = paged_cache_write(k_new, v_new, np.where(slots < NB * BS, slots, -1),
                                 *caches, k_bias=b)
    before = [c.copy() for c in caches]
    written = simulate_kernel_ir(graph.kernel_ir, graph.kernel_layout,
                                 (k_new, v_new, slots, *caches, b))
    assert_written(written, before, expected, slots)
    (kb, ko), (vb, vo) = divmod(int(slots[2]), BS), divmod(int(slots[5]), BS)
    assert not written[0][kb, 1, ko].any() and np.isnan(written[1][kb, 1, ko])
    assert not written[2][vb, 0, :, vo].any() and np.isnan(written[3][vb, 0, vo])
    assert np.isfinite(written[1][kb, 0, ko]) and np.isfinite(written[3][vb, 1, vo])
    assert np.isfinite(written[3][kb, 1, ko]) and np.isfinite(written[1][vb, 0, vo])


def ptx_entry(graph):
    """(the packaged kernel, its `.entry cache_write(...)` parameter list)."""
    from int8attn.serving.kernel_package import KernelPackage

    package = KernelPackage.from_graph(graph)
    (kernel,) = package.kernels
    return kernel, re.search(r"\.entry cache_write\((.*?)\)", package.ptx, re.S).group(1)


@pytest.mark.parametrize("k_bias", [False, True], ids=["plain", "k_bias"])
def test_cache_write_ptx_entry_matches_the_abi(k_bias):
    """One pointer per ABI input (the caches are inputs written in place, no outputs),
    then two b32 words per index push constant (IREE splits each i64 index)."""
    kernel, entry = ptx_entry(int8attn.compile(cache_write_graph(8, 128, 16, k_bias=k_bias),
                                               target="cuda"))
    assert kernel.abi.inputs[-1] == ("k_bias" if k_bias else "v_scale")
    assert entry.count(".u64 .ptr") == len(kernel.abi.inputs) == 7 + k_bias
    assert not kernel.abi.outputs
    assert entry.count(".b32") == 2 * len(kernel.abi.constants) == 4
    assert kernel.abi.writes_inputs == ("k_cache", "k_scale", "v_cache", "v_scale")


def test_cache_write_kernel_refuses_what_it_cannot_do():
    from int8attn.support.diagnostics import DiagnosticError

    with pytest.raises(DiagnosticError, match="head dim 48 must be a multiple of the 32-lane"):
        int8attn.compile(cache_write_graph(2, 48, 16), target="cuda", simulate=True)


@pytest.mark.parametrize("target", TARGETS)
def test_write_and_attend_in_one_kernel_module(target):
    """paged_decode_graph (@write with a k_bias, @attend) on a kernel target: one module,
    each function its own kernels and layout. A PagedDecoder prefills two sequences and
    runs decode steps on it: the pool equals the reference write of every token so far
    bit for bit, and each step's output is what @attend compiled alone gives."""
    from int8attn.driver.paged_decode import (PagedCache, PagedDecoder, paged_attention_graph,
                                              paged_decode_graph)

    rng = seeded_rng(2303)
    q_heads = 4
    graph = int8attn.compile(paged_decode_graph(q_heads, HKV, D, BS, k_bias=True),
                             target=target, simulate=True)
    assert {f: graph.kernel_layout_of(f)["mode"] for f in ("write", "attend")} == {
        "write": "cache_write", "attend": "paged"}
    alone = int8attn.compile(paged_attention_graph(q_heads, HKV, D, BS), target=target,
                             simulate=True)
    cache = PagedCache(NB, HKV, BS, D, seed=5)
    garbage = [c.copy() for c in cache.arrays]
    b = bias(rng)
    decoder = PagedDecoder(graph, cache, k_bias=b)
    rows = lambda n: (rng.standard_normal((n, HKV, D)).astype(np.float32) * 2,
                      rng.standard_normal((n, HKV, D)).astype(np.float32))
    keys, values = {}, {}
    for length in (5, 19):
        k, v = rows(length)
        sequence = decoder.prefill(k, v)
        keys[sequence], values[sequence] = [k], [v]
    for _ in range(2):
        q = rng.standard_normal((2, q_heads, D)).astype(np.float32)
        k, v = rows(2)
        out = decoder.step(q, k, v, [0, 1])
        for s in (0, 1):
            keys[s].append(k[s:s + 1])
            values[s].append(v[s:s + 1])
        assert np.array_equal(out, alone(q, *cache.arrays, *decoder.last_batch))
    slots = np.concatenate([cache.slots(s, np.arange(cache.lengths[s])) for s in (0, 1)])
    expected = paged_cache_write(np.concatenate(keys[0] + keys[1]),
                                 np.concatenate(values[0] + values[1]), slots, *garbage,
                                 k_bias=b)
    assert_written(cache.arrays, garbage, expected, slots)


def test_write_and_attend_package_from_one_cuda_module():
    """One vmfb of @write and @attend: a kernel package per function, from one PTX."""
    from int8attn.driver.paged_decode import paged_decode_graph
    from int8attn.serving.kernel_package import KernelPackage

    graph = int8attn.compile(paged_decode_graph(8, 2, 64, 16), target="cuda")
    write, attend = (KernelPackage.from_graph(graph, f) for f in ("write", "attend"))
    assert [k.abi.kernel for k in write.kernels] == ["cache_write"]
    assert write.layout["mode"] == "cache_write" and attend.layout["mode"] == "paged"
    assert write.ptx == attend.ptx
    for kernel in write.kernels + attend.kernels:
        assert f".entry {kernel.abi.kernel}(" in write.ptx
    with pytest.raises(InputError, match="choose one with --function"):
        KernelPackage.from_graph(graph)
