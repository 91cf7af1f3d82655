"""lower-mmac-tiles: MMAC tiles as exact int8 contractions.

Rewrites `int8attn.mmac_tiles(Wq, v) {groups}` into standard dialects that
every IREE backend runs, computing per MMAC group exactly

    acc[b,h,r,n,g,d] = sum_k Wq[b,h,r,n,g,k] * v[b,h,n,groups[g,k],d]     (int32)

When `groups` is a permutation of the digits of the token index (every
fragment model here: `fragments.token_axes`), V is read in place, through a
`tensor.expand_shape` of its token dimension:

    v  [B,H,N,T,D] -> [B,H,N, O..., Tb, D]     O: the group digits outside every
                                               K-slot digit (whole waves); Tb: the
                                               block of tokens below them (a wave)

Within a block the groups interleave (gfx936: token = 64*wave + 16*r + 8*t + j,
group (wave, t), slot (r, j)), so Wq is spread over the block's tokens with a
zero wherever a token belongs to another group of the block (W is small; V is
never copied):

    Wz[b,h,n,O,i,r,tok] = Wq[b,h,r,n,g(O,i),k(tok)] if tok is in group (O,i), else 0
    acc[b,h,r,n,O,i,d]  = sum_tok Wz[b,h,n,O,i,r,tok] * v[b,h,n,O,tok,d]

one contraction over one contiguous token loop, with r, d, tok innermost (the
(M, N, K) IREE's CPU backend tiles a matmul-like op by). It accumulates in f32:
every product is an integer of magnitude <= 128*128 and every partial sum of a
group's at most K nonzero products one of magnitude <= K*128*128 < 2^24, so
every f32 operation is exact and acc (converted to i32) is the group's int32
sum, bit for bit, in any summation order (the zeros add exactly nothing). On
this CPU the f32 FMA path is the fastest exact one (the i32 multiply-add form
of the same loop ran ~1.35x slower).

With `contraction=mmt4d` the in-place tiles are instead one `linalg.batch_mmt4d`
over the groups (batch B = b*h*n*G), i16 operands (int8 values and u = Wq + 128
exact; the int32 sums are the same bit for bit, in any order):

    Vp[B, D/16, K/2, 16, 2] = i16(v[b,h,n, token(g, k), d])   V packed once through the
                                                              token digits: each group's
                                                              tokens contiguous in K slot
                                                              order, K0 = 2 tokens
                                                              interleaved per column
    Wp[B, r/M0, K/2, M0, 2] = i16(Wq[b,h,r,n,g,k])           (+ 128 for unsigned W)
    tiles[b,h,n,g, r/M0, D/16, M0, 16] = batch_mmt4d(Wp, Vp)  (a view of its result)

which IREE's mmt4d ukernel runs on VNNI (`vpdpwssd`; the cpu target's
`--iree-llvmcpu-enable-ukernels=mmt4d`). The MMAC tiles of several W terms
(w_terms=2) over the same V and groups share one batch_mmt4d: their Wq side
by side in each row tile (M0 = T x rows), V packed and read once
(`stacked_terms`). The sums are not copied back to [r, g, d]: each
linalg.generic that reads them (the rescale
sum_g f32(acc) * sW of pv-to-mmac) is rebuilt to read the tiles in their
layout, its loops over r and d split into (tile, position in the tile) the way
linalg fuses a reshape by expansion (`read_tiles`); only another reader gets
a transposed copy (`untile`). It needs D % 16 == 0 and an even innermost slot
axis; otherwise the f32 form is used. It is not the default: the V pack (i16,
2x V's bytes, a copy per call) costs about what the VNNI contraction saves, and
from 16K the module's transient buffers pass 32 MB, which glibc's malloc maps
afresh on every call (benchmarks/results-cpu-decode.md).

Any other table (not a digit permutation), or K too large for exact f32 sums,
is lowered through a gather of V in fragment order and an i32 contraction:

    Vg[b,h,n,g,k,d] = v[b,h,n,groups[g,k],d]            token gather (the B operand)
    acc[b,h,r,n,g,d] = sum_k i32(Wq[b,h,r,n,g,k]) * i32(Vg[b,h,n,g,k,d])

Either way the `groups` table the scales were computed over is the one that
pairs each K slot of W with its token of V.

Unsigned W (DESIGN.md §2c): a tile with column sums computes
acc = sum Wq*Vq + 128 * cs = sum u*Vq (u = Wq + 128, quantize_contract.unsigned_offset).
In place, the tile sums u * Vq directly: u (in [0, 255]) is what the zero-spread
W holds, every partial sum stays below K * 255 * 128 < 2^24 (K <= 514), so the
f32 sums are the same int32 values bit for bit, and V is read once. The
`int8attn.column_sums` op it no longer needs is erased; where something else
reads it (or through the gather) it becomes the sum of V over each group's
tokens (int32; in place through the same token-digit view, reducing the slot
digits, or through the gather), which the gather form adds as 128 * cs:

    cs[b,h,n,g,d]     = sum_k v[b,h,n,groups[g,k],d]
    acc[b,h,r,n,g,d] += 128 * cs[b,h,n,g,d]          (= sum_k u * Vq, |.| < 2^24)

A lane-level decode kernel gets the column sum for free: the A tile has
16 rows and a GQA group fills only Hq/Hkv of them, so one all-ones padding row
of A makes the same MMAC return sum Vq in that row of C. At 16 query heads per
KV head no row is free: the kernel needs one more MMAC per tile (or a reduction
of the V fragment it already holds). That is the kernels' part; this pass is
the tensor-level form.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key
from math import prod

import numpy as np
from typing import ClassVar, Literal

from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, tensor

from int8attn.dialects import int8attn as d
from int8attn.fragments import NotADigitPermutation, TokenAxes, token_axes
from int8attn.passes import builders as build
from int8attn.passes import quantize_contract as contract
from int8attn.passes.rewrite import apply_patterns
from int8attn.support.options import TypedOptions, option

# How the lowerings reach the tokens of a group: through a view of the token
# digits where the groups table allows it ("in-place"), or always through a
# gather by the table ("gather", the reference form the tests compare with).
TokenAccess = Literal["in-place", "gather"]
# How the in-place tiles contract: f32 FMAs over a zero-spread Wq (the default:
# the fastest measured on the CPU), or a packed i16 batch_mmt4d (issue 12's
# VNNI lead; slower end to end so far, see benchmarks/results-cpu-decode.md).
Contraction = Literal["f32", "mmt4d"]

# f32 accumulates a group's sum exactly while K * max|product| <= 2^24: products
# of two int8 values (|.| <= 128 * 128) up to K = 1024, of an unsigned W
# u = Wq + 128 in [0, 255] with an int8 V (|.| <= 255 * 128) up to K = 514.
EXACT_F32_SUM = 1 << 24
MAX_PRODUCT = {"s8": 128 * 128, "u8": 255 * 128}


def gather_tokens(values: ir.Value, token_dim: int, groups) -> ir.Value:
    """Replace dimension `token_dim` of `values` by [G, K] following `groups`."""
    shape = d.shape_of(values)
    out_shape = shape[:token_dim] + list(groups.shape) + shape[token_dim + 1:]
    table = build.lookup_table(groups)
    element = d.element_of(values)

    def body(_):
        loops = [build.loop_index(i) for i in range(len(out_shape))]
        token = build.lookup(table, loops[token_dim:token_dim + 2])
        indices = loops[:token_dim] + [token] + loops[token_dim + 2:]
        return tensor.ExtractOp(values, indices).result

    dims = "abcdefghij"[:len(out_shape)]
    return build.generic([], [], dims, build.empty(out_shape, element), body)


def _mac(a, b, total):
    return arith.addi(total, arith.muli(build.to_i32(a), build.to_i32(b)))


# Loop names of the token axes (single letters; b, h, r, n, d, k are taken):
# a token digit of axis i, and the group digit of an inner group axis i.
_TOKEN_DIGIT = "ACEFGIJLMOPQSTUVWXYZ"
_GROUP_DIGIT = "acefgijlmopqstuvwxyz"


def contract_in_place(wq: ir.Value, v: ir.Value, axes: TokenAxes, result_shape,
                      column_sums: ir.Value | None = None) -> ir.Value:
    """acc[b,h,r,n,g,d] = sum_k Wq[b,h,r,n,g,k] * v[b,h,n,token(g,k),d] on a view of v;
    with `column_sums` (unsigned W) sum_k (Wq + 128) * v, which equals
    sum_k Wq * v + 128 * column_sums exactly (the column sums are not read).

    The token axes outside every slot axis (whole waves) are batch loops; the
    block below them is one contiguous reduction loop, over which Wq is
    spread with zeros for the tokens of the block's other groups.
    """
    n_axes = len(axes.axes)
    first = min(i for i, a in enumerate(axes.axes) if a.role == "slot")
    block = list(range(first, n_axes))
    inner = [i for i in block if axes.axes[i].role == "group"]
    token = _TOKEN_DIGIT[:n_axes]
    digit = {i: (token[i] if i < first else _GROUP_DIGIT[i]) for i in axes.group_order}
    outer = token[:first]
    inner_dims = "".join(digit[i] for i in inner)
    group = "".join(digit[i] for i in axes.group_order)
    slot = "".join(token[i] for i in axes.slot_order)
    sizes = {c: axes.axes[i].size for i, c in enumerate(token)}
    sizes.update({digit[i]: axes.axes[i].size for i in inner})
    b, h, r, n, _, _ = d.shape_of(wq)
    sizes.update(b=b, h=h, r=r, n=n, d=result_shape[-1],
                 k=prod(axes.axes[i].size for i in block))

    # Wz[b,h,n,O,i,r,<block digits>] = f32(Wq[b,h,r,n,g(O,i),k(slot digits)]) where
    # each inner group axis has its token digit equal to the group's, else 0.
    wq_view = build.split_dim(build.split_dim(wq, 5, axes.slot_shape), 4, axes.group_shape)
    wz_dims = "bhn" + outer + inner_dims + "r" + token[first:]
    loop = {c: i for i, c in enumerate(wz_dims)}

    def own_group_only(w, _):
        w = build.to_f32(w)
        if column_sums is not None:          # u = Wq + 128: the tile sums u * Vq
            w = arith.addf(w, build.f32(contract.W_OFFSET))
        same = None
        for i in inner:
            eq = arith.cmpi(arith.CmpIPredicate.eq, build.loop_index(loop[digit[i]]),
                            build.loop_index(loop[token[i]]))
            same = eq if same is None else arith.andi(same, eq)
        return w if same is None else arith.select(same, w, build.zero("f32"))

    wz = build.generic([wq_view], ["bhrn" + group + slot], wz_dims,
                       build.empty([sizes[c] for c in wz_dims], "f32"), own_group_only)
    wz = build.merge_dims(wz, len(wz_dims) - len(block), len(block))
    v_view = build.split_dim(v, 3, [axes.axes[i].size for i in range(first)] + [sizes["k"]])

    out_dims = "bhrn" + group + "d"
    out_shape = [sizes[c] for c in out_dims]
    acc = build.generic(
        [wz, v_view], ["bhn" + outer + inner_dims + "rk", "bhn" + outer + "kd"], out_dims,
        build.zeros(out_shape, "f32"),
        lambda w, x, total: arith.addf(total, arith.mulf(w, build.to_f32(x))),
        loops="bhn" + outer + inner_dims + "rdk")
    acc = build.generic([acc], [out_dims], out_dims, build.empty(out_shape, "i32"),
                        lambda a, _: arith.fptosi(ir.IntegerType.get_signless(32), a))
    return build.merge_dims(acc, 4, len(group))



# The packed int8 contraction (`linalg.batch_mmt4d`): i16 operands, K0 = 2 K
# slots per i32 lane (what x86's VNNI `vpdpwssd` and IREE's s16s16s32 mmt4d
# ukernel take), N0 = 16 head-dim columns per vector.
MMT4D_N0 = 16
MMT4D_K0 = 2
MMT4D_M0_MAX = 16
# i32 accumulates a group exactly while K * max|product| < 2^31.
EXACT_I32_SUM = 1 << 31


def mmt4d_axes(groups, head_dim: int) -> TokenAxes | None:
    """The token axes to pack V by for the mmt4d contraction, or None.

    Needs a digit permutation (`fragments.token_axes`) whose innermost K slot
    axis holds an even number of tokens (the K0 pairs), and a head dim that is a
    multiple of N0."""
    if head_dim % MMT4D_N0 or groups.shape[1] * MAX_PRODUCT["u8"] >= EXACT_I32_SUM:
        return None
    try:
        axes = token_axes(groups)
    except NotADigitPermutation:
        return None
    if not axes.slot_order or axes.axes[axes.slot_order[-1]].size % MMT4D_K0:
        return None
    return axes


def pack_v(v: ir.Value, axes: TokenAxes) -> ir.Value:
    """V (i8 [b,h,n,T,D]) as the mmt4d RHS, i16 [B = b*h*n*G, D/N0, K/K0, N0, K0].

    One copy of V: the token digits of `axes` put each group's tokens
    contiguously in K slot order (the slot digits, outermost first, the innermost
    one split into K1 and K0 halves), each K0 pair of tokens interleaved per
    head-dim column, sign-extended to i16."""
    b, h, n, _, head_dim = d.shape_of(v)
    n_axes = len(axes.axes)
    lo = axes.slot_order[-1]                 # stride 1 in K: its low bit is K0
    token = _TOKEN_DIGIT[:n_axes]
    view_shape, view_dims = [], ""
    for i, axis in enumerate(axes.axes):
        if i == lo:
            view_shape += [axis.size // MMT4D_K0, MMT4D_K0]
            view_dims += token[i] + "K"
        else:
            view_shape.append(axis.size)
            view_dims += token[i]
    view = build.split_dim(build.split_dim(v, 4, [head_dim // MMT4D_N0, MMT4D_N0]), 3, view_shape)
    group = "".join(token[i] for i in axes.group_order)
    slot = "".join(token[i] for i in axes.slot_order)
    out_dims = "bhn" + group + "d" + slot + "DK"
    sizes = dict(zip("bhn" + view_dims + "dD", [b, h, n, *view_shape,
                                                  head_dim // MMT4D_N0, MMT4D_N0]))
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


def mmt4d_tiles(wqs: list[ir.Value], v: ir.Value, axes: TokenAxes, result_shape,
                unsigned: list[bool]) -> list[ir.Value]:
    """The group sums of each term (same V, same groups) as one `linalg.batch_mmt4d`,
    each term's in the tile layout [b, h, n, g, r/M0, D/N0, M0, N0] (int32; a view
    of the mmt4d result, or a slice of its row tiles where several terms share it):
    tiles[b,h,n,g,R,E,m,e] = acc[b,h,R*M0+m,n,g,E*N0+e] with
    acc[b,h,r,n,g,d] = sum_k Wq[b,h,r,n,g,k] * v[b,h,n,token(g,k),d]; with
    `unsigned[t]`, term t's sum_k (Wq + 128) * v (= sum Wq * v + 128 * column sums,
    bit for bit)."""
    b, h, r, n, g, head_dim = result_shape
    terms = len(wqs)
    m0 = row_tile(r, MMT4D_M0_MAX // terms)
    lhs, rhs = pack_w(wqs, unsigned, m0), pack_v(v, axes)
    batch, m1, _, _, _ = d.shape_of(lhs)
    n1 = d.shape_of(rhs)[1]
    init = build.zeros([batch, m1, n1, terms * m0, MMT4D_N0], "i32")
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


def in_place_axes(groups, w: str = "s8") -> TokenAxes | None:
    """The token axes to read V in place by, or None (lower through the gather).

    `w` is "u8" where the tile sums u * Vq (unsigned W, the +128 folded in)."""
    if groups.shape[1] * MAX_PRODUCT[w] > EXACT_F32_SUM:
        return None
    try:
        axes = token_axes(groups)
    except NotADigitPermutation:
        return None
    return axes if axes.slot_order else None


def lower_tiles(op: d.MMACTilesOp, rewriter, tokens: str = "in-place",
                contraction: str = "f32"):
    wq, v, groups = op.wq, op.v, op.groups
    static = d.DYNAMIC not in d.shape_of(wq) + d.shape_of(v)
    w = "s8" if op.column_sums is None else "u8"
    packed = mmt4d_axes(groups, d.shape_of(v)[-1]) \
        if static and tokens == "in-place" and contraction == "mmt4d" else None
    axes = packed or (in_place_axes(groups, w) if static and tokens == "in-place" else None)
    sums = op.column_sums
    if packed is not None:
        terms = stacked_terms(op) or [op]
        last = terms[-1]
        with ir.InsertionPoint(last.operation), op.location:
            tiles = mmt4d_tiles([t.wq for t in terms], v, packed, d.shape_of(op.result),
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
            if _unused(term.result):
                rewriter.erase_op(term)
            else:                                # only where one term has its own tiles
                with ir.InsertionPoint(last.operation), op.location:
                    rewriter.replace_op(term, [untile(term_tiles)])
    else:
        with rewriter.ip, op.location:
            if axes is not None:
                acc = contract_in_place(wq, v, axes, d.shape_of(op.result), sums)
            else:
                v_groups = gather_tokens(v, 3, groups)
                acc = build.generic([wq, v_groups], ["bhrngk", "bhngkd"], "bhrngd",
                                    build.zeros(d.shape_of(op.result), "i32"), _mac)
            if sums is not None and axes is None:
                acc = build.generic([acc, sums], ["bhrngd", "bhngd"], "bhrngd",
                                    build.empty(d.shape_of(op.result), "i32"),
                                    lambda a, cs, _: contract.unsigned_offset(a, cs))
        rewriter.replace_op(op, [acc])
        all_sums = [sums] if sums is not None and axes is not None else []
    for i, cs in enumerate(all_sums):        # the in-place tiles summed u * Vq themselves
        if cs not in all_sums[:i] and isinstance(cs, ir.OpResult) and _unused(cs):
            rewriter.erase_op(cs.owner)


def stacked_terms(op: d.MMACTilesOp) -> list[d.MMACTilesOp] | None:
    """The MMAC tiles (op among them, in block order) of the W terms that share op's
    V and groups and can share one batch_mmt4d (their Wq side by side in each row
    tile), or None.

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
    if count < 2 or count & (count - 1) or count > MMT4D_M0_MAX:
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


