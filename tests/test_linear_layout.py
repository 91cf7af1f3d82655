"""The layout algebra (fragments/linear_layout.py) and the fragment model rebuilt on it
(fragments/mma_layouts.py), checked element by element against the enumerated tables of
fragments/ and the simulator's independent ISA tables."""

import itertools

import numpy as np
import pytest

from int8attn.fragments import (FRAGMENT_MODELS, GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16,
                                SM80_MMA_BF16, SM80_MMA_S8, DecodeKernelLayout, LaneMap,
                                bf16_pv_model, format_token_set, fragment_model, pv_model,
                                xor_reduction_offsets)
from int8attn.fragments.layout_emit import INT_BUILDER, TEXT_BUILDER, CallableBuilder
from int8attn.fragments.linear_layout import LinearLayout, NotInvertible, NotLinear
from int8attn.fragments.mma_layouts import (group_reduction_offsets, group_tokens,
                                            k_slot_tokens, mma_layouts, row_reduction_offsets,
                                            score_group_layout, score_layout, token_set,
                                            token_slots, v_load_layout, xor_partners)

I = LinearLayout.identity
INSTRUCTIONS = (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16, SM80_MMA_S8, SM80_MMA_BF16)
# Every fragment model the kernels build, the bf16 PV twin, the 8-byte-load variant and
# gfx942's 32x32x16 PV atom.
MODELS = {**{name: fragment_model(name) for name in FRAGMENT_MODELS},
          "cuda-bf16": bf16_pv_model("cuda"), "gfx936-8B": fragment_model("gfx936").with_v_load(8),
          "gfx942-32x32x16": pv_model("gfx942", GFX942_MFMA_32X32X16.name)}


# -- random layouts --------------------------------------------------------------------

def random_layout(rng, ins, outs, zero_chance=0.2):
    """Random bases: {in: size}, {out: size}."""
    def basis():
        if rng.random() < zero_chance:
            return {o: 0 for o in outs}
        return {o: int(rng.integers(0, size)) for o, size in outs.items()}
    return LinearLayout({d: [basis() for _ in range(size.bit_length() - 1)]
                         for d, size in ins.items()}, outs)


def random_bijection(rng, ins, outs):
    while True:
        layout = random_layout(rng, ins, outs, zero_chance=0)
        if layout.is_bijective():
            return layout


def identity_of(shape):
    result = LinearLayout.empty()
    for name, size in shape.items():
        result = result * I(name, size)
    return result


def all_inputs(layout):
    grids = np.meshgrid(*[np.arange(layout.in_size(d)) for d in layout.in_dims], indexing="ij")
    return {d: g.ravel() for d, g in zip(layout.in_dims, grids)}


SEEDS = range(12)


@pytest.mark.parametrize("seed", SEEDS)
def test_apply_on_ints_equals_apply_on_arrays(seed):
    rng = np.random.default_rng(seed)
    layout = random_layout(rng, {"a": 8, "b": 4}, {"x": 16, "y": 4})
    inputs = all_inputs(layout)
    vectorized = layout.apply(inputs)
    for n in range(len(inputs["a"])):
        point = layout.apply(a=int(inputs["a"][n]), b=int(inputs["b"][n]))
        assert point == {o: int(vectorized[o][n]) for o in ("x", "y")}
    # XOR-linear: L(u ^ v) = L(u) ^ L(v)
    u, v = {"a": 5, "b": 3}, {"a": 6, "b": 1}
    both = layout.apply({k: u[k] ^ v[k] for k in u})
    assert both == {o: layout.apply(u)[o] ^ layout.apply(v)[o] for o in both}


@pytest.mark.parametrize("seed", SEEDS)
def test_compose_is_associative_and_pointwise(seed):
    rng = np.random.default_rng(seed)
    f = random_layout(rng, {"a": 8, "b": 4}, {"x": 16, "y": 2})
    g = random_layout(rng, {"x": 16, "y": 2}, {"p": 8, "q": 8})
    h = random_layout(rng, {"p": 8, "q": 8}, {"z": 32})
    assert f.compose(g).compose(h) == f.compose(g.compose(h))
    inputs = all_inputs(f)
    assert np.array_equal(f.compose(g).apply(inputs)["p"], g.apply(f.apply(inputs))["p"])


