"""The cpu target on more than the host's CPU: each x86-64 level IREE compiles for.

IREE caps every op's vector tiles to its target's SIMD register space; an
mmt4d whose inner tile it cuts reaches the mmt4d ukernel with the whole
tile's strides and sums the wrong elements (found on an AVX2-only machine,
where lower-mmac-tiles{contraction=mmt4d} was off by up to 0.4). These tests
hold the rule the mmt4d form sizes its tiles by (`MMT4DTile.fitting`) to what
IREE does on each level: the tile it picks stays whole and sums exactly; the
next larger one is cut, and the build refuses it. They compile for every
level and run what this machine can execute, so an AVX-512 machine checks
what an AVX2 one would compute. Inputs: numpy default_rng, printed seed.
"""

from __future__ import annotations

import sys

import iree.runtime as rt
import numpy as np
import pytest

import int8attn
from accuracy import check_against_references
from conftest import REPO, X86_LEVELS, require_runnable, seeded_rng
from int8attn import cli
from int8attn import reference as ref
from int8attn.driver.graph import attention_graph, random_inputs
from int8attn.driver.cpu_target import UnknownTargetCPU, check_runnable_here, resolve
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS, OptionRefused
from int8attn.passes.mmac_tiles_mmt4d import MMT4D_K0, MMT4DTile, row_tile
from int8attn.runtime import ModuleCache
from int8attn.support.cpu_vectors import REGISTER_FILES
from int8attn.support.diagnostics import StageError

BATCH, M1, N1, K1 = 3, 2, 2, 16


def batch_mmt4d(m0: int, n0: int) -> tuple[str, list[str]]:
    lhs = f"tensor<{BATCH}x{M1}x{K1}x{m0}x{MMT4D_K0}xi16>"
    rhs = f"tensor<{BATCH}x{N1}x{K1}x{n0}x{MMT4D_K0}xi16>"
    out = f"tensor<{BATCH}x{M1}x{N1}x{m0}x{n0}xi32>"
    return f"""func.func @tiles(%a: {lhs}, %b: {rhs}) -> {out} {{
  %zero = arith.constant 0 : i32
  %empty = tensor.empty() : {out}
  %init = linalg.fill ins(%zero : i32) outs(%empty : {out}) -> {out}
  %r = linalg.batch_mmt4d ins(%a, %b : {lhs}, {rhs}) outs(%init : {out}) -> {out}
  return %r : {out}
}}
""", [lhs, rhs]


@pytest.mark.parametrize("target_cpu", sorted(X86_LEVELS))
def test_each_level_resolves_to_its_register_file(target_cpu):
    assert resolve(target_cpu).vector_isa == X86_LEVELS[target_cpu]


@pytest.mark.parametrize("rows", [1, 4, 8, 16])
@pytest.mark.parametrize("target_cpu", sorted(X86_LEVELS))
def test_fitting_tile_stays_whole_and_sums_exactly(target_cpu, rows):
    tile = MMT4DTile.fitting(REGISTER_FILES[X86_LEVELS[target_cpu]], head_dim=128)
    m0 = row_tile(rows, tile.max_rows)
    source, _ = batch_mmt4d(m0, tile.n0)
    vmfb, _ = iree_compile(source, TARGETS["cpu"], target_cpu=target_cpu)  # refuses a cut
    require_runnable(target_cpu)
    rng = seeded_rng(7000 + rows)
    # u = Wq + 128 in [0, 255] against Vq in [-128, 127]: the operands the pass packs.
    a = rng.integers(0, 256, (BATCH, M1, K1, m0, MMT4D_K0)).astype(np.int16)
    b = rng.integers(-128, 128, (BATCH, N1, K1, tile.n0, MMT4D_K0)).astype(np.int16)
    context = rt.SystemContext(config=rt.Config("local-task"))
    context.add_vm_module(rt.VmModule.copy_buffer(context.instance, vmfb))
    out = np.asarray(context.modules.module.tiles(a, b))
    exact = np.einsum("bmkxy,bnkzy->bmnxz", a.astype(np.int64), b.astype(np.int64))
    assert np.array_equal(out, exact), f"max difference {np.abs(out - exact).max()}"


@pytest.mark.parametrize("target_cpu", sorted(X86_LEVELS))
def test_next_larger_tile_is_cut_by_iree_and_refused(target_cpu):
    """The rule is tight: twice the rows IREE's register space holds gets cut."""
    tile = MMT4DTile.fitting(REGISTER_FILES[X86_LEVELS[target_cpu]], head_dim=128)
    if tile.max_rows == 16:
        tile = MMT4DTile(2 * tile.n0, tile.max_rows)      # wider instead
    else:
        tile = MMT4DTile(tile.n0, 2 * tile.max_rows)
    assert not MMT4DTile.fits(REGISTER_FILES[X86_LEVELS[target_cpu]], tile.max_rows, tile.n0)
    source, _ = batch_mmt4d(tile.max_rows, tile.n0)
    with pytest.raises(StageError, match="splits the inner tile of a linalg mmt4d"):
        iree_compile(source, TARGETS["cpu"], target_cpu=target_cpu)


def test_unknown_cpu_is_refused_with_the_names_llvm_accepts():
    with pytest.raises(OptionRefused, match="not a CPU that IREE's LLVM knows.*x86-64-v3"):
        TARGETS["cpu"].cpu("x86-64-v9")


