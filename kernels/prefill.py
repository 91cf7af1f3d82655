"""The lane-level prefill kernel: FlashAttention with INT8 QK and INT8 PV.

One workgroup of 4 waves per (block of 64 query rows, KV head, sequence).
A query row is a (token, head) pair of the KV head's GQA group, packed
token-major into the MMA's M: row r of the KV head is query token r // G,
head r % G, so one K/V tile serves every head of the group. Each wave owns
16 rows and walks the KV tiles of 64 tokens (the fragment model's wave
tokens, which is also the contract's prefill tile); the rows are a `PrefillRows`
(kernels/prefill_rows.py). The same stages as decode (kernels/qk_stages.py,
kernels/pv_stages.py, kernels/v_loads.py), composed differently:

  Q       `quantize_rows`: the workgroup's 64 rows into LDS once, in the MMA's
          register order; each wave keeps its A fragments in registers, or reads
          them in every tile (`TargetSpec.prefill_q_per_tile`) (`q_operands`)
  loop over the tiles the block's last row can see (later tiles are never
  computed; the causal limit of a row is S - Sq + its token), in two loops: the
  tiles the block's first row sees whole build no mask at all, the rest mask:
    QK    `qk` on the tile: scores in the C layout, -inf past each row's
          causal limit (`contract.causal_visible`)
    online softmax   `online_softmax`: per row m' = max(m, tile max),
          guarded alpha, p = exp(s - m'), l' = alpha l + sum p (a lane's own
          tokens; the row's lanes add theirs after the loop), W = p * sV
    PV    `pv_stage` as in decode, its chain starting from alpha o:
          o' = alpha o + sum_g sW acc_g, one FMA per group
  O = o / l, stored for the real rows.

Where the target copies into LDS asynchronously (cuda), the loops read K, V and the
scales from a two-stage ring in LDS (kv_ring.KVRing): the workgroup copies the next
tile while it computes this one, so the waves share one copy of each tile and no lane
holds registers for loads in flight.

Over the paged cache (chunked prefill: q [B, Hq, Sq, D], each sequence's last
Sq tokens) the same kernel reads its tiles through the block table and takes
the history len_b - Sq of its sequence at run time (kv_access.PagedPrefillKV).
The BF16-PV twin differs only in PV, as for decode.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, memref, scf

from ..contract import scalar_ir as contract
from ..contract.numerics import Numerics
from ..fragments import NUMPY_OPS, ceil_div
from .abi import DENSE_INPUTS, PAGED_INPUTS, Buffer, KernelABI
from .decode import check_head_dim, stage_plan
from .executable import build_kernel
from .kv_access import KVView, PagedPrefillKV, PrefillKV
from .kv_ring import KVRing
from .lanes import Lanes, binding, workgroup_id
from .prefill_rows import PrefillRows, q_source, tile_bounds
from .pv_stages import check_w_chain, pv_stage
from .qk_stages import across_row, online_softmax, q_operands, qk, quantize_rows
from .shapes import PagedPrefillShape, PrefillShape
from .stage_plan import StagePlan, VSource, class_of
from .target_spec import TargetSpec
from .v_loads import v_tiles

PREFILL_KERNEL = "prefill_attention"


@dataclass(frozen=True)
class PrefillKernel:
    """The prefill kernel's configuration; `build` composes the stages."""

    access: PrefillKV | PagedPrefillKV
    spec: TargetSpec
    numerics: Numerics
    pv: str
    pv_atom: str | None = None
    feed_w: bool = True
    w_chain: int = 1

    @property
    def threads(self) -> int:
        return self.spec.model.waves_per_partition * self.spec.wave_size

    @property
    def rows_per_workgroup(self) -> int:
        return self.spec.tile_rows * self.spec.model.waves_per_partition

    def build(self, args) -> None:
        lanes = Lanes(self.threads, self.spec.wave_size)
        b, h, block = workgroup_id(2), workgroup_id(1), workgroup_id(0)
        kv, (out_arg,) = self.access.bind(lanes, args, (b, h))
        s = self.access.shape
        # Every row of a wave's tile is a query row (but in the last block), so no
        # C slot is dead, unsigned W takes its column sums from one more MMAC, and W
        # can go from QK's C registers straight into PV's A operand.
        plan = stage_plan(lanes, self.spec, s, self.numerics, self.pv, self.spec.tile_rows,
                          self.pv_atom, feed_w=self.feed_w, a_register_order=True,
                          join_digits_in_i32=self.spec.prefill_digits_join_i32,
                          w_chain=self.w_chain)
        out = binding(out_arg, (kv.batch, s.q_heads, s.query_tokens, s.head_dim), "f32",
                      lanes.index(0))
        rows = PrefillRows(plan, s, block, self.rows_per_workgroup)
        staged_q = quantize_rows(plan, kv.q, rows.rows, lambda row: q_source(rows, kv, row))
        wave_row = lambda row: lanes.affine((lanes.wave, plan.tile_rows), (row, 1))
        if self.spec.prefill_q_per_tile:
            operands = lambda: q_operands(plan, staged_q, wave_row)
        else:
            fixed = q_operands(plan, staged_q, wave_row)
            operands = lambda: fixed
        classes = plan.row_classes()
        query_tokens = [rows.token_and_head(rows.packed(lanes.of_lane(plan.row_map(c[0])),
                                                        lanes.wave))[0] for c in classes]
        o, partial_l = _tile_loop(plan, kv, rows, operands, classes, query_tokens)
        l = [across_row(plan, x, arith.addf) for x in partial_l]     # the lanes' partials
        _store(plan, rows, kv, o, l, classes, out)


