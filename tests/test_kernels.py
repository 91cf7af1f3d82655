"""Lane-level decode kernels: generated IR, the lane simulator, gfx942 through IREE."""

import dataclasses
import re

import numpy as np
import pytest

from conftest import decode_inputs, seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import (DIGIT_NUMERICS,  # the simulated kernels' default
                                        ONE_TERM_NUMERICS)
from int8attn.fragments import GFX936_MMAC, GFX942_MFMA, FragmentModel, VLoadScheme, fragment_model
from int8attn.driver.graph import decode_graph
from int8attn.simulator import simulate_decode
from int8attn.simulator.isa import matrix_instruction
from test_cli import run

FRAGMENT_TOL = 5e-5


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
def test_isa_tables_agree_with_the_fragment_model(target):
    # Two independent encodings of the same instruction: scatter random matrices
    # into lanes with the fragment model, multiply with the simulator's ISA table.
    rng = seeded_rng(40)
    inst = fragment_model(target).instruction
    a = rng.integers(-127, 128, (inst.m, inst.k))
    b = rng.integers(-127, 128, (inst.k, inst.n))
    c = rng.integers(-1000, 1000, (inst.m, inst.n))
    lanes = lambda layout, m: m[layout.coords[..., 0], layout.coords[..., 1]]
    out = matrix_instruction(target, lanes(inst.a, a)[None], lanes(inst.b, b)[None],
                             lanes(inst.c, c)[None].astype(np.int32))[0]
    assert np.array_equal(out, lanes(inst.c, a @ b + c))


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("shape", [
    (1, 8, 2, 300, 64),      # ragged, D=64, GQA 4:1
    (2, 4, 1, 1000, 128),    # batch 2, MQA, D=128
    (1, 16, 4, 257, 64),     # one token into the second partition
    (1, 4, 4, 40, 128),      # shorter than one wave, MHA
    (1, 8, 2, 130, 96),      # D=96: a lane's K run of 24 bytes, read in 8-byte loads
])
def test_simulated_kernels_match_the_fragment_reference(target, shape):
    args = decode_inputs(sum(shape), *shape)
    scale = shape[-1] ** -0.5
    out = simulate_decode(*args, scale, target=target)
    fragment = ref.fragment_attention(*args, scale, model=target, numerics=DIGIT_NUMERICS)
    slack = ref.rounding_tie_slack(*args, scale, model=target, numerics=DIGIT_NUMERICS)
    err = np.abs(out - fragment)
    assert (err <= FRAGMENT_TOL + slack).all(), f"{target} {shape}: {err.max():.3e}"
    print(f"{target} {shape}: simulated kernel vs fragment reference max abs {err.max():.3e}")


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
def test_peaked_decode_stays_within_the_fragment_tolerance(target):
    """Softmax scale 10: scores of magnitude ~100. The partition softmax takes exp of
    s - m (cuda: the hardware's exp2 of (s - m) log2 e), whose error is relative to
    s - m, not to s: the weights that count (s near m) stay within an ulp or two of
    the reference's."""
    shape = (1, 8, 2, 600, 128)
    args = decode_inputs(4712, *shape)
    out = simulate_decode(*args, 10.0, target=target)
    fragment = ref.fragment_attention(*args, 10.0, model=target, numerics=DIGIT_NUMERICS)
    slack = ref.rounding_tie_slack(*args, 10.0, model=target, numerics=DIGIT_NUMERICS)
    err = np.abs(out - fragment)
    assert (err <= FRAGMENT_TOL + slack).all(), f"{target}: {err.max():.3e}"
    print(f"{target} scale 10: simulated kernel vs fragment reference max abs {err.max():.3e}")


def test_a_wrong_layout_fails_the_comparison():
    # The MFMA C layout on gfx936: the kernel misreads which row and token each
    # score register holds; the simulator executes the real gfx936 MMAC.
    shape = (1, 8, 2, 300, 64)
    args = decode_inputs(50, *shape)
    wrong = FragmentModel("gfx936", dataclasses.replace(GFX936_MMAC, c=GFX942_MFMA.c),
                          VLoadScheme(16))
    out = simulate_decode(*args, 0.125, target="gfx936", fragments=wrong)
    fragment = ref.fragment_attention(*args, 0.125, numerics=DIGIT_NUMERICS)
    assert not np.isfinite(out).all() or np.abs(out - fragment).max() > 1e-2


