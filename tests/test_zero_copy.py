"""The CPU runtime reads the caller's memory in place, and copies only what it must.

On `local-task` a C-contiguous, 64-byte aligned argument is imported as the HAL buffer
itself (runtime/module.py): a write through IREE's view shows in the numpy array, and a
call records no copy of it (`LoadedModule.copies`). An argument of a result's size is
copied (IREE 3.13 may compute the result in its buffer: a module returning its argument,
or adding into it, would hand back or overwrite the caller's array), and so is a strided,
misaligned or bf16 argument, once, with its reason. Results are the same either way, bit for bit, and within the contract's
tolerance of both references. Read-only arguments are read in place where the module
only reads them and refused where it writes them. Also: the default cpu decode module's
dispatch count, an upper bound a fusion may lower and a regression may not raise.
"""

from __future__ import annotations

import gc
import re
import subprocess
import sys

import numpy as np
import pytest

import int8attn
from accuracy import check_against_references
from conftest import seeded_rng
from int8attn.driver.graph import decode_graph, random_inputs
from int8attn.driver.paged_decode import PagedCache, PagedDecoder, paged_decode_graph
from int8attn.reference import sequence_cache
from int8attn.runtime import LoadedModule, aligned_copy
from int8attn.runtime.module import InputError, TensorSpec

B, HQ, HKV, S, D = 2, 8, 2, 300, 64      # S crosses a 256-token partition edge
SCALE = D ** -0.5

# A module returning its first argument as it is (IREE hands back the same buffer) and
# a sum of both, compiled by IREE alone: the pointer a result has is the one passed.
SAME = """func.func @same(%a: tensor<4x16xf32>, %b: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %s = arith.addf %a, %b : tensor<4x16xf32>
  return %a, %s : tensor<4x16xf32>, tensor<4x16xf32>
}"""


RESULT_SIZED = "a result of its type"


def _copied(copies) -> list[tuple[int, str]]:
    return [(c.argument, "result-sized" if RESULT_SIZED in c.why else c.why) for c in copies]