def _per_pv_slot(plan: StagePlan, values: list, classes, slots) -> dict:
    """{PV C slot: the value (alpha, l) of the row it holds}, from the score row
    class holding that row in the same lane; where PV's C layout puts rows in other
    lanes than QK's (another PV atom), through LDS [wave, tile row]."""
    lanes = plan.lanes
    found = {}
    for i in slots:
        row = plan.pv_layout.c_row(i)
        match = [c for c, members in enumerate(classes) if plan.row_map(members[0]) == row]
        if not match:
            break
        found[i] = values[match[0]]
    else:
        return found
    lds = lanes.shared([plan.waves, plan.tile_rows], "f32")
    for value, members in zip(values, classes):
        memref.store(value, lds, [lanes.wave, lanes.of_lane(plan.row_map(members[0]))])
    lanes.barrier()
    return {i: memref.load(lds, [lanes.wave, lanes.of_lane(plan.pv_layout.c_row(i))])
            for i in slots}


def _tile_loop(plan: StagePlan, kv: KVView, rows: PrefillRows, operands, classes, query_tokens):
    """Two scf.for over the visible tiles carrying (m, l) per row class and o per PV C
    element: the tiles every row sees whole, unmasked, then the rest under the causal
    mask; returns (o [tile][slot], each lane's partial l per class)."""
    lanes = plan.lanes
    tiles = plan.head_dim // plan.pv_layout.instruction.n
    slots = plan.pv_live_slots()
    count = len(classes)
    carried = ([lanes.f32(float("-inf"))] * count + [lanes.f32(0.0)] * count
               + [lanes.f32(0.0)] * (tiles * len(slots)))
    whole, seen = tile_bounds(plan, rows, kv.history)

    def masked(tile_kv):
        def live(element, local):
            key = arith.addi(tile_kv.first, local)
            return contract.causal_visible(key, query_tokens[class_of(classes, element)],
                                           kv.history, lanes.index)
        return live

    unmasked = lambda tile_kv: None
    tile_of = lambda tile: kv.at(lanes.affine((tile, plan.model.wave_tokens)))
    ring = _ring(plan, kv)
    if ring is not None:
        ring.start(tile_of)
    for lower, upper, mask in ((lanes.index(0), whole, unmasked), (whole, seen, masked)):
        loop = lanes.loop(lower, upper, carried)
        with ir.InsertionPoint(loop.body):
            tile = loop.induction_variable
            tile_kv = reads = tile_of(tile)
            issue = lambda: None
            if ring is not None:
                reads, issue = ring.turn(tile_of, tile, seen)
            carried_out, group = _tile_step(plan, reads, operands, list(loop.inner_iter_args),
                                            classes, mask(tile_kv), issue)
            if group is not None:
                lanes.async_wait(group)
            scf.YieldOp(carried_out)
        carried = list(loop.results)
    o_flat = carried[2 * count:]
    o = [{i: o_flat[tile * len(slots) + u] for u, i in enumerate(slots)}
         for tile in range(tiles)]
    return o, carried[count:2 * count]


