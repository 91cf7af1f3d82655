"""QK's int8 dots on the CPU's integer dot-product instructions (IREE data tiling,
driver/cpu_target.py DATA_TILING, opt-in): the instruction is in the emitted assembly for
each x86-64 level, and the module's output is bit for bit the one without data tiling
and within both references' tolerances, for the shapes below."""

from __future__ import annotations

import collections
import glob
import re
import tempfile

import numpy as np
import pytest
from iree.compiler import compile_str

from accuracy import check_against_references
from conftest import require_runnable, seeded_rng
from int8attn.driver.compile import compile
from int8attn.driver.cpu_target import DATA_TILING, resolve
from int8attn.driver.graph import attention_graph, random_inputs
from int8attn.driver.options import CompileOptions
from int8attn.driver.targets import TARGETS
from int8attn.runtime import LoadedModule

# B, Hq, Hkv, S, D: S not a multiple of the mmt4d tiles (IREE pads the packed K).
SHAPE = (2, 8, 2, 1000, 128)
# What QK's i8 x i8 -> i32 dispatches multiply with, per CPU: AVX2 and AVX-512
# without VNNI sign-extend to i16 and pair the products with vpmaddwd; with VNNI
# vpdpwssd also accumulates. The plain generic multiplied in i32 (vpmulld).
DOT_PRODUCT = {"x86-64-v3": "vpmaddwd", "x86-64-v4": "vpmaddwd",
               "sapphirerapids": "vpdpwssd", "znver4": "vpdpwssd"}
RUNS_HERE = {"x86-64-v3", "x86-64-v4"}


def _linalg(mode="decode"):
    batch, q_heads, kv_heads, tokens, head_dim = SHAPE
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=40 if mode == "prefill" else 1, name="f")
    compiled = compile(source, CompileOptions(), until="linalg")
    return compiled.artifacts["linalg"], compiled.functions["f"]


def _iree(linalg: str, cpu: str, data_tiling: bool = True) -> tuple[bytes, dict]:
    """(vmfb, {function: Counter of its instructions}) as the cpu target compiles it."""
    flags = [*TARGETS["cpu"].iree_flags, *resolve(cpu).iree_flags(),
             *(DATA_TILING if data_tiling else ())]
    with tempfile.TemporaryDirectory() as dump:
        vmfb = compile_str(linalg, extra_args=flags + [
            f"--iree-hal-dump-executable-intermediates-to={dump}"])
        functions: dict[str, collections.Counter] = {}
        current = None
        for path in glob.glob(f"{dump}/*.s"):
            for line in open(path):
                label = re.match(r"^([A-Za-z_][\w.$]*):", line)
                if label:
                    current = functions.setdefault(label.group(1), collections.Counter())
                elif current is not None and line.split() and line.split()[0][0] != ".":
                    current[line.split()[0]] += 1
    return vmfb, functions


def _qk_dispatches(functions) -> dict[str, collections.Counter]:
    qk = {name: c for name, c in functions.items() if re.search(r"_i8xi8xi32$", name)}
    assert qk, f"no i8 x i8 -> i32 dispatch among {sorted(functions)[:8]}"
    return qk


@pytest.mark.parametrize("cpu", list(DOT_PRODUCT))
def test_qk_runs_on_the_integer_dot_product(cpu):
    linalg, info = _linalg()
    vmfb, functions = _iree(linalg, cpu)
    for name, counts in _qk_dispatches(functions).items():
        assert counts[DOT_PRODUCT[cpu]] > 0, f"{cpu}: {name} has no {DOT_PRODUCT[cpu]}"
        assert counts["vpmulld"] == 0, f"{cpu}: {name} still multiplies in i32 (vpmulld)"
    # without data tiling the same dispatches multiply in i32: the flag is what moves them
    _, plain = _iree(linalg, cpu, data_tiling=False)
    assert all(c[DOT_PRODUCT[cpu]] == 0 and c["vpmulld"] > 0
               for c in _qk_dispatches(plain).values())
    if cpu not in RUNS_HERE:
        return
    require_runnable(cpu)
    seed = 48
    args = random_inputs(info, seed)
    print(f"seed {seed}: Gaussian inputs, --target-cpu {cpu}")
    out = LoadedModule(vmfb, {"f": list(info.arguments)}).call("f", *args)[0]
    plain_vmfb, _ = _iree(linalg, cpu, data_tiling=False)
    before = LoadedModule(plain_vmfb, {"f": list(info.arguments)}).call("f", *args)[0]
    assert np.array_equal(out.view(np.uint32), before.view(np.uint32))
    errors = check_against_references(out, args, SHAPE[-1] ** -0.5)
    print(f"{cpu}: {errors}")


@pytest.mark.parametrize("mode, pv", [("decode", "f32"), ("prefill", "int8")])
def test_the_other_modules_keep_their_bits(mode, pv):
    """Data tiling also packs f32 contractions (the partitions' merge, the f32 PV):
    their results stay bit for bit."""
    batch, q_heads, kv_heads, tokens, head_dim = SHAPE
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=40 if mode == "prefill" else 1, name="f")
    compiled = compile(source, CompileOptions(pv=pv), until="linalg")
    info = compiled.functions["f"]
    seeded_rng(49)
    args = random_inputs(info, 49)
    outs = [LoadedModule(_iree(compiled.artifacts["linalg"], "host", tiled)[0],
                         {"f": list(info.arguments)}).call("f", *args)[0]
            for tiled in (True, False)]
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


def test_data_tiling_is_opt_in():
    # it computes the paged decode wrong (driver/cpu_target.py says where)
    assert not set(DATA_TILING) & set(resolve("x86-64-v3").iree_flags())
