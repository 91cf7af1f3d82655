"""The stages up to the weights: quantize the query rows, QK, the row reductions.

Each stage is a function of a `StagePlan` and named fragments (stage_plan.py);
what differs between decode and prefill (which rows are staged, which tokens
count) comes in as arguments.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import arith, memref, vector

from ..contract import scalar_ir as contract
from ..contract.constants import MAX_Q_K_PRODUCT, ROUND_BIAS_BITS, score_scale
from ..fragments import (NUMPY_OPS, PackedTerms, thread_distribution,
                         xor_reduction_offsets)
from .kv_access import KVView
from .lanes import c_element, load_vector, vector_type
from .stage_plan import (QOperands, Scores, StagedQ, StagePlan, class_of,
                         load_operand)

# (is `row` a real query row, its q indices but the head dim), for a staged row.
RowSource = Callable[[ir.Value], tuple[ir.Value, list[ir.Value]]]


def quantize_rows(plan: StagePlan, q: ir.Value, rows: int, source: RowSource) -> StagedQ:
    """`rows` query rows, quantized per row (the contract's rule) into LDS: per
    term, Qq [rows, D] i8 and its score scale sQ * c [rows] f32 (c =
    `score_scale(softmax_scale)`: the scores come out in log2 units), rows past the
    real ones zero. The second term (q-terms 2) quantizes the residual
    fma(-Qq1, s1, q), or is the low digit of q quantized once (q-second digit: one
    scale, s1/BASE, with the first term's rows): into LDS of its own, or, where the
    plan packs the terms (`StagePlan.q_packing`), into the padding rows row + shift
    of the first term's tile, so that one MMA gives both."""
    lanes, d = plan.lanes, plan.head_dim
    _, slots = thread_distribution(rows, d, lanes.threads)
    row_map = slots[0][0]
    offsets = xor_reduction_offsets(row_map(range(lanes.threads))[:, None])
    row = lanes.of_lane(row_map, of=lanes.thread)
    real, q_index = source(row)
    c = plan.constants()
    cols = [lanes.of_lane(col_map, of=lanes.thread) for _, col_map in slots]
    values = [arith.select(real, memref.load(q, q_index + [col]), c.zero) for col in cols]
    numerics, packing = plan.numerics, plan.q_packing
    tiles = [(lanes.shared([rows, d], "i8"), lanes.shared([rows], "f32"))]
    if numerics.q_terms == 2 and packing is None:     # (digits: the first tile's scale)
        tiles.append((lanes.shared([rows, d], "i8"),
                      None if numerics.q_digits else lanes.shared([rows], "f32")))

    staging = plan.q_staging          # (rows past the A tile's M: further tiles)
    score_c = lanes.f32(score_scale(plan.softmax_scale))

    def store(term: int, quantized: list, scale: ir.Value | None) -> None:
        qq_lds, sq_lds = tiles[term if packing is None else 0]
        guard = _stores_term(plan, row, term)
        shift = 0 if packing is None or term == 0 else packing[0]
        writes = _term_writers(plan, row_map(range(lanes.threads)), term)
        with nullcontext() if guard is None else lanes.when(guard):
            for qv, (_, col_map) in zip(quantized, slots):
                at = staging.place(row_map, col_map, lanes.threads, shift, writes)
                memref.store(qv, qq_lds, [lanes.of_lane(m, of=lanes.thread) for m in at])
            if scale is not None:       # the score's scale: sQ * c (log2 units)
                memref.store(contract.score_row_scale(scale, score_c), sq_lds,
                             [lanes.plus(row, shift)])

    for term in range(1 if numerics.q_digits else numerics.q_terms):
        amax = lanes.xor_reduce(contract.absmax(values, c), offsets, contract.absmax_merge)
        inverse = contract.quantize_inverse(amax, c)
        scale = contract.quantize_scale(amax, c, tiny_exact=False)   # never stored
        if numerics.q_digits:       # one rounding: the high digit, the low one (scale s1/BASE)
            digits = [contract.quantize_digits(x, inverse, c) for x in values]
            store(0, [high for high, _ in digits], contract.digit_scale(scale))
            store(1, [low for _, low in digits], None)
            break
        quantized = [contract.quantize_value(x, inverse, c) for x in values]
        store(term, quantized, scale)
        values = [contract.q_residual(x, qv, scale) for x, qv in zip(values, quantized)]
    lanes.barrier()
    return StagedQ(tuple(tiles))


def _term_writers(plan: StagePlan, rows: np.ndarray, term: int) -> np.ndarray | None:
    """Which threads (of staged rows `rows`) store term `term` (None: all)."""
    if plan.q_packing is None:
        return None
    return PackedTerms(plan.q_packing[0], plan.rows_out).stores(NUMPY_OPS, rows, term)


def _stores_term(plan: StagePlan, row: ir.Value, term: int) -> ir.Value | None:
    """Does the thread of staged row `row` store its term `term` (None: always)?"""
    if plan.q_packing is None:
        return None
    return PackedTerms(plan.q_packing[0], plan.rows_out).stores(plan.lanes.ops, row, term)


def q_operands(plan: StagePlan, staged: StagedQ,
               staged_row: Callable[[ir.Value], ir.Value]) -> QOperands:
    """The Q fragment of each term and K step (A, in the layout's head-dim order),
    loaded once for all token blocks, and sQ of the rows the lane's C elements
    hold. `staged_row` maps a row of the wave's tile to its staged row."""
    lanes, inst, layout = plan.lanes, plan.instruction, plan.layout
    d = plan.head_dim
    sq_of_row = {}
    # (term, its sQ, the slot holding the term's sum of live slot i's score); digits
    # have one scale, the first term's rows'
    terms = 1 if plan.numerics.q_digits else plan.numerics.q_terms
    sources = [(term, sq, lambda i: i) for term, (_, sq) in enumerate(staged.terms[:terms])]
    if plan.q_packing is not None and terms == 2:
        sources.append((1, staged.terms[0][1], lambda i: plan.q_packing[1][i]))
    for term, sq, slot in sources:
        for i in plan.live_slots():
            key = (term, layout.c_row(i))
            if key not in sq_of_row:
                row = layout.c_row(slot(i))
                sq_of_row[key] = memref.load(sq, [staged_row(lanes.of_lane(row))])
    a_steps = tuple(
        tuple(load_operand(plan, qq, [], plan.q_staging, step, "i8", staged_row)
              for step in range(d // inst.k))
        for qq, _ in staged.terms)
    return QOperands(a_steps, sq_of_row)


def local_token(plan: StagePlan, wave_token0: ir.Value, element: int) -> ir.Value:
    """Token (within the tile or partition) of score element `element` of the lane."""
    lanes = plan.lanes
    return lanes.affine((wave_token0, 1), (lanes.of_lane(plan.token_in_wave(element)), 1))


def qk(plan: StagePlan, operands: QOperands, kv: KVView, wave_token0: ir.Value,
       token_live: Callable[[int, ir.Value], ir.Value] | None) -> Scores:
    """Scores of the lane's live C elements, -inf where `token_live(element,
    local token)` is false (None: every token is live, no mask is built).

    K and Q are read in the layout's lane-contiguous head-dim order: each lane
    loads its token's run of K bytes once (the layout's loads) and slices every
    step's B operand out of it."""
    lanes, inst, layout = plan.lanes, plan.instruction, plan.layout
    d = plan.head_dim
    steps = range(d // inst.k)
    k_loads = [lanes.of_lane(first) for first in layout.qk_b_loads(d)]
    width = layout.qk_b_width(d)
    # IREE's bindings are 16-byte aligned (the kernel's pointer parameters say so).
    k_alignment = layout.k_load_alignment(d)
    b_pieces = [layout.qk_b_pieces(d, step) for step in steps]
    c = plan.constants()
    bound = MAX_Q_K_PRODUCT * d        # |a QK sum| of any term (a digit's too)
    # the MMAs start from the bias's bits, but not for digits joined as integers
    join_in_i32 = plan.numerics.q_digits and plan.join_digits_in_i32
    biased = contract.through_bias(bound, c) and not join_in_i32
    init = (lanes.splat(inst.c_vector, "i32", ROUND_BIAS_BITS) if biased
            else lanes.zeros(inst.c_vector, "i32"))
    values, live, v_scales = {}, {}, {}
    wave_kv = kv.wave(wave_token0, plan.model.wave_tokens)
    for n in range(layout.blocks):
        token = lanes.of_lane(layout.b_token(n))
        loads = [load_vector(kv.k, wave_kv.k_bytes(token, first), width, "i8", k_alignment)
                 for first in k_loads]
        # The block's K and V scales, issued with its K bytes (not after the MMAs,
        # nor the V scales after the softmax's barriers).
        elements = plan.live_elements(n)
        rows = {e: wave_kv.token_row(lanes.of_lane(plan.token_in_wave(e))) for e in elements}
        k_scales = {e: memref.load(kv.k_scale, rows[e]) for e in elements}
        v_scales.update({e: memref.load(kv.v_scale, rows[e]) for e in elements})
        accs = [init for _ in operands.a_steps]
        for step in steps:
            pieces = [vector.extract_strided_slice(vector_type(length, "i8"), loads[load],
                                                   [start], [length], [1])
                      for load, start, length in b_pieces[step]]
            kb = lanes.assemble(pieces, inst.b_vector)
            accs = [plan.mma(layout, a[step], kb, acc)
                    for a, acc in zip(operands.a_steps, accs)]
        for element in elements:
            i = layout.element_slot(element)
            # fma(f32(acc1), s1, f32(acc2)*s2) * sK (`contract.score_terms`), in log2 units
            # (the staged s = sQ * c, `quantize_rows`); a packed second term is the same MMA's
            # sum at the partner slot; digits are joined (acc1 * BASE + acc2) and
            # converted once.
            sums = [c_element(acc, inst, i) for acc in accs]
            if plan.q_packing is not None:
                sums.append(c_element(accs[0], inst, plan.q_packing[1][i]))
            if plan.numerics.q_digits:
                sums = [contract.join_digits_f32(*sums, bound, c, biased, join_in_i32)]
            else:
                sums = [contract.exact_f32(value, bound, c, biased) for value in sums]
            scales = [operands.sq_of_row[(t, plan.row_map(element))]
                      for t in range(len(sums))]
            value = arith.mulf(contract.score_terms(sums, scales), k_scales[element])
            live[element] = (None if token_live is None
                             else token_live(element, local_token(plan, wave_token0, element)))
            values[element] = masked(live[element], value, lanes.f32(float("-inf")))
    return Scores(values, live, v_scales)


def masked(live: ir.Value | None, value: ir.Value, dead: ir.Value) -> ir.Value:
    """`value` where `live` (None: everywhere), else `dead`."""
    return value if live is None else arith.select(live, value, dead)


def row_reduce(plan: StagePlan, values: dict, members: list[int], combine) -> ir.Value:
    """One row's reduction over the wave: in-lane over `members`, then xor shuffles
    over the lanes that hold the same row."""
    return across_row(plan, contract.reduce([values[e] for e in members], combine), combine)


def across_row(plan: StagePlan, value: ir.Value, combine) -> ir.Value:
    """A lane's partial of its row combined over the lanes that hold the same row."""
    return plan.lanes.xor_reduce(value, plan.layout.row_max_offsets(), combine)


def workgroup_reduce(plan: StagePlan, values: dict, classes, combine) -> list[ir.Value]:
    """Per row class: reduce over the wave (`row_reduce`), then across the
    workgroup's waves through LDS [wave, tile row]."""
    lanes = plan.lanes
    lds = lanes.shared([plan.waves * plan.tile_rows], "f32")
    rows = []
    for members in classes:
        value = row_reduce(plan, values, members, combine)
        row = lanes.of_lane(plan.row_map(members[0]))
        rows.append(row)
        memref.store(value, lds, [lanes.affine((lanes.wave, plan.tile_rows), (row, 1))])
    lanes.barrier()
    out = []
    for row in rows:
        total = None
        for wave in range(plan.waves):
            part = memref.load(lds, [lanes.plus(row, wave * plan.tile_rows)])
            total = part if total is None else combine(total, part)
        out.append(total)
    return out


def partition_softmax(plan: StagePlan, scores: Scores, classes):
    """Decode: the partition's (m, l) per row class and W = P * sV, exactly 0 for
    a dead token (whatever its slot's scale holds); e = 2^(s - m) (scores in log2
    units) by the target's fastest exp2 (`TargetSpec.exp2`), P = e / l by the row's
    reciprocal and one FMA correction (`contract.divide_by_reciprocal`: e / l rounded
    once, but an ulp below 2^-102)."""
    lanes = plan.lanes
    m = workgroup_reduce(plan, scores.values, classes, arith.maximumf)
    exp = plan.spec.exp2
    e = {i: exp(arith.subf(x, m[class_of(classes, i)])) for i, x in scores.values.items()}
    l = workgroup_reduce(plan, e, classes, arith.addf)
    inverse = [contract.reciprocal(total) for total in l]      # once per row
    w = {}
    for i, value in e.items():
        c = class_of(classes, i)
        p = contract.divide_by_reciprocal(value, l[c], inverse[c])
        w[i] = arith.select(scores.live[i], arith.mulf(p, scores.v_scales[i]), lanes.f32(0.0))
    return m, l, w


def online_softmax(plan: StagePlan, scores: Scores, m, l, classes):
    """Prefill: (m', alpha, l', W) of one tile, the contract's guarded online
    softmax per row class (scores in log2 units): alpha = 2^(m - m') (1 while
    m' = -inf), p = 2^(s - m'), l' = alpha l + sum p, W = p * sV; exp2 the target's
    fastest (`TargetSpec.exp2`). l is the lane's partial over its own tokens of the
    row: alpha is the row's on every lane of it, so the lanes' partials add to the
    row's l once, after the last tile (`across_row`), with no shuffle in the loop."""
    lanes = plan.lanes
    exp = plan.spec.exp2
    m_new, alpha, l_new, p = [], [], [], {}
    for c, members in enumerate(classes):
        running = arith.maximumf(m[c], row_reduce(plan, scores.values, members,
                                                  arith.maximumf))
        dead = arith.cmpf(arith.CmpFPredicate.OEQ, running, lanes.f32(float("-inf")))
        alpha.append(arith.select(dead, lanes.f32(1.0), exp(arith.subf(m[c], running))))
        for e in members:
            p[e] = masked(scores.live[e], exp(arith.subf(scores.values[e], running)),
                          lanes.f32(0.0))
        m_new.append(running)
        l_new.append(arith.addf(arith.mulf(alpha[c], l[c]),
                                contract.reduce([p[e] for e in members], arith.addf)))
    w = {e: masked(scores.live[e], arith.mulf(value, scores.v_scales[e]), lanes.f32(0.0))
         for e, value in p.items()}
    return m_new, alpha, l_new, w
