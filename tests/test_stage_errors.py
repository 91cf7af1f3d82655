"""Failures inside IREE name their stage and a command line that reproduces them;
the module cache never hands out a damaged module and never changes a result."""

import os
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import int8attn
from int8attn import cli
from int8attn.api import CompiledGraph
from int8attn.support.diagnostics import StageError
from int8attn.driver.graph import decode_graph, random_inputs
from int8attn.runtime import ModuleCache

SOURCE = decode_graph(1, 4, 2, 40, 32)


@pytest.fixture(scope="module")
def graph():
    return int8attn.compile(SOURCE, cache=False)


def reproduce(command: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(shlex.split(command), capture_output=True, text=True, env=env, timeout=300)


def test_iree_compile_failure_names_the_stage_and_reproduces():
    with pytest.raises(StageError) as failure:
        int8attn.compile(SOURCE, cache=False, iree_flags=("--iree-no-such-flag",))
    error = failure.value
    assert error.stage == "IREE cpu compilation (iree-compile)"
    assert "Unknown command line argument '--iree-no-such-flag'" in str(error)
    assert "Invoked with" not in str(error)          # the compiler's words, not the wrapper's
    saved = Path(shlex.split(error.reproducer)[1]).read_text()
    assert "func.func @decode" in saved and "int8attn." not in saved   # the IR handed to IREE
    again = reproduce(error.reproducer)
    assert again.returncode != 0 and "--iree-no-such-flag" in again.stderr


def test_a_module_that_does_not_load_names_the_stage_and_reproduces(graph):
    arrays = random_inputs(graph.entry(), seed=1)
    damaged = CompiledGraph(graph.functions, graph.options, vmfb=graph.vmfb[:200])
    with pytest.raises(StageError) as failure:
        damaged(*arrays)
    error = failure.value
    assert error.stage == "IREE runtime (loading the module)"
    assert "FlatBuffer" in str(error)
    assert error.reproducer.startswith("iree-run-module --module=")
    again = reproduce(error.reproducer)
    assert again.returncode != 0 and "FlatBuffer length prefix out of bounds" in again.stderr


def test_a_call_that_fails_in_the_runtime_names_the_stage_and_reproduces(graph):
    # The module is for S = 40; a signature claiming S = 41 lets S = 41 inputs
    # through the Python checks, so iree.runtime itself rejects the call.
    other = int8attn.compile(decode_graph(1, 4, 2, 41, 32), cache=False)
    mismatched = CompiledGraph(other.functions, graph.options, vmfb=graph.vmfb)
    with pytest.raises(StageError) as failure:
        mismatched(*random_inputs(other.entry(), seed=2))
    error = failure.value
    assert error.stage == "IREE runtime (calling @decode)"
    assert "expected 40 but have 41" in str(error)
    again = reproduce(error.reproducer)
    assert again.returncode != 0 and "expected 40 but have 41" in again.stderr


def test_a_bf16_argument_reaches_the_reproducer_as_bf16():
    # numpy has no bf16: the reproducer must hand iree-run-module the bf16 bits with
    # their type spelled out, or it fails on the input (an f32 .npy for a bf16 tensor)
    # instead of on what the call failed on
    graph = int8attn.compile(decode_graph(1, 4, 2, 40, 32, q_element="bf16"), cache=False)
    other = int8attn.compile(decode_graph(1, 4, 2, 41, 32, q_element="bf16"), cache=False)
    mismatched = CompiledGraph(other.functions, graph.options, vmfb=graph.vmfb)
    arrays = random_inputs(other.entry(), seed=3)
    with pytest.raises(StageError) as failure:
        mismatched(*arrays)
    error = failure.value
    assert "expected 40 but have 41" in str(error)
    q_input = next(a for a in shlex.split(error.reproducer) if a.startswith("--input=1x4x32xbf16=@"))
    saved = np.frombuffer(Path(q_input.split("@", 1)[1]).read_bytes(), "<u2")
    expected = (np.asarray(arrays[0], np.float32).view(np.uint32) >> 16).ravel()
    assert saved.size == 4 * 32 and (saved == expected).all()     # q's bits, not rounded away
    again = reproduce(error.reproducer)
    assert again.returncode != 0 and "expected 40 but have 41" in again.stderr, again.stderr


def test_a_damaged_cache_entry_is_recompiled(tmp_path):
    cache = ModuleCache(tmp_path)
    first = int8attn.compile(SOURCE, cache=cache)
    (entry,) = tmp_path.glob("*.vmfb")
    entry.write_bytes(entry.read_bytes()[:-100])
    again = int8attn.compile(SOURCE, cache=cache)
    assert not first.cache_hit and not again.cache_hit
    assert again.vmfb == first.vmfb
    assert int8attn.compile(SOURCE, cache=cache).cache_hit


def test_a_cache_that_cannot_be_written_is_said_once(tmp_path, capsys):
    # a file where the folder should be: every call compiles again, which the user
    # hears about once (the CLI prints it as a plain warning)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("x")
    cache = ModuleCache(blocked / "cache")
    with pytest.warns(RuntimeWarning, match="module cache .*not-a-folder/cache' cannot be "
                                            "written .*every call compiles again") as seen:
        cache.store("k1", b"vmfb", {})
        cache.store("k2", b"vmfb", {})
    assert len(seen) == 1 and cache.load("k1") is None
    graph = tmp_path / "decode.mlir"
    graph.write_text(decode_graph(1, 4, 1, 70, 32))
    with mock.patch.dict(os.environ, {"INT8ATTN_CACHE_DIR": str(blocked / "other")}):
        assert cli.main(["run", str(graph), "--seed", "0"]) == 0
    err = capsys.readouterr().err
    assert f"warning: the module cache '{blocked / 'other'}' cannot be written" in err, err


def test_outputs_are_bitwise_identical_across_runs_and_cache_hits(tmp_path):
    cache = ModuleCache(tmp_path)
    fresh = int8attn.compile(SOURCE, cache=cache)
    hit = int8attn.compile(SOURCE, cache=cache)
    uncached = int8attn.compile(SOURCE, cache=False)
    assert not fresh.cache_hit and hit.cache_hit
    arrays = random_inputs(fresh.entry(), seed=3)
    expected = fresh(*arrays)
    for graph in (fresh, hit, uncached):
        for _ in range(3):
            assert np.array_equal(graph(*arrays), expected)
    assert hit.vmfb == fresh.vmfb == uncached.vmfb


def test_an_invalid_kernel_op_is_reported_not_hung():
    # MLIR verifies the driver's module (kernels and host function, several ops
    # isolated from above) on worker threads; a diagnostic raised there needs the GIL
    # the bindings hold, so a kernel generator's invalid op hung the compile until
    # support.ir.new_context turned the context's threading off. In a subprocess with
    # a deadline: a hang here must fail, not stall the suite.
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent("""
        import int8attn
        from int8attn.driver.graph import prefill_graph
        from int8attn.kernels.lanes import Lanes
        from int8attn.support.diagnostics import DiagnosticError
        from iree.compiler import ir
        copy = Lanes.async_copy
        def always_past_l1(self, *args):
            token = copy(self, *args)
            token.owner.attributes["bypassL1"] = ir.UnitAttr.get()   # cp.async.cg: 16 B only
            return token
        Lanes.async_copy = always_past_l1
        try:
            int8attn.compile(prefill_graph(1, 8, 2, 150, 37, 64), filename="prefill.mlir",
                             target="cuda", simulate=True)
        except DiagnosticError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=300)
    assert "prefill.mlir:" in done.stdout and "bypassL1" in done.stdout, done.stderr[-2000:]
