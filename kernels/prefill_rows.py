"""The prefill workgroup's query rows: a block of the KV head's (token, head) rows,
packed token-major (row r is query token r // G, head r % G of the GQA group), which
of them are real, the query token and head of each, where a row's q is read, and the
KV tiles the block's rows see (the causal rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..contract import scalar_ir as contract
from ..fragments import PackedRows, ceil_div, floor_div
from .kv_access import KVView
from .shapes import PagedPrefillShape, PrefillShape
from .stage_plan import StagePlan


@dataclass(frozen=True)
class PrefillRows:
    """The workgroup's query rows: row block `block` of the KV head's packed
    (token, head) rows, `rows` of them, `tile_rows` per wave."""

    plan: StagePlan
    shape: PrefillShape | PagedPrefillShape
    block: ir.Value
    rows: int

    def packed(self, row: ir.Value, wave: ir.Value | None = None) -> ir.Value:
        """Packed row of the block's row `row` (of wave `wave`'s tile, if given)."""
        lanes = self.plan.lanes
        if wave is None:
            return lanes.affine((self.block, self.rows), (row, 1))
        return lanes.affine((self.block, self.rows), (wave, self.plan.tile_rows), (row, 1))

    def real(self, packed: ir.Value) -> ir.Value:
        s = self.shape
        return arith.cmpi(arith.CmpIPredicate.ult, packed,
                          self.plan.lanes.index(s.query_tokens * s.rows))

    def token_and_head(self, packed: ir.Value, clamp: bool = True):
        """(query token, head in the group) of a packed row; with `clamp`, a padding
        row past the last real one takes the last one's (it reads real q and keys,
        and is never stored)."""
        s, lanes = self.shape, self.plan.lanes
        if clamp:
            packed = arith.minui(packed, lanes.index(s.query_tokens * s.rows - 1))
        return PackedRows(s.rows).split(lanes.ops, packed)


def q_source(rows: PrefillRows, kv: KVView, row):
    """(is the block's row `row` real, where its q is read: [b, q head, token])."""
    packed = rows.packed(row)
    token, head = rows.token_and_head(packed)
    s = rows.shape
    return rows.real(packed), [kv.b, kv.lanes.affine((kv.h, s.rows), (head, 1)), token]


def tile_bounds(plan: StagePlan, rows: PrefillRows, history):
    """(tiles every row of the block sees whole, tiles up to the last key the block's
    last real row sees): the causal rule of `contract.causal_last_key`. The block's
    first row has its smallest query token (rows are token-major), so a tile is whole
    for every row iff its last key is at most that row's last key."""
    lanes, tile = plan.lanes, plan.model.wave_tokens
    first, _ = rows.token_and_head(rows.packed(lanes.index(0)))
    last, _ = rows.token_and_head(lanes.affine((rows.block, rows.rows), rows.rows - 1))
    whole = floor_div(lanes.ops, lanes.plus(contract.causal_last_key(first, history,
                                                                     lanes.index), 1), tile)
    seen = ceil_div(lanes.ops, lanes.plus(contract.causal_last_key(last, history, lanes.index),
                                          1), tile)
    return whole, seen