def test_an_unknown_host_cpu_variable_is_named_as_the_source(monkeypatch):
    # the user gave no --target-cpu: the message says the name came from the variable
    monkeypatch.setenv("INT8ATTN_HOST_CPU", "x86-64-v9")
    with pytest.raises(OptionRefused, match=r"\$INT8ATTN_HOST_CPU=x86-64-v9 \(what 'host' "
                                            r"stands for while it is set\): --target-cpu "
                                            r"'x86-64-v9' is not a CPU"):
        TARGETS["cpu"].cpu("host")


def test_cpu_without_this_machines_features_is_refused_at_run():
    """Code for a CPU with features this one lacks would die of SIGILL: refused."""
    missing = next((name for name in ("diamondrapids", "znver5", "graniterapids")
                    if resolve(name).missing_on(resolve("host"))), None)
    if missing is None:
        pytest.skip("this machine has every feature of the CPUs tried")
    with pytest.raises(UnknownTargetCPU, match="cannot run here"):
        check_runnable_here(resolve(missing))


# The pipeline's default numerics end to end on each level, with both
# contractions: against the exact f32 reference and the fragment-level one
# (tests/accuracy.py states the tolerances and where they come from).
NUMERICS_CASES = [("decode", (1, 8, 2, 700, 1, 64)), ("prefill", (1, 4, 1, 200, 70, 64))]


@pytest.mark.parametrize("contraction", ["f32", "mmt4d"])
@pytest.mark.parametrize("target_cpu", ["x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("mode, shape", NUMERICS_CASES, ids=[m for m, _ in NUMERICS_CASES])
def test_each_level_meets_both_references(mode, shape, target_cpu, contraction):
    require_runnable(target_cpu)
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    source = attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode=mode,
                             query_tokens=query_tokens)
    compiled = int8attn.compile(source, filename=f"{mode}.mlir", cache=False,
                                target_cpu=target_cpu, contraction=contraction)
    # the register file sizes only the mmt4d tiles: the module's options say so
    assert compiled.options.vector_isa == (X86_LEVELS[target_cpu] if contraction == "mmt4d"
                                           else None)
    seed = 7100 + 10 * NUMERICS_CASES.index((mode, shape)) + sorted(X86_LEVELS).index(target_cpu)
    print(f"random inputs: driver.graph.random_inputs seed {seed}", file=sys.stderr)
    args = random_inputs(next(iter(compiled.functions.values())), seed)
    out = compiled.run(args)[0]
    check_against_references(out, args, 1 / head_dim ** 0.5)


@pytest.mark.parametrize("target_cpu", ["x86-64", "x86-64-v3", "x86-64-v4"])
def test_two_term_scores_are_one_fma_on_every_level(target_cpu):
    """A large softmax scale makes an ulp of a score (log2 units) visible in the weights:
    two-term Q's score must be the contract's fma(acc1, s1, acc2 * s2) on every level.
    Written as a multiply and an add, LLVM fused them where the CPU has FMA (x86-64-v4:
    1.3e-4 from the fragment reference at scale 50, past its tolerance), not on x86-64."""
    require_runnable(target_cpu)
    scale = 50.0
    source = attention_graph(1, 4, 2, 130, 64, mode="prefill", query_tokens=65,
                             softmax_scale=scale)
    compiled = int8attn.compile(source, filename="prefill.mlir", cache=False,
                                target_cpu=target_cpu)
    seed = 4         # (a seed whose fused scores missed the tolerance on x86-64-v4)
    print(f"random inputs: driver.graph.random_inputs seed {seed}", file=sys.stderr)
    args = random_inputs(next(iter(compiled.functions.values())), seed)
    out = compiled.run(args)[0]
    check_against_references(out, args, np.float32(scale))
    # An ulp of a score here (|s| in the hundreds) moves the output by ~1e-4; the exp's
    # few ulps by ~5e-7. So the fragment reference is met far inside its tolerance.
    fragment = ref.fragment_attention(*args, np.float32(scale),
                                      numerics=compiled.options.numerics)
    assert np.abs(out - fragment).max() < 1e-5


def test_module_cache_keys_by_target_cpu(tmp_path):
    cache = ModuleCache(tmp_path)
    source = attention_graph(1, 4, 1, 64, 32, mode="decode")
    v3 = int8attn.compile(source, cache=cache, target_cpu="x86-64-v3")
    v4 = int8attn.compile(source, cache=cache, target_cpu="x86-64-v4")
    assert not v3.cache_hit and not v4.cache_hit and v3.vmfb != v4.vmfb
    assert int8attn.compile(source, cache=cache, target_cpu="x86-64-v3").cache_hit


@pytest.mark.parametrize("argv, status, message", [
    (["--target-cpu", "x86-64-v9"], 2, "not a CPU that IREE's LLVM knows"),
    (["--target-cpu", "x86-64 -v3"], 2, "is not a CPU name"),
    (["--target", "cuda", "--target-cpu", "x86-64-v3"], 2,
     "--target-cpu x86-64-v3 does not apply to --target cuda"),
    (["--target", "gfx942", "--contraction", "mmt4d"], 2,
     "--contraction mmt4d does not apply to --target gfx942"),
])
def test_cli_refuses_a_target_cpu_that_does_not_apply(argv, status, message, tmp_path, capsys):
    out = tmp_path / "out.vmfb"
    assert cli.main(["compile", str(REPO / "examples" / "decode.mlir"), "-o", str(out),
                     *argv]) == status
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_cli_compiles_for_another_level(tmp_path, capsys):
    out = tmp_path / "decode.vmfb"
    assert cli.main(["compile", str(REPO / "examples" / "decode.mlir"), "-o", str(out),
                     "--target-cpu", "x86-64-v3", "--contraction", "mmt4d"]) == 0
    assert out.stat().st_size > 0
