"""The lane-level prefill kernel: FlashAttention with INT8 QK and INT8 PV.

One workgroup of 4 waves per (block of 64 query rows, KV head, sequence).
A query row is a (token, head) pair of the KV head's GQA group, packed
token-major into the MMA's M: row r of the KV head is query token r // G,
head r % G, so one K/V tile serves every head of the group. Each wave owns
16 rows and walks the KV tiles of 64 tokens (the fragment model's wave
tokens, which is also the contract's prefill tile):

  Q       the workgroup's 64 rows quantized per row (the contract's quantize)
          into LDS once; each wave keeps its A fragments in registers
  loop over the tiles the block's last row can see (later tiles are never
  computed; the causal limit of a row is S - Sq + its token):
    QK    the decode kernel's QK on the tile: scores in the C layout, -inf
          past each row's causal limit
    online softmax   per row: tile max (in-lane, xor shuffles), m' = max(m, .),
          guarded alpha = exp(m - m') (1 while m' = -inf), p = exp(s - m'),
          l' = alpha l + sum p
    W     p * sV, quantized per (row, MMAC group) as in decode (the groups of
          the fragment model's V-load scheme), PV on the INT8 instruction,
          o' = alpha o + sum_g sW acc_g
  O = o / l, stored for the real rows.

Over the paged cache (chunked prefill: q [B, Hq, Sq, D], each sequence's last
Sq tokens) the same kernel reads its tiles through the block table and takes
the history len_b - Sq of its sequence at run time (kv_access.PagedPrefillKV).
The BF16-PV twin differs only in PV, as for decode. The per-wave stages
(QK, quantize, PV) are the decode kernel's (kernels/decode.py); only the
rows, the causal mask and the loop are this file's.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, math, memref, scf

from int8attn.fragments import FragmentModel
from int8attn.kernels.decode import ROWS, DecodeTuning, PartitionKernel, check_head_dim
from int8attn.kernels.abi import PAGED_INPUTS, Buffer, KernelABI
from int8attn.kernels.executable import build_executable
from int8attn.kernels.kv_access import (PagedPrefillKV, PagedPrefillShape, PrefillKV,
                                        PrefillShape)
from int8attn.kernels.lanes import Lanes, binding, workgroup_id
from int8attn.contract import scalar_ir as contract

PREFILL_KERNEL = "prefill_attention"


class _PrefillKernel(PartitionKernel):
    """Builds the prefill kernel body on the decode kernel's per-wave stages."""

    def __init__(self, access: PrefillKV | PagedPrefillKV, model: FragmentModel, target: str, pv: str = "int8",
                 q_terms: int = 1, w_quant: str = "s8"):
        # No occupancy hint: the kernel carries o, m and l across the tile loop.
        super().__init__(access, model, target, pv, DecodeTuning(), q_terms, w_quant)
        self.q_tile_rows = ROWS * self.waves

    def tile_rows_out(self) -> int:
        # Every row of a wave's tile is a query row (but in the last block), so no
        # C slot is dead and unsigned W takes its column sums from one more MMAC.
        return ROWS

    @property
    def rows_per_workgroup(self) -> int:
        return self.q_tile_rows

    def argument_types(self):
        return self.access.argument_types(outputs=1)

    def build(self, args):
        lanes = self.lanes = Lanes(self.threads, self.instruction.wave_size)
        b, h, block = workgroup_id(2), workgroup_id(1), workgroup_id(0)
        self.where, self.block = (b, h), block
        (out_arg,) = self.access.bind(lanes, args, (b, h))
        s = self.shape
        out = binding(out_arg, (self.access.batch, s.q_heads, s.query_tokens, s.head_dim),
                      "f32", lanes.index(0))
        self.wave_token0 = lanes.index(0)        # every wave reads the whole tile
        self.q_fragments = self.quantize_q()
        a_steps = self.q_operands()
        row_classes = self._classes = self._live_classes(self.layout.element_rows())
        self.history = self.access.history     # S - Sq: an int, or a sequence's own
        self.query_tokens = [self._query_token(self._row_map(members[0]))
                             for members in row_classes]
        o, l = self.tile_loop(a_steps, row_classes)
        self.store(o, l, row_classes, out)

    # rows --------------------------------------------------------------------
    def _block_row(self, row):
        """Row of the KV head's packed (token, head) rows of MMA row `row` of the wave."""
        lanes = self.lanes
        return lanes.affine((self.block, self.q_tile_rows), (lanes.wave, ROWS), (row, 1))

    def _token_and_head(self, packed):
        """(query token, head in the group) of a packed row: token-major order."""
        g = self.lanes.index(self.shape.rows)
        return arith.divui(packed, g), arith.remui(packed, g)

    def _real(self, packed):
        s = self.shape
        return arith.cmpi(arith.CmpIPredicate.ult, packed,
                          self.lanes.index(s.query_tokens * s.rows))

    def _clamped_token_and_head(self, packed):
        """(token, head) of a packed row; a padding row past the last real one
        takes the last one's (it reads real q and keys, and is never stored)."""
        s = self.shape
        last = self.lanes.index(s.query_tokens * s.rows - 1)
        return self._token_and_head(arith.minui(packed, last))

    def q_source(self, row):
        lanes, s = self.lanes, self.shape
        b, h = self.where
        packed = lanes.affine((self.block, self.q_tile_rows), (row, 1))
        token, head = self._clamped_token_and_head(packed)
        return self._real(packed), [b, lanes.affine((h, s.rows), (head, 1)), token]

    def wave_q_row(self, row):
        return self.lanes.affine((self.lanes.wave, ROWS), (row, 1))

    def _query_token(self, row_map):
        """Query token of the lane's row of `row_map`."""
        token, _ = self._clamped_token_and_head(self._block_row(self.lanes.of_lane(row_map)))
        return token

    def token_live(self, element, local):
        key = arith.addi(self.access.first, local)
        query_token = self.query_tokens[self._class_of(self._classes, element)]
        return contract.causal_visible(key, query_token, self.history, self.lanes.index)

    # the tile loop -----------------------------------------------------------
    def tile_count(self):
        """Tiles up to the last key the block's last real row sees (history + its
        token: the causal rule of `contract.causal_visible`)."""
        lanes = self.lanes
        token, _ = self._clamped_token_and_head(
            lanes.affine((self.block, self.q_tile_rows), self.q_tile_rows - 1))
        last_key = (lanes.plus(token, self.history) if isinstance(self.history, int)
                    else arith.addi(token, self.history))
        seen = lanes.plus(last_key, 1)
        tile = self.model.wave_tokens
        return arith.divui(lanes.plus(seen, tile - 1), lanes.index(tile))

    def tile_loop(self, a_steps, row_classes):
        """scf.for over the visible tiles carrying (m, l) per row class and o per
        PV C element; returns (o [tile][slot], l per class)."""
        lanes = self.lanes
        pv_inst = self.pv_layout.instruction
        tiles = self.shape.head_dim // pv_inst.n
        slots = self._live_slots(self.pv_dead)
        alpha_class = self._pv_row_classes(row_classes, slots)
        classes = len(row_classes)
        start = ([lanes.f32(float("-inf"))] * classes + [lanes.f32(0.0)] * classes
                 + [lanes.f32(0.0)] * (tiles * len(slots)))
        loop = lanes.loop(lanes.index(0), self.tile_count(), start)
        with ir.InsertionPoint(loop.body):
            carried = list(loop.inner_iter_args)
            m, l, o = carried[:classes], carried[classes:2 * classes], carried[2 * classes:]
            self.access.first = lanes.affine((loop.induction_variable, self.model.wave_tokens))
            scores = self.qk(a_steps)
            m_new, alpha, l_new, w = self.online_softmax(scores, m, l, row_classes)
            if self.pv_kind == "int8":
                tile_o = self.pv(*self.quantize(w))
            else:
                tile_o = self.pv_bf16(self.stage_bf16(w))
            o_new = []
            for tile in range(tiles):
                for u, i in enumerate(slots):
                    previous = o[tile * len(slots) + u]
                    o_new.append(arith.addf(arith.mulf(alpha[alpha_class[i]], previous),
                                            tile_o[tile][i]))
            # The next tile's W overwrites the LDS this tile's PV read.
            lanes.barrier()
            scf.YieldOp(m_new + l_new + o_new)
        results = list(loop.results)
        l = results[classes:2 * classes]
        o_flat = results[2 * classes:]
        o = [{i: o_flat[tile * len(slots) + u] for u, i in enumerate(slots)}
             for tile in range(tiles)]
        return o, l

    def _pv_row_classes(self, row_classes, slots):
        """{PV C slot: the score row class holding its row on every lane}."""
        found = {}
        for i in slots:
            row = self.pv_layout.c_row(i)
            match = [c for c, members in enumerate(row_classes)
                     if self._row_map(members[0]) == row]
            if not match:
                raise ValueError("a PV output row is not a row of the lane's scores")
            found[i] = match[0]
        return found

    def online_softmax(self, scores, m, l, row_classes):
        """(m', alpha, l', W) of one tile: the contract's guarded online softmax."""
        lanes = self.lanes
        offsets = self.layout.row_max_offsets()
        m_new, alpha, l_new = [], [], []
        p = {}
        for c, members in enumerate(row_classes):
            tile_max = scores[members[0]]
            for e in members[1:]:
                tile_max = arith.maximumf(tile_max, scores[e])
            tile_max = lanes.xor_reduce(tile_max, offsets, arith.maximumf)
            running = arith.maximumf(m[c], tile_max)
            dead = arith.cmpf(arith.CmpFPredicate.OEQ, running, lanes.f32(float("-inf")))
            alpha.append(arith.select(dead, lanes.f32(1.0),
                                      math.exp(arith.subf(m[c], running))))
            total = None
            for e in members:
                p[e] = arith.select(self.live[e], math.exp(arith.subf(scores[e], running)),
                                    lanes.f32(0.0))
                total = p[e] if total is None else arith.addf(total, p[e])
            total = lanes.xor_reduce(total, offsets, arith.addf)
            m_new.append(running)
            l_new.append(arith.addf(arith.mulf(alpha[c], l[c]), total))
        w = {e: arith.select(self.live[e], arith.mulf(value, self.v_scales[e]), lanes.f32(0.0))
             for e, value in p.items()}
        return m_new, alpha, l_new, w

    def store(self, o, l, row_classes, out):
        """O = o / l for the real rows, into [B, Hq, Sq, D]."""
        lanes, s = self.lanes, self.shape
        b, h = self.where
        inst = self.pv_layout.instruction
        slots = self._live_slots(self.pv_dead)
        alpha_class = self._pv_row_classes(row_classes, slots)
        for c in range(len(row_classes)):
            members = [i for i in slots if alpha_class[i] == c]
            if not members:
                continue
            packed = self._block_row(lanes.of_lane(self.pv_layout.c_row(members[0])))
            with lanes.when(self._real(packed)):
                token, head = self._token_and_head(packed)
                q_head = lanes.affine((h, s.rows), (head, 1))
                for tile, regs in enumerate(o):
                    for i in members:
                        col = lanes.plus(lanes.of_lane(self.pv_layout.c_col(i)), tile * inst.n)
                        memref.store(arith.divf(regs[i], l[c]), out, [b, q_head, token, col])


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
        """The chunked prefill over the pool: one kernel [row blocks, Hkv, B]."""
        if not isinstance(self.access, PagedPrefillKV):
            return ()
        s = self.shape
        out = Buffer("out", ("B", s.q_heads, s.query_tokens, s.head_dim), "f32")
        return (KernelABI(PREFILL_KERNEL, PAGED_INPUTS, (out,), ("B", "NB", "MB"),
                          (self.row_blocks, s.kv_heads, "B"), self.threads),)

    @property
    def row_blocks(self) -> int:
        s = self.shape
        return -(-s.query_tokens * s.rows // self.rows_per_workgroup)


def check_prefill_shape(shape: PrefillShape | PagedPrefillShape, model: FragmentModel) -> None:
    check_head_dim(shape, model)
    if isinstance(shape, PrefillShape) and shape.query_tokens > shape.tokens:
        raise ValueError(f"{shape.query_tokens} query tokens are more than the "
                         f"{shape.tokens} tokens of the sequence they end")


def build_prefill_kernels(shape: PrefillShape | PagedPrefillShape, model: FragmentModel,
                          target: str, pv: str = "int8", q_terms: int = 1,
                          w_quant: str = "s8") -> PrefillKernels:
    """A module holding the prefill stream.executable (needs an active context):
    over a dense cache (PrefillShape), or a chunked prefill over the block pool
    (PagedPrefillShape: B, NB, MB and each sequence's length at run time)."""
    check_prefill_shape(shape, model)
    if isinstance(shape, PagedPrefillShape):
        access = PagedPrefillKV(shape, model.wave_tokens, model.v_load.bytes_per_lane)
    else:
        access = PrefillKV(shape, model.wave_tokens)
    kernel = _PrefillKernel(access, model, target, pv, q_terms, w_quant)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        build_executable(PREFILL_KERNEL, kernel.argument_types(), 3, kernel.build,
                         kernel.threads, model.instruction.wave_size)
    return PrefillKernels(module.operation, access, kernel.rows_per_workgroup, kernel.threads)
