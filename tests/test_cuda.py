"""The CUDA target: kernels from the mma.sync model, compiled for sm_80; on a GPU, run."""

import re

import numpy as np
import pytest

from conftest import decode_inputs
from int8attn import reference as ref
from int8attn.contract.numerics import DIGIT_NUMERICS  # the simulated kernels' default
from int8attn.driver.graph import decode_graph
from int8attn.simulator import simulate_decode
from test_cli import run


def _cuda_device():
    try:
        import iree.runtime as rt

        return rt.Config("cuda")
    except Exception:  # no driver, no GPU: the runtime says so in various ways
        return None


def test_ptx_has_the_int8_and_bf16_mma(tmp_path):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 8, 2, 512, 64))
    int8 = run("int8attn", "compile", path, "--target", "cuda", "--emit", "ptx", "-o", "-",
               check_rc=0).stdout
    bf16 = run("int8attn", "compile", path, "--target", "cuda", "--pv", "bf16", "--emit", "ptx",
               "-o", "-", check_rc=0).stdout
    s8 = re.compile(r"mma\.sync\.aligned\.m16n8k32\.row\.col\.(satfinite\.)?s32\.s8\.s8\.s32")
    bf = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32")
    qk = (64 // 8) * (64 // 32)                  # 8-token blocks x K steps, per warp
    assert len(s8.findall(int8)) == qk + 2 * (64 // 8)
    assert not bf.findall(int8)
    assert len(s8.findall(bf16)) == qk
    assert len(bf.findall(bf16)) == 4 * (64 // 8)
    assert "shfl.sync.bfly" in int8 and "bar.sync" in int8


def test_bf16_pv_kernel_differs_only_in_pv():
    shape = (1, 8, 2, 300, 64)
    args = decode_inputs(61, *shape)
    out = simulate_decode(*args, 0.125, target="cuda", pv="bf16")
    bf16 = ref.fragment_attention(*args, 0.125, pv="bf16", numerics=DIGIT_NUMERICS)
    assert np.abs(out - bf16).max() <= 5e-5
    int8 = simulate_decode(*args, 0.125, target="cuda")
    expected = ref.fragment_attention(*args, 0.125, model="cuda", numerics=DIGIT_NUMERICS)
    assert np.abs(int8 - expected).max() <= 5e-5


@pytest.mark.skipif(_cuda_device() is None, reason="no CUDA device for IREE's CUDA runtime")
def test_kernels_on_the_gpu(tmp_path):
    from int8attn import bench_cuda

    bench_cuda.prepare(tmp_path, [4096], 2, 32, 8, 128)
    (row,) = bench_cuda.run(tmp_path, iterations=3)
    assert row["int8_within_tolerance"] and row["bf16_within_tolerance"]
    assert row["int8_transpose_v_within_tolerance"]


@pytest.mark.skipif(_cuda_device() is None, reason="no CUDA device for IREE's CUDA runtime")
def test_run_target_cuda_on_the_gpu(tmp_path):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 8, 2, 1000, 64))
    out = run("int8attn", "run", path, "--target", "cuda", "--seed", "3", check_rc=0).stdout
    fragment = float(re.search(r"vs fragment-level reference\s+max abs ([0-9.e+-]+)", out).group(1))
    assert fragment <= 5e-5


def test_the_simulated_ex2_flushes_as_ptx_ftz_does():
    # ex2.approx.ftz.f32: a result below 2^-126 is +0; the simulator must agree, or a
    # kernel's tiny probabilities would differ from the GPU's in the simulator only.
    from iree.compiler import ir

    from int8attn.kernels.target_spec import EXP2_INTRINSICS
    from int8attn.simulator.compute_ops import ComputeOps
    from int8attn.support.ir import new_context

    x = np.array([0.0, -1.0, -125.5, -126.0, -126.5, -140.0, -200.0, 3.0], np.float32)
    with new_context(), ir.Location.unknown():
        module = ir.Module.parse(
            "func.func @f(%x: f32) -> f32 {\n"
            f'  %y = llvm.call_intrinsic "{EXP2_INTRINSICS["cuda"]}"(%x) : (f32) -> f32\n'
            "  return %y : f32\n}")
        call = module.body.operations[0].regions[0].blocks[0].operations[0]
        got = ComputeOps().op_llvm_call_intrinsic(call.operation, [x])
    assert "ftz" in EXP2_INTRINSICS["cuda"]
    np.testing.assert_array_equal(got[:4], np.exp2(x[:4]))
    assert got[3] == np.float32(2.0 ** -126)
    assert not got[4:7].any() and got[7] == 8
