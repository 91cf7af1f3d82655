"""int8attn.serving on torch tensors, where CI runs it: the cpu target, the device-side
value checks (evaluated here on CPU tensors), the cuda kernel package and its
refusals without a GPU. tests/test_serving_cuda.py runs the GPU side."""

from __future__ import annotations

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import seeded_rng

torch = pytest.importorskip("torch")

from int8attn.driver.paged_decode import cache_write_graph, paged_attention_graph  # noqa: E402
from int8attn.reference import paged_cache_write, sequence_cache  # noqa: E402
from int8attn.runtime.module import InputError  # noqa: E402
from int8attn.serving import PagedAttention  # noqa: E402
from int8attn.serving.device_checks import host_arrays, passes_value_rules  # noqa: E402
from int8attn.serving.executors import CudaExecutor  # noqa: E402
from int8attn.serving.kernel_package import KernelPackage, PackageError  # noqa: E402

HQ, HKV, D, BS, NB = 8, 2, 64, 16, 40


def pool_and_batch(rng, lengths, blocks=NB):
    """A garbage pool (random int8, NaN scales), tables scattering each sequence's
    blocks, and the new tokens that fill them (k, v rows, slot mapping)."""
    k_cache = torch.from_numpy(rng.integers(-127, 128, (blocks, HKV, BS, D), dtype=np.int8))
    v_cache = torch.from_numpy(rng.integers(-127, 128, (blocks, HKV, D, BS), dtype=np.int8))
    k_scale = torch.full((blocks, HKV, BS), float("nan"))
    v_scale = torch.full((blocks, HKV, BS), float("nan"))
    width = max(-(-n // BS) for n in lengths) + 1
    tables = np.full((len(lengths), width), -1, np.int32)
    order, used = rng.permutation(blocks), 0
    for b, n in enumerate(lengths):
        tables[b, :-(-n // BS)] = order[used:used + -(-n // BS)]
        used += -(-n // BS)
    slots = np.array([tables[b, t // BS] * BS + t % BS
                      for b, n in enumerate(lengths) for t in range(n)], np.int32)
    new = [torch.from_numpy(rng.standard_normal((len(slots), HKV, D)).astype(np.float32))
           for _ in range(2)]
    return ([k_cache, k_scale, v_cache, v_scale], torch.from_numpy(tables),
            torch.tensor(lengths, dtype=torch.int32), new, torch.from_numpy(slots))


@pytest.fixture(scope="module")
def cpu_attention():
    return PagedAttention(HQ, HKV, D, BS, target="cpu")


def test_write_then_attend_on_cpu_tensors_meets_both_references(cpu_attention):
    rng = seeded_rng(2100)
    lengths = [37, 100, 1, 64]
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, lengths)
    expected_pool = [t.numpy().copy() for t in pool]
    pointers = [t.data_ptr() for t in pool]
    cpu_attention.write(k_new, v_new, slots, *pool)
    expected_pool = paged_cache_write(k_new.numpy(), v_new.numpy(), slots.numpy(), *expected_pool)
    for got, want in zip(pool, expected_pool):          # the write, bit for bit, in place
        assert np.array_equal(got.numpy(), want, equal_nan=True)
    assert [t.data_ptr() for t in pool] == pointers
    q = torch.from_numpy(rng.standard_normal((len(lengths), HQ, D)).astype(np.float32))
    out = torch.empty(q.shape)
    result = cpu_attention(q, *pool, tables, lens, out=out)
    assert result is out
    arrays = [t.numpy() for t in (q, *pool, tables, lens)]
    for b in range(len(lengths)):
        dense = (arrays[0][b:b + 1], *sequence_cache(*arrays[1:], b))
        check_against_references(out.numpy()[b:b + 1], dense, cpu_attention.softmax_scale)


def test_bf16_queries_are_taken_and_computed_in_f32(cpu_attention):
    rng = seeded_rng(2101)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [20, 50])
    cpu_attention.write(k_new, v_new, slots, *pool)
    q = torch.from_numpy(rng.standard_normal((2, HQ, D)).astype(np.float32)).to(torch.bfloat16)
    out = cpu_attention(q, *pool, tables, lens)
    assert out.dtype == torch.float32
    assert torch.equal(out, cpu_attention(q.float(), *pool, tables, lens))


@pytest.mark.parametrize("case", ["non-contiguous v_cache", "f16 k_scale", "i64 tables",
                                  "numpy q", "q batch"])
def test_bad_tensors_are_named(cpu_attention, case):
    rng = seeded_rng(2102)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [20, 50])
    cpu_attention.write(k_new, v_new, slots, *pool)
    q = torch.zeros(2, HQ, D)
    args = [q, *pool, tables, lens]
    if case == "non-contiguous v_cache":
        args[3] = torch.zeros(NB, HKV, BS, D, dtype=torch.int8).transpose(2, 3)
        match = "v_cache.*not contiguous"
    elif case == "f16 k_scale":
        args[2] = pool[1].half()
        match = "k_scale.*must be torch.float32"
    elif case == "i64 tables":
        args[5] = tables.long()
        match = "block_tables.*must be torch.int32"
    elif case == "numpy q":
        args[0] = q.numpy().tolist()
        match = "q.*must be a torch tensor"
    else:
        args[0] = torch.zeros(3, HQ, D)
        match = "q has 3 sequences, block_tables 2"
    before = [t.clone() for t in pool]
    with pytest.raises(InputError, match=match):
        cpu_attention(*args)
    assert all(torch.equal(a, b) or torch.isnan(a).any() for a, b in zip(pool, before))


def _paged_info(query_tokens=None):
    import int8attn

    graph = int8attn.compile(paged_attention_graph(HQ, HKV, D, BS, query_tokens=query_tokens),
                             target="cpu")
    return graph.entry()


def _write_info():
    import int8attn

    return int8attn.compile(cache_write_graph(HKV, D, BS), target="cpu").entry()


BAD_ATTEND = {
    "length 0": lambda a: a[6].__setitem__(0, 0),
    "length beyond the table": lambda a: a[6].__setitem__(1, a[5].shape[1] * BS + 1),
    "negative block id in a used slot": lambda a: a[5].__setitem__((0, 0), -3),
    "block id past the pool": lambda a: a[5].__setitem__((1, 0), NB),
    "NaN k scale in a read slot": lambda a: a[2].__setitem__(
        (int(a[5][0, 0]), 0, 3), float("nan")),
    "negative v scale in a read slot": lambda a: a[4].__setitem__(
        (int(a[5][1, 1]), 1, 0), -1.0),
}


@pytest.mark.parametrize("case", sorted(BAD_ATTEND))
def test_device_value_rules_agree_with_the_host_checks(case):
    """passes_value_rules (what the cuda path runs on the GPU) on CPU tensors: True for a
    legal call, False for each bad one, and the shared numpy check names the fault."""
    from int8attn.driver.paged_inputs import check_paged_arguments

    info = _paged_info()
    rng = seeded_rng(2103)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [20, 50])
    PagedAttention(HQ, HKV, D, BS, target="cpu").write(k_new, v_new, slots, *pool)
    args = [torch.zeros(2, HQ, D), *pool, tables.clone(), lens.clone()]
    assert passes_value_rules(info, args)
    check_paged_arguments(info, host_arrays(info, args))
    BAD_ATTEND[case](args)
    assert not passes_value_rules(info, args)
    with pytest.raises(InputError):
        check_paged_arguments(info, host_arrays(info, args))


@pytest.mark.parametrize("case", ["slot past the pool", "duplicate slot", "NaN row",
                                  "Inf v row", "token counts"])
def test_device_write_rules_agree_with_the_host_checks(case):
    from int8attn.driver.paged_inputs import check_cache_write_arguments

    info = _write_info()
    rng = seeded_rng(2104)
    pool, _, _, (k_new, v_new), slots = pool_and_batch(rng, [5, 9])
    slots = slots.clone()
    slots[2] = -1                    # a skipped token may hold anything
    k_new[2, 0, 0] = float("nan")
    args = [k_new, v_new, slots, *pool]
    assert passes_value_rules(info, args)
    if case == "slot past the pool":
        slots[0] = NB * BS
    elif case == "duplicate slot":
        slots[3] = slots[4]
    elif case == "NaN row":
        k_new[1, 1, 5] = float("nan")
    elif case == "Inf v row":
        v_new[0, 0, 0] = float("inf")
    else:
        args[1] = v_new[:-1]
    assert not passes_value_rules(info, args)
    with pytest.raises(InputError):
        check_cache_write_arguments(info, host_arrays(info, args))


@pytest.fixture(scope="module")
def cuda_package(tmp_path_factory):
    import int8attn

    graph = int8attn.compile(paged_attention_graph(HQ, HKV, D, BS), target="cuda")
    return KernelPackage.from_graph(graph)


def test_kernel_package_matches_its_ptx_and_round_trips(cuda_package, tmp_path):
    import re

    for kernel in cuda_package.kernels:
        abi = kernel.abi
        entry = re.search(rf"\.entry {abi.kernel}\((.*?)\)", cuda_package.ptx, re.S).group(1)
        pointers, words = entry.count(".u64 .ptr"), entry.count(".b32")
        assert pointers == len(abi.inputs) + len(abi.outputs)
        assert words == 2 * len(abi.constants)
        assert re.search(rf"\.entry {abi.kernel}\(.*?\.maxntid {abi.threads}, 1, 1", cuda_package.ptx,
                         re.S)
        assert kernel.shared_bytes > 0
    loaded = KernelPackage.load(cuda_package.save(tmp_path / "pkg"))
    assert loaded == cuda_package


def test_a_cuda_module_refuses_cpu_tensors_before_any_device_work(cuda_package):
    executor = CudaExecutor(cuda_package)
    attn = PagedAttention(HQ, HKV, D, BS, target="cuda")
    attn._executors["decode"] = executor
    rng = seeded_rng(2105)
    pool, tables, lens, _, _ = pool_and_batch(rng, [20])
    with pytest.raises(InputError, match=r"q, arg0\) of @paged is on cpu, but this module "
                                         r"runs on cuda"):
        attn(torch.zeros(1, HQ, D), *pool, tables, lens)
    assert executor._loaded == {}          # no module was loaded, nothing launched


def test_packages_need_cuda_graphs_and_folders_that_are_packages(tmp_path):
    import int8attn

    graph = int8attn.compile(paged_attention_graph(HQ, HKV, D, BS), target="cpu")
    with pytest.raises(PackageError, match="--target cuda"):
        KernelPackage.from_graph(graph)
    with pytest.raises(PackageError, match="is not a kernel package"):
        KernelPackage.load(tmp_path)
    with pytest.raises(InputError, match="holds no saved PagedAttention"):
        PagedAttention.load(tmp_path)
    with pytest.raises(InputError, match="target 'cuda' or 'cpu'"):
        PagedAttention(HQ, HKV, D, BS, target="gfx942")


def test_torch_ops_trace_under_fake_tensors(cpu_attention):
    from torch._subclasses.fake_tensor import FakeTensorMode

    from int8attn.serving import torch_ops

    handle = torch_ops.register(cpu_attention)
    assert torch_ops.register(cpu_attention) == handle
    with FakeTensorMode():
        q = torch.empty(3, HQ, D)
        pool = [torch.empty(NB, HKV, BS, D, dtype=torch.int8), torch.empty(NB, HKV, BS),
                torch.empty(NB, HKV, D, BS, dtype=torch.int8), torch.empty(NB, HKV, BS)]
        out = torch.ops.int8attn.paged_attention(q, *pool, torch.empty(3, 4, dtype=torch.int32),
                                                 torch.empty(3, dtype=torch.int32), handle, False)
        assert out.shape == q.shape and out.dtype == torch.float32
    with pytest.raises(ValueError, match="names no PagedAttention"):
        torch.ops.int8attn.paged_attention(torch.zeros(1, HQ, D), *[torch.zeros(1)] * 4,
                                           torch.zeros(1, 1, dtype=torch.int32),
                                           torch.ones(1, dtype=torch.int32), 10**6, False)


def test_torch_ops_write_and_attend_on_cpu(cpu_attention):
    from int8attn.serving import torch_ops

    handle = torch_ops.register(cpu_attention)
    rng = seeded_rng(2106)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [30, 17])
    torch.ops.int8attn.cache_write(k_new, v_new, slots, *pool, handle, True)
    q = torch.from_numpy(rng.standard_normal((2, HQ, D)).astype(np.float32))
    via_op = torch.ops.int8attn.paged_attention(q, *pool, tables, lens, handle, True)
    assert torch.equal(via_op, cpu_attention(q, *pool, tables, lens))


def test_torch_compile_traces_the_ops_whole(cpu_attention):
    """fullgraph=True: the ops are leaves of the traced graph (their fake
    implementations give the shapes), no graph break; the compiled function gives the
    eager result."""
    from int8attn.serving import torch_ops

    handle = torch_ops.register(cpu_attention)
    rng = seeded_rng(2107)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [30, 17])

    def step(k_new, v_new, slots, k_cache, k_scale, v_cache, v_scale, q, tables, lens):
        torch.ops.int8attn.cache_write(k_new, v_new, slots, k_cache, k_scale, v_cache,
                                       v_scale, handle, False)
        out = torch.ops.int8attn.paged_attention(q, k_cache, k_scale, v_cache, v_scale,
                                                 tables, lens, handle, False)
        return out * 2.0

    q = torch.from_numpy(rng.standard_normal((2, HQ, D)).astype(np.float32))
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(k_new, v_new, slots, *pool, q, tables, lens)
    assert torch.equal(got, cpu_attention(q, *pool, tables, lens) * 2.0)


