"""A prefill's K/V tiles staged in LDS by asynchronous copies (cuda: cp.async).

`KVRing` holds `STAGES` copies of a tile's K [T, D] (its rows' bytes through the
K loads' bank swizzle, fragments/lds_tile.py), V [D, T] and both scales [T]; its
`fill` starts the workgroup's copies of a tile (each thread's chunks are
`fragments.tile_copies`'), and its `view` is the tile's `KVView` reading the staged
copy, so the stages (kernels/qk_stages.py, pv_stages.py) read a staged tile as they
read the cache. `start` and `turn` are a tile loop's steps (the prefill kernel's,
kernels/prefill.py): tile t in stage t % STAGES (`fragments.TileRing`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..fragments import DecodeKernelLayout, LinearLayout, TileRing, tile_copies
from ..fragments.lds_tile import k_tile_swizzle
from .kv_access import KVView
from .lanes import Lanes


@dataclass(frozen=True)
class _StageView(KVView):
    """A tile staged in LDS ([stages, T, D] K, [stages, D, T] V, [stages, T] scales):
    its token `local` at [stage, first + local]."""

    stage: ir.Value = None
    k_swizzle: LinearLayout = None      # (token, byte) -> byte of the K tile

    def token_row(self, local: ir.Value) -> list[ir.Value]:
        return [self.stage, arith.addi(self.first, local)]

    def k_bytes(self, local: ir.Value, first: ir.Value) -> list[ir.Value]:
        token = arith.addi(self.first, local)
        byte = self.k_swizzle.emit(self.lanes.layout_builder, {"token": token, "byte": first},
                                   assume_in_range=True)["byte"]
        return [self.stage, token, byte]

    def v_row(self, col: ir.Value, local: ir.Value) -> list[ir.Value]:
        return [self.stage, col, arith.addi(self.first, local)]


COPY_BYTES = 16           # an asynchronous copy's largest chunk (cp.async: 4, 8 or 16)


@dataclass(frozen=True)
class KVRing:
    """A prefill's K/V tiles staged in LDS by asynchronous copies, `STAGES` of them:
    the workgroup copies the next tile while it computes this one, so no lane holds
    registers for loads in flight and the waves share one copy of each tile. Which
    thread copies which chunk is `fragments.tile_copies`'."""

    STAGES = 2

    lanes: Lanes
    k: ir.Value              # LDS [stages, T, D] i8, each row's bytes through k_swizzle
    k_scale: ir.Value        # LDS [stages, T] f32
    v: ir.Value              # LDS [stages, D, T] i8
    v_scale: ir.Value        # LDS [stages, T] f32
    tokens: int
    head_dim: int
    k_swizzle: LinearLayout  # fragments.k_tile_swizzle: (token, byte) -> byte

    @staticmethod
    def lds_bytes(tokens: int, head_dim: int) -> int:
        return KVRing.STAGES * tokens * (2 * head_dim + 8)

    @staticmethod
    def copies(tokens: int, head_dim: int, threads: int):
        """(K, V, scales) copy slots of `tile_copies`; ValueError where a split is
        not linear in the thread bits (then the kernel reads the cache directly)."""
        return (tile_copies(tokens, head_dim, threads, COPY_BYTES),
                tile_copies(head_dim, tokens, threads, COPY_BYTES),
                tile_copies(tokens, 1, threads, 1))

    @staticmethod
    def copy_count(tokens: int, head_dim: int, threads: int) -> int:
        """Asynchronous copies a thread issues per tile (K, V, and both scales)."""
        k, v, scales = KVRing.copies(tokens, head_dim, threads)
        return len(k) + len(v) + 2 * len(scales)

    @staticmethod
    def allocate(lanes: Lanes, layout: DecodeKernelLayout, head_dim: int) -> "KVRing":
        """The ring of a kernel whose QK reads K as `layout` says (its swizzle's)."""
        stages, tokens = KVRing.STAGES, layout.model.wave_tokens
        return KVRing(lanes, lanes.shared([stages, tokens, head_dim], "i8"),
                      lanes.shared([stages, tokens], "f32"),
                      lanes.shared([stages, head_dim, tokens], "i8"),
                      lanes.shared([stages, tokens], "f32"), tokens, head_dim,
                      k_tile_swizzle(layout, head_dim))

    def fill(self, tile: KVView, stage: ir.Value) -> ir.Value:
        """Start copying the tile `tile` views into `stage`; returns the copies'
        group for `lanes.async_wait` (each thread waits for its own copies; a barrier
        after the wait publishes them to the workgroup)."""
        return self._issue(self._copies(tile, stage))

    def _copies(self, tile: KVView, stage: ir.Value):
        """The (source, source indices, target, target indices, elements) of each of
        the thread's copies of `tile` into `stage`, one at a time: each one's addresses
        built (a pooled tile's block ids loaded) when it is drawn, nothing issued."""
        lanes = self.lanes
        of = lambda lane_map: lanes.of_lane(lane_map, lanes.thread)
        k_slots, v_slots, scale_slots = self.copies(self.tokens, self.head_dim, lanes.threads)
        staged = self.view(tile, stage)
        for token_map, byte_map in k_slots:
            token, byte = of(token_map), of(byte_map)
            yield (tile.k, tile.k_bytes(token, byte), self.k, staged.k_bytes(token, byte),
                   COPY_BYTES)
        for col_map, token_map in v_slots:
            col, token = of(col_map), of(token_map)
            yield tile.v, tile.v_row(col, token), self.v, [stage, col, token], COPY_BYTES
        for token_map, _ in scale_slots:
            token = of(token_map)
            for source, target in ((tile.k_scale, self.k_scale), (tile.v_scale, self.v_scale)):
                yield source, tile.token_row(token), target, [stage, token], 1

    def _issue(self, copies) -> ir.Value:
        return self.lanes.async_group([self.lanes.async_copy(*copy) for copy in copies])

    # the loop's turns: tile t reads stage t % STAGES (fragments.TileRing) ---------
    def start(self, tile_of: Callable[[ir.Value], KVView]) -> None:
        """Before the tile loop: tile 0 copied and waited for (a sequence has one: it
        holds its queries)."""
        zero = self.lanes.index(0)
        self.lanes.async_wait(self.fill(tile_of(zero), zero))

    def turn(self, tile_of: Callable[[ir.Value], KVView], tile: ir.Value,
             count: ir.Value) -> tuple[KVView, Callable[[], ir.Value]]:
        """At the top of tile `tile` of `count`: the barrier that publishes its copies
        and orders the reads of the tile before it (the stage refilled now) before
        the refill, then the next tile's copies into the other stage (the last tile
        copies itself again there: no branch). Returns (the tile's staged view,
        `issue`): `issue()` gives the copies' group, to wait for at the bottom of the
        tile; the caller calls it after its QK. Where the next tile's addresses load
        (`KVView.addresses_load`: a chunked prefill's block ids), only they are
        computed here and `issue()` issues the copies, so the loads pass under QK's
        MMAs instead of stalling the copies at once (the chunked prefill is faster so);
        elsewhere the copies are issued here, with the most time to land (issued after
        QK, the dense history case is slower;
        benchmarks/results/2026-12-05-h100-prefill-reciprocal/)."""
        lanes, ring = self.lanes, TileRing(self.STAGES)
        lanes.barrier()
        following = tile_of(ring.following(lanes.ops, tile, count))
        copies = self._copies(following, ring.stage(lanes.ops, lanes.plus(tile, 1)))
        if following.addresses_load:
            copies = list(copies)           # every address now, the copies later
            issue = lambda: self._issue(copies)
        else:
            group = self._issue(copies)
            issue = lambda: group
        return self.view(tile_of(tile), ring.stage(lanes.ops, tile)), issue

    def view(self, tile: KVView, stage: ir.Value) -> KVView:
        """`tile`'s view reading its staged copy in `stage` (the same tokens)."""
        return _StageView(self.lanes, tile.q, self.k, self.k_scale, self.v, self.v_scale,
                          tile.b, tile.h, self.lanes.index(0), batch=tile.batch,
                          history=tile.history, stage=stage, k_swizzle=self.k_swizzle)
