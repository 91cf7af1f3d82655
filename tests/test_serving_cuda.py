"""The serving path on a CUDA GPU (skipped without one): torch CUDA tensors in and out.

Kernels come from the IREE compiler where it is installed, else from the packages
`python benchmarks/serving_cuda.py prepare DIR --write` saved, named by
INT8ATTN_SERVING_PACKAGES=DIR (a GPU server without the compiler).
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from conftest import REPO

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(REPO / "benchmarks"))
import serving_cuda as bench  # noqa: E402

from int8attn.runtime.module import InputError  # noqa: E402
from int8attn.serving import PagedAttention  # noqa: E402

SEED = 2200


@pytest.fixture(scope="module")
def attn():
    folder = os.environ.get("INT8ATTN_SERVING_PACKAGES")
    if folder:
        return PagedAttention.load(folder)
    return PagedAttention(bench.HQ, bench.HKV, bench.D, bench.BS, target="cuda")


@pytest.fixture(scope="module")
def batch():
    print(f"random inputs: seed {SEED}", file=sys.stderr)
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    lengths = [1, 16, 17, 256, 257, 3000, 40, 1023]
    pool = bench.random_pool(torch, rng, 600, lengths, torch.device("cuda"))
    q = torch.randn(len(lengths), bench.HQ, bench.D, device="cuda")
    return q, pool


def test_ragged_batch_meets_both_references(attn, batch):
    q, pool = batch
    out = attn(q, *pool)
    checked = bench.check_against_references(attn, torch, out, q, pool, attn.numerics)
    assert checked["within_fragment_tolerance"], checked
    assert checked["exact_max_abs"] < 2e-2, checked    # one-term numerics on Gaussian q


def test_call_is_ordered_on_the_current_stream(attn, batch):
    q, pool = batch
    order = bench.stream_order(attn, torch, q, pool, torch.device("cuda"))
    assert order["control_reads_stale_q"], "the control did not race: the test cannot fail"
    assert order["ordered_on_side_stream"]


def test_no_copy_of_the_pool(attn, batch):
    q, pool = batch
    copies = bench.no_copies(attn, torch, q, pool)
    assert copies["pool_pointers_unchanged"]
    assert copies["host_device_memcpy_events_20_calls"] == 0
    assert copies["kernel_events_20_calls"] == 40


@pytest.mark.parametrize("case", ["cpu q", "f16 k_scale", "non-contiguous k_cache",
                                  "bad length", "block past the pool"])
def test_bad_inputs_are_named_and_write_nothing(attn, batch, case):
    q, pool = batch
    args = [q, *[t.clone() for t in pool]]
    if case == "cpu q":
        args[0], match = q.cpu(), "q, arg0\\) of @paged is on cpu"
    elif case == "f16 k_scale":
        args[2], match = args[2].half(), "k_scale.*must be torch.float32"
    elif case == "non-contiguous k_cache":
        args[1], match = args[1].transpose(0, 1).contiguous().transpose(0, 1), "not contiguous"
    elif case == "bad length":
        args[6][2], match = 10**6, "sequence 2 has length 1000000"
    else:
        args[5][0, 0], match = pool[0].shape[0], "sequence 0, slot 0"
    out = torch.full(q.shape, 7.0, device="cuda")
    with pytest.raises(InputError, match=match):
        attn(*args, out=out, validate="sync")
    assert bool((out == 7.0).all())


def test_cache_write_on_the_gpu_matches_the_reference_bitwise(attn):
    from int8attn.reference import paged_cache_write

    if "write" not in attn._executors and os.environ.get("INT8ATTN_SERVING_PACKAGES"):
        pytest.skip("no cache_write package in INT8ATTN_SERVING_PACKAGES")
    rng = np.random.default_rng(SEED + 1)
    pool = bench.random_pool(torch, rng, 64, [64 * bench.BS], torch.device("cuda"))[:4]
    slots = rng.permutation(64 * bench.BS)[:300].astype(np.int32)
    slots[::7] = -1                               # skipped tokens write nothing
    k_new = torch.randn(300, bench.HKV, bench.D, device="cuda") * 3
    v_new = torch.randn(300, bench.HKV, bench.D, device="cuda")
    k_new[5] = 0.0                                # a zero row: q = 0
    expected = paged_cache_write(k_new.cpu().numpy(), v_new.cpu().numpy(), slots,
                                 *[t.cpu().numpy() for t in pool])
    pointers = [t.data_ptr() for t in pool]
    attn.write(k_new, v_new, torch.from_numpy(slots).cuda(), *pool)
    assert [t.data_ptr() for t in pool] == pointers
    for got, want in zip(pool, expected):
        assert np.array_equal(got.cpu().numpy(), want, equal_nan=True)
