"""The mmt4d form of lower-mmac-tiles (`contraction=mmt4d`): each MMAC group's
int32 sum as one tile of a `linalg.batch_mmt4d` with i16 operands, which IREE's
CPU backend runs on its mmt4d ukernel (VNNI `vpdpwssd` on x86).

V is packed once through the token digits of the groups table
(`fragments.token_axes`), so that each group's K slots are contiguous, in
pairs per head-dim column; Wq is packed in row tiles; W terms that share V and
groups share one batch_mmt4d (their Wq side by side in each row tile). The
tiles are sized to fit the target's SIMD register file whole (`MMT4DTile`). The
consumers of the group sums read the result in its tile layout (`read_tiles`),
so no untiled copy is made. Bit for bit the same int32 sums as the other forms
(tests/test_mmac_lowering.py); measured against them in
benchmarks/results/2026-12-03-cpu-zen4-decode-time/.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, tensor

from ..dialects import int8attn as d
from ..fragments import NotADigitPermutation, TokenAxes, token_axes
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from ..support.cpu_vectors import RegisterFile


# The packed int8 contraction (`linalg.batch_mmt4d`): i16 operands, K0 = 2 K
# slots per i32 lane (what x86's VNNI `vpdpwssd` and IREE's s16s16s32 mmt4d
# ukernel take); N0 head-dim columns (one vector of i32) and up to M0_MAX rows
# per tile, as many as the target's register file holds (`MMT4DTile.fitting`).
MMT4D_K0 = 2
MMT4D_M0_MAX = 16
# i32 accumulates a group exactly while K * max|product| < 2^31.
EXACT_I32_SUM = 1 << 31


@dataclass(frozen=True)
class MMT4DTile:
    """The inner tile of the batch_mmt4d: N0 head-dim columns, at most `max_rows` rows.

    IREE caps each op's vector tiles to its target's SIMD register space
    (`support.cpu_vectors`); a batch_mmt4d whose inner tile it splits reaches the
    ukernel with the whole tile's strides and sums the wrong elements. Every tile
    chosen here fits whole: i32 accumulators M0*N0 plus the i16 operand rows
    (M0 + N0)*K0 within the register space, so IREE leaves it in one piece."""

    n0: int
    max_rows: int

    @staticmethod
    def fits(registers: RegisterFile, m0: int, n0: int) -> bool:
        tile_bytes = 4 * m0 * n0 + 2 * MMT4D_K0 * (m0 + n0)
        return tile_bytes <= registers.space_bytes

    @classmethod
    def fitting(cls, registers: RegisterFile, head_dim: int) -> "MMT4DTile | None":
        """One vector of i32 columns (fewer where D needs it), the most rows that fit."""
        n0 = registers.i32_lanes
        while n0 > 1 and head_dim % n0:
            n0 //= 2
        rows = next((m for m in (16, 8, 4, 2, 1) if m <= MMT4D_M0_MAX
                     and cls.fits(registers, m, n0)), None)
        return cls(n0, rows) if rows else None


def token_axes_for(groups, head_dim: int, tile: MMT4DTile | None) -> TokenAxes | None:
    """The token axes to pack V by for the mmt4d contraction, or None.

    Needs a tile that fits the target's registers, a digit permutation
    (`fragments.token_axes`) whose innermost K slot axis holds an even number of
    tokens (the K0 pairs), and a head dim that is a multiple of N0."""
    if (tile is None or head_dim % tile.n0
            or groups.shape[1] * contract.MAX_W_V_PRODUCT["u8"] >= EXACT_I32_SUM):
        return None
    try:
        axes = token_axes(groups)
    except NotADigitPermutation:
        return None
    if not axes.slot_order or axes.axes[axes.slot_order[-1]].size % MMT4D_K0:
        return None
    return axes


def pack_v(v: ir.Value, axes: TokenAxes, n0: int) -> ir.Value:
    """V (i8 [b,h,n,T,D]) as the mmt4d RHS, i16 [B = b*h*n*G, D/N0, K/K0, N0, K0].

    One copy of V: the token digits of `axes` put each group's tokens
    contiguously in K slot order (the slot digits, outermost first, the innermost
    one split into K1 and K0 halves), each K0 pair of tokens interleaved per
    head-dim column, sign-extended to i16."""
    b, h, n, _, head_dim = d.shape_of(v)
    n_axes = len(axes.axes)
    lo = axes.slot_order[-1]                 # stride 1 in K: its low bit is K0
    token = build.TOKEN_DIGITS[:n_axes]
    view_shape, view_dims = [], ""
    for i, axis in enumerate(axes.axes):
        if i == lo:
            view_shape += [axis.size // MMT4D_K0, MMT4D_K0]
            view_dims += token[i] + "K"
        else:
            view_shape.append(axis.size)
            view_dims += token[i]
    view = build.split_dim(build.split_dim(v, 4, [head_dim // n0, n0]), 3, view_shape)
    group = "".join(token[i] for i in axes.group_order)
    slot = "".join(token[i] for i in axes.slot_order)
    out_dims = "bhn" + group + "d" + slot + "DK"
    sizes = dict(zip("bhn" + view_dims + "dD", [b, h, n, *view_shape, head_dim // n0, n0]))
    packed = build.generic(
        [view], ["bhn" + view_dims + "dD"], out_dims,
        build.empty([sizes[c] for c in out_dims], "i16"),
        lambda x, _: arith.extsi(ir.IntegerType.get_signless(16), x))
    packed = build.merge_dims(packed, 4 + len(group), len(slot))         # K1
    return build.merge_dims(packed, 0, 3 + len(group))                    # B


def row_tile(rows: int, most: int = 16) -> int:
    """M0: the largest power of two up to `most` dividing the rows (the ukernel's
    tiles go up to 16 rows)."""
    return next(m for m in (16, 8, 4, 2, 1) if m <= most and rows % m == 0)


def pack_w(wqs: list[ir.Value], unsigned: list[bool], m0: int) -> ir.Value:
    """The Wq of T terms (i8 [b,h,r,n,G,K] each) as one mmt4d LHS,
    i16 [B = b*h*n*G, r/m0, K/K0, T*m0, K0]: the terms side by side in each row tile
    (term t's row R*m0 + i is row t*m0 + i of tile R); an unsigned term's W as
    u = Wq + 128 (in [0, 255], an i16). Several terms: each widened on its own,
    stacked (tensor.concat along a new outer dim), then packed by one copy."""
    b, h, r, n, g, k = d.shape_of(wqs[0])
    i16 = ir.IntegerType.get_signless(16)

    def widener(offset):
        def widen(w, _):
            w = arith.extsi(i16, w)
            if offset:                        # u = Wq + 128: the tile sums u * Vq
                w = arith.addi(w, arith.constant(i16, contract.W_OFFSET))
            return w
        return widen

    def split(w):
        return build.split_dim(build.split_dim(w, 5, [k // MMT4D_K0, MMT4D_K0]), 2,
                               [r // m0, m0])

    if len(wqs) == 1:
        packed = build.generic([split(wqs[0])], ["bhmRngkK"], "bhngmkRK",
                               build.empty([b, h, n, g, r // m0, k // MMT4D_K0, m0,
                                            MMT4D_K0], "i16"), widener(unsigned[0]))
        return build.merge_dims(packed, 0, 4)
    terms = len(wqs)
    wide = [build.merge_dims(build.generic([wq], ["bhrngk"], "bhrngk",
                                           build.empty([b, h, r, n, g, k], "i16"),
                                           widener(offset)), 0, 0)
            for wq, offset in zip(wqs, unsigned)]
    stacked = tensor.concat(build.tensor_type([terms, b, h, r, n, g, k], "i16"), 0, wide)
    view = build.split_dim(build.split_dim(stacked, 6, [k // MMT4D_K0, MMT4D_K0]), 3,
                           [r // m0, m0])
    packed = build.generic([view], ["TbhmRngkK"], "bhngmkTRK",
                           build.empty([b, h, n, g, r // m0, k // MMT4D_K0, terms, m0,
                                        MMT4D_K0], "i16"), lambda w, _: w)
    return build.merge_dims(build.merge_dims(packed, 6, 2), 0, 4)


def mmt4d_tiles(wqs: list[ir.Value], v: ir.Value, axes: TokenAxes, tile: MMT4DTile,
                result_shape, unsigned: list[bool]) -> list[ir.Value]:
    """The group sums of each term (same V, same groups) as one `linalg.batch_mmt4d`,
    each term's in the tile layout [b, h, n, g, r/M0, D/N0, M0, N0] (int32; a view
    of the mmt4d result, or a slice of its row tiles where several terms share it):
    tiles[b,h,n,g,R,E,m,e] = acc[b,h,R*M0+m,n,g,E*N0+e] with
    acc[b,h,r,n,g,d] = sum_k Wq[b,h,r,n,g,k] * v[b,h,n,token(g,k),d]; with
    `unsigned[t]`, term t's sum_k (Wq + 128) * v (= sum Wq * v + 128 * column sums,
    bit for bit)."""
    b, h, r, n, g, head_dim = result_shape
    terms = len(wqs)
    m0 = row_tile(r, tile.max_rows // terms)
    lhs, rhs = pack_w(wqs, unsigned, m0), pack_v(v, axes, tile.n0)
    batch, m1, _, _, _ = d.shape_of(lhs)
    n1 = d.shape_of(rhs)[1]
    init = build.zeros([batch, m1, n1, terms * m0, tile.n0], "i32")
    tiles = linalg.batch_mmt4d(lhs, rhs, outs=[init], emit_generic=False)
    tiles = build.split_dim(tiles, 0, [b, h, n, g])
    if terms == 1:
        return [tiles]
    tiles = build.split_dim(tiles, 6, [terms, m0])         # [b,h,n,g,R,E,T,m,e]
    shape = d.shape_of(tiles)
    sizes = shape[:6] + [1] + shape[7:]
    return [build.split_dim(tensor.ExtractSliceOp(
        build.tensor_type(sizes, "i32"), tiles, [], [], [],
        [0] * 6 + [t] + [0] * 2, sizes, [1] * 9).result, 6, []) for t in range(terms)]


def untile(tiles: ir.Value) -> ir.Value:
    """The mmt4d tiles [b,h,n,g,R,E,m,e] as acc [b,h,r,n,g,d] (a transposed copy)."""
    b, h, n, g, m1, n1, m0, n0 = d.shape_of(tiles)
    acc = build.generic([tiles], ["bhngmdRD"], "bhmRngdD",
                        build.empty([b, h, m1, m0, n, g, n1, n0], "i32"), lambda x, _: x)
    return build.merge_dims(build.merge_dims(acc, 6, 2), 2, 2)


# acc's dims [b, h, r, n, g, d] in the tiles' order [b, h, n, g, R, E, m, e]:
# (acc dim, 0 for the tile index / 1 for the position in the tile, or None).
_TILE_DIMS = ((0, None), (1, None), (3, None), (4, None), (2, 0), (5, 0), (2, 1), (5, 1))


def read_tiles(consumer: ir.Operation, operand: int, tiles: ir.Value,
               check_only: bool = False):
    """`consumer` (a linalg.generic reading acc [b,h,r,n,g,d] as input `operand`)
    rebuilt to read the mmt4d `tiles` in their layout, or None where it cannot be
    (with `check_only`, True where it can, building nothing).

    The consumer's loops over r and d are split into (tile index, position in
    the tile), like linalg's fusion of a reshape by expansion: every other
    operand indexed by those loops is viewed with the same split dims
    (tensor.expand_shape), the result merged back. No copy of the tiles is left
    for IREE to materialise: the consumer's indexing map does the untiling."""
    if consumer.name != "linalg.generic" or len(consumer.results) != 1:
        return None
    generic = consumer.opview
    n_inputs = len(generic.inputs)
    if operand >= n_inputs:
        return None
    maps = [ir.AffineMapAttr(m).value for m in generic.indexing_maps]
    if any(any(not isinstance(e, ir.AffineDimExpr) for e in m.results) for m in maps):
        return None
    dims = [[e.position for e in m.results] for m in maps]
    block = generic.regions[0].blocks[0]
    if any(o.operation.name == "linalg.index" for o in block.operations):
        return None
    n_loops = maps[0].n_dims
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    if 2 * n_loops > len(letters):
        return None
    split_loops = {dims[operand][2]: 0, dims[operand][5]: 1}      # r, d
    if len(split_loops) != 2:
        return None
    _, _, _, _, m1, n1, m0, n0 = d.shape_of(tiles) if not check_only else (0,) * 8
    halves = ([m1, m0], [n1, n0])
    name = [letters[i] for i in range(n_loops)]
    inner = {i: letters[n_loops + i] for i in split_loops}   # the position-in-tile loops
    reduction = {name[i] for i, t in enumerate(generic.iterator_types)
                 if str(t) == "#linalg.iterator_type<reduction>"}
    out_dims_old = dims[-1]
    if any((name[i] in reduction) == (i in out_dims_old) for i in range(n_loops)):
        return None                           # build.generic infers the iterator types
    if check_only:
        return True

    def view(value: ir.Value, loops_of_dims) -> tuple[ir.Value, str]:
        text = ""
        for pos in reversed(range(len(loops_of_dims))):   # split from the back
            loop = loops_of_dims[pos]
            if loop in split_loops:
                value = build.split_dim(value, pos, halves[split_loops[loop]])
        for loop in loops_of_dims:
            text += name[loop] + (inner[loop] if loop in split_loops else "")
        return value, text

    acc_loops = dims[operand]
    tile_dims = "".join(name[acc_loops[a]] if half is None else
                        (name[acc_loops[a]] if half == 0 else inner[acc_loops[a]])
                        for a, half in _TILE_DIMS)
    inputs, input_dims = [], []
    for i, value in enumerate(generic.inputs):
        if i == operand:
            inputs.append(tiles)
            input_dims.append(tile_dims)
        else:
            viewed, text = view(value, dims[i])
            inputs.append(viewed)
            input_dims.append(text)
    init, out_dims = view(generic.outputs[0], out_dims_old)
    loops = "".join(name[i] + (inner[i] if i in split_loops else "") for i in range(n_loops))

    def body(*args):
        mapped = {old: new for old, new in zip(block.arguments, args)}
        for old_op in block.operations:
            if old_op.operation.name == "linalg.yield":
                return [mapped.get(x, x) for x in old_op.operands][0]
            new_op = old_op.operation.clone()
            for j, x in enumerate(old_op.operands):
                if x in mapped:
                    new_op.operands[j] = mapped[x]
            for old_r, new_r in zip(old_op.results, new_op.results):
                mapped[old_r] = new_r
        raise ValueError("linalg.generic body without linalg.yield")

    result = build.generic(inputs, input_dims, out_dims, init, body, loops=loops)
    for pos in reversed(range(len(out_dims_old))):       # merge the split dims back
        if out_dims_old[pos] in split_loops:
            before = sum(loop in split_loops for loop in out_dims_old[:pos])
            result = build.merge_dims(result, pos + before, 2)
    return result


