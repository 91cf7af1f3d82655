"""Accumulation chains in cuda's lane-level prefill kernel (`w_chain`, docs/design.md §4).

- The chain's token sets as the kernels read them (`group_tokens` of a chained model,
  through which the score -> W group layout and the absmax shuffles are derived) are the
  fragment model's `token_groups`, for every model and PV atom, c = 1, 2, 4.
- c = 1 is bitwise the kernels before chains: the kernel IR of the cuda and gfx936
  prefill (dense and chunked) and decode at digit, one-term and default numerics has the
  digests it had before (GOLDEN, recorded from the commit before the kernel chains).
- Simulated cuda prefill at c = 1, 2 (Gaussian and key-outlier data, digit and one-term
  numerics) against both references with the chain's groups (tests/accuracy.py); the
  chain reaches the kernel (the c = 2 kernel is far closer to the c = 2 reference than
  to the c = 1 one); the CLI runs it in the simulator.
- Refusals, each with its reason: a chain that does not divide a warp's K-steps per
  64-token tile (c = 4), the decode kernels, gfx936; the int32 bound of joined digit sums.
"""

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from iree.compiler import ir

from accuracy import check_against_references
from test_prefill import prefill_inputs
from int8attn import reference as ref
from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS, Numerics
from int8attn.fragments import PV_ATOMS, W_CHAINS, fragment_model, group_tokens, pv_model
from int8attn.kernels.decode import build_decode_kernels, dense_access
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.pv_stages import digit_join_bound
from int8attn.kernels.shapes import DenseShape, PagedPrefillShape, PrefillShape
from int8attn.kernels.target_spec import target_spec
from int8attn.simulator.prefill import run_prefill_kernels
from int8attn.support.ir import new_context

NUMERICS = {"digits": DIGIT_NUMERICS, "one-term": ONE_TERM_NUMERICS, "defaults": Numerics()}

# sha256 of str(module) of each kernel at w-chain 1, recorded from the commit before the
# kernels took a chain (f36be1d): (target, kernel, numerics) -> digest.
GOLDEN = {
    ("cuda", "prefill", "digits"):
        "d7f94f955b21ddae7f87aa28617ad5f32ef165ded4cbeb5c3e44a3d8c350ad89",
    ("cuda", "paged-prefill", "digits"):
        "46ff9ca395fb425e1ac7595806bc884dec455434724f5408e0c828cbca0736a7",
    ("cuda", "prefill", "one-term"):
        "51c516bf5911e46d9888eb6b5ab6f35657899a9cc3131cbf8f7a7138dc6cb2b2",
    ("cuda", "paged-prefill", "one-term"):
        "31e515d78a648f05b221e804b642ec3d5733d2869f97503787768588b2db12a1",
    ("cuda", "prefill", "defaults"):
        "71b912db2454c12d2787deb13a22903c060875bf7e1e24ac53a34f2ba3c0a1b4",
    ("gfx936", "prefill", "digits"):
        "718e40be87133cf0c1c53e5a6f5b000b5fa2e4543550096b0100737a2a79cb9c",
    ("gfx936", "prefill", "defaults"):
        "2aed42895d747c0836e484228bef9d748ab8257478b08ae4f75ef95a8b0872a8",
    ("cuda", "decode", "digits"):
        "7032c1a902847dca117d53ca6e77e55c43c42ca4e8e70308e28096e697ffdcf1",
    ("cuda", "decode", "defaults"):
        "b77c6dff8b394baec0528e8c9af5b318e6ba0a52c4f5acd242bb547bba456c9c",
    ("gfx936", "decode", "digits"):
        "8111e5bd79a7689bafe9cc17d542b492c61651758381d95e573bec1e30979ceb",
}


def _golden_module(target, kernel, numerics_name):
    spec, numerics = target_spec(target), NUMERICS[numerics_name]
    if kernel == "prefill":
        return build_prefill_kernels(PrefillShape(1, 2, 4, 300, 70, 128, 0.088), spec,
                                     numerics=numerics, w_chain=1).module
    if kernel == "paged-prefill":
        return build_prefill_kernels(PagedPrefillShape(2, 4, 37, 64, 16, 0.125), spec,
                                     numerics=numerics, w_chain=1).module
    access = dense_access(DenseShape(1, 2, 4, 700, 128, 0.088), spec)
    return build_decode_kernels(access, spec, numerics=numerics, w_chain=1).module


