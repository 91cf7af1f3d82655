"""gfx942's v_mfma_i32_32x32x16_i8 as an alternative PV atom (issue 23).

Adding an MMA shape is one atom definition (fragments/mma_atoms.py, its linear
layouts; an entry in PV_ATOMS) plus its ISA table in
the simulator (simulator/isa.py, written independently). These tests check the
two encodings against each other, the token groups the model derives (16 tokens per
MMA with 16-byte V loads), the numpy fragment reference on that model against the
exact reference, the verifier on its groups, and an amdgpu.mfma 32x32x16 op in the
lane interpreter.
"""

import numpy as np
import pytest

from conftest import decode_inputs, seeded_rng
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.fragments import (FRAGMENT_MODELS, GFX942_MFMA, GFX942_MFMA_32X32X16, PV_ATOMS,
                                format_token_set, fragment_model, pv_model, pv_model_named)
from int8attn.fragments.mma_layouts import (group_tokens, k_slot_tokens, mma_layouts,
                                            token_set, v_load_layout)
from int8attn.simulator.isa import TABLES, matrix_instruction, table_for

ATOM = GFX942_MFMA_32X32X16
MODEL = pv_model("gfx942", ATOM.name)
# The four token sets of a 64-token wave (docs/design.md §4): K slot 8r + j of MMA t
# is token 32(t / 2) + 16r + 8(t % 2) + j.
WAVE_SETS = ["{0-7,16-23}", "{8-15,24-31}", "{32-39,48-55}", "{40-47,56-63}"]


def scatter(layout, matrix):
    """Per-lane registers [lanes, slots] of `matrix` through an OperandLayout."""
    return matrix[layout.coords[..., 0], layout.coords[..., 1]]


# -- the atom and its registry ----------------------------------------------------------

def test_the_atom_is_registered_beside_the_targets_own_model():
    assert (ATOM.m, ATOM.n, ATOM.k, ATOM.wave_size) == (32, 32, 16, 64)
    assert ATOM.intrinsic == "llvm.amdgcn.mfma.i32.32x32x16.i8"
    assert (ATOM.a_vector, ATOM.b_vector, ATOM.c_vector) == ((8,), (8,), (16,))
    assert PV_ATOMS["gfx942"] == (GFX942_MFMA.name, ATOM.name)
    for target in FRAGMENT_MODELS:                 # the QK+PV models are untouched
        assert pv_model(target) is fragment_model(target)
        assert pv_model(target, PV_ATOMS[target][0]) is fragment_model(target)
    assert fragment_model("gfx942").instruction is GFX942_MFMA
    assert MODEL.instruction is ATOM and MODEL.group_size == 16 and MODEL.mmacs_per_wave == 4
    assert MODEL.v_load == fragment_model("gfx942").v_load
    assert MODEL.name == "gfx942:" + ATOM.name and pv_model_named(MODEL.name) is MODEL
    assert pv_model_named("gfx942") is fragment_model("gfx942")
    with pytest.raises(KeyError, match="gfx936 has no PV atom"):
        pv_model("gfx936", ATOM.name)
    with pytest.raises(KeyError):
        pv_model_named("gfx942:v_mfma_i32_4x4x4_16b_i8")