def lower_tiles(op: d.MMACTilesOp, rewriter, packed: TokenAxes,
                tile: MMT4DTile) -> list[ir.Value]:
    """Rewrite op (and the W terms stacked with it) and its consumers; returns
    the column sums the tiles made unneeded (u * Vq is summed in place)."""
    v = op.v
    terms = stacked_terms(op, tile.max_rows) or [op]
    last = terms[-1]
    with ir.InsertionPoint(last.operation), op.location:
        tiles = mmt4d_tiles([t.wq for t in terms], v, packed, tile, d.shape_of(op.result),
                            [t.column_sums is not None for t in terms])
    all_sums = [t.column_sums for t in terms if t.column_sums is not None]
    for term, term_tiles in zip(terms, tiles):
        for use in list(term.result.uses):   # consumers that read the tiles in place
            consumer = use.owner.operation
            at = consumer if len(terms) == 1 or last.operation.is_before_in_block(
                consumer) else last.operation
            with ir.InsertionPoint(at), consumer.location:
                direct = read_tiles(consumer, use.operand_number, term_tiles)
            if direct is not None:
                rewriter.replace_op(consumer, [direct])
        if build.has_no_uses(term.result):
            rewriter.erase_op(term)
        else:                                # only where one term has its own tiles
            with ir.InsertionPoint(last.operation), op.location:
                rewriter.replace_op(term, [untile(term_tiles)])
    return all_sums