def _ring(plan: StagePlan, kv: KVView) -> KVRing | None:
    """The K/V ring in LDS where the target stages the prefill's tiles
    (`TargetSpec.prefill_kv_ring`), the copies split linearly over the threads and
    the ring fits the target's LDS budget; else None (loads from the cache)."""
    spec, lanes, tokens = plan.spec, plan.lanes, plan.model.wave_tokens
    if not spec.prefill_kv_ring or KVRing.lds_bytes(tokens, plan.head_dim) > spec.ring_lds_bytes:
        return None
    try:
        KVRing.copies(tokens, plan.head_dim, lanes.threads)
    except ValueError:
        return None
    return KVRing.allocate(lanes, plan.layout, plan.head_dim)


def _tile_step(plan: StagePlan, tile_kv: KVView, operands, carried, classes, live,
               after_qk) -> tuple[list, object]:
    """One tile (QK, the online softmax, PV) under the mask `live`, its K and V read
    through `tile_kv` (the cache's tile, or its staged copy) and Q's operands from
    `operands()` (held in registers, or read from LDS in the tile), `after_qk()`
    built between QK and the softmax (the ring's copies of the next tile); returns
    (the carried (m, l, o) after it, what `after_qk()` returned)."""
    lanes = plan.lanes
    slots = plan.pv_live_slots()
    count = len(classes)
    m, l, o = carried[:count], carried[count:2 * count], carried[2 * count:]
    wave_token0 = lanes.index(0)        # every wave reads the whole tile
    scores = qk(plan, operands(), tile_kv, wave_token0, live)
    between = after_qk()
    m_new, alpha, l_new, w = online_softmax(plan, scores, m, l, classes)
    # The tile's sums go on from alpha o (the contract's chain, reference.pv_chain).
    start = _rescaled(plan, _per_pv_slot(plan, alpha, classes, slots), o)
    # V loaded per 16-column tile just before its MMACs: fewer live registers (INT8
    # as fast, the BF16 twin faster at 3 workgroups per SM; benchmarks/results/).
    o_new = [regs[i] for regs in pv_stage(plan, w, v_tiles(plan, tile_kv, wave_token0,
                                                           VSource(per_tile=True)), start)
             for i in slots]
    if plan.w_feed is None:     # the next tile's W overwrites the LDS this PV read
        lanes.barrier()
    return m_new + l_new + o_new, between


def _slots_by_row(plan: StagePlan) -> dict:
    """{PV C row (its lane map): the live C slots of a lane that hold it}."""
    by_row = {}
    for i in plan.pv_live_slots():
        by_row.setdefault(plan.pv_layout.c_row(i), []).append(i)
    return by_row


def _rescaled(plan: StagePlan, alpha_of: dict, o: list) -> list[dict]:
    """alpha o per tile and PV C slot, each row's products under a branch on its
    alpha != 1: alpha is exactly 1 wherever the tile leaves the row's max where it was
    (most tiles once a row has seen its largest scores), and 1 * o is o bitwise, so
    the multiplies run only where some lane of the warp needs them. Unordered: a NaN
    alpha still multiplies."""
    slots = plan.pv_live_slots()
    tiles = plan.head_dim // plan.pv_layout.instruction.n
    flat = {(tile, i): o[tile * len(slots) + u] for tile in range(tiles)
            for u, i in enumerate(slots)}
    start = [{} for _ in range(tiles)]
    for members in _slots_by_row(plan).values():
        keys = [(tile, i) for tile in range(tiles) for i in members]
        moved = arith.cmpf(arith.CmpFPredicate.UNE, alpha_of[members[0]], plan.lanes.f32(1.0))
        values = plan.lanes.branch(
            moved, lambda: [arith.mulf(alpha_of[i], flat[tile, i]) for tile, i in keys],
            [flat[key] for key in keys])
        for (tile, i), value in zip(keys, values):
            start[tile][i] = value
    return start


def _store(plan: StagePlan, rows: PrefillRows, kv: KVView, o, l, classes, out) -> None:
    """O = o / l for the real rows, into [B, Hq, Sq, D]."""
    lanes, s = plan.lanes, rows.shape
    inst = plan.pv_layout.instruction
    slots = plan.pv_live_slots()
    l_of = _per_pv_slot(plan, l, classes, slots)
    # Slots of one row: stored under one guard.
    for row, members in _slots_by_row(plan).items():
        packed = rows.packed(lanes.of_lane(row), lanes.wave)
        with lanes.when(rows.real(packed)):
            token, head = rows.token_and_head(packed, clamp=False)
            q_head = lanes.affine((kv.h, s.rows), (head, 1))
            for tile, regs in enumerate(o):
                for i in members:
                    col = lanes.plus(lanes.of_lane(plan.pv_layout.c_col(i)), tile * inst.n)
                    memref.store(arith.divf(regs[i], l_of[i]), out, [kv.b, q_head, token, col])