@pytest.mark.parametrize("seed", SEEDS)
def test_invert_of_a_bijection_is_its_two_sided_inverse(seed):
    rng = np.random.default_rng(seed)
    ins, outs = {"register": 4, "lane": 16}, {"row": 8, "col": 8}
    layout = random_bijection(rng, ins, outs)
    inverse = layout.invert()
    assert layout.compose(inverse) == identity_of(ins)
    assert inverse.compose(layout) == identity_of(outs)
    assert inverse.invert() == layout


@pytest.mark.parametrize("seed", SEEDS)
def test_right_inverse_of_a_surjection(seed):
    rng = np.random.default_rng(seed)
    while True:
        layout = random_layout(rng, {"register": 8, "lane": 16}, {"row": 4, "col": 8})
        if layout.is_surjective():
            break
    assert not layout.is_injective()
    assert layout.invert().compose(layout) == identity_of({"row": 4, "col": 8})
    # the kernel: 7 input bits onto 5 output bits leaves 2 directions that map to 0
    kernel = layout.kernel()
    assert len(kernel) == 2 and all(layout.apply(k) == {"row": 0, "col": 0} for k in kernel)


def test_invert_refuses_a_layout_that_is_not_surjective():
    broadcast = I("lane", 4, "row") * LinearLayout.zeros("register", 4, {"row": 1})
    assert broadcast.is_surjective() and not broadcast.is_injective()
    assert broadcast.invert() == I("row", 4, "lane") * LinearLayout.zeros(
        "row", 1, {"register": 4})
    # two lane bits onto one row bit: row bit 1 is never reached
    short = LinearLayout({"lane": [{"row": 1}, {"row": 1}]}, {"row": 4})
    with pytest.raises(NotInvertible, match="not surjective .*row bit 1"):
        short.invert()


@pytest.mark.parametrize("seed", SEEDS)
def test_preimage_is_every_solution(seed):
    rng = np.random.default_rng(seed)
    layout = random_layout(rng, {"a": 8, "b": 8}, {"x": 8}, zero_chance=0.4)
    inputs = all_inputs(layout)
    image = layout.apply(inputs)["x"]
    for x in range(8):
        pre = layout.preimage(x=x)
        want = sorted(zip(inputs["a"][image == x], inputs["b"][image == x]),
                      key=lambda ab: ab[0] + 8 * ab[1])
        assert list(zip(pre["a"], pre["b"])) == want


