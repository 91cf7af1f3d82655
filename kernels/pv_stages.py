"""The stages from the weights to a wave's output: quantize W per MMAC group,
PV on the INT8 instruction (or the bf16 baseline's), and the W chains a kernel can
take. PV's V operands come from kernels/v_loads.py.

Each stage is a function of a `StagePlan` and named fragments (stage_plan.py).
"""

from __future__ import annotations

from dataclasses import replace

from iree.compiler import ir
from iree.compiler.dialects import arith, memref, vector

from ..contract import scalar_ir as contract
from ..contract.constants import DIGIT_BASE, LEVEL_BYTE, MAX_W_V_PRODUCT, ROUND_BIAS_BITS
from ..contract.numerics import Numerics
from ..fragments import W_CHAINS, DecodeKernelLayout, FragmentModel, thread_distribution
from .lanes import c_element, c_fragment, vector_type
from .stage_plan import StagedW, StagePlan, load_operand


def quantize_w(plan: StagePlan, w: dict) -> StagedW:
    """Per (row, MMAC) scale; Wq bytes and sW for the PV operands (`_group_terms`):
    into LDS, or, where the plan feeds W from registers (`StagePlan.w_feed`), into
    PV's A operands directly, the scales kept in the lane (every lane of a group holds
    its scale after the shuffles).

    Through LDS, two-term W's second term goes into the padding rows row + shift of
    the first term's tile where the plan packs the terms (`StagePlan.w_packing`),
    else into LDS of its own. As digits, the one scale stored is the low digit's,
    sW1 / BASE.
    """
    if plan.w_feed is not None:
        terms = [({}, {}) for _ in range(plan.numerics.w_terms)]     # ({element: Wq}, sw)
        # i32 levels: four packed into each A register (`TargetSpec.pack_levels`)
        for members, quantized in _group_terms(plan, w, width=LEVEL_BYTE):
            key = (plan.row_map(members[0]),
                   plan.layout.uniform_group(members[0], plan.w_groups))
            for (levels, scales), (term_levels, scale) in zip(terms, quantized):
                levels.update(term_levels)
                if scale is not None:
                    scales[key] = scale
        staged = [StagedW(fragments=_fed_fragments(plan, levels), sw=scales or None)
                  for levels, scales in terms]
        return staged[0] if len(staged) == 1 else replace(staged[0], second=staged[1])
    numerics = plan.numerics
    first = _w_lds(plan)
    second = None
    if numerics.w_terms == 2:    # (digits: one scale, the first term's rows')
        second = (first if plan.w_packing is not None
                  else _w_lds(plan, scales=not numerics.w_digits))
    shift = plan.w_packing[0] if plan.w_packing is not None else 0
    if plan.column_sums:
        _store_ones_rows(plan, first.w, plan.column_sums[1])
    for members, quantized in _group_terms(plan, w):
        for (levels, scale), (staged, at) in zip(quantized, ((first, 0), (second, shift))):
            if scale is not None:
                _store_scale(plan, members[0], scale, staged, at)
            for e in members:
                _store_w(plan, e, levels[e], staged.w, at)
    plan.lanes.barrier()
    if second is None or second is first:
        return first
    return StagedW(first.w, first.scales, second)


