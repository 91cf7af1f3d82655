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
group's at most K nonzero products (c*K for a chain of c MMACs: one group, one
accumulator) one of magnitude <= K*128*128 < 2^24, so
every f32 operation is exact and acc (converted to i32) is the group's int32
sum, bit for bit, in any summation order (the zeros add exactly nothing). On
the CPU the f32 FMA path is the fastest exact one (the i32 multiply-add form of
the same loop is slower; benchmarks/results/2026-12-03-cpu-zen4-decode-time/).

With `contraction=mmt4d` (passes/mmac_tiles_mmt4d.py) the in-place tiles are one
`linalg.batch_mmt4d` over the groups (batch B = b*h*n*G), i16 operands (int8 values and u = Wq + 128
exact; the int32 sums are the same bit for bit, in any order):

    Vp[B, D/N0, K/2, N0, 2] = i16(v[b,h,n, token(g, k), d])  V packed once through the
                                                              token digits: each group's
                                                              tokens contiguous in K slot
                                                              order, K0 = 2 tokens
                                                              interleaved per column
    Wp[B, r/M0, K/2, M0, 2] = i16(Wq[b,h,r,n,g,k])           (+ 128 for unsigned W)
    tiles[b,h,n,g, r/M0, D/N0, M0, N0] = batch_mmt4d(Wp, Vp)  (a view of its result)

which IREE's mmt4d ukernel runs on VNNI (`vpdpwssd`; the cpu target's
`--iree-llvmcpu-enable-ukernels=mmt4d`). The (M0, N0) tile fits the register
file of the CPU it is compiled for (`vector-isa`; N0 one vector of i32, M0 up
to 16 rows): IREE caps vector tiles to that register space, and an mmt4d
tile it cuts reaches the ukernel with the whole tile's strides and sums the
wrong elements (as it did on AVX2; `support/cpu_vectors.py`). The MMAC tiles of
several W terms (w_terms=2) over the same V and groups share one batch_mmt4d: their Wq side
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
afresh on every call (benchmarks/results/2026-12-03-cpu-zen4-decode-time/).

Any other table (not a digit permutation), or a group too large for exact f32 sums
(c*K above 1024 for s8 W, 514 for u8: longer chains than any offered), is lowered through a gather of V in fragment order and an i32 contraction:

    Vg[b,h,n,g,k,d] = v[b,h,n,groups[g,k],d]            token gather (the B operand)
    acc[b,h,r,n,g,d] = sum_k i32(Wq[b,h,r,n,g,k]) * i32(Vg[b,h,n,g,k,d])

Either way the `groups` table the scales were computed over is the one that
pairs each K slot of W with its token of V.

Unsigned W (docs/design.md §2c): a tile with column sums computes
acc = sum Wq*Vq + 128 * cs = sum u*Vq (u = Wq + 128, scalar_ir.unsigned_offset).
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
from math import prod
from typing import ClassVar, Literal

from iree.compiler import ir
from iree.compiler.dialects import arith, tensor

from ..dialects import int8attn as d
from ..fragments import NotADigitPermutation, TokenAxes, token_axes
from ..dialects import builders as build
from . import mmac_tiles_mmt4d as mmt4d
from ..contract import scalar_ir as contract
from .rewrite import apply_patterns
from ..support.cpu_vectors import REGISTER_FILES, VectorISA
from ..support.options import TypedOptions, option

# How the lowerings reach the tokens of a group: through a view of the token
# digits where the groups table allows it ("in-place"), or always through a
# gather by the table ("gather", the reference form the tests compare with).
TokenAccess = Literal["in-place", "gather"]
# How the in-place tiles contract: f32 FMAs over a zero-spread Wq (the default:
# the fastest on the CPU), or a packed i16 batch_mmt4d on IREE's VNNI ukernel
# (slower end to end: benchmarks/results/2026-12-03-cpu-zen4-decode-time/).
Contraction = Literal["f32", "mmt4d"]

# f32 accumulates a group's sum exactly while K * max|product| <= 2^24 (the
# products' bound: contract.MAX_W_V_PRODUCT): up to K = 1024 for s8 W, 514 for u8.
EXACT_F32_SUM = 1 << 24


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
    token = build.TOKEN_DIGITS[:n_axes]
    digit = {i: (token[i] if i < first else build.GROUP_DIGITS[i]) for i in axes.group_order}
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



def in_place_axes(groups, w: str = "s8") -> TokenAxes | None:
    """The token axes to read V in place by, or None (lower through the gather).

    `w` is "u8" where the tile sums u * Vq (unsigned W, the +128 folded in)."""
    if groups.shape[1] * contract.MAX_W_V_PRODUCT[w] > EXACT_F32_SUM:
        return None
    try:
        axes = token_axes(groups)
    except NotADigitPermutation:
        return None
    return axes if axes.slot_order else None


def lower_tiles(op: d.MMACTilesOp, rewriter, tokens: str = "in-place",
                contraction: str = "f32", vector_isa: str = "sse"):
    wq, v, groups = op.wq, op.v, op.groups
    static = d.DYNAMIC not in d.shape_of(wq) + d.shape_of(v)
    w = "s8" if op.column_sums is None else "u8"
    tile = mmt4d.MMT4DTile.fitting(REGISTER_FILES[vector_isa], d.shape_of(v)[-1])
    packed = mmt4d.token_axes_for(groups, d.shape_of(v)[-1], tile) \
        if static and tokens == "in-place" and contraction == "mmt4d" else None
    axes = packed or (in_place_axes(groups, w) if static and tokens == "in-place" else None)
    sums = op.column_sums
    if packed is not None:
        all_sums = mmt4d.lower_tiles(op, rewriter, packed, tile)
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
        if cs not in all_sums[:i] and isinstance(cs, ir.OpResult) and build.has_no_uses(cs):
            rewriter.erase_op(cs.owner)


def sum_columns_in_place(v: ir.Value, axes: TokenAxes) -> ir.Value:
    """cs[b,h,n,g,d] = sum of v over group g's tokens, on a view of v's token digits."""
    b, h, n, _, head_dim = d.shape_of(v)
    token = build.TOKEN_DIGITS[:len(axes.axes)]
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

    vector_isa: VectorISA = option(
        "sse", "contraction=mmt4d: the SIMD register file of the CPU the module is compiled "
        "for (sse: 16 x 128 bits, every x86-64; avx: 16 x 256, AVX/AVX2; avx512: 32 x 512; "
        "neon: 32 x 128, AArch64). The tiles are sized to fit it whole, as IREE splits any "
        "larger one and its ukernel then sums the wrong elements; a smaller file than the "
        "CPU's is correct, only slower")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {
            d.MMAC_TILES: lambda op, rw: lower_tiles(op, rw, self.tokens, self.contraction,
                                                     self.vector_isa),
            d.COLUMN_SUMS: lambda op, rw: lower_column_sums(op, rw, self.tokens)})