def test_dlpack_producers_are_taken_without_a_copy(cpu_attention):
    """numpy arrays (DLPack producers, as IREE device arrays and CuPy arrays are) in
    place of tensors: the same result, and the pool written in the caller's memory."""
    rng = seeded_rng(2108)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, [30, 17])
    arrays = [t.numpy() for t in pool]
    cpu_attention.write(k_new.numpy(), v_new.numpy(), slots.numpy(), *arrays)
    assert not np.isnan(arrays[1][tables[0, 0].item()]).any()   # written in place
    q = rng.standard_normal((2, HQ, D)).astype(np.float32)
    out = cpu_attention(q, *arrays, tables.numpy(), lens.numpy())
    assert torch.equal(out, cpu_attention(torch.from_numpy(q), *pool, tables, lens))


def test_a_shape_the_kernels_cannot_build_names_the_attention_not_a_graph_file():
    # the graph is generated: its file name means nothing to the caller
    from int8attn.serving.paged_attention import DECODE

    attention = PagedAttention(8, 2, 40, 16, target="cpu")
    with pytest.raises(InputError, match=r"PagedAttention\(q_heads=8, kv_heads=2, head_dim=40, "
                                         r"block_size=16, target='cpu'\) cannot build its "
                                         r"decode kernel: head dim 40 is not a multiple of "
                                         r"N=16") as error:
        attention.executor(DECODE)
    assert "decode.mlir" not in str(error.value)
