"""The softmax's exp2 where no hardware exp2 is used (contract.exp2): the cpu pipeline,
the gfx targets' kernels and every merge.

Claimed: within 2 ulps of 2^x wherever 2^x is normal (x >= -126); for -126.5 <= x <
-126 (a subnormal 2^x) within 2^-148 of it, or +0 where subnormals flush (IREE's CPU
runtime flushes them); +0 below -126.5 and at -inf; NaN for NaN; never poison (fptosi
sees no NaN). Checked on IREE's CPU
(x86-64-v3 and x86-64-v4, the code an AVX2-only and an AVX-512 machine run) and in
the lane simulator, against 2^x in float64. IREE's own math.exp2 is not enough by
itself: its error grows with |x| (56 ulps at x = -126 on llvm-cpu), which is why the
contract reduces the range first."""

import numpy as np
import pytest
from iree.compiler import ir
from iree.compiler.dialects import func, memref

from conftest import require_runnable, seeded_rng, simulate_workgroup
from int8attn.contract import scalar_ir as contract
from int8attn.dialects import builders as build
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS
from int8attn.support.ir import new_context

F32 = np.float32
SPECIAL = np.array([0.0, -0.0, -0.5, 0.5 - 1, -1.5, -125.5, -126.0, -126.4, -126.5, -126.6,
                    -127.0, -127.5, -127.6, -149.0, -1000.0, -np.inf, np.nan], F32)


def draw(seed: int, count: int) -> np.ndarray:
    """x over the softmax's range (s - m <= 0): uniform on [-150, 0], the specials."""
    print(f"seed {seed}")
    x = seeded_rng(seed).uniform(-150, 0, count).astype(F32)
    return np.concatenate([x, SPECIAL])


def check(x: np.ndarray, got: np.ndarray) -> None:
    exact = np.exp2(x.astype(np.float64))
    normal = exact >= 2.0 ** -126
    want = exact.astype(F32)
    ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
    assert ulps[normal].max() <= 2, f"{ulps[normal].max()} ulps at x = {x[normal][ulps[normal].argmax()]}"
    flushed = x < -126.5                                # -inf too
    assert (got[flushed] == 0).all() and not np.signbit(got[flushed]).any()
    between = ~normal & ~flushed & ~np.isnan(x)        # 2^-126.5 <= 2^x < 2^-126
    close = np.abs(got[between] - exact[between]) <= 2.0 ** -148
    assert between.any() and (close | (got[between] == 0)).all()
    assert np.isnan(got[np.isnan(x)]).all()


def _exp2_module(count: int) -> str:
    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            vector = ir.RankedTensorType.get([count], ir.F32Type.get())

            @func.FuncOp.from_py_func(vector, name="exp2")
            def exp2(x):
                return build.generic([x], ["i"], "i", build.empty([count], "f32"),
                                     lambda value, _: contract.exp2(value))
        return str(module)


@pytest.mark.parametrize("target_cpu", ["x86-64-v3", "x86-64-v4"])
def test_exp2_on_the_iree_cpu(target_cpu):
    import iree.runtime as rt

    require_runnable(target_cpu)
    x = draw(21, 4096)
    vmfb, _ = iree_compile(_exp2_module(x.size), TARGETS["cpu"], target_cpu=target_cpu)
    module = rt.load_vm_flatbuffer(vmfb, driver="local-task")
    check(x, np.asarray(module.exp2(x).to_host()))


def test_exp2_in_the_lane_simulator():
    threads, width = 64, 16
    x = draw(22, threads * width - SPECIAL.size).reshape(threads, width)
    got = np.zeros_like(x)

    def body(lanes, views):
        xs, out = views
        for j in range(width):
            at = [lanes.thread, lanes.index(j)]
            memref.store(contract.exp2(memref.load(xs, at)), out, at)

    simulate_workgroup("exp2", [x, got], threads, body)
    check(x.ravel(), got.ravel())
