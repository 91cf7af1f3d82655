"""The lane-level decode kernels (vLLM's ll4mi structure, as the write-up modified it).

Partition kernel, one workgroup of 4 waves per (partition, KV head, sequence),
64 tokens per wave; a composition of the stages (kernels/qk_stages.py,
kernels/pv_stages.py, kernels/v_loads.py):

  Q       `quantize_rows`: the KV head's query rows (GQA heads, zero-padded to
          the tile's M) quantized per row in the workgroup, Qq and sQ to LDS
  QK      `qk`: Qq as A (one fragment per K step, loaded once), K as B: scores
          in the C layout, -inf past the sequence's length
  softmax `partition_softmax`: partition max and sum in-lane, xor shuffles,
          then across waves via LDS; W = P * sV (0 for dead tokens)
  PV      `pv_stage`: W quantized per (row, MMAC group) to LDS, read back in the
          A layout; V loaded 16 bytes per lane from the token-innermost cache;
          one MMAC per (group, head-dim tile); rescale by sW
  store   the waves' partials summed through LDS; the partition's max and sum
Merge kernel (kernels/merge.py): each row's max over the sequence's own
partitions, then the weighted sum of the partial outputs. With `fused_merge`
there is no merge kernel: each workgroup counts its arrival (an atomic add on a
zeroed [B, Hkv] counter, after a release fence), and the last of a (sequence,
KV head) to arrive runs the same merge on its own threads (after an acquire
fence), then zeroes the counter again.

Every lane index, shuffle offset and LDS offset comes from the target's atoms
(`TargetSpec`, `DecodeKernelLayout`); swapping the model swaps the kernel.
Where a token's K/V live (dense, or paged through a block table) is the
access object's business (kernels/kv_access.py); the kernels are the same.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from iree.compiler import ir
from iree.compiler.dialects import arith, memref

from ..contract.numerics import Numerics
from ..fragments import (DecodeKernelLayout, StagingNotLinear, score_feed,
                         thread_distribution)
from .abi import DENSE_INPUTS, PAGED_INPUTS, Buffer, KernelABI
from .executable import build_kernel
from .kv_access import DenseKV, KVView, PagedKV
from .lanes import Lanes, binding, workgroup_id
from .merge import MergePlan, build_merge, merge_sequence
from .pv_stages import check_w_chain, pv_stage
from .qk_stages import partition_softmax, q_operands, qk, quantize_rows
from .stage_plan import StagePlan, VSource
from .target_spec import DecodeTuning, TargetSpec
from .v_loads import load_v, stage_v, v_tiles

PARTITION_KERNEL = "decode_partition"
MERGE_KERNEL = "decode_merge"


def output_rows(rows: int, head_dim: int, threads: int, tile_rows: int) -> int:
    """Rows of the partial outputs: the real query rows, rounded up to a power of two
    until the rows x head_dim tile splits evenly over the workgroup's threads (a
    thread's rows are then a lane map of its id: 3 rows of 128 over 128 threads are
    not)."""
    return next(r for r in (1 << b for b in range(tile_rows.bit_length()))
                if r >= rows and r * head_dim % threads == 0)


def stage_plan(lanes: Lanes, spec: TargetSpec, shape, numerics: Numerics, pv: str,
               rows_out: int, pv_atom: str | None = None, pack_q_terms: bool = False,
               pack_w_terms: bool = False, feed_w: bool = False,
               a_register_order: bool = False,
               join_digits_in_i32: bool = False, w_chain: int = 1) -> StagePlan:
    """The stages' plan; with `pack_q_terms` (`pack_w_terms`), two-term Q (W) shares
    one A tile of QK (PV) where its layout has the padding rows for it
    (`DecodeKernelLayout.term_rows`); with `feed_w`, W goes from QK's C registers
    straight into PV's A operand where the layouts allow it (`score_feed`: every
    row of the tile live, QK's K rows then read in the feed's token order); with
    `a_register_order`, Q and W sit in LDS in the MMA's register order where that
    holds (`OperandStaging`); with `join_digits_in_i32`, digit pairs' sums are joined as
    integers; `w_chain` PV MMACs add into one accumulator (`check_w_chain` says which
    chains a kernel can take)."""
    pv_model = spec.pv_model(pv, pv_atom)
    layout = DecodeKernelLayout(spec.model)
    pv_layout = DecodeKernelLayout(pv_model)
    feed = None
    if feed_w and not layout.dead_c_slots(rows_out) and not pv_layout.dead_c_slots(rows_out):
        feed = score_feed(spec.model, pv_model)
    if feed is not None:
        layout = DecodeKernelLayout(spec.model, feed.order)
    q_packing = (layout.term_rows(rows_out, rows_out)
                 if pack_q_terms and numerics.q_terms == 2 else None)
    w_packing = (pv_layout.term_rows(rows_out, rows_out)
                 if pack_w_terms and pv == "int8" and numerics.w_terms == 2 and feed is None
                 else None)
    plan = StagePlan(lanes, spec, layout, pv_layout, numerics, pv, shape.head_dim,
                     shape.softmax_scale, rows_out, q_packing, w_packing, feed,
                     a_register_order, join_digits_in_i32, w_chain)
    check_w_chain(pv_model, numerics, pv, w_chain)
    return plan


@dataclass(frozen=True)
class PartitionKernel:
    """The partition kernel's configuration; `build` composes the stages."""

    access: DenseKV | PagedKV
    spec: TargetSpec
    numerics: Numerics
    pv: str
    tuning: DecodeTuning
    pv_atom: str | None = None
    merge: MergePlan | None = None   # the merge its last workgroup runs (fused_merge)

    @property
    def threads(self) -> int:
        return self.spec.model.waves_per_partition * self.spec.wave_size

    @property
    def rows_out(self) -> int:
        s = self.access.shape
        return output_rows(s.rows, s.head_dim, self.threads, self.spec.tile_rows)

    def build(self, args) -> None:
        lanes = Lanes(self.threads, self.spec.wave_size)
        b, h, p = workgroup_id(2), workgroup_id(1), workgroup_id(0)
        counter = None
        if self.merge is not None:    # the counters are the last inputs (decode_abi)
            inputs = self.access.inputs
            args, counter = args[:inputs] + args[inputs + 1:], args[inputs]
        kv, outputs = self.access.bind(lanes, args, (b, h, p))
        plan = stage_plan(lanes, self.spec, self.access.shape, self.numerics, self.pv,
                          self.rows_out, self.pv_atom, self.tuning.pack_q_terms,
                          self.tuning.pack_w_terms,
                          a_register_order=self.tuning.a_register_order,
                          join_digits_in_i32=self.tuning.digits_join_i32)

        def work():
            partials = self.body(plan, kv, outputs, p)
            if counter is not None:
                self.merge_if_last(kv, partials, outputs[3], counter)

        guard = kv.guard()
        if guard is None:
            work()
        else:
            with lanes.when(guard):
                work()

    def body(self, plan: StagePlan, kv: KVView, outputs, p) -> tuple:
        """The partition's partial o, m and l, stored; returns their memrefs."""
        lanes, s, tuning = plan.lanes, self.access.shape, self.tuning
        zero = lanes.index(0)
        parts = (kv.batch, s.kv_heads, kv.partition_count)
        out_o = binding(outputs[0], parts + (plan.rows_out, s.head_dim), "f32", zero)
        out_m = binding(outputs[1], parts + (plan.tile_rows,), "f32", zero)
        out_l = binding(outputs[2], parts + (plan.tile_rows,), "f32", zero)
        wave_token0 = lanes.affine((lanes.wave, plan.model.wave_tokens))
        kv.stage()                    # published by quantize_rows' barrier
        staged_q = quantize_rows(plan, kv.q, plan.tile_rows, lambda row: _q_source(kv, s, row))
        # The V loads: copied into LDS during QK, issued right after QK, or at PV.
        source = VSource(per_tile=tuning.v_per_tile)
        if tuning.v_async:
            source = VSource(staged=stage_v(plan, kv, wave_token0))
        if tuning.v_first:
            source = VSource(loaded=load_v(plan, kv, wave_token0))
        live = lambda element, local: arith.cmpi(arith.CmpIPredicate.slt, local, kv.remaining)
        scores = qk(plan, q_operands(plan, staged_q, lambda row: row), kv, wave_token0, live)
        if tuning.v_early:
            source = VSource(loaded=load_v(plan, kv, wave_token0))
        classes = plan.row_classes()
        m, l, w = partition_softmax(plan, scores, classes)
        o = pv_stage(plan, w, v_tiles(plan, kv, wave_token0, source))
        _store_partition(plan, o, out_o, (kv.b, kv.h, p))
        for values, out in ((m, out_m), (l, out_l)):
            for c, members in enumerate(classes):
                row = lanes.of_lane(plan.row_map(members[0]))
                memref.store(values[c], out, [kv.b, kv.h, p, row])
        return out_o, out_m, out_l

    def merge_if_last(self, kv: KVView, partials, out_arg, counter_arg) -> None:
        """Count this workgroup's arrival; the last of its (sequence, KV head) merges
        the partials into `out` and zeroes the counter for the next call."""
        lanes, s, merge = kv.lanes, self.access.shape, self.merge
        zero = lanes.index(0)
        arrivals = binding(counter_arg, (kv.batch, s.kv_heads), "i32", zero)
        parts = self.access.live_partitions(kv)
        last = arrive(lanes, self.spec, arrivals, [kv.b, kv.h], parts)
        with lanes.when(last):
            out = binding(out_arg, (kv.batch, s.kv_heads, merge.rows_out, s.head_dim), "f32",
                          zero)
            merge_sequence(merge, lanes, partials, out, (kv.b, kv.h), zero, parts)
            with lanes.when(arith.cmpi(arith.CmpIPredicate.eq, lanes.thread, zero)):
                memref.store(lanes.i32(0), arrivals, [kv.b, kv.h])


