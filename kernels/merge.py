"""The decode merge kernel: a sequence's partitions into its output rows.

out = sum_p 2^(m_p - M) l_p O_p / sum_p 2^(m_p - M) l_p over the sequence's
partitions, M = max_p m_p per output row.

Grid (chunk, KV head, sequence): workgroup c covers head-dim columns
[c, c + 1) * D / chunks of every output row, so that one sequence still
spreads over many SMs.

  rows     M per row first: the lanes of a wave stride over the partitions
           (a max needs no rescaling), xor shuffles, LDS.
  cells    `splits` thread groups each cover the chunk's tile; group g runs
           over partitions g, g + splits, ..., `unroll` of them per
           iteration with all their loads issued first (a slot past the
           last partition re-reads it with weight 0); the first iteration's
           loads go before the rows' M, in flight with its loads. A thread's
           cells are runs of one row, read 16 bytes at a time, and one weight
           2^(m_p - M) l_p per (row, partition) serves all of them.
  combine  with one M for all, the groups' numerators and denominators are
           plain sums: through LDS, then group 0 divides and stores.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import arith, memref, scf, vector

from ..contract import scalar_ir as contract
from ..fragments import thread_groups, thread_runs, xor_reduction_offsets
from .lanes import Lanes, binding, load_vector, vector_type, workgroup_id
from .target_spec import DecodeTuning

VECTOR = 4                # f32 per load: 16 bytes


@dataclass(frozen=True)
class MergePlan:
    """The merge's split of a (KV head, sequence) over workgroups and threads."""

    head_dim: int
    kv_heads: int
    rows_out: int            # rows of the partial and merged outputs
    tile_rows: int           # rows of the partial m and l
    wave_size: int
    unroll: int
    splits: int
    chunks: int
    group_threads: int       # threads of one group: a chunk of the partition's

    @staticmethod
    def of(shape, rows_out: int, tile_rows: int, wave_size: int, partition_threads: int,
           tuning: DecodeTuning) -> "MergePlan":
        d, chunks = shape.head_dim, tuning.merge_chunks
        if d % chunks or partition_threads % chunks:
            raise ValueError(f"{chunks} merge chunks must divide the head dim {d} and "
                             f"the {partition_threads} partition threads")
        # rows_out x D splits over the partition kernel's threads (output_rows), so
        # one chunk's columns split over a chunks-th of them.
        plan = MergePlan(d, shape.kv_heads, rows_out, tile_rows, wave_size,
                         tuning.merge_unroll, tuning.merge_splits, chunks,
                         partition_threads // chunks)
        if plan.threads % wave_size or plan.threads > 1024:
            raise ValueError(f"a merge workgroup of {plan.threads} threads: it must be whole "
                             f"waves of {wave_size} and at most 1024")
        return plan

    @staticmethod
    def in_partition(shape, rows_out: int, tile_rows: int, wave_size: int,
                     partition_threads: int, tuning: DecodeTuning) -> "MergePlan":
        """The merge run by a partition workgroup (`fused_merge`): its threads, every
        column, `fused_splits` groups each over every splits-th partition."""
        splits = tuning.fused_splits
        if splits < 1 or partition_threads % splits:
            raise ValueError(f"{splits} fused merge splits must divide the "
                             f"{partition_threads} partition threads")
        return MergePlan(shape.head_dim, shape.kv_heads, rows_out, tile_rows, wave_size,
                         tuning.fused_unroll, splits, 1, partition_threads // splits)

    @property
    def columns(self) -> int:
        return self.head_dim // self.chunks

    @property
    def threads(self) -> int:
        return self.group_threads * self.splits


@dataclass(frozen=True)
class _Cells:
    """A thread's cells: its rows (index values) and runs (row, first column,
    length, alignment)."""

    rows: list
    runs: list

    @property
    def count(self) -> int:
        return sum(n for _, _, n, _ in self.runs)


def build_merge(plan: MergePlan, access, args) -> None:
    """The merge kernel's body (the module docstring)."""
    lanes = Lanes(plan.threads, plan.wave_size)
    chunk, h, b = workgroup_id(0), workgroup_id(1), workgroup_id(2)
    batch, partition_count, parts, (o_arg, m_arg, l_arg, out_arg) = \
        access.bind_merge(lanes, args, b)
    partials = bind_partials(plan, lanes, (o_arg, m_arg, l_arg), batch, partition_count)
    out = binding(out_arg, (batch, plan.kv_heads, plan.rows_out, plan.head_dim), "f32",
                  lanes.index(0))
    merge_sequence(plan, lanes, partials, out, (b, h), chunk, parts)


def bind_partials(plan: MergePlan, lanes: Lanes, arguments, batch, partition_count):
    """The partial o [B, Hkv, P, rows, D], m and l [B, Hkv, P, tile rows] as memrefs."""
    kv = (batch, plan.kv_heads, partition_count)
    o_arg, m_arg, l_arg = arguments
    zero = lanes.index(0)
    return (binding(o_arg, kv + (plan.rows_out, plan.head_dim), "f32", zero),
            binding(m_arg, kv + (plan.tile_rows,), "f32", zero),
            binding(l_arg, kv + (plan.tile_rows,), "f32", zero))


def merge_sequence(plan: MergePlan, lanes: Lanes, partials, out, where, chunk, parts) -> None:
    """Chunk `chunk` of the output rows of (sequence, KV head) `where` from its `parts`
    partitions' partials (o, m, l), by the workgroup's `plan.threads` threads: the
    merge kernel's body, and the partition kernel's last workgroup's."""
    b, h = where
    zero = lanes.index(0)
    o, m, l = partials
    _, runs = thread_runs(plan.rows_out, plan.columns, plan.group_threads, VECTOR)
    member_map, group_map = thread_groups(plan.group_threads, plan.splits)
    member = lanes.of_lane(member_map, of=lanes.thread)
    group = lanes.of_lane(group_map, of=lanes.thread)
    row_maps = list(dict.fromkeys(row for row, _, _ in runs))
    first = lanes.affine((chunk, plan.columns))
    cells = _Cells([lanes.of_lane(row, of=member) for row in row_maps],
                   [(row_maps.index(row), arith.addi(first, lanes.of_lane(col, of=member)), n,
                     _alignment(plan, col, n)) for row, col, n in runs])
    # The first partitions' partials are loaded before M: their loads need no M, so
    # they are in flight with the max's instead of one L2 round trip after it.
    bounds = (parts, arith.subi(parts, lanes.index(1)))
    first_chunk = _load_chunk(plan, lanes, partials, (b, h), bounds, cells, group, zero)
    top_lds = _row_max(plan, lanes, m, (b, h), parts)
    top = [memref.load(top_lds, [row]) for row in cells.rows]
    sums = _accumulate(lanes, [lanes.f32(0.0)] * (cells.count + len(cells.rows)),
                       first_chunk, cells, top)
    sums = _sums(plan, lanes, partials, (b, h), bounds, cells, top, group, sums)
    if plan.splits == 1:
        _store(out, (b, h), cells, sums)
        return
    lds = _publish(plan, lanes, sums, member, group)
    with lanes.when(arith.cmpi(arith.CmpIPredicate.eq, group, zero)):
        _store(out, (b, h), cells, _totals(plan, lanes, lds, len(sums), member))


def _row_max(plan: MergePlan, lanes: Lanes, m, where, parts) -> ir.Value:
    """M of each output row, in LDS [tile rows]. Threads past the last row repeat
    it: the xor shuffles need every lane of the wave."""
    b, h = where
    span = 1 << (plan.rows_out - 1).bit_length()
    width = min(plan.wave_size, plan.threads // span)
    slot_map, row_map = thread_groups(width, plan.threads // width)
    slot = lanes.of_lane(slot_map, of=lanes.thread)
    row = lanes.of_lane(row_map, of=lanes.thread)
    read = arith.minui(row, lanes.index(plan.rows_out - 1))
    last = arith.subi(parts, lanes.index(1))
    loop = lanes.loop(lanes.index(0), parts, [lanes.f32(float("-inf"))],
                      step=plan.unroll * width)
    with ir.InsertionPoint(loop.body):
        # A slot past the last partition re-reads it: no change to a max.
        loads = [memref.load(m, [b, h, arith.minui(
            lanes.affine((loop.induction_variable, 1), (slot, 1), j * width), last), read])
            for j in range(plan.unroll)]
        top = loop.inner_iter_args[0]
        for value in loads:
            top = arith.maximumf(top, value)
        scf.YieldOp([top])
    offsets = xor_reduction_offsets(row_map(np.arange(plan.threads))[:, None])
    top = lanes.xor_reduce(loop.results[0], offsets, arith.maximumf)
    lds = lanes.shared([plan.tile_rows], "f32")
    writer = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, slot, lanes.index(0)),
                        arith.cmpi(arith.CmpIPredicate.ult, row, lanes.index(plan.rows_out)))
    with lanes.when(writer):
        memref.store(top, lds, [row])
    lanes.barrier()
    return lds


def _load_chunk(plan: MergePlan, lanes: Lanes, partials, where, parts, cells: _Cells,
                group, base: ir.Value) -> list:
    """The loads of one loop iteration of the group: `unroll` partitions from `base`,
    (valid, m_p, l_p, O_p runs) each; a slot past the last partition (`parts`: (count,
    count - 1)) re-reads it."""
    (o, m, l), (b, h), (parts, last) = partials, where, parts
    chunk = []
    for j in range(plan.unroll):
        slot = lanes.affine((base, 1), (group, 1), j * plan.splits)
        p = arith.minui(slot, last)
        valid = arith.cmpi(arith.CmpIPredicate.ult, slot, parts)
        chunk.append((valid, [memref.load(m, [b, h, p, row]) for row in cells.rows],
                      [memref.load(l, [b, h, p, row]) for row in cells.rows],
                      [_load_run(o, [b, h, p, cells.rows[r], col], n, align)
                       for r, col, n, align in cells.runs]))
    return chunk


def _accumulate(lanes: Lanes, sums: list, chunk: list, cells: _Cells, top) -> list:
    """`sums` [numerator per cell..., denominator per row...] plus the chunk's
    partitions, each weighted 2^(m_p - M) l_p (0 past the last; m in log2 units)."""
    sums = list(sums)
    for valid, m_p, l_p, o_p in chunk:
        weights = [arith.select(valid, arith.mulf(contract.exp2(arith.subf(mp, t)), lp),
                                lanes.f32(0.0))
                   for mp, lp, t in zip(m_p, l_p, top)]
        cell = 0
        for (r, _, n, _), loaded in zip(cells.runs, o_p):
            for e in range(n):
                term = arith.mulf(weights[r], loaded[e])
                sums[cell] = arith.addf(sums[cell], term)
                cell += 1
        for r, weight in enumerate(weights):
            sums[cells.count + r] = arith.addf(sums[cells.count + r], weight)
    return sums


def _sums(plan: MergePlan, lanes: Lanes, partials, where, parts, cells: _Cells, top,
          group, start: list) -> list[ir.Value]:
    """`start` plus this group's partitions past its first iteration's (`parts`: the
    count and the last, as for `_load_chunk`)."""
    step = plan.unroll * plan.splits
    loop = lanes.loop(lanes.index(step), parts[0], start, step=step)
    with ir.InsertionPoint(loop.body):
        chunk = _load_chunk(plan, lanes, partials, where, parts, cells, group,
                            loop.induction_variable)
        scf.YieldOp(_accumulate(lanes, loop.inner_iter_args, chunk, cells, top))
    return list(loop.results)


def _alignment(plan: MergePlan, col, n: int) -> int | None:
    """Bytes of alignment of a run of n f32 whose first column is `col` (a lane
    map of the thread in its group), or None. A power-of-two run that starts at
    a multiple of n in rows and chunks of a multiple of n f32 is n * 4-byte
    aligned (bindings are at least 16-byte aligned): said explicitly, or the
    backend splits the vector access into scalars."""
    starts = col(np.arange(plan.group_threads))
    if n & (n - 1) or (starts % n).any() or plan.columns % n or plan.head_dim % n:
        return None
    return 4 * n


def _load_run(memory, indices, n: int, alignment) -> list[ir.Value]:
    """n consecutive f32 as scalars, one vector load (scalar for n = 1)."""
    if n == 1:
        return [memref.load(memory, indices)]
    loaded = load_vector(memory, indices, n, "f32", alignment)
    return [vector.extract(loaded, [], [e]) for e in range(n)]


def _publish(plan: MergePlan, lanes: Lanes, sums, member, group) -> ir.Value:
    """Every group's sums into LDS [group, sum, member]."""
    lds = lanes.shared([plan.splits, len(sums), plan.group_threads], "f32")
    for k, value in enumerate(sums):
        memref.store(value, lds, [group, lanes.index(k), member])
    lanes.barrier()
    return lds


def _totals(plan: MergePlan, lanes: Lanes, lds, count: int, member) -> list[ir.Value]:
    """The sums over all groups (read by group 0)."""
    totals = []
    for k in range(count):
        total = None
        for g in range(plan.splits):
            part = memref.load(lds, [lanes.index(g), lanes.index(k), member])
            total = part if total is None else arith.addf(total, part)
        totals.append(total)
    return totals


def _store(out, where, cells: _Cells, sums) -> None:
    b, h = where
    cell = 0
    for r, col, n, alignment in cells.runs:
        values = [arith.divf(sums[cell + e], sums[cells.count + r]) for e in range(n)]
        indices = [b, h, cells.rows[r], col]
        if n == 1:
            memref.store(values[0], out, indices)
        else:
            vector.store(vector.from_elements(vector_type(n, "f32"), values), out, indices,
                         alignment=alignment)
        cell += n