def _unused(value: ir.Value) -> bool:
    return next(iter(value.uses), None) is None


def sum_columns_in_place(v: ir.Value, axes: TokenAxes) -> ir.Value:
    """cs[b,h,n,g,d] = sum of v over group g's tokens, on a view of v's token digits."""
    b, h, n, _, head_dim = d.shape_of(v)
    token = _TOKEN_DIGIT[:len(axes.axes)]
    group = "".join(token[i] for i in axes.group_order)
    sums = build.generic([build.split_dim(v, 3, axes.token_shape)], ["bhn" + token + "d"],
                         "bhn" + group + "d",
                         build.zeros([b, h, n, *axes.group_shape, head_dim], "i32"),
                         lambda x, total: arith.addi(total, build.to_i32(x)))
    return build.merge_dims(sums, 3, len(group))


def lower_column_sums(op: d.ColumnSumsOp, rewriter, tokens: str = "in-place"):
    v, groups = op.v, op.groups
    static = d.DYNAMIC not in d.shape_of(v)
    axes = in_place_axes(groups) if static and tokens == "in-place" else None
    with rewriter.ip, op.location:
        if axes is not None:
            sums = sum_columns_in_place(v, axes)
        else:
            sums = build.generic([gather_tokens(v, 3, groups)], ["bhngkd"], "bhngd",
                                 build.zeros(d.shape_of(op.result), "i32"),
                                 lambda x, total: arith.addi(total, build.to_i32(x)))
    rewriter.replace_op(op, [sums])


@dataclass(frozen=True)
class LowerMMACTiles(TypedOptions):
    """Lower MMAC tiles (and the column sums of unsigned W) to exact int8
    contractions, reading V in place where the groups allow.

    Groups that are no digit permutation of the token index (or `tokens=gather`)
    go through a token gather of V instead.
    """

    argument: ClassVar[str] = "lower-mmac-tiles"
    tokens: TokenAccess = option(
        "in-place", "read V's tokens in place where the groups allow it, or always "
        "gather them through the groups table (the reference form)")

    contraction: Contraction = option(
        "f32", "the in-place tiles as one f32 contraction over each wave's tokens with "
        "Wq zero-spread (f32), or as a linalg.batch_mmt4d of i16 operands over a packed "
        "copy of V (mmt4d; IREE's mmt4d ukernel, VNNI on x86)")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {
            d.MMAC_TILES: lambda op, rw: lower_tiles(op, rw, self.tokens, self.contraction),
            d.COLUMN_SUMS: lambda op, rw: lower_column_sums(op, rw, self.tokens)})
