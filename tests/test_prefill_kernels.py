"""The lane-level prefill kernel (gfx936, gfx942, cuda) in the simulator.

Causal prefill with history: ragged S (not multiples of the 64-token tile),
Sq = 1 / 37 / 64 / 65 / S, GQA 1 / 4 / 8 / 20 / 32, D 64 / 128, batch > 1. Every output
against both references with the target's own fragment model
(tests/accuracy.py: vs the fragment-level reference 1.25e-5 x max|V| plus the
exact rounding-tie slack; vs the exact reference the hard W-rounding and
INT8-QK bounds and 6 sd of their first-order models). Also: every numerics
variant, the BF16-PV twin, the driver path, tiles past a block's causal limit
never read, a wrong fragment model caught.
"""

import dataclasses

import numpy as np
import pytest
from iree.compiler import ir

from accuracy import check_against_references
from conftest import first_loop_body, seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.fragments import GFX936_MMAC, GFX942_MFMA, FragmentModel, VLoadScheme, fragment_model
from int8attn.kernels.shapes import PrefillShape
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.target_spec import target_spec
from int8attn.simulator import simulate_prefill
from int8attn.simulator import interpreter
from int8attn.simulator.prefill import run_prefill_kernels
from int8attn.support.ir import new_context
from test_prefill import prefill_inputs

TARGETS = ["gfx936", "gfx942", "cuda"]

# (batch, q_heads, kv_heads, tokens, query_tokens, head_dim)
SHAPES = {
    "sq1_gqa4_d128": (1, 8, 2, 300, 1, 128),
    "sq37_gqa4_d64": (1, 8, 2, 200, 37, 64),
    "sq64_gqa1_d64": (1, 2, 2, 130, 64, 64),
    "sq65_gqa8_d64_b2": (2, 16, 2, 129, 65, 64),
    "sq_is_s_gqa1_d128": (1, 2, 2, 100, 100, 128),
    "sq_is_s_gqa8_d64": (1, 8, 1, 70, 70, 64),
    # More query heads per KV head than an MMA tile has rows: packed rows span tiles.
    "sq20_gqa32_d64": (1, 32, 1, 90, 20, 64),
    "sq9_gqa20_d64": (1, 40, 2, 70, 9, 64),
}