def _group_terms(plan: StagePlan, w: dict, width: int = 8):
    """Per W group class of the lane's elements: (members, [({element: Wq}, sW)] per
    term), Wq an i8, or with `width` LEVEL_BYTE an i32 holding it in its low byte (for a
    sink that packs the bytes itself), the contract's rule (contract/scalar_ir.py, as
    in lower-quantize): a zero or tiny group gives Wq = 0, a NaN/Inf group Wq = 0 and
    sW = NaN. The absmax is NaN-propagating in-lane and across the xor shuffles, so
    every lane of a group sees the same a. The second term is the residual W - level*sW1 on its own scale,
    or W's low digit (sW None: the first term's scale is then the digit's, sW1/BASE)."""
    numerics = plan.numerics
    unsigned = numerics.unsigned_w
    c = plan.constants(unsigned)
    signed = plan.constants() if unsigned else c
    value_of = contract.quantize_unsigned_value if unsigned else contract.quantize_value
    for members in plan.live_classes(plan.layout.group_keys(plan.w_groups)):
        values = {e: w[e] for e in members}
        inverse, scale = _group_scale(plan, members, values, c, unsigned)
        if numerics.w_digits:
            digits = {e: contract.quantize_digits(values[e], inverse, c, unsigned, width)
                      for e in members}
            yield members, [({e: high for e, (high, _) in digits.items()},
                             contract.digit_scale(scale)),
                            ({e: low for e, (_, low) in digits.items()}, None)]
            continue
        first = {e: value_of(values[e], inverse, c, width) for e in members}
        if numerics.w_terms == 1:
            yield members, [(first, scale)]
            continue
        residual = {e: contract.w_residual(values[e], first[e], scale, unsigned)
                    for e in members}
        inverse2, scale2 = _group_scale(plan, members, residual, signed, False)
        yield members, [(first, scale),
                        ({e: contract.quantize_value(residual[e], inverse2, signed, width)
                          for e in members}, scale2)]


def _fed_fragments(plan: StagePlan, values: dict) -> tuple:
    """PV's A operand of each MMAC, its registers taken from the lane's score
    elements `values` as the feed maps them (i32 levels: packed, four to a word)."""
    layout, feed = plan.pv_layout, plan.w_feed
    inst = layout.instruction
    fragments = []
    for t in range(layout.model.mmacs_per_wave):
        registers = [values[plan.layout.element(block, slot)]
                     for slot, block in (feed.element(r, t) for r in range(inst.a.slots))]
        fragments.append(plan.spec.pack_levels(plan.lanes, registers, inst.a_vector)
                         if str(registers[0].type) == "i32"
                         else plan.lanes.from_elements(registers, inst.a_vector))
    return tuple(fragments)


