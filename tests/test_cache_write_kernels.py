"""cache_write as a lane kernel (kernels/cache_write.py) on cuda, gfx942 and gfx936, run
in the lane simulator: the pool after the call equals reference.paged_cache_write bit
for bit (levels and scales), untouched slots keep their garbage, a negative slot
writes nothing; the compiled PTX entry matches the kernel's ABI."""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import seeded_rng

import int8attn
from int8attn.driver.paged_decode import cache_write_graph
from int8attn.reference import paged_cache_write

HKV, D, BS, NB = 2, 64, 16, 6


def pool(rng):
    """Garbage everywhere: random levels, NaN scales (a slot the kernel should have
    written and did not shows as NaN or a wrong level)."""
    return [rng.integers(-127, 128, (NB, HKV, BS, D), dtype=np.int8),
            np.full((NB, HKV, BS), np.nan, np.float32),
            rng.integers(-127, 128, (NB, HKV, D, BS), dtype=np.int8),
            np.full((NB, HKV, BS), np.nan, np.float32)]


@pytest.mark.parametrize("target", ["cuda", "gfx942", "gfx936"])
def test_cache_write_kernel_matches_the_reference_bitwise(target):
    rng = seeded_rng(2300)
    graph = int8attn.compile(cache_write_graph(HKV, D, BS), target=target, simulate=True)
    caches = pool(rng)
    tokens = 11
    slots = rng.permutation(NB * BS)[:tokens].astype(np.int32)
    slots[3] = -1                                          # vLLM's padding: skipped
    k_new = (rng.standard_normal((tokens, HKV, D)) * 3).astype(np.float32)
    v_new = rng.standard_normal((tokens, HKV, D)).astype(np.float32)
    k_new[1] = 0.0                                         # a zero row: q = 0, scale 0
    k_new[4, 1] *= np.float32(1e-38)                       # below 2^-118: q = 0
    v_new[6, 0, :5] = [1e30, -1e30, 3e-45, 0.5, -0.5]      # wide dynamic range
    expected = paged_cache_write(k_new, v_new, slots, *caches)
    before = [c.copy() for c in caches]
    written = graph(k_new, v_new, slots, *caches)
    for got, caller, want in zip(written, caches, expected):
        assert np.array_equal(got, want, equal_nan=True)
        assert np.array_equal(caller, want, equal_nan=True)   # the caller's arrays, in place
    block, offset = divmod(int(slots[0]), BS)
    assert not np.array_equal(caches[0][block, :, offset], before[0][block, :, offset])


def test_cache_write_ptx_entry_matches_the_abi():
    from int8attn.serving.kernel_package import KernelPackage

    package = KernelPackage.from_graph(
        int8attn.compile(cache_write_graph(8, 128, 16), target="cuda"))
    (kernel,) = package.kernels
    entry = re.search(r"\.entry cache_write\((.*?)\)", package.ptx, re.S).group(1)
    assert entry.count(".u64 .ptr") == len(kernel.abi.inputs) == 7
    assert entry.count(".b32") == 2 * len(kernel.abi.constants)
    assert kernel.abi.writes_inputs == ("k_cache", "k_scale", "v_cache", "v_scale")


def test_cache_write_kernel_refuses_what_it_cannot_do():
    from int8attn.support.diagnostics import DiagnosticError

    with pytest.raises(DiagnosticError, match="head dim 48 must be a multiple of the 32-lane"):
        int8attn.compile(cache_write_graph(2, 48, 16), target="cuda", simulate=True)
    with pytest.raises(DiagnosticError, match="takes no k_bias yet"):
        int8attn.compile(cache_write_graph(2, 64, 16, k_bias=True), target="cuda",
                         simulate=True)
