"""The in-place lowering of the W groups and MMAC tiles against the gather lowering.

`lower-mmac-tiles` and `lower-quantize` read V and W through a view of the
token index's digits (fragments.token_axes) instead of gathering them through
the groups table. Every group's int32 sum is exact either way, so the two
lowerings of the same algorithm-stage IR must give bitwise equal outputs, for
decode and prefill, for every fragment model's groups and for signed and
unsigned W (whose column sums are lowered both ways too). The inputs are random
from a printed seed.
"""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from conftest import require_runnable

from int8attn.driver.compile import compile
from int8attn.driver.graph import decode_graph, prefill_graph, random_inputs
from int8attn.driver.options import CompileOptions
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS
from int8attn.fragments import NotADigitPermutation, fragment_model, token_axes
from int8attn.passes import LowerMMACTiles, LowerQuantize
from int8attn.pipelines.manager import UpstreamPass, run_passes
from int8attn.runtime import LoadedModule
from int8attn.support.ir import new_context, parse_module

MODELS = ("gfx936", "gfx942", "cuda")
GATHER = re.compile(r"= tensor\.extract %")

GRAPHS = {
    # S not a multiple of the 256-token partition (padding); GQA 4:1.
    "decode": (decode_graph(1, 8, 2, 700, 64), {}),
    # 192-token partitions: 3 waves, an odd outer group digit.
    "decode-p192": (decode_graph(1, 4, 1, 400, 32), {"partition_tokens": 192}),
    # causal prefill with history, Sq not a multiple of the 64-token tile.
    "prefill": (prefill_graph(1, 4, 1, 200, 70, 64), {}),
}


def lowered(algorithm: str, tokens: str, contraction: str = "f32", vector_isa: str = "sse") -> str:
    with new_context():
        module = parse_module(algorithm, "algorithm.mlir")
        run_passes(module, [LowerMMACTiles(tokens=tokens, contraction=contraction,
                                           vector_isa=vector_isa),
                            LowerQuantize(tokens=tokens),
                            UpstreamPass("canonicalize"), UpstreamPass("cse")])
        return str(module)


# Every form is compiled for the same CPU: `host` (signed and unsigned W), and
# each x86-64 level with the pipeline's unsigned W (the mmt4d form sized for
# that level's register file), so that this machine computes what an
# AVX2-only or an AVX-512 one would. Beside `host` the gather form is left
# out: it is the tokens' reference, not a CPU-dependent lowering.
CASES = [(w_quant, "host") for w_quant in ("s8", "u8")] + \
    [("u8", level) for level in ("x86-64-v3", "x86-64-v4")]


@pytest.mark.parametrize("w_quant, target_cpu", CASES)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_in_place_lowering_matches_gather_bitwise(graph, model, w_quant, target_cpu):
    if target_cpu != "host":
        require_runnable(target_cpu)
    source, extra = GRAPHS[graph]
    options = CompileOptions(fragment_model=model, w_quant=w_quant, **extra)
    compiled = compile(source, options, filename=f"{graph}.mlir", until="algorithm")
    (name, info), = compiled.functions.items()
    algorithm = compiled.artifacts["algorithm"]
    isa = TARGETS["cpu"].cpu(target_cpu).vector_isa
    in_place = lowered(algorithm, "in-place")
    mmt4d = lowered(algorithm, "in-place", "mmt4d", isa)
    assert "linalg.batch_mmt4d" in mmt4d
    assert not GATHER.search(in_place), "the in-place lowering still gathers tokens"
    forms = [in_place, mmt4d]
    if target_cpu == "host":
        gather = lowered(algorithm, "gather")
        assert GATHER.search(gather)
        forms.append(gather)

    seed = 1000 + MODELS.index(model) * 10 + sorted(GRAPHS).index(graph)
    print(f"random inputs: driver.graph.random_inputs seed {seed}", file=sys.stderr)
    arrays = random_inputs(info, seed)
    outputs = []
    for text in forms:
        vmfb, _ = iree_compile(text, TARGETS["cpu"], target_cpu=target_cpu)
        module = LoadedModule(vmfb, {name: list(info.arguments)})
        outputs.append(module.call(name, *arrays)[0])
    assert np.isfinite(outputs[0]).all()
    for other in outputs[1:]:
        assert np.array_equal(outputs[0].view(np.uint32), other.view(np.uint32)), (
            f"max difference {np.abs(outputs[0] - other).max()} (seed {seed}, "
            f"--target-cpu {target_cpu})")


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tokens", [64, 192, 256, 512])
def test_token_axes_rebuild_the_fragment_groups(model, tokens):
    """Every fragment model's groups are a digit permutation whose axes rebuild them."""
    groups = fragment_model(model).token_groups(tokens)
    axes = fragment_model(model).token_axes(tokens)
    assert np.array_equal(axes.table(), groups)
    assert np.prod(axes.token_shape) == tokens
    assert np.prod(axes.group_shape) == groups.shape[0]
    assert np.prod(axes.slot_shape) == groups.shape[1]


def test_token_axes_of_gfx936_partition():
    """token = 64*wave + 16*r + 8*t + j: axes wave, r, t, j; group (wave, t), slot (r, j)."""
    axes = fragment_model("gfx936").token_axes(256)
    assert [(a.size, a.token_stride, a.role, a.stride) for a in axes.axes] == [
        (4, 64, "group", 2), (4, 16, "slot", 8), (2, 8, "group", 1), (8, 1, "slot", 1)]
    assert axes.group_shape == [4, 2] and axes.slot_shape == [4, 8]


def test_token_axes_merge_runs_and_keep_odd_factors():
    contiguous = token_axes(np.arange(192).reshape(6, 32))
    assert [(a.size, a.role) for a in contiguous.axes] == [(6, "group"), (32, "slot")]
    # 8-byte V loads on gfx936: contiguous groups, one run per role
    eight = fragment_model("gfx936").with_v_load(8).token_axes(128)
    assert [(a.size, a.role) for a in eight.axes] == [(4, "group"), (32, "slot")]


def _swapped(a: int, b: int) -> np.ndarray:
    table = np.arange(64)
    table[[a, b]] = table[[b, a]]
    return table.reshape(2, 32)


@pytest.mark.parametrize("table, message", [
    (np.array([list(range(31)) + [63], list(range(31, 63))]), "not a single bit"),
    (_swapped(3, 5), "K slot 3 holds token 5, not the bit permutation's 3"),
    (np.random.default_rng(0).permutation(64).reshape(2, 32), "not a single bit"),
    (np.arange(64).reshape(2, 32) % 32, "exactly once"),
    (np.arange(48).reshape(2, 24), "not a power of two"),
])
def test_token_axes_refuse_tables_that_are_no_digit_permutation(table, message):
    with pytest.raises(NotADigitPermutation, match=message):
        token_axes(table)