def arrive(lanes: Lanes, spec: TargetSpec, counters, where, count) -> ir.Value:
    """Whether this workgroup is the last of `count` to arrive at counter `where`:
    its global stores released (a barrier, then one thread's release fence and
    atomic add), the others' acquired (that thread's acquire fence, then a
    barrier) where it is. Uniform over the workgroup."""
    zero = lanes.index(0)
    flag = lanes.shared([1], "i32")
    lanes.barrier()
    with lanes.when(arith.cmpi(arith.CmpIPredicate.eq, lanes.thread, zero)):
        spec.device_fence("release")
        before = memref.AtomicRMWOp(arith.AtomicRMWKind.addi, lanes.i32(1), counters,
                                    list(where)).result
        spec.device_fence("acquire")
        last = arith.cmpi(arith.CmpIPredicate.eq,
                          arith.index_cast(ir.IndexType.get(), before),
                          arith.subi(count, lanes.index(1)))
        memref.store(arith.select(last, lanes.i32(1), lanes.i32(0)), flag, [zero])
    lanes.barrier()
    return arith.cmpi(arith.CmpIPredicate.ne, memref.load(flag, [zero]), lanes.i32(0))


def _q_source(kv: KVView, shape, row):
    """(is `row` a real query row, its q indices but the head dim): the KV head's
    rows of the GQA group; a padding row reads the last real one."""
    lanes = kv.lanes
    real = arith.cmpi(arith.CmpIPredicate.ult, row, lanes.index(shape.rows))
    q_row = lanes.affine((kv.h, shape.rows), (arith.minui(row, lanes.index(shape.rows - 1)), 1))
    return real, [kv.b, q_row]


