"""Shared fixtures: a private module cache, seeded inputs, compiled decode graphs."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from int8attn.contract.numerics import SEED_NUMERICS  # noqa: F401  (the tests' name for it)

REPO = Path(__file__).resolve().parent.parent

# Property-based tests: `quick` runs in CI (fixed, derandomized examples);
# `long` (--hypothesis-profile=long) draws >= 10,000 fresh cases on demand.
_FUZZ = dict(deadline=None, print_blob=True,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("quick", max_examples=30, derandomize=True, **_FUZZ)
settings.register_profile("long", max_examples=10_000, **_FUZZ)
settings.load_profile("quick")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Compiled modules go to a per-session cache, never the user's."""
    os.environ["INT8ATTN_CACHE_DIR"] = str(tmp_path_factory.mktemp("int8attn-cache"))
    yield


@pytest.fixture(autouse=True, scope="session")
def _private_temp_dir(tmp_path_factory):
    """Reproducer folders (int8attn-repro-*) that tests provoke land in pytest's own
    temporary tree, in this process and in the commands it starts; the system temp
    dir must gain none."""
    import tempfile

    system = Path(tempfile.gettempdir())
    before = set(system.glob("int8attn-repro-*"))
    private = tmp_path_factory.mktemp("tmp")
    saved = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = str(private)
    os.environ["TMPDIR"] = str(private)
    yield
    tempfile.tempdir = saved[0]
    if saved[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[1]
    leaked = set(system.glob("int8attn-repro-*")) - before
    assert not leaked, f"tests left reproducer folders in {system}: {sorted(leaked)}"


def seeded_rng(seed: int) -> np.random.Generator:
    print(f"random inputs: numpy default_rng seed {seed}", file=sys.stderr)
    return np.random.default_rng(seed)


@lru_cache(maxsize=None)
def compiled_decode(batch, q_heads, kv_heads, tokens, head_dim, pv="int8",
                    numerics=SEED_NUMERICS):
    """`numerics` (a Numerics) default to the seed's contract (SEED_NUMERICS, one-term Q,
    s8 W in one term), which the files using this helper pass to the references too;
    test_numerics.py also tests the pipeline's defaults (`Numerics()`)."""
    import int8attn
    from int8attn.driver.graph import decode_graph

    source = decode_graph(batch, q_heads, kv_heads, tokens, head_dim)
    return int8attn.compile(source, filename=f"decode_{tokens}.mlir", pv=pv, cache=False,
                            numerics=numerics)


@lru_cache(maxsize=None)
def compiled_attention(mode, shape, pv="int8"):
    """shape = (B, Hq, Hkv, S, Sq, D); Sq is ignored for decode. The pipeline's default
    numerics (accuracy.check_against_references follows them)."""
    import int8attn
    from int8attn.driver.graph import attention_graph

    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=query_tokens)
    return int8attn.compile(source, filename=f"{mode}.mlir", pv=pv, cache=False)


def decode_inputs(seed, batch, q_heads, kv_heads, tokens, head_dim):
    from int8attn.reference import quantize_cache

    rng = seeded_rng(seed)
    q = rng.standard_normal((batch, q_heads, head_dim)).astype(np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim)).astype(np.float32))
    return q, k, k_scale, v, v_scale


# The x86-64 levels the cpu-target tests compile for beside `host`, with the
# register file IREE sizes vector tiles by on each (support/cpu_vectors.py).
# A level this machine cannot execute is compiled but not run (skipped).
X86_LEVELS = {"x86-64": "sse", "x86-64-v3": "avx", "x86-64-v4": "avx512"}


def runnable_here(target_cpu: str) -> bool:
    """Whether this machine can execute code compiled for `target_cpu`."""
    from int8attn.driver.cpu_target import UnknownTargetCPU, check_runnable_here, resolve

    if not resolve("host").triple.startswith("x86_64") and target_cpu != "host":
        return False
    try:
        check_runnable_here(resolve(target_cpu))
    except UnknownTargetCPU:
        return False
    return True


def require_runnable(target_cpu: str) -> None:
    if not runnable_here(target_cpu):
        pytest.skip(f"this machine cannot execute --target-cpu {target_cpu} code")


# The slow tier: files whose tests compile and run full-size modules on IREE or
# through the lane simulator (numerics at 4K-16K tokens, every lowering form and
# CPU level, the kernel targets, the fuzzer's compiled cases), and the slowest
# tests of the other files. `pytest -m "not slow"` runs the rest: the error paths
# of every surface, the IR tests (lit), the references, the fragment model, the
# CPU-level rule and the CLIs' everyday paths.
SLOW_FILES = {
    "test_mmac_lowering.py", "test_fuzz.py", "test_numerics.py", "test_prefill.py",
    "test_scale_groups.py", "test_w_terms.py", "test_q_terms.py", "test_w_quant.py",
    "test_edge_cases.py", "test_onnx_import.py", "test_onnx_cli.py", "test_kernels.py",
    "test_prefill_kernels.py", "test_paged_kernels.py", "test_targets.py", "test_cuda.py",
    "test_paged.py", "test_paged_prefill.py", "test_paged_decode_loop.py",
    "test_stage_errors.py", "test_key_bias.py",
}
SLOW_TESTS = {
    "test_cpu_levels.py::test_each_level_meets_both_references",
    "test_cli.py::test_inputs_that_are_not_an_npz_of_arrays",
    "test_cli.py::test_several_public_functions_need_function",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        file = item.path.name
        test = f"{file}::{item.originalname}"
        if file in SLOW_FILES or test in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)