def test_the_tables_are_the_vendors_formulas():
    # The lane tables of docs/design.md §3, cell by cell.
    lanes = np.arange(64)[:, None]
    j = np.arange(8)[None, :]
    assert np.array_equal(ATOM.a.coords[..., 0], np.broadcast_to(lanes % 32, (64, 8)))
    assert np.array_equal(ATOM.a.coords[..., 1], 8 * (lanes // 32) + j)
    assert np.array_equal(ATOM.b.coords[..., 0], 8 * (lanes // 32) + j)
    assert np.array_equal(ATOM.b.coords[..., 1], np.broadcast_to(lanes % 32, (64, 8)))
    i = np.arange(16)[None, :]
    assert np.array_equal(ATOM.c.coords[..., 0], 8 * (i // 4) + 4 * (lanes // 32) + i % 4)
    assert np.array_equal(ATOM.c.coords[..., 1], np.broadcast_to(lanes % 32, (64, 16)))
    for operand, (rows, cols) in (("a", (32, 16)), ("b", (16, 32)), ("c", (32, 32))):
        owner = getattr(ATOM, operand).owner()      # a bijection onto the matrix
        assert sorted(owner) == [(r, c) for r in range(rows) for c in range(cols)]


# -- fragment tables vs the simulator's independent ISA table --------------------------

def test_the_simulators_table_is_found_by_target_and_shape():
    assert table_for("gfx942", (16, 16, 32)) == "gfx942"
    name = table_for("gfx942", (32, 32, 16))
    assert TABLES[name]["mnk"] == (32, 32, 16)
    with pytest.raises(KeyError):
        table_for("gfx942", (32, 32, 8))
    with pytest.raises(KeyError):
        table_for("gfx936", (32, 32, 16))


def test_the_fragment_tables_agree_with_the_simulators_isa_table():
    table = TABLES[table_for("gfx942", (32, 32, 16))]
    lanes = np.arange(64)
    for operand in "abc":
        coords = getattr(ATOM, operand).coords
        for slot in range(coords.shape[1]):
            rows, cols = table[operand](slot)
            assert np.array_equal(coords[:, slot, 0], np.broadcast_to(rows, lanes.shape))
            assert np.array_equal(coords[:, slot, 1], np.broadcast_to(cols, lanes.shape))


@pytest.mark.parametrize("seed", [231, 232, 233])
def test_one_mma_through_the_isa_table_equals_the_fragment_model_matmul(seed):
    # As tests/test_kernels.py does for the other instructions: scatter random matrices
    # into lanes with the fragment model, multiply with the simulator's ISA table.
    rng = seeded_rng(seed)
    waves = 2
    a = rng.integers(-128, 128, (waves, ATOM.m, ATOM.k))
    b = rng.integers(-128, 128, (waves, ATOM.k, ATOM.n))
    c = rng.integers(-2**20, 2**20, (waves, ATOM.m, ATOM.n))
    lanes = lambda layout, m: np.stack([scatter(layout, x) for x in m])
    out = matrix_instruction(table_for("gfx942", (32, 32, 16)),
                             lanes(ATOM.a, a).astype(np.int8), lanes(ATOM.b, b).astype(np.int8),
                             lanes(ATOM.c, c).astype(np.int32))
    assert out.shape == (waves, 64, 16) and out.dtype == np.int32
    assert np.array_equal(out, lanes(ATOM.c, a @ b + c))


# -- linear layouts ---------------------------------------------------------------------

@pytest.mark.parametrize("operand", ["a", "b", "c"])
def test_the_linear_layouts_reproduce_the_tables(operand):
    layout = mma_layouts(ATOM).operand(operand)
    table = getattr(ATOM, operand)
    assert layout.in_shape == {"register": table.slots, "lane": 64}
    assert np.array_equal(layout.table(["lane", "register"], ["row", "col"]), table.coords)
    assert layout.is_bijective()


def test_the_v_load_layout_follows_the_16_byte_loads():
    # Lane l is in lane group l / 32 (the lanes holding K rows 8(l / 32) ..) and
    # column l % 32; load L gives it tokens 16(2L + l / 32) .. + 15.
    layout = v_load_layout(MODEL)
    assert layout.in_shape == {"byte": 16, "load": 2, "lane": 64}
    lane, load, byte = np.meshgrid(np.arange(64), np.arange(2), np.arange(16), indexing="ij")
    got = layout.apply(lane=lane.ravel(), load=load.ravel(), byte=byte.ravel())
    assert np.array_equal(got["token"], (16 * (2 * load + lane // 32) + byte).ravel())
    assert np.array_equal(got["head_dim"], (lane % 32).ravel())


# -- the token groups -------------------------------------------------------------------

def test_the_derived_token_groups_are_the_four_sets():
    groups = MODEL.wave_token_groups
    assert [format_token_set(g) for g in groups] == WAVE_SETS
    t, r, j = np.meshgrid(np.arange(4), np.arange(2), np.arange(8), indexing="ij")
    formula = (32 * (t // 2) + 16 * r + 8 * (t % 2) + j).reshape(4, 16)
    assert np.array_equal(groups, formula)
    # the same, solved on the linear layouts
    assert np.array_equal(k_slot_tokens(MODEL).table(["mmac", "k"])[..., 0], groups)
    assert [format_token_set(token_set(MODEL, g)) for g in range(4)] == WAVE_SETS
    # a decode partition of 4 waves: 16 groups, the wave's repeated every 64 tokens
    block = MODEL.partition_tokens
    table = MODEL.token_groups(block)
    assert table.shape == (16, 16)
    assert np.array_equal(group_tokens(MODEL, block).table(["group", "k"])[..., 0], table)
    assert np.array_equal(table, (64 * np.arange(4)[:, None, None] + groups).reshape(16, 16))
    # and not the 16x16x32 model's two 32-token sets
    assert [format_token_set(g) for g in fragment_model("gfx942").wave_token_groups] == \
        ["{0-7,16-23,32-39,48-55}", "{8-15,24-31,40-47,56-63}"]


def test_each_set_is_what_one_mma_consumes():
    # A wave's V loads as the kernel makes them (16 bytes a load, lane group l / 32,
    # column l % 32, from the token-innermost cache); MMA t takes bytes 8t .. 8t + 7 of
    # each lane as its B registers. V[s][d] = s + 64 (d % 2), and A selects K slot k in
    # row k, so the simulator's ISA table returns D[k][n] = V[token of K slot k][n].
    head_dim = 32
    v_t = (np.arange(64)[None, :] + 64 * (np.arange(head_dim)[:, None] % 2)).astype(np.int8)
    lane = np.arange(64)[:, None]
    loaded = np.concatenate([v_t[lane % 32, 16 * (2 * load + lane // 32) + np.arange(16)]
                             for load in range(2)], axis=1)              # [lanes, 32 bytes]
    select = np.zeros((ATOM.m, ATOM.k), np.int64)
    select[np.arange(16), np.arange(16)] = 1                              # D[k] = B[k]
    table = table_for("gfx942", (32, 32, 16))
    for t, expected in enumerate(WAVE_SETS):
        b = loaded[:, 8 * t:8 * t + 8]
        out = matrix_instruction(table, scatter(ATOM.a, select)[None].astype(np.int8),
                                 b[None], np.zeros((1, 64, 16), np.int32))[0]
        d = np.zeros((32, 32), np.int64)
        d[ATOM.c.coords[..., 0], ATOM.c.coords[..., 1]] = out              # [M, N]
        tokens = d[:16] - 64 * (np.arange(32) % 2)                        # [K slot, column]
        assert (tokens == tokens[:, :1]).all(), "column n is head-dim n of the slot's token"
        assert format_token_set(tokens[:, 0]) == expected
        assert np.array_equal(tokens[:, 0], MODEL.wave_token_groups[t])


# -- the numpy fragment reference on the atom's model -----------------------------------

FLOAT_SLACK = 5e-7      # x max|V|: f32 rounding of the references (tests/accuracy.py)


@pytest.mark.parametrize("seed,shape", [
    (235, (1, 8, 2, 300, 64)),      # ragged second partition, GQA 4:1
    (236, (2, 4, 1, 520, 128)),     # batch 2, MQA, three partitions
])
def test_the_fragment_reference_on_the_atom_matches_the_exact_reference(seed, shape):
    # Tolerance from the quantization (docs/design.md §2d): the fragment reference
    # differs from exact attention by its W rounding, |eW| <= sW/2 per element with
    # sW = max|W| / 127 over the atom's 16-token groups (w_quantization_error_scale,
    # hard bound), plus INT8 QK's hard bound (qk_quantization_error_bound), plus f32
    # rounding FLOAT_SLACK * max|V|; and statistically 6 standard deviations of the
    # two rounding models plus the QK bound's second-order remainder. The W part alone
    # (vs f32 PV on the same INT8 scores): the W bound, and 6 sd of its rounding model.
    args = decode_inputs(seed, *shape)
    scale = shape[-1] ** -0.5
    out = ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS, fragments=MODEL)
    exact = ref.exact_attention(*args, scale).astype(np.float64)
    value_scale = float(np.abs(args[3] * args[4][..., None].astype(np.float64)).max())
    err = np.abs(out - exact)
    w_bound, w_sd = ref.w_quantization_error_scale(*args, scale, numerics=ONE_TERM_NUMERICS,
                                                   fragments=MODEL)
    qk_hard, qk_beyond = ref.qk_quantization_error_bound(*args, scale, numerics=ONE_TERM_NUMERICS)
    hard = w_bound * (1 + 1e-4) + qk_hard + FLOAT_SLACK * value_scale
    assert (err <= hard).all(), f"beyond the hard bound by {(err - hard).max():.3e}"
    qk_sd = ref.qk_quantization_error_scale(*args, scale, numerics=ONE_TERM_NUMERICS)
    statistical = 6 * np.sqrt(qk_sd ** 2 + w_sd ** 2) + qk_beyond + FLOAT_SLACK * value_scale
    assert (err <= statistical).all(), \
        f"{(err / statistical).max():.2f} x the statistical tolerance"
    # Sharper, the PV part alone: against the same contract with f32 PV (same INT8
    # QK, same partitions) the only difference is the W rounding over the 16-token groups.
    w_err = np.abs(out - ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS,
                                                pv="f32"))
    slack = FLOAT_SLACK * value_scale
    assert (w_err <= w_bound * (1 + 1e-4) + slack).all()
    assert (w_err <= 6 * w_sd + slack).all(), f"{(w_err / (6 * w_sd + slack)).max():.2f}"

    # The 16x16x32 model's groups are other tokens (32 per group): another result,
    # by far more than f32 rounding, within its own bound of exact.
    other = ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS, model="gfx942")
    differ = np.abs(out - other)
    assert differ.max() > 100 * FLOAT_SLACK * value_scale
    w_bound32, _ = ref.w_quantization_error_scale(*args, scale, numerics=ONE_TERM_NUMERICS,
                                                  model="gfx942")
    assert (np.abs(other - exact) <= w_bound32 * (1 + 1e-4) + qk_hard
            + FLOAT_SLACK * value_scale).all()
    # With the contiguous (wrong) 16-token groups it is another result again.
    wrong = ref.fragment_attention(*args, scale, numerics=ONE_TERM_NUMERICS, fragments=MODEL,
                                   scale_groups="contiguous")
    assert np.abs(wrong - out).max() > 100 * FLOAT_SLACK * value_scale
    print(f"{shape}: 32x32x16 vs exact max {err.max():.3e} (hard bound min "
          f"{hard.min():.3e}, at most {(err / statistical).max():.2f} x the statistical "
          f"tolerance); W rounding alone max {w_err.max():.3e} = "
          f"{(w_err / (6 * w_sd + slack)).max():.2f} x 6 sd; vs 16x16x32 model max "
          f"{differ.max():.3e}; W bound mean "
          f"{w_bound.mean():.3e} (16 tokens) vs {w_bound32.mean():.3e} (32 tokens)")


# -- the verifier on the atom's groups --------------------------------------------------

def _mmac_tiles_module(groups: np.ndarray, scale_groups: np.ndarray, model: str) -> str:
    attr = lambda g: "[" + ", ".join("array<i64: " + ", ".join(map(str, row)) + ">"
                                     for row in g) + "]"
    count, k = groups.shape
    wq = f"tensor<1x1x4x1x{count}x{k}xi8>"
    return f"""
func.func @pv(%w: tensor<1x1x4x1x64xf32>, %v: tensor<1x1x1x64x32xi8>) -> tensor<1x1x4x1x{count}x32xi32> {{
  %q:2 = "int8attn.group_quantize"(%w) {{groups = {attr(groups)}, scale_groups = {attr(scale_groups)}}} : (tensor<1x1x4x1x64xf32>) -> ({wq}, tensor<1x1x4x1x{count}xf32>)
  %acc = "int8attn.mmac_tiles"(%q#0, %v) {{groups = {attr(groups)}, fragment_model = "{model}"}} : ({wq}, tensor<1x1x1x64x32xi8>) -> tensor<1x1x4x1x{count}x32xi32>
  return %acc : tensor<1x1x4x1x{count}x32xi32>
}}
"""


def _verify(text: str) -> None:
    from int8attn.passes import VerifyScaleGroups
    from int8attn.pipelines.manager import run_passes
    from int8attn.support.ir import new_context, parse_module

    with new_context():
        run_passes(parse_module(text, "atom.mlir"), [VerifyScaleGroups()])


def test_the_verifier_proves_the_atoms_groups():
    from int8attn.support.diagnostics import DiagnosticError

    groups = MODEL.token_groups(64)
    _verify(_mmac_tiles_module(groups, groups, MODEL.name))
    contiguous = MODEL.contiguous_groups(64)
    with pytest.raises(DiagnosticError, match=r"MMAC 0 consumes tokens \{0-15\} but "
                       r"gfx942:v_mfma_i32_32x32x16_i8's fragment model says \{0-7,16-23\}"):
        _verify(_mmac_tiles_module(contiguous, contiguous, MODEL.name))
    with pytest.raises(DiagnosticError, match=r"W scale of group 0 is computed over tokens "
                       r"\{0-15\} but the MMAC consuming its quantized values reads tokens "
                       r"\{0-7,16-23\}"):
        _verify(_mmac_tiles_module(groups, contiguous, MODEL.name))
    # the 16-token groups are not the gfx942 (16x16x32) model's
    with pytest.raises(DiagnosticError, match="do not match the K=32"):
        _verify(_mmac_tiles_module(groups, groups, "gfx942"))


# -- amdgpu.mfma 32x32x16 in the lane interpreter ---------------------------------------

def _mfma_kernel(threads: int):
    """A kernel: every thread loads its A, B (8 x i8) and C (16 x i32) registers,
    runs amdgpu.mfma 32x32x16 and stores D."""
    from iree.compiler import ir
    from iree.compiler.dialects import amdgpu, arith, func, gpu, stream, vector

    i8, i32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32)
    index = ir.IndexType.get()
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        binding = ir.Type.parse("!stream.binding")
        kernel = func.FuncOp("mfma", ir.FunctionType.get([binding] * 4, []))
        with ir.InsertionPoint(kernel.add_entry_block()):
            zero = arith.ConstantOp(index, 0).result
            thread = gpu.thread_id(gpu.Dimension.x)
            views = [stream.BindingSubspanOp(ir.MemRefType.get([threads, n], t), arg, zero,
                                             []).result
                     for arg, (n, t) in zip(kernel.arguments,
                                            [(8, i8), (8, i8), (16, i32), (16, i32)])]
            a, b, c = (vector.LoadOp(ir.VectorType.get([n], t), view, [thread, zero]).result
                       for view, (n, t) in zip(views, [(8, i8), (8, i8), (16, i32)]))
            d = amdgpu.MFMAOp(32, 32, 16, a, b, c).result
            vector.StoreOp(d, views[3], [thread, zero])
            func.ReturnOp([])
    assert module.operation.verify()
    return module, kernel


def test_an_amdgpu_mfma_32x32x16_op_runs_in_the_interpreter():
    from iree.compiler import ir
    from int8attn.simulator.interpreter import Machine
    from int8attn.support.ir import new_context

    rng = seeded_rng(237)
    waves = 2
    a = rng.integers(-128, 128, (waves, 32, 16))
    b = rng.integers(-128, 128, (waves, 16, 32))
    c = rng.integers(-2**20, 2**20, (waves, 32, 32))
    regs = lambda layout, m: np.concatenate([scatter(layout, x) for x in m])   # [threads, slots]
    a_regs, b_regs = regs(ATOM.a, a).astype(np.int8), regs(ATOM.b, b).astype(np.int8)
    c_regs = regs(ATOM.c, c).astype(np.int32)
    d_regs = np.zeros_like(c_regs)
    with new_context(), ir.Location.unknown():
        module, kernel = _mfma_kernel(64 * waves)
        assert "amdgpu.mfma 32x32x16" in str(module)
        Machine(kernel.operation, [a_regs, b_regs, c_regs, d_regs], (1, 1, 1), 64 * waves,
                64).run()
    d = np.zeros((waves, 32, 32), np.int64)
    for w in range(waves):
        d[w][ATOM.c.coords[..., 0], ATOM.c.coords[..., 1]] = d_regs[64 * w:64 * (w + 1)]
    assert np.array_equal(d, np.einsum("wmk,wkn->wmn", a, b) + c)
