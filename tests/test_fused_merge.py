"""The decode partition kernel that merges in its last workgroup (`fused_merge`).

Each workgroup counts its arrival with an atomic add; the last of a (sequence, KV
head) merges the partials. In the simulator (simulator/global_order.py) the atomics
of one op land in a seeded random order, a workgroup may read another's global
stores only through a release and a later acquire fence, the outputs start
poisoned (NaN) and the counter must be zero again after the call. Every output is
checked against both references, and against the merge kernel's.
"""

from dataclasses import replace

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import seeded_rng
from int8attn.kernels.decode import build_decode_kernels, dense_access, paged_access
from int8attn.kernels.shapes import DenseShape, PagedShape
from int8attn.kernels.target_spec import TargetSpec, target_spec
from int8attn.reference import sequence_cache
from int8attn.simulator.decode import run_dense_kernels, run_paged_kernels
from int8attn.simulator.global_order import atomic_add
from int8attn.simulator.interpreter import SimulationError
from int8attn.support.ir import new_context
from iree.compiler import ir
from test_paged import paged_batch

TARGETS = ["gfx936", "gfx942", "cuda"]
# One token, one partition, both sides of a partition edge (256 tokens), many partitions.
LENGTHS = [1, 17, 256, 257, 1300]
SCALE = 0.125


def _paged(spec: TargetSpec, arrays, head_dim=64, kv_heads=2, seed=0, **tuning):
    q_heads = arrays[0].shape[1]
    shape = PagedShape(kv_heads, q_heads // kv_heads, head_dim, 16, SCALE)
    with new_context(), ir.Location.unknown():
        chosen = replace(spec.default_tuning(head_dim), **tuning)
        built = build_decode_kernels(paged_access(shape, spec), spec, tuning=chosen)
        return run_paged_kernels(built.module, built.layout, *arrays, seed=seed), built.layout


@pytest.mark.parametrize("target", TARGETS)
def test_the_last_workgroup_merges_what_the_merge_kernel_does(target):
    rng = seeded_rng(401)
    arrays = paged_batch(rng, LENGTHS, 8, 2, 64, 16)
    spec = target_spec(target)
    separate, layout = _paged(spec, arrays)
    fused, fused_layout = _paged(spec, arrays, fused_merge=True)
    assert [a["kernel"] for a in layout["abi"]] == ["decode_partition", "decode_merge"]
    assert [a["kernel"] for a in fused_layout["abi"]] == ["decode_partition"]
    q, k, ks, v, vs, tables, lens = arrays
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b))
        check_against_references(fused[b:b + 1], dense, SCALE, model=target)
    # The same partials and weights; only the order of the merge's sums differs.
    np.testing.assert_allclose(fused, separate, rtol=0, atol=1e-6)


@pytest.mark.parametrize("splits, unroll", [(1, 1), (2, 4), (4, 3), (8, 2)])
def test_fused_merge_schedules_agree(splits, unroll):
    rng = seeded_rng(403)
    arrays = paged_batch(rng, [700, 3, 513], 8, 2, 64, 16)
    spec = target_spec("cuda")
    base, _ = _paged(spec, arrays, fused_merge=True)
    other, _ = _paged(spec, arrays, fused_merge=True, fused_splits=splits, fused_unroll=unroll)
    np.testing.assert_allclose(other, base, rtol=0, atol=1e-6)


def test_which_workgroup_arrives_last_changes_no_bit():
    # The merge reads every partition in a fixed order, whoever runs it.
    rng = seeded_rng(405)
    arrays = paged_batch(rng, [900, 260, 31], 8, 2, 64, 16)
    spec = target_spec("gfx942")
    outs = [_paged(spec, arrays, seed=seed, fused_merge=True)[0] for seed in (0, 1, 2)]
    assert np.isfinite(outs[0]).all()
    assert all(np.array_equal(outs[0], out) for out in outs[1:])