def _misaligned(array: np.ndarray, offset: int = 16) -> np.ndarray:
    """A copy of `array` whose data starts `offset` bytes past a 64-byte edge."""
    raw = np.zeros(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    out = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def _strided(array: np.ndarray) -> np.ndarray:
    """The same values in memory that is not C-contiguous (every second element)."""
    wide = np.zeros(array.shape[:-1] + (2 * array.shape[-1],), array.dtype)
    view = wide[..., ::2]
    view[...] = array
    return view


@pytest.fixture(scope="module")
def same_module():
    from iree.compiler import compile_str

    vmfb = compile_str(SAME, target_backends=["llvm-cpu"],
                       extra_args=["--iree-llvmcpu-target-cpu=generic"])
    return LoadedModule(vmfb, {"same": [TensorSpec((4, 16), "f32")] * 2})


@pytest.fixture(scope="module")
def decode():
    graph = int8attn.compile(decode_graph(B, HQ, HKV, S, D), target="cpu")
    arrays = random_inputs(graph.entry(), 4800)
    print("random inputs: random_inputs seed 4800", file=sys.stderr)
    return graph, [aligned_copy(a) for a in arrays]


def test_a_write_through_the_device_view_is_the_numpy_arrays_memory(same_module):
    rng = seeded_rng(4801)
    array = aligned_copy(rng.standard_normal((4, 16)).astype(np.float32))
    view = same_module.host_view(array)
    mapped = view.map().asarray(tuple(view.shape), np.dtype(np.float32))
    assert mapped.ctypes.data == array.ctypes.data
    mapped[1, 2] = 7.5                      # through IREE's mapping ...
    assert array[1, 2] == 7.5               # ... into the caller's array
    array[3, 3] = -2.0
    assert mapped[3, 3] == -2.0
    # what cannot be one buffer is not offered as one
    assert same_module.host_view(_misaligned(array)) is None
    assert same_module.host_view(_strided(array)) is None


def test_an_argument_the_size_of_a_result_is_copied_and_never_written(same_module):
    rng = seeded_rng(4802)
    a = aligned_copy(rng.standard_normal((4, 16)).astype(np.float32))
    b = aligned_copy(rng.standard_normal((4, 16)).astype(np.float32))
    kept, expected = a.copy(), a + b
    same, total = same_module.call("same", a, b)
    assert _copied(same_module.copies) == [(0, "result-sized"), (1, "result-sized")]
    assert not np.shares_memory(same, a)
    np.testing.assert_array_equal(same, kept)
    np.testing.assert_array_equal(total, expected)
    np.testing.assert_array_equal(a, kept)


def test_a_module_adding_into_its_argument_leaves_the_callers_array_as_it_was():
    # IREE 3.13 computes `a + b` in a's buffer where it may: imported as it is, the
    # caller's `a` would be overwritten
    from iree.compiler import compile_str

    add = """func.func @add(%a: tensor<64x16xf32>, %b: tensor<16xf32>) -> tensor<64x16xf32> {
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (j)>, affine_map<(i, j) -> (i, j)>],
                       iterator_types = ["parallel", "parallel"]}
      ins(%b : tensor<16xf32>) outs(%a : tensor<64x16xf32>) {
    ^bb0(%x: f32, %acc: f32):
      %s = arith.addf %acc, %x : f32
      linalg.yield %s : f32
  } -> tensor<64x16xf32>
  return %r : tensor<64x16xf32>
}"""
    vmfb = compile_str(add, target_backends=["llvm-cpu"],
                       extra_args=["--iree-llvmcpu-target-cpu=generic"])
    module = LoadedModule(vmfb, {"add": [TensorSpec((64, 16), "f32"), TensorSpec((16,), "f32")]})
    rng = seeded_rng(4807)
    a = aligned_copy(rng.standard_normal((64, 16)).astype(np.float32))
    b = aligned_copy(rng.standard_normal(16).astype(np.float32))
    kept = a.copy()
    out = module.call("add", a, b)[0]
    np.testing.assert_array_equal(a, kept)
    np.testing.assert_array_equal(out, kept + b)
    assert _copied(module.copies) == [(0, "result-sized")]


def test_a_read_only_argument_is_read_in_place(decode):
    graph, arrays = decode
    read_only = [aligned_copy(a) for a in arrays]
    for a in read_only:
        a.setflags(write=False)
    np.testing.assert_array_equal(graph(*read_only), graph(*arrays))
    assert _copied(graph.executor.copies) == [(0, "result-sized")]     # q: [B, Hq, D]


@pytest.mark.parametrize("layout, reason", [(_misaligned, "64-byte aligned"),
                                             (_strided, "C-contiguous")],
                         ids=["misaligned", "strided"])
def test_what_cannot_be_read_in_place_is_copied_once_with_its_reason(same_module, layout,
                                                                     reason):
    rng = seeded_rng(4804)
    a = layout(rng.standard_normal((4, 16)).astype(np.float32))
    b = aligned_copy(rng.standard_normal((4, 16)).astype(np.float32))
    same, total = same_module.call("same", a, b)
    assert [(c.argument, c.direction, c.nbytes) for c in same_module.copies] == \
        [(0, "in", 4 * 16 * 4), (1, "in", 4 * 16 * 4)]
    assert reason in same_module.copies[0].why
    np.testing.assert_array_equal(same, a)
    np.testing.assert_array_equal(total, a + b)
    assert not np.shares_memory(same, a)


def test_the_dense_api_copies_only_q_of_what_it_is_given_aligned(decode):
    graph, arrays = decode
    before = [a.copy() for a in arrays]
    out = graph(*arrays)
    assert _copied(graph.executor.copies) == [(0, "result-sized")]    # the caches: in place
    for kept, array in zip(before, arrays):            # read, never written
        np.testing.assert_array_equal(array, kept)
    # the same call on the same values, each argument in turn strided then misaligned:
    # one copy of that argument, the same result bit for bit
    for index in range(1, len(arrays)):
        for layout, reason in ((_strided, "C-contiguous"), (_misaligned, "aligned")):
            moved = list(arrays)
            moved[index] = layout(arrays[index])
            np.testing.assert_array_equal(graph(*moved), out)
            copies = graph.executor.copies
            assert [(c.argument, c.direction) for c in copies] == [(0, "in"), (index, "in")]
            assert reason in copies[1].why and copies[1].nbytes == arrays[index].nbytes


def test_dense_results_match_both_references_whatever_the_layout(decode):
    graph, arrays = decode
    read_only = [aligned_copy(a) for a in arrays]
    for a in read_only:
        a.setflags(write=False)
    out = graph(*read_only)
    assert _copied(graph.executor.copies) == [(0, "result-sized")]
    errors = check_against_references(out, arrays, SCALE, numerics=graph.options.numerics)
    print(f"vs references: {errors}", file=sys.stderr)
    np.testing.assert_array_equal(graph(*[_misaligned(a) for a in arrays]), out)


def test_out_receives_the_result(decode):
    graph, arrays = decode
    expected = graph(*arrays)
    out = np.full(expected.shape, np.nan, np.float32)
    got = graph(*arrays, out=out)
    assert got is out
    np.testing.assert_array_equal(out, expected)
    for bad, words in ((np.zeros((B, HQ, D + 1), np.float32), "shape"),
                       (np.zeros((B, HQ, D), np.float64), "dtype"),
                       ([0.0], "numpy array")):
        with pytest.raises(InputError, match=words):
            graph(*arrays, out=bad)
    read_only = np.zeros(expected.shape, np.float32)
    read_only.setflags(write=False)
    with pytest.raises(InputError, match="read-only"):
        graph(*arrays, out=read_only)


def test_a_torch_tensor_is_read_in_place(decode):
    torch = pytest.importorskip("torch")
    graph, arrays = decode
    tensors = [torch.tensor(a) for a in arrays]      # torch's allocator: 64-byte aligned
    assert all(t.data_ptr() % 64 == 0 for t in tensors)
    out = graph(*tensors)
    assert _copied(graph.executor.copies) == [(0, "result-sized")]
    np.testing.assert_array_equal(out, graph(*arrays))


def test_a_decode_step_copies_only_q_and_matches_the_references():
    rng = seeded_rng(4805)
    graph = int8attn.compile(paged_decode_graph(HQ, HKV, D, 16), target="cpu")
    cache = PagedCache(blocks=64, kv_heads=HKV, block_size=16, head_dim=D, seed=4805)
    decoder = PagedDecoder(graph, cache)
    prompts = [40, 17]
    floats = [(rng.standard_normal((n, HKV, D)).astype(np.float32),
               rng.standard_normal((n, HKV, D)).astype(np.float32)) for n in prompts]
    sequences = [decoder.prefill(aligned_copy(k), aligned_copy(v)) for k, v in floats]
    assert graph.executor.copies == []                     # @write: every argument in place
    pool = [a.ctypes.data for a in cache.arrays]
    q = aligned_copy(rng.standard_normal((2, HQ, D)).astype(np.float32))
    k_new, v_new = (aligned_copy(rng.standard_normal((2, HKV, D)).astype(np.float32))
                    for _ in range(2))
    out = np.empty((2, HQ, D), np.float32)
    got = decoder.step(q, k_new, v_new, sequences, out=out)
    assert got is out                                   # @attend: the pool in place, q copied
    assert _copied(graph.executor.copies) == [(0, "result-sized")]
    assert [a.ctypes.data for a in cache.arrays] == pool
    tables, lengths = decoder.last_batch
    for row in range(len(sequences)):
        dense = (q[row:row + 1], *sequence_cache(*cache.arrays, tables, lengths, row))
        print(f"sequence {row} vs references: "
              f"{check_against_references(out[row:row + 1], dense, SCALE)}", file=sys.stderr)
    # a strided q: one copy, named
    decoder.step(_strided(q), k_new, v_new, sequences)
    assert [(c.argument, c.direction) for c in graph.executor.copies] == [(0, "in")]


def test_a_read_only_cache_is_refused_where_written_and_read_where_only_read():
    rng = seeded_rng(4806)
    graph = int8attn.compile(paged_decode_graph(HQ, HKV, D, 16), target="cpu")
    cache = PagedCache(blocks=8, kv_heads=HKV, block_size=16, head_dim=D, seed=4806)
    decoder = PagedDecoder(graph, cache)
    k, v = (rng.standard_normal((20, HKV, D)).astype(np.float32) for _ in range(2))
    sequence = decoder.prefill(k, v)
    caches = [aligned_copy(a) for a in cache.arrays]
    for a in caches:
        a.setflags(write=False)
    tables, lengths = cache.batch([sequence])
    q = aligned_copy(rng.standard_normal((1, HQ, D)).astype(np.float32))
    out = graph(q, *caches, tables, lengths, function="attend")      # read: in place
    assert _copied(graph.executor.copies) == [(0, "result-sized")]
    np.testing.assert_array_equal(out, graph(q, *cache.arrays, tables, lengths,
                                             function="attend"))
    with pytest.raises(InputError, match="read-only"):
        graph(k[:1], v[:1], np.array([21], np.int32), *caches, function="write")


def test_the_default_cpu_decode_module_has_at_most_todays_dispatches():
    # Dispatches the memoized command buffer records (hal.command_buffer.dispatch) and
    # the distinct executables they run, in `iree-dump-module` of the vmfb. Today's
    # counts are upper bounds: a fusion lowers them, a split that adds passes over the
    # data fails here. (B 1, Hq 32, Hkv 8, S 4K, D 128; the count does not depend on S.)
    graph = int8attn.compile(decode_graph(1, 32, 8, 4096, 128), target="cpu")
    dispatches, executables = _dispatch_counts(graph.vmfb)
    print(f"default cpu decode module: {dispatches} dispatches of {executables} "
          f"executables", file=sys.stderr)
    assert 0 < executables <= dispatches
    assert dispatches <= 27 and executables <= 23


def _dispatch_counts(vmfb: bytes) -> tuple[int, int]:
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "module.vmfb"
        path.write_bytes(vmfb)
        dump = subprocess.run([sys.executable, "-m", "iree._runtime.scripts.iree_dump_module",
                               str(path)], capture_output=True, text=True, check=True).stdout
    dispatches = len(re.findall(r"vm\.call\.variadic @hal\.command_buffer\.dispatch\b", dump))
    executables = len(set(re.findall(r"`(\w+_dispatch_\d+)", dump)))
    return dispatches, executables
