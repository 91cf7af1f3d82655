"""The lane-level decode kernels (vLLM's ll4mi structure, as the seed modified it).

Partition kernel, one workgroup of 4 waves per (partition, KV head, sequence),
64 tokens per wave:

  Q       the KV head's query rows (GQA heads, zero-padded to 16) quantized
          per row in the workgroup (the contract's quantize), Qq and sQ to LDS
  QK      Qq as A (one fragment per K step, loaded once), K as B: scores in
          the C layout, -inf past the sequence's length
  softmax partition max and sum: in-lane, xor shuffles, then across waves via LDS
  W       P * sV in registers (0 for dead tokens)
  quant   per (row, MMAC) absmax: in-lane over the lane's elements of a group,
          xor shuffles over lanes that share (row, group); Wq to LDS
  PV      Wq read back in the A layout; V loaded 16 bytes per lane from the
          token-innermost cache; one MMAC per (group, 16 head-dim columns);
          rescale by sW; the partition's output rows, max and sum
Merge kernel, `merge_chunks` workgroups per (KV head, sequence), each over a
slice of the head dim: each row's max over the sequence's own partitions, then
the weighted sum of the partial outputs.

Every lane index, shuffle offset and LDS offset comes from the target's
`DecodeKernelLayout` (int8attn.fragments); swapping the model swaps the kernel.
Where a token's K/V live (dense, or paged through a block table) is the
access object's business (kernels/kv_access.py); the kernels are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import arith, math, memref, scf, vector

from int8attn.fragments import (DecodeKernelLayout, FragmentModel, bf16_pv_model,
                                element_classes, thread_distribution, thread_groups,
                                thread_runs, xor_reduction_offsets)
from int8attn.kernels.abi import PAGED_INPUTS, Buffer, KernelABI
from int8attn.kernels.executable import build_executable
from int8attn.kernels.kv_access import DenseKV, PagedKV
from int8attn.kernels.lanes import (Lanes, binding, c_element, load_vector, mma, vector_type,
                                    workgroup_id)
from int8attn.contract import scalar_ir as contract

ROWS = 16  # MMAC M: query rows of a tile (GQA heads, zero-padded)

PARTITION_KERNEL = "decode_partition"
MERGE_KERNEL = "decode_merge"


@dataclass(frozen=True)
class DecodeTuning:
    """Schedule choices of the partition kernel that do not change its results."""

    v_early: bool = False    # issue the V loads right after QK, before the softmax
    v_per_tile: bool = False  # load V for one 16-column tile just before its MMACs
    # Copy the partition's V into LDS asynchronously before QK (cuda: cp.async), so
    # that it streams in during QK and the softmax without holding registers; PV
    # reads it from LDS.
    v_async: bool = False
    # Ask the backend to fit this many workgroups per SM / CU (it caps the registers
    # per thread accordingly); 0 leaves the choice to it.
    workgroups_per_sm: int = 0
    merge_unroll: int = 8     # partitions each merge thread loads per loop iteration
    merge_splits: int = 1     # thread groups of the merge, each over every splits-th partition
    merge_chunks: int = 1     # merge workgroups per (KV head, sequence), each D / chunks columns

    def kernel_attributes(self, target: str) -> dict[str, str]:
        if not self.workgroups_per_sm:
            return {}
        if target not in OCCUPANCY_ATTRIBUTE:
            raise ValueError(f"--target {target} has no occupancy hint for the kernel")
        return {OCCUPANCY_ATTRIBUTE[target]: f"{self.workgroups_per_sm} : i32"}


# How a target's backend is told the workgroups per SM to fit (NVPTX: .minnctapersm).
OCCUPANCY_ATTRIBUTE = {"cuda": "nvvm.minctasm"}

# Targets with an asynchronous global -> LDS copy (`DecodeTuning.v_async`).
ASYNC_COPY_TARGETS = ("cuda",)

# The schedule each target's kernels get unless the caller chooses one: measured
# on the H200 (benchmarks/results-h200-paged.md); the AMD targets take the
# target-independent choices only (nothing there is measured on hardware).
DEFAULT_TUNING = {
    "cuda": DecodeTuning(workgroups_per_sm=6, merge_chunks=4, merge_splits=16, merge_unroll=2),
    "gfx942": DecodeTuning(merge_splits=4),
    "gfx936": DecodeTuning(merge_splits=4),
}

# Workgroups per SM the cuda partition kernel asks for, by head dim: a lane's V
# loads and output accumulators grow with D, so fewer workgroups fit without
# spilling. (largest head dim, workgroups per SM), first match; measured on the
# H200 (benchmarks/results-h200-paged.md); above the last row, its value.
OCCUPANCY_BY_HEAD_DIM = {"cuda": ((64, 7), (128, 6), (256, 4))}


def default_tuning(target: str, head_dim: int) -> DecodeTuning:
    """The target's measured schedule for a head dim of `head_dim`."""
    tuning = DEFAULT_TUNING.get(target, DecodeTuning())
    table = OCCUPANCY_BY_HEAD_DIM.get(target)
    if not table:
        return tuning
    fits = next((wps for bound, wps in table if head_dim <= bound), table[-1][1])
    return replace(tuning, workgroups_per_sm=fits)


def output_rows(rows: int, head_dim: int, threads: int) -> int:
    """Rows of the partial outputs: the real query rows, rounded up until the
    rows x head_dim tile splits evenly over the workgroup's threads."""
    return next(r for r in range(rows, ROWS + 1) if r * head_dim % threads == 0)


