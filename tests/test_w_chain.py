"""Accumulation chains (`w_chain`, docs/design.md §4): a W group is the token set one
int32 accumulator sums; c chained MMACs make it the union of c consecutive MMAC sets.

- The fragment model derives the chain's sets (every model and PV atom, c = 1, 2, 4);
  c = 1 is today's model object and table. A block that is no whole number of chains,
  a float PV and the kernel targets refuse a chain, each with its reason.
- c = 1 is bitwise today's output: the algorithm IR of the named pipeline at
  `w-chain=1` has the digests it had before chains existed (GOLDEN, recorded from
  the commit before them: decode and prefill, default and one-term numerics).
- Compiled cpu modules at c = 1, 2, 4 (decode and prefill, Gaussian and key-outlier
  data, default and one-term numerics) against both references with the chain's groups
  (tests/accuracy.py: the fragment reference tight, the exact one within the W
  rounding bound derived from the chain's own scales plus the INT8-QK bounds). The
  chain reaches the module: at one-term numerics the c = 2 module is far closer (RMS) to
  the c = 2 reference than to the c = 1 one.
- A chain whose scale covers one step (`scale_groups="step"`) is refused by the verifier;
  compiled without it, it matches the reference that reproduces it and is far worse.
- The error split adds up with chains; the cache key follows `w_chain`.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import pytest

import int8attn
from accuracy import attention_inputs, check_against_references
from conftest import seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.graph import attention_graph, random_inputs
from int8attn.fragments import (PV_ATOMS, W_CHAINS, format_token_set, fragment_model,
                                pv_model, pv_model_named)
from int8attn.pipelines import named_pipeline
from int8attn.pipelines.manager import run_passes
from int8attn.support.ir import new_context, parse_module

# (B, Hq, Hkv, S, Sq, D); prefill tiles of 128 tokens so that c = 4 (4 MMACs of 32) fits
# and every c is compared on the same tiles.
SHAPES = {"decode": (1, 8, 2, 1000, 1, 64), "prefill": (1, 4, 2, 300, 70, 64)}
TILE_TOKENS = 128
NUMERICS = {"default": Numerics(), "one-term": ONE_TERM_NUMERICS}

# sha256 of the int8attn-to-algorithm IR of GOLDEN_GRAPHS at w-chain=1: (mode, options) ->
# digest, recorded before chains (f98ee2a) and again when int8-qk's dots took one batch dim. A change to the algorithm
# passes that alters this IR on purpose records new digests (print them from
# `_algorithm_digest`); a chain that leaks into c = 1 fails here.
GOLDEN_GRAPHS = {"decode": (1, 4, 2, 700, 1, 32), "prefill": (1, 4, 2, 200, 70, 32)}
GOLDEN = {
    ("decode", ""): "98c7b5dc3c69ff4762c85ab0a3a80a805598c9fe7eb3935c605d1722490437f2",
    ("decode", "q-terms=1 w-quant=s8 w-terms=1"):
        "3e95bc767ba2ed94b47c5b9d1d5ff912ff3f72c6e1f424daa8118e3e4bb33e57",
    ("prefill", ""): "3739cc3f6cc2d1434c0d98d28c6f5c079ee4c897e48ca9e7394500486e71688a",
    ("prefill", "q-terms=1 w-quant=s8 w-terms=1"):
        "1f263cbb89942e178fa8b18d05a4f36368903a7bf3d417397583f3d158906ffa",
}


def _source(mode, shapes=SHAPES):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shapes[mode]
    return attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                           query_tokens=query_tokens)


@lru_cache(maxsize=None)
def _compiled(mode, chain, numerics_name, **options):
    return int8attn.compile(_source(mode), filename=f"{mode}.mlir", cache=False,
                            numerics=NUMERICS[numerics_name], w_chain=chain,
                            tile_tokens=TILE_TOKENS, **options)


def _inputs(seed, mode, key_outliers=False):
    return attention_inputs(seeded_rng(seed), SHAPES[mode], mode, key_outliers)


def _model_names():
    return [(t, a) for t, atoms in PV_ATOMS.items() for a in (None, *atoms[1:])]


@pytest.mark.parametrize("target, atom", _model_names())
@pytest.mark.parametrize("chain", W_CHAINS)
def test_chain_sets_are_unions_of_consecutive_mmacs(target, atom, chain):
    base = pv_model(target, atom)
    model = pv_model(target, atom, chain)
    assert model.chained(1) is base and base.chained(chain) is model
    assert pv_model_named(model.name) is model
    for block in (256, 512):
        mmacs = base.token_groups(block)
        groups = model.token_groups(block)
        assert groups.shape == (block // (chain * base.instruction.k),
                                chain * base.instruction.k)
        # row g: MMACs c*g .. c*g + c - 1, in issue order, their K slots step after step
        assert np.array_equal(groups, mmacs.reshape(groups.shape))
        assert np.array_equal(np.sort(groups.ravel()), np.arange(block))
        assert np.array_equal(model.step_groups(block), mmacs[::chain])
    if chain == 1:
        assert model is base and model.name == base.name


def test_gfx936_chain_of_two_is_the_wave():
    model = fragment_model("gfx936").chained(2)
    assert model.name == "gfx936 chain 2" and model.group_size == 64
    assert [format_token_set(g) for g in model.token_groups(128)] == ["{0-63}", "{64-127}"]
    assert [format_token_set(g) for g in model.chained(4).token_groups(256)] == \
        ["{0-127}", "{128-255}"]


def test_what_a_chain_does_not_apply_to_is_refused():
    with pytest.raises(ValueError, match="a block of 64 tokens holds 2 MMACs of K=32, not a "
                       "whole number of 4-MMAC chains"):
        fragment_model("gfx936").chained(4).token_groups(64)
    with pytest.raises(ValueError, match="chains are 1, 2, 4"):
        fragment_model("gfx936").chained(3)
    with pytest.raises(KeyError, match="unknown PV fragment model 'gfx936 chain 3'"):
        pv_model_named("gfx936 chain 3")
    # a prefill tile of 64 tokens holds 2 MMACs: the op that quantizes it says so
    with pytest.raises(Exception, match=r"prefill\.mlir:\d+:\d+: error: 'int8attn\."
                       r"folded_pv' op: a block of 64 tokens holds 2 MMACs"):
        int8attn.compile(_source("prefill"), filename="prefill.mlir", cache=False, w_chain=4)
    for options, why in (
            ({"pv": "bf16"}, "--w-chain 2 does not apply with --pv bf16"),
            ({"target": "cuda"}, r"the cuda decode kernel: --w-chain 2: the decode kernels "
                                 r"convert each MMAC's int32 sum to f32 on its own"),
            ({"target": "gfx936"}, "--w-chain 2 does not apply to --target gfx936")):
        with pytest.raises(Exception, match=why):
            int8attn.compile(_source("decode"), cache=False, w_chain=2, **options)
    with pytest.raises(Exception, match="scale-groups=step with w-chain=1"):
        int8attn.compile(_source("decode"), cache=False, scale_groups="step", verify=False)


def _algorithm_digest(mode, options):
    with new_context():
        module = parse_module(_source(mode, GOLDEN_GRAPHS), "g.mlir")
        run_passes(module.operation, named_pipeline(f"int8attn-to-algorithm{{{options}}}"))
        return hashlib.sha256(str(module).encode()).hexdigest()


@pytest.mark.parametrize("mode, options", list(GOLDEN))
def test_chain_one_is_bitwise_todays_algorithm(mode, options):
    given = " ".join(o for o in (options, "w-chain=1") if o)
    assert _algorithm_digest(mode, given) == GOLDEN[(mode, options)]


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("chain", W_CHAINS)
@pytest.mark.parametrize("numerics_name", list(NUMERICS))
@pytest.mark.parametrize("family", ["gaussian", "key-outliers"])
def test_chained_modules_match_both_references(mode, chain, numerics_name, family):
    seed = {"gaussian": 61, "key-outliers": 67}[family]
    args = _inputs(seed, mode, key_outliers=family == "key-outliers")
    scale = SHAPES[mode][-1] ** -0.5
    out = _compiled(mode, chain, numerics_name)(*args)
    model = fragment_model("gfx936").chained(chain).name
    errors = check_against_references(out, args, scale, numerics=NUMERICS[numerics_name],
                                      model=model, tile_tokens=TILE_TOKENS)
    print(f"seed {seed}: {mode} {family} {numerics_name} chain {chain}: {errors}")


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_the_chain_reaches_the_module(mode):
    args = _inputs(71, mode)
    scale = SHAPES[mode][-1] ** -0.5
    out = _compiled(mode, 2, "one-term")(*args).astype(np.float64)
    refs = {c: ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS,
                                      model=fragment_model("gfx936").chained(c).name,
                                      tile_tokens=TILE_TOKENS) for c in (1, 2)}
    # RMS: a rare W element on a rounding tie may flip either way (rounding_tie_slack)
    own, other = (float(np.sqrt(np.mean((out - refs[c]) ** 2))) for c in (2, 1))
    print(f"seed 71: {mode} chain-2 module RMS vs chain-2 reference {own:.2e}, "
          f"vs chain 1 {other:.2e}")
    assert other > 30 * own


def test_a_scale_over_one_step_is_refused_and_measurably_wrong():
    mode = "decode"
    with pytest.raises(Exception, match=r"W scale of group 0 is computed over tokens "
                       r"\{0-7,16-23,32-39,48-55\}, 32 of the 64 tokens \{0-63\} whose "
                       r"products one accumulator sums"):
        int8attn.compile(_source(mode), filename="decode.mlir", cache=False, w_chain=2,
                         scale_groups="step", numerics=ONE_TERM_NUMERICS)
    args = _inputs(73, mode)
    scale = SHAPES[mode][-1] ** -0.5
    step = _compiled(mode, 2, "one-term", scale_groups="step", verify=False)(*args)
    good = _compiled(mode, 2, "one-term")(*args)
    model = fragment_model("gfx936").chained(2).name
    reproduced = ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS, model=model,
                                        scale_groups="step")
    exact = ref.exact_attention(*args, scale)
    value_scale = float(np.abs(args[3] * args[4][..., None]).max())
    assert np.abs(step - reproduced).max() <= 1.25e-5 * value_scale
    bad_err, good_err = (float(np.abs(o - exact).max()) for o in (step, good))
    print(f"seed 73: decode chain 2 vs exact: step scales {bad_err:.2e}, chain scales "
          f"{good_err:.2e} ({bad_err / good_err:.0f}x)")
    assert bad_err > 5 * good_err


@pytest.mark.parametrize("mode, query_tokens, tokens", [("decode", 1, 1000),
                                                        ("prefill", 37, 300)])
@pytest.mark.parametrize("chain", [2, 4])
def test_error_split_adds_up_with_chains(mode, query_tokens, tokens, chain):
    source = attention_graph(1, 8, 2, tokens, 64, mode=mode, query_tokens=query_tokens)
    graph = int8attn.compile(source, cache=False, w_chain=chain, tile_tokens=TILE_TOKENS,
                             numerics=ONE_TERM_NUMERICS)
    info = graph.entry()
    arrays, floats = random_inputs(info, 19, float_caches=True)
    out = graph(*arrays)
    scale = info.attention.softmax_scale
    model = graph.options.pv_model_name
    assert model == f"gfx936 chain {chain}"
    split = ref.error_split(*arrays, floats["k"], floats["v"], scale, out, model=model,
                            tile_tokens=TILE_TOKENS, numerics=ONE_TERM_NUMERICS)
    slack = ref.rounding_tie_slack(*arrays, scale, model=model, tile_tokens=TILE_TOKENS,
                                   numerics=ONE_TERM_NUMERICS)
    residual = np.abs(split["total"] - sum(split[t] for t in ref.TERMS))
    assert (residual <= 5e-5 + slack).all(), residual.max()
    assert np.abs(split["w_quantization"]).max() > 1e-5


def test_the_cache_key_follows_the_chain(tmp_path):
    from int8attn.driver.options import CompileOptions
    from int8attn.runtime import ModuleCache

    cache = ModuleCache(tmp_path)
    keys = {cache.key("graph", CompileOptions(w_chain=c)) for c in W_CHAINS}
    assert len(keys) == len(W_CHAINS)