@pytest.mark.parametrize("target, kernel, numerics_name", list(GOLDEN))
def test_chain_one_is_bitwise_the_kernels_before_chains(target, kernel, numerics_name):
    with new_context(), ir.Location.unknown():
        text = str(_golden_module(target, kernel, numerics_name))
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN[(target, kernel, numerics_name)]


@pytest.mark.parametrize("target, atom", [(t, a) for t, atoms in PV_ATOMS.items()
                                          for a in (None, *atoms[1:])])
@pytest.mark.parametrize("chain", W_CHAINS)
def test_the_kernels_group_layout_is_the_models_chain(target, atom, chain):
    model = pv_model(target, atom, chain)
    for block in (128, 256):
        layout = group_tokens(model, block)
        table = np.array([[layout.apply(k=k, group=g)["token"]
                           for k in range(model.group_size)]
                          for g in range(block // model.group_size)])
        assert np.array_equal(table, model.token_groups(block))


SHAPE = (1, 8, 2, 200, 37, 64)   # (B, Hq, Hkv, S, Sq, D): GQA 4, a ragged last tile


def _key_outliers(args, seed):
    """4 of the head dim's channels of K x30-60 per KV head, requantized."""
    q, k, k_scale, v, v_scale = args
    rng = np.random.default_rng(seed)
    keys = k.astype(np.float32) * k_scale[..., None]
    for h in range(keys.shape[1]):
        channels = rng.choice(keys.shape[-1], 4, replace=False)
        keys[:, h, :, channels] *= rng.uniform(30, 60, 4).astype(np.float32)[:, None, None]
    return (q, *ref.quantize_cache(keys), v, v_scale)


def _inputs(seed, family):
    args = prefill_inputs(seed, *SHAPE)
    return _key_outliers(args, seed) if family == "key-outliers" else args


def _simulated(args, chain, numerics, shape=SHAPE):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    prefill = PrefillShape(batch, kv_heads, q_heads // kv_heads, tokens, query_tokens,
                           head_dim, float(np.float32(head_dim ** -0.5)))
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(prefill, target_spec("cuda"), numerics=numerics,
                                      w_chain=chain)
        return run_prefill_kernels(built.module, built.layout, *args)


@pytest.mark.parametrize("chain", [1, 2])
@pytest.mark.parametrize("numerics_name", ["digits", "one-term"])
@pytest.mark.parametrize("family", ["gaussian", "key-outliers"])
def test_chained_prefill_matches_both_references(chain, numerics_name, family):
    seed = {"gaussian": 811, "key-outliers": 823}[family]
    args = _inputs(seed, family)
    numerics = NUMERICS[numerics_name]
    out = _simulated(args, chain, numerics)
    model = fragment_model("cuda").chained(chain).name
    errors = check_against_references(out, args, np.float32(SHAPE[-1] ** -0.5),
                                      numerics=numerics, model=model)
    print(f"seed {seed}: cuda prefill {family} {numerics_name} chain {chain}: {errors}")


def test_the_chain_reaches_the_kernel():
    seed = 829
    args = prefill_inputs(seed, *SHAPE)
    scale = float(np.float32(SHAPE[-1] ** -0.5))
    out = _simulated(args, 2, ONE_TERM_NUMERICS).astype(np.float64)
    refs = {c: ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS,
                                      model=fragment_model("cuda").chained(c).name)
            for c in (1, 2)}
    own, other = (float(np.sqrt(np.mean((out - refs[c]) ** 2))) for c in (2, 1))
    print(f"seed {seed}: chain-2 kernel RMS vs chain-2 reference {own:.2e}, vs chain 1 "
          f"{other:.2e}")
    assert other > 30 * own


def test_the_cli_simulates_a_chained_prefill(tmp_path):
    from int8attn.driver.graph import attention_graph

    graph = tmp_path / "prefill.mlir"
    graph.write_text(attention_graph(1, 8, 2, 200, 64, mode="prefill", query_tokens=37))
    run = subprocess.run([str(Path(sys.executable).parent / "int8attn"), "run", str(graph),
                          "--target", "cuda", "--w-chain", "2", "--simulate", "--seed", "7"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "fragment model cuda chain 2" in run.stdout
    fragment = float(run.stdout.split("vs fragment-level reference")[1].split()[2])
    assert fragment < 1e-6


def test_what_the_kernels_cannot_chain_is_refused():
    import int8attn
    from int8attn.driver.graph import attention_graph

    prefill = attention_graph(1, 8, 2, 200, 64, mode="prefill", query_tokens=37)
    with pytest.raises(Exception, match=r"prefill\.mlir:\d+:\d+: error: the cuda prefill "
                       r"kernel: --w-chain 4: a warp issues 2 PV K-steps \(MMACs of K=32\) "
                       r"per 64-token KV tile, not a whole number of 4-step chains; a chain "
                       r"cannot span two tiles .*the chains here are 1, 2"):
        int8attn.compile(prefill, filename="prefill.mlir", cache=False, target="cuda",
                         w_chain=4)
    decode = attention_graph(1, 8, 2, 200, 64, mode="decode")
    with pytest.raises(Exception, match=r"the cuda decode kernel: --w-chain 2: the decode "
                       r"kernels convert each MMAC's int32 sum to f32 on its own"):
        int8attn.compile(decode, cache=False, target="cuda", w_chain=2)
    with pytest.raises(Exception, match=r"--w-chain 2 does not apply to --target gfx936: "
                       r".*--target cuda's prefill kernel's"):
        int8attn.compile(prefill, cache=False, target="gfx936", w_chain=2)
    with pytest.raises(ValueError, match="the bf16 PV kernel accumulates in f32"):
        with new_context(), ir.Location.unknown():
            build_prefill_kernels(PrefillShape(1, 2, 4, 300, 70, 64, 0.125),
                                  target_spec("cuda"), pv="bf16", w_chain=2)


def test_joined_digit_sums_fit_int32_exactly_for_the_offered_chains():
    """high * 256 + low over c x 32 tokens of |W level x Vq| <= 128 x 128 (s8) or
    255 x 128 (u8): within int32 up to c = 15 (s8) and 8 (u8); a longer chain is refused."""
    k = fragment_model("cuda").instruction.k
    s8, u8 = DIGIT_NUMERICS, Numerics(w_quant="u8", w_second="digit")
    for chain in W_CHAINS:
        assert digit_join_bound(k, s8, chain) < 2 ** 31
        assert digit_join_bound(k, u8, chain) < 2 ** 31
    assert digit_join_bound(k, s8, 15) < 2 ** 31 <= digit_join_bound(k, s8, 16)
    assert digit_join_bound(k, u8, 8) < 2 ** 31 <= digit_join_bound(k, u8, 9)


def test_the_bench_prepares_one_module_per_chain_and_checks_each_against_its_own(tmp_path):
    import json

    from int8attn import bench_prefill, cli
    from test_cli import run

    assert cli.main(["bench", "--mode", "prefill", "--context", "128", "--new-tokens", "0",
                     "--q-heads", "8", "--kv-heads", "2", "--head-dim", "64", "--w-chain",
                     "1,2", "--prepare-only", str(tmp_path)]) == 0
    meta = json.loads((tmp_path / "prefill.json").read_text())
    assert meta["w_chains"] == [1, 2]
    assert bench_prefill.module_files(meta) == ["prefill_int8_128_128.vmfb",
                                                "prefill_int8-chain2_128_128.vmfb"]
    for name in bench_prefill.module_files(meta):
        assert (tmp_path / name).stat().st_size > 0
    # the chain-2 kernel passes its own reference's check and fails chain 1's
    seed = 839
    args = prefill_inputs(seed, 1, 8, 2, 128, 128, 64)
    out = _simulated(args, 2, ONE_TERM_NUMERICS, (1, 8, 2, 128, 128, 64))
    scale = float(np.float32(64 ** -0.5))
    own = bench_prefill.check_slices(out, args, scale, "int8", ONE_TERM_NUMERICS, 2)
    other = bench_prefill.check_slices(out, args, scale, "int8", ONE_TERM_NUMERICS, 1)
    print(f"seed {seed}: chain-2 kernel vs chain 2 {own}, vs chain 1 {other}")
    assert own[1] and not other[1]
    proc = run("int8attn", "bench", "--mode", "prefill", "--w-chain", "4", "--prepare-only",
               tmp_path, check_rc=2)
    assert "'4': give comma-separated chains of 1, 2 (the cuda prefill kernel's: a chain " \
           "divides the 2 PV K-steps a warp issues per 64-token tile)" in proc.stderr
    proc = run("int8attn", "bench", "--mode", "decode", "--w-chain", "2", "--prepare-only",
               tmp_path, check_rc=2)
    assert "--w-chain applies to --mode prefill, not --mode decode" in proc.stderr