def _store_partition(plan: StagePlan, o, out_o, where) -> None:
    """Sum the waves' partials through LDS; all threads store a slice of the
    output rows."""
    lanes, layout = plan.lanes, plan.pv_layout
    inst, d = layout.instruction, plan.head_dim
    live = plan.pv_live_slots()
    rows = 1 + max(int(inst.c.coords[:, i, 0].max()) for i in live)
    o_lds = lanes.shared([plan.waves, rows, d], "f32")
    for tile, regs in enumerate(o):
        for i in live:
            col = lanes.plus(lanes.of_lane(layout.c_col(i)), tile * inst.n)
            memref.store(regs[i], o_lds, [lanes.wave, lanes.of_lane(layout.c_row(i)), col])
    lanes.barrier()
    _, slots = thread_distribution(plan.rows_out, d, lanes.threads)
    for row_map, col_map in slots:
        row = lanes.of_lane(row_map, of=lanes.thread)
        col = lanes.of_lane(col_map, of=lanes.thread)
        total = None
        for wave in range(plan.waves):
            part = memref.load(o_lds, [lanes.index(wave), row, col])
            total = part if total is None else arith.addf(total, part)
        memref.store(total, out_o, list(where) + [row, col])


@dataclass(frozen=True)
class DecodeKernels:
    """The two executables of a decode graph, and what the host must pass them."""

    module: ir.Operation
    access: DenseKV | PagedKV
    rows_out: int             # query rows of the partial and merged outputs
    tile_rows: int            # rows of the partial max and sum: the QK tile's M
    abi: tuple[KernelABI, ...]  # the partition's and the merge's calling convention

    @property
    def shape(self):
        return self.access.shape

    @property
    def layout(self) -> dict:
        """What a host (the driver's, the simulator's) needs to call the kernels."""
        return {"kernel": "decode", "rows_out": self.rows_out, "tile_rows": self.tile_rows,
                "partition_tokens": self.access.partition_tokens,
                "abi": [a.to_json() for a in self.abi]}


def check_decode_shape(shape, spec: TargetSpec) -> None:
    """The limits of the lane-level kernel, as errors a user can act on."""
    if shape.rows > spec.tile_rows:
        raise ValueError(f"{shape.rows} query heads per KV head do not fit one "
                         f"{spec.tile_rows}-row MMAC tile; --target cpu takes any group")
    check_head_dim(shape, spec)


def check_head_dim(shape, spec: TargetSpec) -> None:
    inst = spec.model.instruction
    if shape.head_dim % inst.k or shape.head_dim % inst.n:
        raise ValueError(f"head dim {shape.head_dim} must be a multiple of {inst.k} "
                         f"(the MMAC K) for the lane-level kernel; --target cpu takes any")