def _check(out, args, target, numerics: Numerics = KERNEL_TARGET_NUMERICS, pv="int8", scale=None):
    scale = np.float32(args[0].shape[-1] ** -0.5 if scale is None else scale)
    return check_against_references(out, args, scale, pv, numerics=numerics, model=target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", SHAPES)
def test_simulated_prefill_matches_both_references(target, name):
    shape = SHAPES[name]
    seed = 300 + sum(shape)
    args = prefill_inputs(seed, *shape)
    out = simulate_prefill(*args, shape[-1] ** -0.5, target=target)
    err = _check(out, args, target)
    print(f"{target} {name} seed {seed}: vs fragment {err['fragment']:.2e}, vs exact "
          f"{err['exact']:.2e} (x max|V|)")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("numerics", [ONE_TERM_NUMERICS, KERNEL_TARGET_NUMERICS], ids=["seed", "kernel"])
def test_peaked_scores_stay_within_the_fragment_tolerance(target, numerics):
    """Softmax scale 10: scores of magnitude ~100, whose rounding is an ulp of ~1e-5.
    The kernel must compute them in the contract's order, (((n sQ) sK) c) then
    exp(s - m), so that they differ from the reference's by no more than exp does;
    scores rounded in other units (the scale folded into sQ, say) move every weight
    by ~1e-5 and the output past the fragment tolerance (1.4x it on cuda, measured)."""
    shape = (1, 8, 2, 256, 256, 128)
    seed = 4711
    args = prefill_inputs(seed, *shape)
    out = simulate_prefill(*args, 10.0, target=target, numerics=numerics)
    err = _check(out, args, target, numerics, scale=10.0)
    print(f"{target} seed {seed}, scale 10: vs fragment {err['fragment']:.2e} (x max|V|)")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("numerics", [Numerics(q_terms=2, w_quant="s8", w_terms=1),
                                      Numerics(q_terms=1, w_quant="u8", w_terms=1),
                                      Numerics(q_terms=2, w_quant="u8", w_terms=1)],
                         ids=["q2", "u8", "q2_u8"])
def test_every_numerics_variant_in_the_prefill_kernel(target, numerics):
    shape = (1, 8, 2, 150, 50, 64)
    args = prefill_inputs(311, *shape)
    out = simulate_prefill(*args, 0.125, target=target, numerics=numerics)
    _check(out, args, target, numerics)


def test_the_bf16_twin_matches_its_references():
    shape = (1, 8, 2, 200, 80, 64)
    args = prefill_inputs(312, *shape)
    out = simulate_prefill(*args, 0.125, target="cuda", pv="bf16")
    _check(out, args, "cuda", pv="bf16")
    int8 = simulate_prefill(*args, 0.125, target="cuda")
    # The twins differ only in PV: their difference is the W quantization's.
    assert 0 < np.abs(out - int8).max() < 2e-2


def test_a_wrong_layout_fails_the_comparison():
    # The kernel generated with the MFMA C layout but run on the real gfx936 MMAC.
    shape = (1, 8, 2, 150, 40, 64)
    args = prefill_inputs(313, *shape)
    wrong = FragmentModel("gfx936", dataclasses.replace(GFX936_MMAC, c=GFX942_MFMA.c),
                          VLoadScheme(16))
    out = simulate_prefill(*args, 0.125, target="gfx936", fragments=wrong)
    fragment = ref.fragment_attention(*args, 0.125, numerics=KERNEL_TARGET_NUMERICS)
    assert not np.isfinite(out).all() or np.abs(out - fragment).max() > 1e-2


def test_the_load_scheme_sets_the_prefill_groups():
    # 8-byte V loads make each MMAC consume contiguous tokens: the kernel follows the
    # contiguous-group reference and is far from the interleaved one (one W term: two
    # make W nearly exact, whatever its groups).
    shape = (1, 4, 1, 256, 128, 64)
    args = prefill_inputs(314, *shape)
    eight = fragment_model("gfx936").with_v_load(8)
    out = simulate_prefill(*args, 0.125, target="gfx936", fragments=eight,
                           numerics=ONE_TERM_NUMERICS)
    contiguous = ref.fragment_attention(*args, 0.125, fragments=eight, numerics=ONE_TERM_NUMERICS)
    interleaved = ref.fragment_attention(*args, 0.125, numerics=ONE_TERM_NUMERICS)
    assert np.abs(out - contiguous).max() <= 5e-5
    assert np.abs(out - interleaved).max() > 10 * np.abs(out - contiguous).max()


@pytest.mark.parametrize("target", ["gfx936", "cuda"])
def test_tiles_past_a_blocks_causal_limit_are_never_read(target, monkeypatch):
    # Sq = S = 300, GQA 4: the workgroup of rows 0-63 (query tokens 0-15) needs tile 0
    # only, the last one (tokens 288-299) all five. Record the K tokens each workgroup
    # loads.
    batch, q_heads, kv_heads, tokens, head_dim = 1, 4, 1, 300, 64
    args = prefill_inputs(315, batch, q_heads, kv_heads, tokens, tokens, head_dim)
    padded, groups = 320, q_heads // kv_heads
    seen: dict[int, set] = {}
    load = interpreter._Memory.load

    def recording(memory, indices, machine, count=1):
        if memory.shape == (batch, kv_heads, padded, head_dim):
            token = memory.addresses(indices, machine, count) // head_dim % padded
            token = token if token.ndim == 1 else token[:, 0]
            active = np.ones(machine.thread_count, bool) if machine.active is None \
                else machine.active
            for wg in np.unique(machine.workgroup_index[active]):
                mine = active & (machine.workgroup_index == wg)
                seen.setdefault(int(wg), set()).update(token[mine].tolist())
        return load(memory, indices, machine, count)

    monkeypatch.setattr(interpreter._Memory, "load", recording)
    out = simulate_prefill(*args, 0.125, target=target)
    _check(out, args, target)
    rows_per_block = 64
    for block, tokens_read in sorted(seen.items()):
        last_query = min((block + 1) * rows_per_block - 1, tokens * groups - 1) // groups
        visible_tiles = last_query // 64 + 1
        assert max(tokens_read) // 64 + 1 == visible_tiles, \
            f"workgroup {block}: read up to token {max(tokens_read)}, needs {visible_tiles} tiles"
    assert len(seen) == -(-tokens * groups // rows_per_block)


def test_one_module_per_shape_through_the_driver():
    # The driver's kernel artifact (host function + kernel) run in the simulator.
    import int8attn
    from int8attn.driver.graph import prefill_graph

    shape = (1, 8, 2, 150, 37, 64)
    args = prefill_inputs(316, *shape)
    compiled = int8attn.compile(prefill_graph(*shape), filename="prefill.mlir",
                                target="cuda", simulate=True)
    assert compiled.kernel_layout["mode"] == "prefill"
    _check(compiled(*args), args, "cuda")


def test_query_tokens_past_the_sequence_are_refused():
    with new_context(), ir.Location.unknown():
        shape = PrefillShape(1, 1, 4, 10, 11, 64, 0.125)
        with pytest.raises(ValueError, match="11 query tokens are more than the 10 tokens"):
            build_prefill_kernels(shape, target_spec("cuda"))


def test_one_kernel_module_runs_every_batch_element():
    # Batch elements with different data share the workgroup grid's z axis.
    rng = seeded_rng(317)
    shape = PrefillShape(3, 2, 2, 90, 20, 64, 0.125)
    args = prefill_inputs(317, 3, 4, 2, 90, 20, 64)
    args = (args[0] * rng.uniform(0.5, 2.0, (3, 1, 1, 1)).astype(np.float32), *args[1:])
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(shape, target_spec("gfx942"))
        out = run_prefill_kernels(built.module, built.layout, *args)
    _check(out, args, "gfx942")


@pytest.mark.parametrize("name", ["seed", "kernel"])
def test_bench_checks_slices_of_the_query_tokens_as_shorter_prefills(name):
    # The GPU bench checks 3 slices of 64 query tokens, each as the prefill of the
    # sequence that ends at its last token, against the reference of the modules'
    # numerics (--numerics): on a simulated output they pass, an error in one middle
    # row is found, and so is a kernel of other numerics.
    from int8attn import bench_prefill
    from int8attn.bench_numerics import bench_numerics
    from int8attn.kernels.target_spec import target_spec

    numerics = bench_numerics(name, bench_prefill.NUMERICS) or target_spec("cuda").numerics
    other = target_spec("cuda").numerics if name == "seed" else bench_numerics("seed", "seed")
    args = prefill_inputs(318, 1, 4, 1, 300, 200, 64)
    out = simulate_prefill(*args, 0.125, target="cuda", numerics=numerics)
    worst, ok = bench_prefill.check_slices(out, args, np.float32(0.125), "int8", numerics)
    assert ok and worst < 5e-5
    bad = out.copy()
    bad[0, 2, 100, 7] += 1e-3                  # token 100: in the middle slice [68, 132)
    assert not bench_prefill.check_slices(bad, args, np.float32(0.125), "int8", numerics)[1]
    assert not bench_prefill.check_slices(out, args, np.float32(0.125), "int8", other)[1]


def test_a_prepared_folder_records_its_numerics(tmp_path):
    # a prefill folder prepared with the kernel target's numerics (--numerics kernel)
    # records them in its manifest, which the runner checks against
    import json

    from int8attn import bench_prefill
    from int8attn.bench_numerics import bench_numerics, manifest_numerics
    from int8attn.contract.numerics import ONE_TERM_NUMERICS

    bench_prefill.prepare(tmp_path / "kernel", [64], 0, 0, 1, 2, 1, 64,
                          numerics=bench_numerics("kernel", bench_prefill.NUMERICS))
    bench_prefill.prepare(tmp_path / "seed", [64], 0, 0, 1, 2, 1, 64)
    recorded = {name: manifest_numerics(json.loads(
        (tmp_path / name / bench_prefill.MANIFEST).read_text())) for name in ("kernel", "seed")}
    assert recorded == {"kernel": target_spec("cuda").numerics, "seed": ONE_TERM_NUMERICS}
    assert recorded["kernel"] != recorded["seed"]


@pytest.mark.parametrize("tokens, query_tokens", [(1, 1), (300, 300), (300, 37), (64, 1)])
def test_bench_counts_the_causal_pairs(tokens, query_tokens):
    from int8attn import bench_prefill

    positions = np.arange(tokens - query_tokens, tokens)
    visible = (np.arange(tokens)[None, :] <= positions[:, None]).sum()
    assert bench_prefill.causal_pairs(tokens, query_tokens) == visible


def test_bench_prepares_prefill_modules(tmp_path):
    import json

    from int8attn import cli

    assert cli.main(["bench", "--mode", "prefill", "--context", "128", "--history", "100",
                     "--new-tokens", "37", "--q-heads", "8", "--kv-heads", "2", "--head-dim",
                     "64", "--prepare-only", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "prefill.json").read_text())
    assert meta["cases"] == [["Sq=S=128", 128, 128], ["100+37", 137, 37]]
    assert meta["batch"] == 1
    for pv in ("int8", "bf16", "paged"):
        for tokens, query_tokens in ((128, 128), (137, 37)):
            assert (tmp_path / f"prefill_{pv}_{tokens}_{query_tokens}.vmfb").stat().st_size > 0


def test_bench_refuses_prefill_flags_in_other_modes(tmp_path):
    from test_cli import run

    proc = run("int8attn", "bench", "--mode", "decode", "--history", "100", "--prepare-only",
               tmp_path, check_rc=2)   # misuse: a usage message (tests/test_cli_bad_inputs.py)
    assert "usage: int8attn bench" in proc.stderr
    assert "--history applies to --mode prefill, not --mode decode" in proc.stderr


def _cuda_device():
    try:
        import iree.runtime as rt

        return rt.Config("cuda")
    except Exception:  # no driver, no GPU: the runtime says so in various ways
        return None


@pytest.mark.skipif(_cuda_device() is None, reason="no CUDA device for IREE's CUDA runtime")
def test_prefill_kernels_on_the_gpu(tmp_path):
    from int8attn import bench_prefill

    bench_prefill.prepare(tmp_path, [512], 256, 65, 1, 8, 2, 128)
    rows = bench_prefill.run(tmp_path, iterations=2)
    assert all(r["int8_within_tolerance"] and r["bf16_within_tolerance"] for r in rows)


@pytest.mark.parametrize("target", ["gfx936", "cuda"])
def test_w_fed_from_registers_matches_w_through_lds(target):
    """The register feed (fragments/score_feed.py) against the same kernel with W
    staged in LDS: both within both references, and within a few f32 ulps of each
    other (the feed reads QK's tokens in another order: only the in-lane order of
    the row sums moves); the fed kernel's tile loop has no barrier of its own (cuda's
    has the K/V ring's, one per tile)."""
    shape = (1, 8, 2, 200, 70, 64)
    seed = 3251
    args = prefill_inputs(seed, *shape)
    spec = target_spec(target)
    s = PrefillShape(1, 2, 4, 200, 70, 64, 0.125)
    outs = {}
    for feed in (True, False):
        with new_context(), ir.Location.unknown():
            built = build_prefill_kernels(s, spec, numerics=ONE_TERM_NUMERICS, feed_w=feed)
            loop = first_loop_body(str(built.module))
            ring = 1 if spec.prefill_kv_ring else 0
            barriers = loop.count("gpu.barrier")
            assert barriers == ring if feed else barriers > ring
            # the online softmax takes the hardware's exp2 (TargetSpec.exp2) on every
            # kernel target, no polynomial
            assert spec.exp2_intrinsic is not None and spec.exp2_intrinsic in loop
            assert "math.exp" not in loop
            outs[feed] = run_prefill_kernels(built.module, built.layout, *args)
        _check(outs[feed], args, target, ONE_TERM_NUMERICS)
    np.testing.assert_allclose(outs[True], outs[False], rtol=0, atol=2e-6)
    print(f"{target} seed {seed}: fed vs LDS max abs "
          f"{np.abs(outs[True] - outs[False]).max():.1e}")