class PartitionKernel:
    """Builds the partition kernel body; one method per stage of the docstring.

    Its per-wave stages (QK, W quantization, PV) serve the prefill kernel too
    (kernels/prefill.py), which overrides the hooks: which query rows are staged
    (`q_tile_rows`, `q_source`, `wave_q_row`), which tokens count (`token_live`)
    and how many tile rows hold query rows (`tile_rows_out`)."""

    def __init__(self, access, model: FragmentModel, target: str, pv: str = "int8",
                 tuning: "DecodeTuning | None" = None, q_terms: int = 1, w_quant: str = "s8"):
        self.access = access
        self.q_terms, self.unsigned = q_terms, w_quant == "u8"
        self.tuning = tuning or DecodeTuning()
        if self.tuning.v_async and target not in ASYNC_COPY_TARGETS:
            raise ValueError(f"--target {target} has no asynchronous copy into LDS for the "
                             f"V stage (v_async; targets with one: {', '.join(ASYNC_COPY_TARGETS)})")
        self.v_loaded = self.v_staged = None
        self.shape = access.shape
        self.model = model
        self.pv_kind = pv
        self.layout = DecodeKernelLayout(model)
        # PV's instruction: the same as QK's for INT8 PV, the bf16 one for the baseline.
        self.pv_layout = self.layout if pv == "int8" else DecodeKernelLayout(bf16_pv_model(target))
        self.instruction = model.instruction
        self.target = target
        self.waves = model.waves_per_partition
        self.threads = self.waves * self.instruction.wave_size
        self.rows_out = self.tile_rows_out()
        # C registers that hold padding rows on every lane are never computed.
        self.dead = set(self.layout.dead_c_slots(self.rows_out))
        self.pv_dead = set(self.pv_layout.dead_c_slots(self.rows_out))
        # Unsigned W: where each live C element finds sum Vq (a ones row of A), or
        # None for one more MMAC with A all ones.
        self.column_sums = self.layout.column_sum_slots(self.rows_out) if self.unsigned else None

    def tile_rows_out(self) -> int:
        """Rows of a wave's MMA tile that hold query rows (the rest is padding)."""
        return output_rows(self.shape.rows, self.shape.head_dim, self.threads)

    def argument_types(self):
        return self.access.argument_types(outputs=3)

    def build(self, args):
        lanes = self.lanes = Lanes(self.threads, self.instruction.wave_size)
        b, h, p = workgroup_id(2), workgroup_id(1), workgroup_id(0)
        self.where = (b, h)
        outputs = self.access.bind(lanes, args, (b, h, p))
        guard = self.access.guard()
        if guard is None:
            self.body(outputs, p)
        else:
            with lanes.when(guard):
                self.body(outputs, p)

    def body(self, outputs, p):
        lanes, access, d = self.lanes, self.access, self.shape.head_dim
        b, h = self.where
        zero = lanes.index(0)
        batch, parts = access.batch, access.partition_count
        kv = (batch, self.shape.kv_heads, parts)
        out_o = binding(outputs[0], kv + (self.rows_out, d), "f32", zero)
        out_m = binding(outputs[1], kv + (ROWS,), "f32", zero)
        out_l = binding(outputs[2], kv + (ROWS,), "f32", zero)
        self.wave_token0 = lanes.affine((lanes.wave, self.model.wave_tokens))
        access.stage()                    # published by quantize_q's barrier
        self.q_fragments = self.quantize_q()
        if self.tuning.v_async:
            self.v_staged = self._stage_v(self.pv_layout)
        scores = self.qk(self.q_operands())
        if self.tuning.v_early:
            self.v_loaded = self._v_loads(self.pv_layout)
        row_classes = self._live_classes(self.layout.element_rows())
        m = self.wave_reduce(scores, row_classes, "max")
        e = {i: math.exp(arith.subf(x, m[self._class_of(row_classes, i)]))
             for i, x in scores.items()}
        l = self.wave_reduce(e, row_classes, "sum")
        w = self.weights(e, l, row_classes)
        if self.pv_kind == "int8":
            o = self.pv(*self.quantize(w))
        else:
            o = self.pv_bf16(self.stage_bf16(w))
        self.store_partition(o, out_o, p)
        for values, out in ((m, out_m), (l, out_l)):
            for c, members in enumerate(row_classes):
                row = lanes.of_lane(self._row_map(members[0]))
                memref.store(values[c], out, [b, h, p, row])

    # helpers -----------------------------------------------------------------
    @staticmethod
    def _class_of(classes, element):
        return next(c for c, members in enumerate(classes) if element in members)

    def _live_slots(self, dead):
        return [i for i in range(self.instruction.c.slots) if i not in dead]

    def _live_classes(self, keys):
        """Element classes with equal keys on every lane, padding-row classes left out."""
        slots = self.instruction.c.slots
        return [c for c in element_classes(keys) if c[0] % slots not in self.dead]

    def _row_map(self, element):
        return self.layout.c_row(element % self.instruction.c.slots)

    def _token_in_wave(self, element):
        n, i = divmod(element, self.instruction.c.slots)
        return self.layout.c_col(i).shifted(n * self.instruction.n)

    # stages --------------------------------------------------------------------
    def quantize_q(self):
        """The workgroup's query rows, quantized per row (the contract's rule) into
        LDS: per term, Qq [rows, D] i8 and sQ [rows] f32, rows past the real ones
        zero. The second term (`q_terms=2`) quantizes the residual fma(-Qq1, s1, q)."""
        lanes, s = self.lanes, self.shape
        rows = self.q_tile_rows
        _, slots = thread_distribution(rows, s.head_dim, self.threads)
        row_map = slots[0][0]
        offsets = xor_reduction_offsets(row_map(range(self.threads))[:, None])
        row = lanes.of_lane(row_map, of=lanes.thread)
        real, q_index = self.q_source(row)
        c = contract.quantize_constants(lanes.f32)
        cols = [lanes.of_lane(col_map, of=lanes.thread) for _, col_map in slots]
        values = [arith.select(real, memref.load(self.access.q, q_index + [col]), c.zero)
                  for col in cols]
        terms = []
        for term in range(self.q_terms):
            qq_lds = lanes.shared([rows, s.head_dim], "i8")
            sq_lds = lanes.shared([rows], "f32")
            amax = c.zero
            for x in values:
                amax = contract.absmax_step(amax, x)
            amax = lanes.xor_reduce(amax, offsets, contract.absmax_merge)
            inverse = contract.quantize_inverse(amax, c)
            scale = contract.quantize_scale(amax, c)
            quantized = [contract.quantize_value(x, inverse, c) for x in values]
            for qv, col in zip(quantized, cols):
                memref.store(qv, qq_lds, [row, col])
            memref.store(scale, sq_lds, [row])
            terms.append((qq_lds, sq_lds))
            values = [contract.q_residual(x, qv, scale) for x, qv in zip(values, quantized)]
        lanes.barrier()
        return terms

    # The query rows of the workgroup: decode stages the KV head's 16-row tile once
    # and every wave reads all of it.
    q_tile_rows = ROWS

    def q_source(self, row):
        """(is `row` a real query row, its q indices but the head dim)."""
        lanes, s = self.lanes, self.shape
        b, h = self.where
        real = arith.cmpi(arith.CmpIPredicate.ult, row, lanes.index(s.rows))
        q_row = lanes.affine((h, s.rows), (arith.minui(row, lanes.index(s.rows - 1)), 1))
        return real, [b, q_row]

    def wave_q_row(self, row):
        """The staged Q row of the wave's MMA row `row`."""
        return row

    def token_live(self, element, local):
        """Does score element `element` (token `local` of the partition) count?"""
        return arith.cmpi(arith.CmpIPredicate.slt, local, self.access.remaining)

    def q_operands(self):
        """The Q fragment of each term and K step (A, in the layout's head-dim
        order), loaded once for all token blocks; likewise sQ of the rows the
        lane's C elements hold (`self.sq_of_row[(term, row map)]`)."""
        lanes, inst, layout = self.lanes, self.instruction, self.layout
        d = self.shape.head_dim
        self.sq_of_row = {}
        for term, (_, sq) in enumerate(self.q_fragments):
            for i in self._live_slots(self.dead):
                key = (term, layout.c_row(i))
                if key not in self.sq_of_row:
                    row = self.wave_q_row(lanes.of_lane(key[1]))
                    self.sq_of_row[key] = memref.load(sq, [row])
        return [[lanes.assemble([load_vector(qq, [self.wave_q_row(lanes.of_lane(row)),
                                                  lanes.of_lane(dim)], length, "i8")
                                 for row, dim, length in layout.qk_a_runs(d, step)],
                                inst.a_vector) for step in range(d // inst.k)]
                for qq, _ in self.q_fragments]

    def qk(self, a_steps):
        """Scores {element: f32} of the lane's live C elements, -inf past the length.

        K and Q are read in the layout's lane-contiguous head-dim order: each
        lane loads its token's run of K bytes once (the layout's loads) and
        slices every step's B operand out of it."""
        lanes, inst, access, layout = self.lanes, self.instruction, self.access, self.layout
        d = self.shape.head_dim
        steps = range(d // inst.k)
        k_loads = [lanes.of_lane(first) for first in layout.qk_b_loads(d)]
        width = layout.qk_b_width(d)
        b_runs = [[layout.qk_b_slots(d, step)[first] for first, _ in inst.b.runs(axis=0)]
                  for step in steps]
        b_lengths = [length for _, length in inst.b.runs(axis=0)]
        b_col = lanes.of_lane(layout.b_col())
        scores, self.live, self.v_scales = {}, {}, {}
        for n in range(layout.blocks):
            k_row = access.token_row(lanes.affine((self.wave_token0, 1), (b_col, 1), n * inst.n))
            loads = [load_vector(access.k, k_row + [first], width, "i8") for first in k_loads]
            # The block's K and V scales, issued with its K bytes (not after the MMAs,
            # nor the V scales after the softmax's barriers).
            elements = [n * inst.c.slots + i for i in self._live_slots(self.dead)]
            rows = {e: access.token_row(self._local_token(e)) for e in elements}
            k_scales = {e: memref.load(access.k_scale, rows[e]) for e in elements}
            self.v_scales.update({e: memref.load(access.v_scale, rows[e]) for e in elements})
            accs = [lanes.zeros(inst.c_vector, "i32") for _ in a_steps]
            for step in steps:
                pieces = []
                for offset, length in zip(b_runs[step], b_lengths):
                    load, start = divmod(offset, width)
                    if start + length > width:
                        raise ValueError("a B run straddles two K loads")
                    pieces.append(vector.extract_strided_slice(
                        vector_type(length, "i8"), loads[load], [start], [length], [1]))
                kb = lanes.assemble(pieces, inst.b_vector)
                accs = [mma(inst, self.target, a[step], kb, acc) for a, acc in zip(a_steps, accs)]
            for element in elements:
                i = element % inst.c.slots
                local = self._local_token(element)
                # (f32(acc1)*s1 [+ f32(acc2)*s2]) * sK * scale, the contract's order.
                qk = None
                for t, acc in enumerate(accs):
                    term = arith.mulf(arith.sitofp(ir.F32Type.get(), c_element(acc, inst, i)),
                                      self.sq_of_row[(t, self._row_map(element))])
                    qk = term if qk is None else arith.addf(qk, term)
                value = arith.mulf(qk, k_scales[element])
                value = arith.mulf(value, lanes.f32(self.shape.softmax_scale))
                live = self.token_live(element, local)
                self.live[element] = live
                scores[element] = arith.select(live, value, lanes.f32(float("-inf")))
        return scores

    def _local_token(self, element):
        """Token (within the partition) of score element `element` of the lane."""
        return self.lanes.affine((self.wave_token0, 1),
                                 (self.lanes.of_lane(self._token_in_wave(element)), 1))

    def wave_reduce(self, values, classes, kind):
        """Per row class: reduce in-lane, across lanes (xor), across waves (LDS)."""
        lanes = self.lanes
        combine = arith.maximumf if kind == "max" else arith.addf
        lds = lanes.shared([self.waves * ROWS], "f32")
        rows = []
        for members in classes:
            value = values[members[0]]
            for e in members[1:]:
                value = combine(value, values[e])
            value = lanes.xor_reduce(value, self.layout.row_max_offsets(), combine)
            row = lanes.of_lane(self._row_map(members[0]))
            rows.append(row)
            memref.store(value, lds, [lanes.affine((lanes.wave, ROWS), (row, 1))])
        lanes.barrier()
        out = []
        for row in rows:
            total = None
            for wave in range(self.waves):
                part = memref.load(lds, [lanes.plus(row, wave * ROWS)])
                total = part if total is None else combine(total, part)
            out.append(total)
        return out

    def weights(self, e, l, classes):
        """W = P * sV, exactly 0 for a dead token (whatever its slot's scale holds)."""
        lanes = self.lanes
        w = {}
        for i, value in e.items():
            p = arith.divf(value, l[self._class_of(classes, i)])
            w[i] = arith.select(self.live[i], arith.mulf(p, self.v_scales[i]), lanes.f32(0.0))
        return w

    def quantize(self, w):
        """Per (row, MMAC) scale; Wq bytes and sW to LDS for the PV operands.

        The scalar ops are the contract's (contract/scalar_ir.py), as in
        lower-quantize: a zero or tiny group gives Wq = 0, a NaN/Inf group Wq = 0
        and sW = NaN. The absmax is NaN-propagating in-lane and across the xor
        shuffles, so every lane of a group sees the same a.
        """
        lanes, layout = self.lanes, self.layout
        mmacs, wave_tokens = self.model.mmacs_per_wave, self.model.wave_tokens
        wq_lds = lanes.shared([self.waves, ROWS, wave_tokens], "i8")
        sw_lds = lanes.shared([self.waves, ROWS, mmacs], "f32")
        unsigned = self.unsigned
        c = contract.quantize_constants(lanes.f32, unsigned=unsigned)
        value_of = contract.quantize_unsigned_value if unsigned else contract.quantize_value
        if self.column_sums:
            self._store_ones_rows(wq_lds, self.column_sums[1])
        for members in self._live_classes(layout.group_keys()):
            amax = c.zero
            for e in members:
                amax = contract.absmax_step(amax, w[e])
            amax = lanes.xor_reduce(amax, layout.group_max_offsets(), contract.absmax_merge)
            inverse = contract.quantize_inverse(amax, c, unsigned)
            row = lanes.of_lane(self._row_map(members[0]))
            group = lanes.of_lane(layout.group_map(members[0]))
            memref.store(contract.quantize_scale(amax, c, unsigned), sw_lds,
                         [lanes.wave, row, group])
            for e in members:
                q = value_of(w[e], inverse, c)
                token = lanes.of_lane(self._token_in_wave(e))
                memref.store(q, wq_lds, [lanes.wave, lanes.of_lane(self._row_map(e)), token])
        lanes.barrier()
        return wq_lds, sw_lds

    def _store_ones_rows(self, wq_lds, rows):
        """Unsigned W: the A rows whose MMAC outputs are the column sums, all ones."""
        lanes, one = self.lanes, self.lanes.i8(1)
        _, slots = thread_distribution(rows, self.model.wave_tokens, lanes.wave_size)
        for row, token in slots:
            memref.store(one, wq_lds, [lanes.wave, lanes.of_lane(row), lanes.of_lane(token)])

    def pv(self, wq_lds, sw_lds):
        """O partial of the wave: per (row, head-dim) C elements, f32; unsigned W
        adds 128 * sum Vq of the MMAC's tokens to each int32 sum first."""
        lanes, inst, layout = self.lanes, self.instruction, self.layout
        mmacs = range(self.model.mmacs_per_wave)
        a = self._w_fragments(layout, wq_lds, "i8")
        o = []
        for tile, loads in self._v_tiles(layout):
            regs = [None] * inst.c.slots
            for t in mmacs:
                bv = lanes.assemble(self._v_runs(layout, loads, t), inst.b_vector)
                acc = mma(inst, self.target, a[t], bv, lanes.zeros(inst.c_vector, "i32"))
                sums = self._column_sums(acc, bv)
                for i in self._live_slots(self.dead):
                    sw = memref.load(sw_lds, [lanes.wave, lanes.of_lane(layout.c_row(i)),
                                              lanes.index(t)])
                    value = c_element(acc, inst, i)
                    if sums is not None:
                        value = contract.unsigned_offset(value, sums[i])
                    term = arith.mulf(arith.sitofp(ir.F32Type.get(), value), sw)
                    regs[i] = term if regs[i] is None else arith.addf(regs[i], term)
            o.append(regs)
        return o

    def _w_fragments(self, layout, w_lds, element: str):
        """The wave's A operand of each PV MMAC, read from W staged in LDS."""
        lanes, inst = self.lanes, layout.instruction
        return [lanes.assemble([load_vector(w_lds, [lanes.wave, lanes.of_lane(row),
                                                    lanes.of_lane(token)], length, element)
                                for row, token, length in layout.a_token_runs(t)],
                               inst.a_vector)
                for t in range(layout.model.mmacs_per_wave)]

    @staticmethod
    def _v_runs(layout, loads, t):
        """The i8 runs of PV MMAC t's B operand, sliced out of the lane's V loads."""
        return [vector.extract_strided_slice(vector_type(length, "i8"), loads[u], [offset],
                                             [length], [1])
                for u, offset, length in layout.v_runs_of_mmac(t)]

    def _column_sums(self, acc, bv):
        """{live C slot: int32 sum Vq of its column over the MMAC's tokens}, or None
        for signed W."""
        if not self.unsigned:
            return None
        inst, live = self.instruction, self._live_slots(self.dead)
        if self.column_sums:
            return {i: c_element(acc, inst, self.column_sums[0][i]) for i in live}
        ones = mma(inst, self.target, self.lanes.splat(inst.a_vector, "i8", 1), bv,
                   self.lanes.zeros(inst.c_vector, "i32"))
        return {i: c_element(ones, inst, i) for i in live}

    def _v_tiles(self, layout):
        """(tile, the lane's V loads for its 16 head-dim columns), in tile order:
        loaded earlier (`v_early`), all up front, each just before its tile
        (`v_per_tile`), or read back from LDS (`v_async`)."""
        tiles = range(self.shape.head_dim // layout.instruction.n)
        if self.v_staged is not None:
            lds, group = self.v_staged
            self.lanes.async_wait(group)
            loaded = self._v_loads(layout, staged=lds)
        elif self.v_loaded is not None:
            loaded = self.v_loaded
        elif not self.tuning.v_per_tile:
            loaded = self._v_loads(layout)
        else:
            for tile in tiles:
                yield tile, [row[0] for row in self._v_loads(layout, [tile])]
            return
        for tile in tiles:
            yield tile, [row[tile] for row in loaded]

    def _v_pieces(self, layout, tiles=None):
        """[load][tile]: (head-dim column, first token in the wave, first token in
        the partition) of each of the lane's V loads, 16 bytes of consecutive
        tokens of one head-dim column."""
        lanes, inst = self.lanes, layout.instruction
        b_col = lanes.of_lane(layout.b_col())
        tiles = tiles if tiles is not None else range(self.shape.head_dim // inst.n)
        pieces = []
        for u in range(layout.v_loads()):
            in_wave = lanes.of_lane(layout.v_load_start(u))
            start = lanes.affine((self.wave_token0, 1), (in_wave, 1))
            pieces.append([(lanes.plus(b_col, tile * inst.n), in_wave, start) for tile in tiles])
        return pieces

    def _v_loads(self, layout, tiles=None, staged=None):
        """Each lane's V loads [load][tile], from the cache or from the LDS copy
        `staged` [wave, head dim, wave token] (`_stage_v`)."""
        lanes, width = self.lanes, self.model.v_load.bytes_per_lane
        if staged is not None:
            return [[load_vector(staged, [lanes.wave, col, in_wave], width, "i8")
                     for col, in_wave, _ in row] for row in self._v_pieces(layout, tiles)]
        return [[load_vector(self.access.v, self.access.v_row(col, start), width, "i8")
                 for col, _, start in row] for row in self._v_pieces(layout, tiles)]

    def _stage_v(self, layout):
        """Start the async copies of the lane's V loads into LDS; (LDS, group).
        Each lane reads back only what it copied, so the group's wait alone
        orders the copies before the reads."""
        lanes, width = self.lanes, self.model.v_load.bytes_per_lane
        lds = lanes.shared([self.waves, self.shape.head_dim, self.model.wave_tokens], "i8")
        copies = [lanes.async_copy(self.access.v, self.access.v_row(col, start), lds,
                                   [lanes.wave, col, in_wave], width)
                  for row in self._v_pieces(layout) for col, in_wave, start in row]
        return lds, lanes.async_group(copies)

    def stage_bf16(self, w):
        """The BF16-PV baseline: W rounded to bf16 into LDS (no scales)."""
        lanes = self.lanes
        w_lds = lanes.shared([self.waves, ROWS, self.model.wave_tokens], "bf16")
        bf16 = ir.BF16Type.get()
        for e, value in w.items():
            memref.store(arith.truncf(bf16, value), w_lds,
                         [lanes.wave, lanes.of_lane(self._row_map(e)),
                          lanes.of_lane(self._token_in_wave(e))])
        lanes.barrier()
        return w_lds

    def pv_bf16(self, w_lds):
        """O partial with bf16 W x bf16(Vq) on the bf16 instruction, f32 accumulate."""
        lanes, layout = self.lanes, self.pv_layout
        inst, model = layout.instruction, layout.model
        mmacs = range(model.mmacs_per_wave)
        a = self._w_fragments(layout, w_lds, "bf16")
        o = []
        for tile, loads in self._v_tiles(layout):
            regs = [None] * inst.c.slots
            for t in mmacs:
                runs = []
                for piece in self._v_runs(layout, loads, t):
                    length = ir.VectorType(piece.type).shape[0]
                    as_f32 = arith.sitofp(vector_type(length, "f32"), piece)
                    runs.append(arith.truncf(vector_type(length, "bf16"), as_f32))
                acc = mma(inst, self.target, a[t], lanes.assemble(runs, inst.b_vector),
                          lanes.zeros(inst.c_vector, "f32"))
                for i in self._live_slots(self.pv_dead):
                    term = c_element(acc, inst, i)
                    regs[i] = term if regs[i] is None else arith.addf(regs[i], term)
            o.append(regs)
        return o

    def store_partition(self, o, out_o, p):
        """Sum the waves' partials through LDS; all threads store a slice of the
        output rows."""
        lanes, layout, (b, h) = self.lanes, self.pv_layout, self.where
        inst = layout.instruction
        d = self.shape.head_dim
        live = self._live_slots(self.pv_dead)
        rows = 1 + max(int(inst.c.coords[:, i, 0].max()) for i in live)
        o_lds = lanes.shared([self.waves, rows, d], "f32")
        for tile, regs in enumerate(o):
            for i in live:
                value = regs[i]
                col = lanes.plus(lanes.of_lane(layout.c_col(i)), tile * inst.n)
                memref.store(value, o_lds, [lanes.wave, lanes.of_lane(layout.c_row(i)), col])
        lanes.barrier()
        _, slots = thread_distribution(self.rows_out, d, self.threads)
        for row_map, col_map in slots:
            row = lanes.of_lane(row_map, of=lanes.thread)
            col = lanes.of_lane(col_map, of=lanes.thread)
            total = None
            for wave in range(self.waves):
                part = memref.load(o_lds, [lanes.index(wave), row, col])
                total = part if total is None else arith.addf(total, part)
            memref.store(total, out_o, [b, h, p, row, col])


class _MergeKernel:
    """out = sum_p e^(m_p - M) l_p O_p / sum_p e^(m_p - M) l_p over the sequence's
    partitions, M = max_p m_p per output row.

    Grid (chunk, KV head, sequence): workgroup c covers head-dim columns
    [c, c + 1) * D / chunks of every output row, so that one sequence still
    spreads over many SMs.

      rows     M per row first: the lanes of a wave stride over the partitions
               (a max needs no rescaling), xor shuffles, LDS.
      cells    `splits` thread groups each cover the chunk's tile; group g runs
               over partitions g, g + splits, ..., `unroll` of them per
               iteration with all their loads issued first (a slot past the
               last partition re-reads it with weight 0). A thread's cells are
               runs of one row, read 16 bytes at a time, and one weight
               e^(m_p - M) l_p per (row, partition) serves all of them.
      combine  with one M for all, the groups' numerators and denominators are
               plain sums: through LDS, then group 0 divides and stores.
    """

    VECTOR = 4                # f32 per load: 16 bytes

    def __init__(self, access, model: FragmentModel, rows_out: int, tuning: DecodeTuning):
        self.access, self.shape, self.rows_out = access, access.shape, rows_out
        self.unroll, self.splits, self.chunks = (tuning.merge_unroll, tuning.merge_splits,
                                                 tuning.merge_chunks)
        self.wave_size = model.instruction.wave_size
        partition_threads = model.waves_per_partition * self.wave_size
        d = self.shape.head_dim
        if d % self.chunks or partition_threads % self.chunks:
            raise ValueError(f"{self.chunks} merge chunks must divide the head dim {d} and "
                             f"the {partition_threads} partition threads")
        # rows_out x D splits over the partition kernel's threads (output_rows), so
        # one chunk's columns split over a chunks-th of them.
        self.columns = d // self.chunks
        self.group_threads = partition_threads // self.chunks
        self.threads = self.group_threads * self.splits
        if self.threads % self.wave_size or self.threads > 1024:
            raise ValueError(f"a merge workgroup of {self.threads} threads: it must be whole "
                             f"waves of {self.wave_size} and at most 1024")

    def argument_types(self):
        return self.access.merge_argument_types(partials=3)

    def build(self, args):
        d, access = self.shape.head_dim, self.access
        lanes = self.lanes = Lanes(self.threads, self.wave_size)
        zero = lanes.index(0)
        chunk, h, b = workgroup_id(0), workgroup_id(1), workgroup_id(2)
        o_arg, m_arg, l_arg, out_arg = access.bind_merge(lanes, args, b)
        kv = (access.batch, self.shape.kv_heads, access.partition_count)
        o = binding(o_arg, kv + (self.rows_out, d), "f32", zero)
        m = binding(m_arg, kv + (ROWS,), "f32", zero)
        l = binding(l_arg, kv + (ROWS,), "f32", zero)
        out = binding(out_arg, (access.batch, self.shape.kv_heads, self.rows_out, d), "f32", zero)
        self.where, self.parts = (b, h), access.partitions_of(lanes, b)
        top_lds = self._row_max(m)

        _, runs = thread_runs(self.rows_out, self.columns, self.group_threads, self.VECTOR)
        member_map, group_map = thread_groups(self.group_threads, self.splits)
        member = lanes.of_lane(member_map, of=lanes.thread)
        group = lanes.of_lane(group_map, of=lanes.thread)
        row_maps = list(dict.fromkeys(row for row, _, _ in runs))
        self.rows = [lanes.of_lane(row, of=member) for row in row_maps]
        first = lanes.affine((chunk, self.columns))
        self.runs = [(row_maps.index(row), arith.addi(first, lanes.of_lane(col, of=member)), n,
                      self._alignment(col, n)) for row, col, n in runs]
        top = [memref.load(top_lds, [row]) for row in self.rows]
        sums = self._sums((o, m, l), top, group)
        if self.splits == 1:
            self._store(out, sums)
            return
        lds = self._publish(sums, member, group)
        with lanes.when(arith.cmpi(arith.CmpIPredicate.eq, group, zero)):
            self._store(out, self._totals(lds, len(sums), member))

    def _row_max(self, m):
        """M of each output row, in LDS [ROWS]. Threads past the last row repeat
        it: the xor shuffles need every lane of the wave."""
        lanes, (b, h) = self.lanes, self.where
        span = 1 << (self.rows_out - 1).bit_length()
        width = min(self.wave_size, self.threads // span)
        slot_map, row_map = thread_groups(width, self.threads // width)
        slot = lanes.of_lane(slot_map, of=lanes.thread)
        row = lanes.of_lane(row_map, of=lanes.thread)
        read = arith.minui(row, lanes.index(self.rows_out - 1))
        last = arith.subi(self.parts, lanes.index(1))
        loop = lanes.loop(lanes.index(0), self.parts, [lanes.f32(float("-inf"))],
                          step=self.unroll * width)
        with ir.InsertionPoint(loop.body):
            # A slot past the last partition re-reads it: no change to a max.
            loads = [memref.load(m, [b, h, arith.minui(
                lanes.affine((loop.induction_variable, 1), (slot, 1), j * width), last), read])
                for j in range(self.unroll)]
            top = loop.inner_iter_args[0]
            for value in loads:
                top = arith.maximumf(top, value)
            scf.YieldOp([top])
        offsets = xor_reduction_offsets(row_map(np.arange(self.threads))[:, None])
        top = lanes.xor_reduce(loop.results[0], offsets, arith.maximumf)
        lds = lanes.shared([ROWS], "f32")
        writer = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, slot, lanes.index(0)),
                            arith.cmpi(arith.CmpIPredicate.ult, row, lanes.index(self.rows_out)))
        with lanes.when(writer):
            memref.store(top, lds, [row])
        lanes.barrier()
        return lds

    def _sums(self, partials, top, group):
        """[numerator per cell..., denominator per row...] over this group's partitions."""
        lanes, (o, m, l), (b, h) = self.lanes, partials, self.where
        cells = sum(n for _, _, n, _ in self.runs)
        last = arith.subi(self.parts, lanes.index(1))
        start = [lanes.f32(0.0)] * (cells + len(self.rows))
        loop = lanes.loop(lanes.index(0), self.parts, start, step=self.unroll * self.splits)
        with ir.InsertionPoint(loop.body):
            chunk = []
            for j in range(self.unroll):
                slot = lanes.affine((loop.induction_variable, 1), (group, 1), j * self.splits)
                p = arith.minui(slot, last)
                valid = arith.cmpi(arith.CmpIPredicate.ult, slot, self.parts)
                chunk.append((valid, [memref.load(m, [b, h, p, row]) for row in self.rows],
                              [memref.load(l, [b, h, p, row]) for row in self.rows],
                              [self._load_run(o, [b, h, p, self.rows[r], col], n, align)
                               for r, col, n, align in self.runs]))
            sums = list(loop.inner_iter_args)
            for valid, m_p, l_p, o_p in chunk:
                weights = [arith.select(valid, arith.mulf(math.exp(arith.subf(mp, t)), lp),
                                        lanes.f32(0.0))
                           for mp, lp, t in zip(m_p, l_p, top)]
                cell = 0
                for (r, _, n, _), loaded in zip(self.runs, o_p):
                    for e in range(n):
                        term = arith.mulf(weights[r], loaded[e])
                        sums[cell] = arith.addf(sums[cell], term)
                        cell += 1
                for r, weight in enumerate(weights):
                    sums[cells + r] = arith.addf(sums[cells + r], weight)
            scf.YieldOp(sums)
        return list(loop.results)

    def _alignment(self, col, n):
        """Bytes of alignment of a run of n f32 whose first column is `col` (a
        lane map of the thread in its group), or None. A power-of-two run that
        starts at a multiple of n in rows and chunks of a multiple of n f32 is
        n * 4-byte aligned (bindings are at least 16-byte aligned): said
        explicitly, or the backend splits the vector access into scalars."""
        starts = col(np.arange(self.group_threads))
        if n & (n - 1) or (starts % n).any() or self.columns % n or self.shape.head_dim % n:
            return None
        return 4 * n

    @staticmethod
    def _load_run(memory, indices, n, alignment):
        """n consecutive f32 as scalars, one vector load (scalar for n = 1)."""
        if n == 1:
            return [memref.load(memory, indices)]
        loaded = vector.LoadOp(vector_type(n, "f32"), memory, indices,
                               alignment=alignment).result
        return [vector.extract(loaded, [], [e]) for e in range(n)]

    def _publish(self, sums, member, group):
        """Every group's sums into LDS [group, sum, member]."""
        lanes = self.lanes
        lds = lanes.shared([self.splits, len(sums), self.group_threads], "f32")
        for k, value in enumerate(sums):
            memref.store(value, lds, [group, lanes.index(k), member])
        lanes.barrier()
        return lds

    def _totals(self, lds, count, member):
        """The sums over all groups (read by group 0)."""
        lanes, totals = self.lanes, []
        for k in range(count):
            total = None
            for g in range(self.splits):
                part = memref.load(lds, [lanes.index(g), lanes.index(k), member])
                total = part if total is None else arith.addf(total, part)
            totals.append(total)
        return totals

    def _store(self, out, sums):
        (b, h), cells = self.where, sum(n for _, _, n, _ in self.runs)
        cell = 0
        for r, col, n, alignment in self.runs:
            values = [arith.divf(sums[cell + e], sums[cells + r]) for e in range(n)]
            where = [b, h, self.rows[r], col]
            if n == 1:
                memref.store(values[0], out, where)
            else:
                vector.store(vector.from_elements(vector_type(n, "f32"), values), out, where,
                             alignment=alignment)
            cell += n


@dataclass(frozen=True)
class DecodeKernels:
    """The two executables of a decode graph, and what the host must pass them."""

    module: ir.Operation
    access: DenseKV | PagedKV
    rows_out: int             # query rows of the partial and merged outputs
    abi: tuple[KernelABI, ...] = ()   # the paged kernels' calling convention

    @property
    def shape(self):
        return self.access.shape

    @property
    def layout(self) -> dict:
        """What a host (the driver's, the simulator's) needs to call the kernels."""
        return {"kernel": "decode", "rows_out": self.rows_out,
                "partition_tokens": self.access.partition_tokens,
                "abi": [a.to_json() for a in self.abi]}


def check_decode_shape(shape, model: FragmentModel) -> None:
    """The limits of the lane-level kernel, as errors a user can act on."""
    if shape.rows > ROWS:
        raise ValueError(f"{shape.rows} query heads per KV head do not fit one {ROWS}-row "
                         f"MMAC tile")
    check_head_dim(shape, model)


def check_head_dim(shape, model: FragmentModel) -> None:
    inst = model.instruction
    if shape.head_dim % inst.k or shape.head_dim % inst.n:
        raise ValueError(f"head dim {shape.head_dim} must be a multiple of {inst.k} "
                         f"(the MMAC K) for the lane-level kernel")


def build_decode_kernels(access: DenseKV | PagedKV, model: FragmentModel, target: str,
                         pv: str = "int8", tuning: DecodeTuning | None = None,
                         q_terms: int = 1, w_quant: str = "s8") -> DecodeKernels:
    """A module holding both stream.executables (needs an active context/location).

    `pv="bf16"` builds the BF16-PV baseline: everything identical but PV.
    `q_terms` and `w_quant` are the contract's variants (docs/design.md §2c).
    """
    check_decode_shape(access.shape, model)
    tuning = tuning or default_tuning(target, access.shape.head_dim)
    partition = PartitionKernel(access, model, target, pv, tuning, q_terms, w_quant)
    merge = _MergeKernel(access, model, partition.rows_out, partition.tuning)
    module = ir.Module.create()
    wave = model.instruction.wave_size
    with ir.InsertionPoint(module.body):
        build_executable(PARTITION_KERNEL, partition.argument_types(), 3, partition.build,
                         partition.threads, wave, partition.tuning.kernel_attributes(target))
        build_executable(MERGE_KERNEL, merge.argument_types(), 2, merge.build,
                         merge.threads, wave, leading=[merge.chunks])
    abi = (paged_decode_abi(access.shape, partition.rows_out, partition.threads, merge)
           if isinstance(access, PagedKV) else ())
    return DecodeKernels(module.operation, access, partition.rows_out, abi)


def paged_decode_abi(shape, rows_out: int, threads: int, merge) -> tuple[KernelABI, ...]:
    """The paged decode's two kernels: partitions [P, Hkv, B], then the merge of
    each (sequence, KV head) over its `chunks` column chunks."""
    hkv, d = shape.kv_heads, shape.head_dim
    partials = ("B", hkv, "P")
    partition = KernelABI(
        PARTITION_KERNEL, PAGED_INPUTS,
        (Buffer("o_part", partials + (rows_out, d), "f32"),
         Buffer("m_part", partials + (ROWS,), "f32"),
         Buffer("l_part", partials + (ROWS,), "f32")),
        ("B", "NB", "MB", "P"), ("P", hkv, "B"), threads)
    merged = KernelABI(
        MERGE_KERNEL, ("o_part", "m_part", "l_part", "context_lens"),
        (Buffer("out", ("B", hkv, rows_out, d), "f32"),),
        ("B", "P"), (merge.chunks, hkv, "B"), merge.threads, leading=1)
    return partition, merged


def dense_access(shape, model: FragmentModel) -> DenseKV:
    return DenseKV(shape, model.partition_tokens)


def paged_access(shape, model: FragmentModel) -> PagedKV:
    return PagedKV(shape, model.partition_tokens, model.v_load.bytes_per_lane)