def stacked_terms(op: d.MMACTilesOp, max_rows: int) -> list[d.MMACTilesOp] | None:
    """The MMAC tiles (op among them, in block order) of the W terms that share op's
    V and groups and can share one batch_mmt4d (their Wq side by side in each row
    tile of at most `max_rows` rows), or None.

    The shared tiles are computed where the last of them is; each consumer of
    their sums is rebuilt after that point (`read_tiles`), so every consumer must
    be a generic `read_tiles` takes, and its users must come after that point."""
    block = op.operation.block
    terms = []
    for use in op.v.uses:
        other = use.owner.operation
        if (other.name == d.MMAC_TILES and use.operand_number == 1
                and other.block == block and other not in (t.operation for t in terms)):
            other = other.opview
            if (d.shape_of(other.wq) == d.shape_of(op.wq)
                    and np.array_equal(other.groups, op.groups)):
                terms.append(other)
    count = len(terms)
    if count < 2 or count & (count - 1) or count > max_rows:
        return None
    terms.sort(key=cmp_to_key(lambda a, b: -1 if a.operation.is_before_in_block(b.operation)
                                else 1))
    last = terms[-1].operation
    for term in terms:
        for use in term.result.uses:
            consumer = use.owner.operation
            if consumer.block != block or not read_tiles(consumer, use.operand_number,
                                                         term.result, check_only=True):
                return None
            if not last.is_before_in_block(consumer):
                for result in consumer.results:
                    for later in result.uses:
                        user = later.owner.operation
                        if user.block != block or not last.is_before_in_block(user):
                            return None
    return terms