@pytest.mark.parametrize("seed", SEEDS)
def test_product_and_sublayout(seed):
    rng = np.random.default_rng(seed)
    f = random_layout(rng, {"a": 4}, {"x": 8})
    g = random_layout(rng, {"b": 8}, {"y": 4})
    both = f * g
    assert both.in_shape == {"a": 4, "b": 8} and both.out_shape == {"x": 8, "y": 4}
    assert both.sublayout(["a"], ["x"]) == f and both.sublayout(["b"], ["y"]) == g
    assert both.sublayout(["a"], ["y"]) == LinearLayout.zeros("a", 4, {"y": 4})
    # a dim in both factors: the outer's bits above the inner's, in and out
    h = random_layout(rng, {"a": 2}, {"x": 4})
    shared = f * h
    assert shared.in_shape == {"a": 8} and shared.out_shape == {"x": 32}
    for a in range(8):
        assert shared.apply(a=a)["x"] == f.apply(a=a % 4)["x"] ^ (h.apply(a=a // 4)["x"] << 3)


def test_reshape_rename_transpose_and_equality():
    layout = I("register", 8, "col") * I("lane", 16, "row") * I("lane", 4, "col")
    flat = layout.reshape_ins([("thread", 512)])
    assert flat.apply(thread=8 * 21 + 3) == layout.apply(register=3, lane=21)
    assert flat.reshape_ins([("register", 8), ("lane", 64)]) == layout
    assert layout.transpose_outs(["row", "col"]) == layout          # same map
    assert layout.rename(outs={"col": "k"}).out_dims == ("k", "row")
    assert layout.rename(outs={"col": "k"}) != layout
    joined = layout.reshape_outs([("element", 512)])
    assert joined.apply(register=3, lane=21)["element"] == 8 * 1 + 3 + 32 * 5
    assert "lane[64]: (row=1)" in repr(layout) and "-> col[32], row[16]" in repr(layout)
    with pytest.raises(ValueError, match="outside"):
        LinearLayout({"lane": [{"row": 16}]}, {"row": 16})
    with pytest.raises(ValueError, match="not an input of the outer"):
        layout.compose(I("row", 16))


def test_from_function_fits_and_rejects():
    fitted = LinearLayout.from_function({"lane": 64}, {"row": 16, "col": 4},
                                        lambda lane: {"row": lane % 16, "col": lane // 16})
    assert fitted == I("lane", 16, "row") * I("lane", 4, "col")
    with pytest.raises(NotLinear, match="XOR of its bits"):
        LinearLayout.from_function({"x": 8}, {"y": 16}, lambda x: {"y": 3 * x})


# -- a swizzle --------------------------------------------------------------------------

SWIZZLE = LinearLayout({"row": [{"row": 1, "chunk": 1}, {"row": 2, "chunk": 2},
                                {"row": 4, "chunk": 4}],
                        "chunk": [{"chunk": 1}, {"chunk": 2}, {"chunk": 4}]},
                       {"row": 8, "chunk": 8})


def test_xor_swizzle_is_a_layout():
    # LDS rows of eight 16-byte chunks, chunk' = chunk ^ row: bank-conflict-free columns.
    out = SWIZZLE.apply(all_inputs(SWIZZLE))
    inputs = all_inputs(SWIZZLE)
    assert np.array_equal(out["chunk"], inputs["chunk"] ^ inputs["row"])
    assert SWIZZLE.is_bijective() and SWIZZLE.invert() == SWIZZLE     # an involution
    # a column (fixed chunk) lands on 8 different chunks: the 8 rows hit 8 banks
    column = SWIZZLE.apply(row=np.arange(8), chunk=3)["chunk"]
    assert sorted(column.tolist()) == list(range(8))
    # one thread per (row, chunk): what a LaneMap (additive in the lane bits) cannot say
    flat = SWIZZLE.transpose_ins(["chunk", "row"]).reshape_ins([("thread", 64)])
    chunks = flat.apply(thread=np.arange(64))["chunk"]
    assert np.array_equal(chunks, (np.arange(64) & 7) ^ (np.arange(64) >> 3))
    with pytest.raises(ValueError, match="not linear"):
        LaneMap.fit(chunks)
    assert SWIZZLE.emit(TEXT_BUILDER, {"row": "r", "chunk": "c"}) == {
        "row": "(r & 7)", "chunk": "((r & 7) ^ (c & 7))"}


# -- emit -------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", SEEDS)
def test_emit_evaluates_to_apply(seed):
    rng = np.random.default_rng(seed)
    layout = random_layout(rng, {"register": 8, "lane": 64}, {"row": 16, "col": 32})
    inputs = all_inputs(layout)
    assert all(np.array_equal(v, layout.apply(inputs)[o])
               for o, v in layout.emit(INT_BUILDER, inputs).items())


def test_emit_is_one_term_per_run():
    c = mma_layouts(GFX936_MMAC).c                   # C[l % 16][l / 16 + 4i]
    assert c.emit(TEXT_BUILDER, {"register": "i", "lane": "l"}) == {
        "row": "(l & 15)", "col": "(((i & 3) << 2) | ((l & 48) >> 4))"}
    assert c.emit(TEXT_BUILDER, {"register": "i", "lane": "l"}, assume_in_range=True)["col"] \
        == "((i << 2) | ((l & 48) >> 4))"
    assert c.emit(TEXT_BUILDER, {"lane": "l"}, outs=["col"]) == {"col": "((l & 48) >> 4)"}
    assert I("x", 4, "y").emit(TEXT_BUILDER, {}) == {"y": "0"}


def _arith_builder():
    from iree.compiler import ir
    from iree.compiler.dialects import arith
    index = ir.IndexType.get()
    const = lambda c: arith.constant(index, int(c))
    return CallableBuilder(
        const=const, and_=lambda v, m: arith.andi(v, const(m)),
        shl=lambda v, s: arith.shli(v, const(s)), shru=lambda v, s: arith.shrui(v, const(s)),
        or_=arith.ori, xor=arith.xori)


def _evaluate(func_op, arguments):
    """A tiny interpreter of the emitted arith ops (index values as numpy arrays)."""
    ops = {"arith.andi": np.bitwise_and, "arith.ori": np.bitwise_or,
           "arith.xori": np.bitwise_xor, "arith.shli": np.left_shift,
           "arith.shrui": np.right_shift}
    block = func_op.regions[0].blocks[0]
    values = {str(arg.get_name()): a for arg, a in zip(block.arguments, arguments)}
    for op in block.operations:
        name = op.operation.name
        if name == "arith.constant":
            values[op.result.get_name()] = int(str(op.attributes["value"]).split(":")[0])
        elif name in ops:
            a, b = (values[v.get_name()] for v in op.operands)
            values[op.result.get_name()] = ops[name](a, b)
        else:
            assert name == "func.return", name
            return [values[v.get_name()] for v in op.operands]


@pytest.mark.parametrize("layout_name", ["gfx936 C", "cuda A", "swizzle"])
def test_emit_arith_ir_builds_a_function_that_computes_the_layout(layout_name):
    from iree.compiler import ir
    from iree.compiler.dialects import func
    layout = {"gfx936 C": mma_layouts(GFX936_MMAC).c, "cuda A": mma_layouts(SM80_MMA_S8).a,
              "swizzle": SWIZZLE}[layout_name]
    with ir.Context(), ir.Location.unknown():
        index = ir.IndexType.get()
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(*[index] * len(layout.in_dims), name="layout")
            def _(*args):
                out = layout.emit(_arith_builder(), dict(zip(layout.in_dims, args)))
                return tuple(out[o] for o in layout.out_dims)
        assert module.operation.verify()
        text = str(module)
        func_op = module.body.operations[0]
        inputs = all_inputs(layout)
        got = _evaluate(func_op, [inputs[d] for d in layout.in_dims])
    want = layout.apply(inputs)
    for o, value in zip(layout.out_dims, got):
        assert np.array_equal(np.broadcast_to(value, want[o].shape), want[o])
    assert ("arith.xori" in text) == (layout_name == "swizzle")
    assert "arith.muli" not in text and "arith.divui" not in text and "arith.remui" not in text


# -- the fragment model, rebuilt --------------------------------------------------------

@pytest.mark.parametrize("inst", INSTRUCTIONS, ids=lambda i: i.name)
@pytest.mark.parametrize("operand", ["a", "b", "c"])
def test_operand_layouts_equal_the_tables(inst, operand):
    layout = mma_layouts(inst).operand(operand)
    table = getattr(inst, operand)
    assert layout.in_shape == {"register": table.slots, "lane": inst.wave_size}
    assert np.array_equal(layout.table(["lane", "register"], ["row", "col"]), table.coords)
    rows, cols = {"a": (inst.m, inst.k), "b": (inst.k, inst.n), "c": (inst.m, inst.n)}[operand]
    assert layout.out_shape == {"row": rows, "col": cols} and layout.is_bijective()


SIMULATOR_TARGETS = {GFX936_MMAC.name: "gfx936", GFX942_MFMA.name: "gfx942",
                     GFX942_MFMA_32X32X16.name: "gfx942-32x32x16",
                     SM80_MMA_S8.name: "cuda", SM80_MMA_BF16.name: "cuda-bf16"}


@pytest.mark.parametrize("inst", INSTRUCTIONS, ids=lambda i: i.name)
def test_operand_layouts_equal_the_simulators_isa_tables(inst):
    from int8attn.simulator.isa import TABLES       # written independently of fragments/
    table = TABLES[SIMULATOR_TARGETS[inst.name]]
    assert table["mnk"] == (inst.m, inst.n, inst.k)
    lanes = np.arange(inst.wave_size)
    for operand in "abc":
        layout = mma_layouts(inst).operand(operand)
        for slot in range(layout.in_size("register")):
            rows, cols = table[operand](slot)
            got = layout.apply(register=slot, lane=lanes)
            assert np.array_equal(got["row"], rows) and np.array_equal(got["col"], cols)


@pytest.mark.parametrize("name", MODELS)
def test_v_load_layout_equals_the_load_scheme(name):
    model = MODELS[name]
    layout = v_load_layout(model)
    b, width = model.instruction.b, model.v_load.bytes_per_lane
    lane_group = b.lane_groups(axis=0)
    groups = int(lane_group.max()) + 1
    loads = layout.in_size("load")
    assert loads * width == model.mmacs_per_wave * b.slots
    for lane, load, byte in itertools.product(range(b.lanes), range(loads), range(width)):
        got = layout.apply(lane=lane, load=load, byte=byte)
        assert got["token"] == model.v_load.token_of_byte(
            int(lane_group[lane]), groups, load * width + byte)
        assert got["head_dim"] == b.element(lane, 0)[1]


@pytest.mark.parametrize("name", MODELS)
def test_derived_token_groups_equal_the_fragment_models(name):
    model = MODELS[name]
    tokens = k_slot_tokens(model)
    assert np.array_equal(tokens.table(["mmac", "k"])[..., 0], model.wave_token_groups)
    block = 4 * model.wave_tokens
    groups = model.token_groups(block)
    assert np.array_equal(group_tokens(model, block).table(["group", "k"])[..., 0], groups)
    for g, row in enumerate(groups):
        assert np.array_equal(token_set(model, g, block), np.sort(row))
    owner = token_slots(model, block).apply(token=np.arange(block))["group"]
    assert np.array_equal(owner, model.group_of_token(block))


def test_gfx936_groups_are_the_seeds_interleaved_sets():
    model = fragment_model("gfx936")
    assert [format_token_set(token_set(model, g)) for g in range(2)] == [
        "{0-7,16-23,32-39,48-55}", "{8-15,24-31,40-47,56-63}"]
    # K slot 8r + j of MMAC t is token 16r + 8t + j: k bits 0-2 -> 1, 2, 4; 3-4 -> 16, 32
    assert k_slot_tokens(model) == LinearLayout(
        {"k": [{"token": t} for t in (1, 2, 4, 16, 32)], "mmac": [{"token": 8}]},
        {"token": 64})
    assert [format_token_set(token_set(model.with_v_load(8), g)) for g in range(2)] == [
        "{0-31}", "{32-63}"]


def test_load_schemes_that_miss_tokens_are_refused():
    with pytest.raises(ValueError, match="does not cover"):
        k_slot_tokens(fragment_model("gfx936").with_v_load(32))
    with pytest.raises(ValueError, match="power-of-two number of 64-token waves"):
        group_tokens(fragment_model("gfx936"), 192)


@pytest.mark.parametrize("name", FRAGMENT_MODELS)
def test_score_layout_equals_the_kernel_layouts_elements(name):
    model = fragment_model(name)
    kernel = DecodeKernelLayout(model)
    table = score_layout(model).table(["lane", "block", "register"], ["row", "token"])
    lanes = model.instruction.wave_size
    assert np.array_equal(table[..., 0].reshape(lanes, -1), kernel.element_rows())
    assert np.array_equal(table[..., 1].reshape(lanes, -1), kernel.element_tokens())
    groups = score_group_layout(model).table(["lane", "block", "register"], ["group"])
    assert np.array_equal(groups[..., 0].reshape(lanes, -1), kernel.element_groups())


EXPECTED_OFFSETS = {  # docs/design.md §4: row max/sum, (row, MMAC) absmax
    "gfx936": ((16, 32), (16, 32)), "gfx942": ((1, 2, 4, 8), (1, 2, 4)),
    "cuda": ((1, 2), (1, 2))}


@pytest.mark.parametrize("name", FRAGMENT_MODELS)
def test_shuffle_partners_equal_the_kernels(name):
    model = fragment_model(name)
    kernel = DecodeKernelLayout(model)
    rows, groups = row_reduction_offsets(model), group_reduction_offsets(model)
    assert rows == kernel.row_max_offsets() == xor_reduction_offsets(kernel.element_rows())
    assert groups == kernel.group_max_offsets() == xor_reduction_offsets(kernel.group_keys())
    assert (rows, groups) == EXPECTED_OFFSETS[name]
    # and they are the lane directions that keep the row: the kernel of lane -> row
    lane_rows = score_layout(model).sublayout(["lane"], ["row"])
    assert sorted(k["lane"] for k in lane_rows.kernel()) == list(rows)
    assert xor_partners(score_layout(model), []) == tuple(1 << b for b in range(
        model.instruction.wave_size.bit_length() - 1))