def build_decode_kernels(access: DenseKV | PagedKV, spec: TargetSpec, *,
                         numerics: Numerics | None = None, pv: str = "int8",
                         tuning: DecodeTuning | None = None,
                         pv_atom: str | None = None, w_chain: int = 1) -> DecodeKernels:
    """A module holding both stream.executables (needs an active context/location).

    `numerics` are the contract's variants (docs/design.md §2c; default the
    target's); `pv="bf16"` builds the BF16-PV baseline, everything identical but
    PV; `pv_atom` names another INT8 PV instruction of the target; `w_chain` must
    be 1 (a partition's W is staged through LDS per MMAC and converted per MMAC).
    """
    if w_chain != 1:
        raise ValueError(f"--w-chain {w_chain}: the decode kernels convert each MMAC's "
                         f"int32 sum to f32 on its own (chain 1); the prefill kernel "
                         f"(dense and chunked) takes a chain")
    check_decode_shape(access.shape, spec)
    tuning = tuning or spec.default_tuning(access.shape.head_dim, pv)
    spec.check_tuning(tuning)
    numerics = spec.resolve_numerics(numerics, access.shape.head_dim)
    partition = PartitionKernel(access, spec, numerics, pv, tuning, pv_atom)
    shape_args = (access.shape, partition.rows_out, spec.tile_rows, spec.wave_size,
                  partition.threads, tuning)
    if tuning.fused_merge:
        partition = replace(partition, merge=MergePlan.in_partition(*shape_args))
        merge = None
    else:
        merge = MergePlan.of(*shape_args)
    abi = decode_abi(access, partition, merge)
    try:
        module = _decode_module(partition, merge, abi)
    except StagingNotLinear:     # this shape's Q or W writers have no register-order map
        partition = replace(partition, tuning=replace(tuning, a_register_order=False))
        module = _decode_module(partition, merge, abi)
    return DecodeKernels(module.operation, access, partition.rows_out, spec.tile_rows, abi)


def _decode_module(partition: PartitionKernel, merge: MergePlan | None,
                   abi: tuple[KernelABI, ...]) -> ir.Module:
    spec, access = partition.spec, partition.access
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        build_kernel(abi[0], partition.build, spec.wave_size,
                     spec.kernel_attributes(partition.tuning))
        if merge is not None:
            build_kernel(abi[1], lambda args: build_merge(merge, access, args),
                         spec.wave_size)
    return module


def decode_abi(access: DenseKV | PagedKV, partition: PartitionKernel,
               merge: MergePlan | None) -> tuple[KernelABI, ...]:
    """The decode's kernels: partitions [P, Hkv, B], then the merge of each (sequence,
    KV head) over its `chunks` column chunks; with the merge in the partition kernel
    (`partition.merge`), that kernel alone, writing `out` too and counting arrivals
    per (sequence, KV head). Dense: every size is static; paged: B, NB, MB and P are
    the host's run-time values."""
    s = access.shape
    hkv, d, rows_out = s.kv_heads, s.head_dim, partition.rows_out
    tile_rows = partition.spec.tile_rows
    paged = isinstance(access, PagedKV)
    batch, parts = ("B", "P") if paged else (s.batch, access.partitions)
    partials = (batch, hkv, parts)
    out = Buffer("out", (batch, hkv, rows_out, d), "f32")
    inputs = PAGED_INPUTS if paged else DENSE_INPUTS
    outputs = (Buffer("o_part", partials + (rows_out, d), "f32"),
               Buffer("m_part", partials + (tile_rows,), "f32"),
               Buffer("l_part", partials + (tile_rows,), "f32"))
    constants = ("B", "NB", "MB", "P") if paged else ()
    if partition.merge is not None:
        arrivals = Buffer("arrivals", (batch, hkv), "i32")
        return (KernelABI(PARTITION_KERNEL, inputs + ("arrivals",), outputs + (out,), constants,
                          (parts, hkv, batch), partition.threads, writes_inputs=("arrivals",),
                          counters=(arrivals,)),)
    kernel = KernelABI(PARTITION_KERNEL, inputs, outputs, constants, (parts, hkv, batch),
                       partition.threads)
    merged = KernelABI(
        MERGE_KERNEL, ("o_part", "m_part", "l_part") + (("context_lens",) if paged else ()),
        (out,), ("B", "P") if paged else (), (merge.chunks, hkv, batch), merge.threads,
        leading=1)
    return kernel, merged


def dense_access(shape, spec: TargetSpec) -> DenseKV:
    return DenseKV(shape, spec.model.partition_tokens)


def paged_access(shape, spec: TargetSpec) -> PagedKV:
    return PagedKV(shape, spec.model.partition_tokens, spec.model.v_load.bytes_per_lane)