def test_the_load_scheme_sets_the_groups_end_to_end():
    # A kernel generated for 8-byte V loads consumes contiguous groups: it matches
    # the contiguous-group reference, not the interleaved one. (One W term: two make
    # W nearly exact, whatever its groups.)
    shape = (1, 8, 2, 512, 64)
    args = decode_inputs(51, *shape)
    eight = fragment_model("gfx936").with_v_load(8)
    out = simulate_decode(*args, 0.125, target="gfx936", fragments=eight,
                          numerics=ONE_TERM_NUMERICS)
    contiguous = ref.fragment_attention(*args, 0.125, fragments=eight, numerics=ONE_TERM_NUMERICS)
    interleaved = ref.fragment_attention(*args, 0.125, numerics=ONE_TERM_NUMERICS)
    assert np.abs(out - contiguous).max() <= FRAGMENT_TOL
    assert np.abs(out - interleaved).max() > 10 * np.abs(out - contiguous).max()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_mmacs_per_wave(tmp_path, head_dim):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 8, 2, 600, head_dim))
    text = run("int8attn", "compile", path, "--target", "gfx936", "-o", "-", check_rc=0).stdout
    partition = text[:text.index("stream.executable private @decode_merge")]
    qk = (64 // 16) * (head_dim // 32)          # token blocks x K steps
    pv = 2 * (head_dim // 16)                   # MMACs x head-dim tiles
    # gfx936's C layout holds one row per lane: no padding rows take a second term, so
    # each term of q and of W is an MMAC of its own.
    terms = DIGIT_NUMERICS.q_terms * qk + DIGIT_NUMERICS.w_terms * pv
    assert partition.count('llvm.call_intrinsic "llvm.amdgcn.mmac.i32.16x16x32i8"') == terms


def test_gfx942_isa_has_the_int8_mfma(tmp_path):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 8, 2, 600, 64))
    isa = tmp_path / "decode.s"
    run("int8attn", "compile", path, "--target", "gfx942", "--emit", "isa", "-o", isa, check_rc=0)
    text = isa.read_text()
    # 4 rows per KV head: no padding rows in the same lane for a second term
    qk, pv = (64 // 16) * (64 // 32), 2 * (64 // 16)
    assert text.count("v_mfma_i32_16x16x32_i8") == \
        DIGIT_NUMERICS.q_terms * qk + DIGIT_NUMERICS.w_terms * pv
    assert "s_barrier" in text
    vmfb = tmp_path / "decode.vmfb"
    run("int8attn", "compile", path, "--target", "gfx942", "-o", vmfb, check_rc=0)
    assert vmfb.stat().st_size > 1000


def test_run_simulate_with_inputs_and_output(tmp_path):
    path = tmp_path / "decode.mlir"
    path.write_text(decode_graph(1, 4, 1, 100, 64))
    arrays = decode_inputs(52, 1, 4, 1, 100, 64)
    np.savez(tmp_path / "in.npz", **{f"arg{i}": a for i, a in enumerate(arrays)})
    run("int8attn", "run", path, "--target", "gfx936", "--simulate", "--inputs",
        tmp_path / "in.npz", "--output", tmp_path / "out.npz", check_rc=0)
    with np.load(tmp_path / "out.npz") as out:
        expected = ref.fragment_attention(*arrays, 0.125, numerics=DIGIT_NUMERICS)
        assert np.abs(out["result0"] - expected).max() <= FRAGMENT_TOL
    report = run("int8attn", "run", path, "--target", "gfx942", "--simulate", "--seed", "1",
                 check_rc=0).stdout
    fragment_err = float(re.search(r"vs fragment-level reference\s+max abs ([0-9.e+-]+)",
                                   report).group(1))
    assert fragment_err <= FRAGMENT_TOL


def test_kernel_targets_reject_what_they_do_not_cover(tmp_path):
    # (cache_write on a kernel target: tests/test_paged.py)
    decode = tmp_path / "decode.mlir"
    decode.write_text(decode_graph(1, 4, 1, 100, 64))
    assert "run them in the lane simulator with --simulate" in run(
        "int8attn", "run", decode, "--target", "gfx936", check_rc=2).stderr
    assert "there is no 'isa' to emit" in run("int8attn", "compile", decode, "--target",
                                              "gfx936", "--emit", "isa", "-o", tmp_path / "x.s",
                                              check_rc=2).stderr


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("q_heads", [6, 14])
def test_a_gqa_group_that_is_no_power_of_two_through_the_driver(target, q_heads):
    # 3 and 7 query heads per KV head at D 128: the partial outputs hold 4 and 8 rows (a
    # power of two; 3 rows of 128 over cuda's 128 threads were no lane map, and the
    # build failed), and the host function hands back the real ones, in q's layout.
    import int8attn
    from accuracy import check_against_references

    args = decode_inputs(150 + q_heads, 2, q_heads, 2, 300, 128)
    graph = int8attn.compile(decode_graph(2, q_heads, 2, 300, 128), target=target,
                             simulate=True, cache=False)
    out = graph(*args)
    assert out.shape == args[0].shape
    check_against_references(out, args, np.float32(128 ** -0.5), model=target,
                             numerics=DIGIT_NUMERICS)