def test_the_dense_decode_merges_in_its_last_workgroup_too():
    rng = seeded_rng(407)
    batch, kv_heads, q_heads, tokens, dim = 2, 2, 8, 600, 64
    q = rng.standard_normal((batch, q_heads, dim)).astype(np.float32)
    k = rng.integers(-127, 128, (batch, kv_heads, tokens, dim), dtype=np.int8)
    v = rng.integers(-127, 128, (batch, kv_heads, tokens, dim), dtype=np.int8)
    ks = rng.uniform(0.002, 0.02, (batch, kv_heads, tokens)).astype(np.float32)
    vs = rng.uniform(0.002, 0.02, (batch, kv_heads, tokens)).astype(np.float32)
    shape = DenseShape(batch, kv_heads, q_heads // kv_heads, tokens, dim, SCALE)
    spec = target_spec("gfx936")
    with new_context(), ir.Location.unknown():
        tuning = replace(spec.default_tuning(dim), fused_merge=True)
        built = build_decode_kernels(dense_access(shape, spec), spec, tuning=tuning)
        out = run_dense_kernels(built.module, built.layout, q, k, ks, v, vs, seed=3)
    check_against_references(out, (q, k, ks, v, vs), SCALE, model="gfx936")


@pytest.mark.parametrize("dropped, message", [
    ("release", "stored with no release fence after the store"),
    ("acquire", "with no acquire fence after that release")])
def test_a_missing_fence_is_refused(monkeypatch, dropped, message):
    fence = TargetSpec.device_fence
    monkeypatch.setattr(TargetSpec, "device_fence",
                        lambda self, ordering: None if ordering == dropped
                        else fence(self, ordering))
    arrays = paged_batch(seeded_rng(409), [300, 40], 8, 2, 64, 16)
    with pytest.raises(SimulationError, match=message):
        _paged(target_spec("cuda"), arrays, fused_merge=True)


def test_a_fence_that_orders_only_its_workgroup_is_refused():
    arrays = paged_batch(seeded_rng(411), [300, 40], 8, 2, 64, 16)
    spec = replace(target_spec("cuda"), device_scope="block")
    with pytest.raises(SimulationError, match="sync scope 'block' does not order"):
        _paged(spec, arrays, fused_merge=True)


def test_fused_splits_must_divide_the_workgroup():
    spec = target_spec("cuda")
    shape = PagedShape(2, 4, 64, 16, SCALE)
    with new_context(), ir.Location.unknown(), pytest.raises(ValueError,
                                                             match="3 fused merge splits"):
        build_decode_kernels(paged_access(shape, spec), spec,
                             tuning=replace(spec.default_tuning(64), fused_merge=True,
                                            fused_splits=3))


def test_atomic_adds_land_once_each_in_a_random_order():
    rng = seeded_rng(413)
    where = rng.integers(0, 5, 200)
    orders = []
    for seed in (0, 1):
        buffer = np.zeros(5, np.int32)
        seen = atomic_add(buffer, where, np.ones(200, np.int32), np.random.default_rng(seed))
        counts = np.bincount(where, minlength=5)
        assert np.array_equal(buffer, counts)
        for address in range(5):   # each thread saw a distinct count before its add
            assert sorted(seen[where == address]) == list(range(counts[address]))
        orders.append(seen)
    assert not np.array_equal(*orders)


def test_iree_builds_the_fused_kernel_for_cuda(monkeypatch):
    # The host zero-fills the counter and ties it to the dispatch; the PTX has one atomic
    # add between a release and an acquire fence of GPU scope, and no merge kernel.
    import int8attn
    from int8attn.driver.paged_decode import paged_attention_graph
    from int8attn.kernels import target_spec as specs
    from int8attn.serving.kernel_package import KernelPackage

    cuda = specs.TARGET_SPECS["cuda"]
    monkeypatch.setitem(specs.TARGET_SPECS, "cuda",
                        replace(cuda, tuning=replace(cuda.tuning, fused_merge=True)))
    graph = int8attn.compile(paged_attention_graph(8, 2, 64, 16), target="cuda", cache=False)
    package = KernelPackage.from_graph(graph)
    (kernel,) = package.kernels
    assert kernel.abi.kernel == "decode_partition"
    assert [b.name for b in kernel.abi.counters] == ["arrivals"]
    body = package.ptx[package.ptx.index(".entry decode_partition"):]
    atomic = body.index("atom.")
    assert body.count("atom.") == 1 and ".add." in body[atomic:body.index("\n", atomic)]
    assert "fence.acq_rel.gpu" in body[:atomic] and "fence.acq_rel.gpu" in body[atomic:]
    # The torch launcher passes a counter per call that it never clears: the kernel
    # leaves it zero (KernelABI.counters).
    torch = pytest.importorskip("torch")
    from int8attn.serving.executors import CudaExecutor

    sizes = {"B": 3, "NB": 40, "MB": 9, "P": 1}
    (grid, _, _, names, counters), = CudaExecutor(package).plan(sizes)
    assert grid == (1, 2, 3) and names[len(kernel.abi.inputs) - 1] == "arrivals"
    assert counters == [("arrivals", (3, 2), torch.int32)]


def test_the_dense_host_zero_fills_a_static_counter(monkeypatch):
    # The dense decode's counter has no run-time size: the host fills a static [B, Hkv].
    import int8attn
    from int8attn.driver.graph import decode_graph
    from int8attn.kernels import target_spec as specs
    from int8attn.serving.kernel_package import read_executable

    cuda = specs.TARGET_SPECS["cuda"]
    monkeypatch.setitem(specs.TARGET_SPECS, "cuda",
                        replace(cuda, tuning=replace(cuda.tuning, fused_merge=True)))
    graph = int8attn.compile(decode_graph(2, 8, 2, 600, 64), target="cuda", cache=False)
    exports, ptx = read_executable(graph.vmfb)
    # (IREE's own dispatches pad K/V and transpose V)
    assert "decode_partition" in exports and "decode_merge" not in exports and "atom." in ptx
    assert graph.kernel_layout_of()["abi"][0]["counters"] == [
        {"name": "arrivals", "shape": [2, 2], "element": "i32"}]


def test_counters_are_the_last_inputs_the_kernel_writes():
    from int8attn.kernels.abi import Buffer, KernelABI

    counter = Buffer("arrivals", ("B", 2), "i32")
    KernelABI("k", ("q", "arrivals"), (), (), (1, 1, 1), 32, writes_inputs=("arrivals",),
              counters=(counter,))
    for inputs, writes in ((("arrivals", "q"), ("arrivals",)), (("q", "arrivals"), ())):
        with pytest.raises(ValueError, match="counters .* must be its last inputs"):
            KernelABI("k", inputs, (), (), (1, 1, 1), 32, writes_inputs=writes,
                      counters=(counter,))
