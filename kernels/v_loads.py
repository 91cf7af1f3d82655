"""V's operands for PV: each lane's V loads (16 bytes of consecutive tokens of one
head-dim column), from the cache or from an LDS copy, the asynchronous copies that
stage them, and the tiles in the order PV takes them.

Each stage is a function of a `StagePlan` and a `KVView` (stage_plan.py, kv_access.py).
"""

from __future__ import annotations

from iree.compiler import ir

from .kv_access import KVView
from .lanes import load_vector
from .stage_plan import StagePlan, VSource


def _v_pieces(plan: StagePlan, tiles=None):
    """[load][tile]: (head-dim column, first token in the wave) of each of the lane's
    V loads, 16 bytes of consecutive tokens of one head-dim column."""
    lanes, layout = plan.lanes, plan.pv_layout
    inst = layout.instruction
    b_col = lanes.of_lane(layout.b_col())
    tiles = tiles if tiles is not None else range(plan.head_dim // inst.n)
    return [[(lanes.plus(b_col, tile * inst.n), lanes.of_lane(layout.v_load_start(u)))
             for tile in tiles] for u in range(layout.v_loads())]


def load_v(plan: StagePlan, kv: KVView, wave_token0: ir.Value, tiles=None,
           staged: ir.Value | None = None) -> list[list]:
    """Each lane's V loads [load][tile], from the cache (the wave's tokens from
    `wave_token0`) or from the LDS copy `staged` [wave, head dim, wave token]
    (`stage_v`)."""
    lanes, width = plan.lanes, plan.model.v_load.bytes_per_lane
    if staged is not None:
        return [[load_vector(staged, [lanes.wave, col, in_wave], width, "i8")
                 for col, in_wave in row] for row in _v_pieces(plan, tiles)]
    # Rows of the cache's last dimension (the padded sequence, or a block), read from
    # multiples of the wave's tokens; the bindings are 16-byte aligned (IREE's).
    alignment = plan.pv_layout.v_load_alignment(ir.MemRefType(kv.v.type).shape[-1])
    wave_kv = kv.wave(wave_token0, plan.model.wave_tokens)
    return [[load_vector(kv.v, wave_kv.v_row(col, in_wave), width, "i8", alignment)
             for col, in_wave in row] for row in _v_pieces(plan, tiles)]


def stage_v(plan: StagePlan, kv: KVView, wave_token0: ir.Value) -> tuple:
    """Start the asynchronous copies of the lane's V loads into LDS; (LDS, group).
    Each lane reads back only what it copied, so the group's wait alone orders
    the copies before the reads."""
    lanes, width = plan.lanes, plan.model.v_load.bytes_per_lane
    lds = lanes.shared([plan.waves, plan.head_dim, plan.model.wave_tokens], "i8")
    wave_kv = kv.wave(wave_token0, plan.model.wave_tokens)
    copies = [lanes.async_copy(kv.v, wave_kv.v_row(col, in_wave), lds,
                               [lanes.wave, col, in_wave], width)
              for row in _v_pieces(plan) for col, in_wave in row]
    return lds, lanes.async_group(copies)


def v_tiles(plan: StagePlan, kv: KVView, wave_token0: ir.Value, source: VSource):
    """(tile, the lane's V loads for its head-dim columns), in tile order."""
    tiles = range(plan.head_dim // plan.pv_layout.instruction.n)
    if source.staged is not None:
        lds, group = source.staged
        plan.lanes.async_wait(group)
        loaded = load_v(plan, kv, wave_token0, staged=lds)
    elif source.loaded is not None:
        loaded = source.loaded
    elif not source.per_tile:
        loaded = load_v(plan, kv, wave_token0)
    else:
        for tile in tiles:
            yield tile, [row[0] for row in load_v(plan, kv, wave_token0, [tile])]
        return
    for tile in tiles:
        yield tile, [row[tile] for row in loaded]