@dataclass(frozen=True)
class PrefillKernels:
    """The prefill executable, and what the host must pass it."""

    module: ir.Operation
    access: PrefillKV | PagedPrefillKV
    rows_per_workgroup: int
    threads: int = 0

    @property
    def shape(self) -> PrefillShape | PagedPrefillShape:
        return self.access.shape

    @property
    def layout(self) -> dict:
        """What a host (the driver's, the simulator's) needs to call the kernel."""
        return {"kernel": "prefill", "rows_per_workgroup": self.rows_per_workgroup,
                "tile_tokens": self.access.partition_tokens,
                "abi": [a.to_json() for a in self.abi]}

    @property
    def abi(self) -> tuple[KernelABI, ...]:
        """One kernel [row blocks, Hkv, B]: over the dense cache (padded by the host,
        every size static), or a chunked prefill over the pool."""
        s = self.shape
        if isinstance(self.access, PagedPrefillKV):
            out = Buffer("out", ("B", s.q_heads, s.query_tokens, s.head_dim), "f32")
            return (KernelABI(PREFILL_KERNEL, PAGED_INPUTS, (out,), ("B", "NB", "MB"),
                              (self.row_blocks, s.kv_heads, "B"), self.threads),)
        out = Buffer("out", (s.batch, s.q_heads, s.query_tokens, s.head_dim), "f32")
        return (KernelABI(PREFILL_KERNEL, DENSE_INPUTS, (out,), (),
                          (self.row_blocks, s.kv_heads, s.batch), self.threads),)

    @property
    def workgroups(self) -> int | None:
        """The grid's workgroups, where the shape fixes them (not over the pool)."""
        if isinstance(self.access, PagedPrefillKV):
            return None
        s = self.shape
        return self.row_blocks * s.kv_heads * s.batch

    @property
    def row_blocks(self) -> int:
        s = self.shape
        return ceil_div(NUMPY_OPS, s.query_tokens * s.rows, self.rows_per_workgroup)


def check_prefill_shape(shape: PrefillShape | PagedPrefillShape, spec: TargetSpec) -> None:
    check_head_dim(shape, spec)
    if isinstance(shape, PrefillShape) and shape.query_tokens > shape.tokens:
        raise ValueError(f"{shape.query_tokens} query tokens are more than the "
                         f"{shape.tokens} tokens of the sequence they end")


def build_prefill_kernels(shape: PrefillShape | PagedPrefillShape, spec: TargetSpec, *,
                          numerics: Numerics | None = None, pv: str = "int8",
                          pv_atom: str | None = None, feed_w: bool = True,
                          w_chain: int = 1) -> PrefillKernels:
    """A module holding the prefill stream.executable (needs an active context):
    over a dense cache (PrefillShape), or a chunked prefill over the block pool
    (PagedPrefillShape: B, NB, MB and each sequence's length at run time).
    `numerics`, `pv` and `pv_atom` as for `build_decode_kernels`; `feed_w`: W from
    QK's C registers into PV's A operand where the fragment model allows it
    (fragments/score_feed.py), else through LDS; `w_chain` PV MMACs (K-steps) of a
    tile add into one int32 accumulator, their W scale over the chain's tokens
    (`FragmentModel.chained`)."""
    check_prefill_shape(shape, spec)
    model = spec.model
    numerics = spec.resolve_numerics(numerics, shape.head_dim)
    check_w_chain(spec.pv_model(pv, pv_atom), numerics, pv, w_chain)
    if isinstance(shape, PagedPrefillShape):
        access = PagedPrefillKV(shape, model.wave_tokens, model.v_load.bytes_per_lane)
    else:
        access = PrefillKV(shape, model.wave_tokens)
    kernel = PrefillKernel(access, spec, numerics, pv, pv_atom, feed_w, w_chain)
    module = ir.Module.create()
    built = PrefillKernels(module.operation, access, kernel.rows_per_workgroup, kernel.threads)
    with ir.InsertionPoint(module.body):
        build_kernel(built.abi[0], kernel.build, spec.wave_size,
                     spec.prefill_attributes(built.workgroups))
    return built
