"""lower-mmac-tiles: MMAC tiles as exact i8 x i8 -> i32 contractions.

Rewrites `int8attn.mmac_tiles(Wq, v) {groups}` into standard dialects that
every IREE backend runs:

    Vg[b,h,n,g,k,d] = v[b,h,n,groups[g,k],d]            token gather (the B operand)
    acc[b,h,r,n,g,d] = sum_k i32(Wq[b,h,r,n,g,k]) * i32(Vg[b,h,n,g,k,d])

The gather reads the same `groups` table the scales were computed over, so
the K slot k of group g pairs W and V of the same token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith, tensor

from int8attn.dialects import int8attn as d
from int8attn.passes import builders as build
from int8attn.passes.rewrite import apply_patterns


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


def lower_tiles(op: d.MMACTilesOp, rewriter):
    wq, v, groups = op.wq, op.v, op.groups
    with rewriter.ip, op.location:
        v_groups = gather_tokens(v, 3, groups)
        acc = build.generic(
            [wq, v_groups], ["bhrngk", "bhngkd"], "bhrngd",
            build.zeros(d.shape_of(op.result), "i32"),
            lambda a, b, total: arith.addi(total, arith.muli(build.to_i32(a), build.to_i32(b))))
    rewriter.replace_op(op, [acc])


@dataclass(frozen=True)
class LowerMMACTiles:
    """Lower MMAC tiles to token gathers and int32 `linalg.generic` contractions."""

    argument: ClassVar[str] = "lower-mmac-tiles"

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.MMAC_TILES: lower_tiles})