def _w_lds(plan: StagePlan, scales: bool = True) -> StagedW:
    """LDS for one term of W: Wq [wave, PV's A rows, token], sW [wave, row, group]."""
    lanes, groups = plan.lanes, plan.w_groups
    return StagedW(lanes.shared([plan.waves, plan.w_rows, groups.wave_tokens], "i8"),
                   lanes.shared([plan.waves, plan.w_rows,
                                 groups.mmacs_per_wave // groups.chain], "f32")
                   if scales else None)


def _group_scale(plan: StagePlan, members: list[int], values: dict, c, unsigned: bool):
    """(inverse, scale) of one group class of the lane's values: the group's absmax
    over its lanes by xor shuffles, then the contract's rule."""
    amax = contract.absmax([values[e] for e in members], c)
    offsets = plan.layout.group_max_offsets(plan.w_groups)
    amax = plan.lanes.xor_reduce(amax, offsets, contract.absmax_merge)
    return (contract.quantize_inverse(amax, c, unsigned, plan.spec.approximate_reciprocal()),
            contract.quantize_scale(amax, c, unsigned, tiny_exact=False))


def _row(plan: StagePlan, element: int, shift: int) -> ir.Value:
    return plan.lanes.plus(plan.lanes.of_lane(plan.row_map(element)), shift)


def _store_scale(plan: StagePlan, element: int, scale: ir.Value, staged: StagedW,
                 shift: int = 0) -> None:
    """A group's scale at the row of `element` (+ `shift`) and the group's accumulator."""
    lanes = plan.lanes
    group = lanes.of_lane(plan.layout.group_map(element, plan.w_groups))
    memref.store(scale, staged.scales, [lanes.wave, _row(plan, element, shift), group])


def _store_w(plan: StagePlan, element: int, wq: ir.Value, w_lds: ir.Value,
             shift: int = 0) -> None:
    """W element `element` of the lane (its row + `shift`) where `plan.w_staging`
    places it."""
    lanes = plan.lanes
    at = plan.w_staging.place(plan.row_map(element), plan.token_in_wave(element),
                              lanes.wave_size, shift)
    memref.store(wq, w_lds, [lanes.wave] + [lanes.of_lane(m) for m in at])


def _store_ones_rows(plan: StagePlan, wq_lds: ir.Value, rows) -> None:
    """Unsigned W: the A rows whose MMAC outputs are the column sums, all ones."""
    lanes, one = plan.lanes, plan.lanes.i8(1)
    _, slots = thread_distribution(rows, plan.model.wave_tokens, lanes.wave_size)
    for row, token in slots:
        at = plan.w_staging.place(row, token, lanes.wave_size)
        memref.store(one, wq_lds, [lanes.wave] + [lanes.of_lane(m) for m in at])


def stage_bf16(plan: StagePlan, w: dict) -> StagedW:
    """The BF16-PV baseline: W rounded to bf16 into LDS (no scales)."""
    lanes = plan.lanes
    bf16 = ir.BF16Type.get()
    if plan.w_feed is not None:
        return StagedW(fragments=_fed_fragments(
            plan, {e: arith.truncf(bf16, value) for e, value in w.items()}))
    w_lds = lanes.shared([plan.waves, plan.w_rows, plan.model.wave_tokens], "bf16")
    for e, value in w.items():
        _store_w(plan, e, arith.truncf(bf16, value), w_lds)
    lanes.barrier()
    return StagedW(w_lds)


def _w_fragments(plan: StagePlan, w_lds: ir.Value, element: str) -> list[ir.Value]:
    """The wave's A operand of each PV MMAC, read from W staged in LDS."""
    return [load_operand(plan, w_lds, [plan.lanes.wave], plan.w_staging, t, element)
            for t in range(plan.pv_layout.model.mmacs_per_wave)]


def _v_runs(layout: DecodeKernelLayout, loads, t: int) -> list[ir.Value]:
    """The i8 runs of PV MMAC t's B operand, sliced out of the lane's V loads."""
    return [vector.extract_strided_slice(vector_type(length, "i8"), loads[u], [offset],
                                         [length], [1])
            for u, offset, length in layout.v_runs_of_mmac(t)]


def pv(plan: StagePlan, staged: StagedW, v_tiles, start=None) -> list[list]:
    """A wave's O [tile][C slot] in f32: `start` [tile]{C slot} (None: +0) plus
    Wq x Vq on the INT8 instruction, each accumulator's sum rescaled by its sW into the
    running O by one FMA (`contract.accumulate_pv`): an accumulator sums the plan's
    chain of `w_chain` consecutive MMACs (their W group), converted to f32 once;
    unsigned W adds 128 * sum Vq of the chain's tokens to each int32 sum first.
    Two-term W: the second term's accumulators go on into the first's chain (the
    contract's order, reference.pv_chain); as digits, the two int32 sums joined
    (high * BASE + low) and converted once. A packed second term is the same
    accumulator's sum at the partner slot. `v_tiles`: (tile, the lane's V loads) in
    tile order."""
    lanes, layout, numerics = plan.lanes, plan.pv_layout, plan.numerics
    inst = layout.instruction
    a = _a_operands(plan, staged, "i8")
    a_second = _a_operands(plan, staged.second, "i8") if staged.second is not None else None
    live = plan.pv_live_slots()
    c = plan.constants()
    chain = plan.w_chain
    bound = accumulator_bound(plan)    # |an accumulator's sum|, any term
    # The MMACs start from the bias's bits where the sums cross to f32 through them,
    # but not where a column sum shares their accumulator (it must stay unbiased), nor
    # for digits joined as integers.
    join_in_i32 = numerics.w_digits and plan.join_digits_in_i32
    biased = contract.through_bias(bound, c) and not plan.column_sums and not join_in_i32
    init = (lanes.splat(inst.c_vector, "i32", ROUND_BIAS_BITS) if biased
            else lanes.zeros(inst.c_vector, "i32"))
    # Per term: where its scale sits (LDS or the lane, the slot whose row holds it).
    scales = [(staged, lambda i: i)]
    if numerics.w_terms == 2 and not numerics.w_digits:
        scales.append((staged.second, lambda i: i) if a_second is not None else
                      (staged, lambda i: plan.w_packing[1][i]))
    o = []
    for tile, loads in v_tiles:
        # per term, per live slot: its (f32 sum, sW) of each accumulator, in order
        terms = [{i: [] for i in live} for _ in scales]
        for g in range(layout.model.mmacs_per_wave // chain):
            # the chain's first steps only add into the accumulators (and the column
            # sums' where they need an MMAC of their own); its last one ends them
            acc, second, ones = init, init, None
            for t in range(g * chain, (g + 1) * chain - 1):
                bv = lanes.assemble(_v_runs(layout, loads, t), inst.b_vector)
                acc = plan.mma(layout, a[t], bv, acc)
                ones = _ones_mma(plan, bv, ones)
                if a_second is not None:
                    second = plan.mma(layout, a_second[t], bv, second)
            t = (g + 1) * chain - 1
            bv = lanes.assemble(_v_runs(layout, loads, t), inst.b_vector)
            acc = plan.mma(layout, a[t], bv, acc)
            sums = _column_sums(plan, acc, bv, ones)
            values = [{i: c_element(acc, inst, i) for i in live}]
            if sums is not None:
                values[0] = {i: contract.unsigned_offset(v, sums[i]) for i, v in values[0].items()}
            if a_second is not None:
                second = plan.mma(layout, a_second[t], bv, second)
                values.append({i: c_element(second, inst, i) for i in live})
            elif plan.w_packing is not None:
                values.append({i: c_element(acc, inst, plan.w_packing[1][i]) for i in live})
            if numerics.w_digits:
                values = [{i: contract.join_digits_f32(v, values[1][i], bound, c, biased,
                                                       join_in_i32)
                           for i, v in values[0].items()}]
            else:
                values = [{i: contract.exact_f32(v, bound, c, biased) for i, v in term.items()}
                          for term in values]
            for sums_of, term_values, (term, slot) in zip(terms, values, scales):
                for i, value in term_values.items():
                    sums_of[i].append((value, _scale(plan, term, layout.c_row(slot(i)), g)))
        regs = [None] * inst.c.slots
        for i in live:
            regs[i] = c.zero if start is None else start[tile][i]
            for sums_of in terms:
                for value, sw in sums_of[i]:
                    regs[i] = contract.accumulate_pv(regs[i], value, sw)
        o.append(regs)
    return o


def accumulator_bound(plan: StagePlan) -> int:
    """|the int32 sum| of one accumulator of any W term: the chain's w_chain x K products
    of at most MAX_W_V_PRODUCT each."""
    return _chain_bound(plan.pv_layout.instruction.k, plan.numerics, plan.w_chain)


def _chain_bound(k: int, numerics: Numerics, chain: int) -> int:
    return MAX_W_V_PRODUCT[numerics.w_quant] * k * chain


def digit_join_bound(k: int, numerics: Numerics, chain: int) -> int:
    """|high * BASE + low| of W's digit sums over a chain of `chain` MMACs of K=`k`:
    each digit sum within `_chain_bound`."""
    return _chain_bound(k, numerics, chain) * (DIGIT_BASE + 1)


def kernel_chains(model: FragmentModel) -> tuple[int, ...]:
    """The chains a lane kernel of PV model `model` can take: those dividing a wave's
    MMACs per tile (digit joins permitting, `check_w_chain`)."""
    return tuple(c for c in W_CHAINS if model.mmacs_per_wave % c == 0)


def check_w_chain(model: FragmentModel, numerics: Numerics, pv: str, chain: int) -> None:
    """Refuse a chain of `chain` PV MMACs (of `model`) the kernel cannot run: one that is
    no whole number of chains of a wave's MMACs per tile (a chain's W is quantized at
    once, under one running max), on a PV that is not INT8, or whose digit sums joined
    in int32 (high * BASE + low) could overflow."""
    if chain == 1:
        return
    if chain not in W_CHAINS:
        raise ValueError(f"--w-chain {chain}: the chains are {', '.join(map(str, W_CHAINS))}")
    if pv != "int8":
        raise ValueError(f"--w-chain {chain} chains INT8 MMACs; the {pv} PV kernel "
                         f"accumulates in f32 on the instruction itself (chain 1)")
    steps, k = model.mmacs_per_wave, model.instruction.k
    if steps % chain:
        raise ValueError(
            f"--w-chain {chain}: a warp issues {steps} PV K-steps (MMACs of K={k}) per "
            f"{model.wave_tokens}-token KV tile, not a whole number of {chain}-step chains; "
            f"a chain cannot span two tiles (each tile's W is quantized under its own "
            f"running max), so the chains here are "
            f"{', '.join(map(str, kernel_chains(model)))}")
    joined = digit_join_bound(k, numerics, chain)
    if numerics.w_digits and joined >= 2 ** 31:
        raise ValueError(
            f"--w-chain {chain}: W's digit sums over {chain} x {k} tokens joined in int32 "
            f"reach |high * {DIGIT_BASE} + low| <= {joined} >= 2^31 (they would "
            f"overflow); use a shorter chain")


def _a_operands(plan: StagePlan, staged: StagedW, element: str) -> list:
    """PV's A operand of each MMAC: fed from registers, or read from LDS."""
    if staged.fragments is not None:
        return list(staged.fragments)
    return _w_fragments(plan, staged.w, element)


def _scale(plan: StagePlan, staged: StagedW, row, group: int) -> ir.Value:
    """sW of C row map `row` at the wave's W group (accumulator) `group`: held by the
    lane, or from LDS."""
    if staged.sw is not None:
        return staged.sw[(row, group)]
    lanes = plan.lanes
    return memref.load(staged.scales, [lanes.wave, lanes.of_lane(row), lanes.index(group)])


def _ones_mma(plan: StagePlan, bv: ir.Value, ones: ir.Value | None):
    """Unsigned W without ones rows in W's tile: the column sums' MMAC (A all ones)
    added to `ones` (None: from 0); else None."""
    if not plan.numerics.unsigned_w or plan.column_sums:
        return None
    layout = plan.pv_layout
    inst = layout.instruction
    return plan.mma(layout, plan.lanes.splat(inst.a_vector, "i8", 1), bv,
                    plan.lanes.zeros(inst.c_vector, "i32") if ones is None else ones)


def _column_sums(plan: StagePlan, acc: ir.Value, bv: ir.Value, ones: ir.Value | None = None):
    """{live C slot: int32 sum Vq of its column over the accumulator's tokens}, or None
    for signed W; `ones`: the chain's earlier steps' column-sum MMACs."""
    if not plan.numerics.unsigned_w:
        return None
    layout = plan.pv_layout
    inst, live = layout.instruction, plan.pv_live_slots()
    if plan.column_sums:
        return {i: c_element(acc, inst, plan.column_sums[0][i]) for i in live}
    ones = _ones_mma(plan, bv, ones)
    return {i: c_element(ones, inst, i) for i in live}


def pv_bf16(plan: StagePlan, staged: StagedW, v_tiles, start=None) -> list[list]:
    """O with bf16 W x bf16(Vq) on the bf16 instruction, accumulated in f32 by the
    instruction itself from `start` [tile]{C slot} (None: +0): each MMA's C is the
    one before it."""
    lanes, layout = plan.lanes, plan.pv_layout
    inst = layout.instruction
    a = _a_operands(plan, staged, "bf16")
    o = []
    for tile, loads in v_tiles:
        acc = (lanes.zeros(inst.c_vector, "f32") if start is None
               else c_fragment(start[tile], inst, lanes.f32(0.0)))
        for t in range(layout.model.mmacs_per_wave):
            runs = []
            for piece in _v_runs(layout, loads, t):
                length = ir.VectorType(piece.type).shape[0]
                as_f32 = arith.sitofp(vector_type(length, "f32"), piece)
                runs.append(arith.truncf(vector_type(length, "bf16"), as_f32))
            acc = plan.mma(layout, a[t], lanes.assemble(runs, inst.b_vector), acc)
        regs = [None] * inst.c.slots
        for i in plan.pv_live_slots():
            regs[i] = c_element(acc, inst, i)
        o.append(regs)
    return o


def pv_stage(plan: StagePlan, w: dict, v_tiles, start=None) -> list[list]:
    """W to a wave's O, added to `start` [tile]{C slot} (None: from +0): quantized on
    the INT8 instruction, or the bf16 baseline."""
    if plan.pv == "int8":
        return pv(plan, quantize_w(plan, w), v_tiles, start)
    return pv_bf16(plan, stage_bf16(plan, w), v_tiles, start)
