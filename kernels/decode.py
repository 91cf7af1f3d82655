"""The lane-level decode kernels (vLLM's ll4mi structure, as the seed modified it).

Partition kernel, one workgroup of 4 waves per (partition, KV head, batch),
64 tokens per wave:

  QK      Q rows (GQA heads, padded to 16) as A, K as B: scores in the C layout
  softmax partition max and sum: in-lane, xor shuffles, then across waves via LDS
  W       P * sV in registers
  quant   per (row, MMAC) absmax: in-lane over the lane's elements of a group,
          xor shuffles over lanes that share (row, group); Wq to LDS
  PV      Wq read back in the A layout; V loaded 16 bytes per lane from the
          token-innermost cache; one MMAC per (group, 16 head-dim columns);
          rescale by sW; partition output, max and sum
Merge kernel, one workgroup per (KV head, batch): the log-sum-exp merge.

Every lane index, shuffle offset and LDS offset comes from the target's
`DecodeKernelLayout` (int8attn.fragments); swapping the model swaps the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, func, math, memref, stream, vector

from int8attn.fragments import (DecodeKernelLayout, FragmentModel, bf16_pv_model,
                                element_classes, thread_distribution)
from int8attn.kernels.lanes import (Lanes, binding, c_element, load_vector, mma, vector_type,
                                    workgroup_id)
from int8attn.passes import quantize_contract as contract

ROWS = 16  # MMAC M: query rows of a tile (GQA heads, zero-padded)


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    kv_heads: int
    rows: int          # query heads per KV head (<= 16)
    tokens: int
    head_dim: int
    softmax_scale: float

    def partitions(self, partition_tokens: int) -> int:
        return -(-self.tokens // partition_tokens)


def _translation(threads: int, wave_size: int) -> ir.Attribute:
    return ir.Attribute.parse(
        "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<BaseLowering> "
        f"workgroup_size = [{threads}, 1, 1] subgroup_size = {wave_size}>")


def _executable(name: str, grid, arguments: int, body, threads: int, wave_size: int):
    """stream.executable @name with export @name and a kernel built by `body`."""
    exe = stream.ExecutableOp(name, sym_visibility="private")
    exe.body.blocks.append()
    with ir.InsertionPoint(exe.body.blocks[0]):
        export = stream.ExecutableExportOp(name, name)
        export.workgroup_count.blocks.append()
        with ir.InsertionPoint(export.workgroup_count.blocks[0]):
            counts = [arith.constant(ir.IndexType.get(), g) for g in grid]
            stream.ReturnOp(counts)
        inner = ir.Operation.create("builtin.module", regions=1)
        inner.regions[0].blocks.append()
        with ir.InsertionPoint(inner.regions[0].blocks[0]):
            binding_type = ir.Type.parse("!stream.binding")
            kernel = func.FuncOp(name, ir.FunctionType.get([binding_type] * arguments, []))
            kernel.attributes["translation_info"] = _translation(threads, wave_size)
            entry = kernel.add_entry_block()
            with ir.InsertionPoint(entry):
                body(list(entry.arguments))
                func.ReturnOp([])
        stream.ExecutableEndOp()
    return exe


class _PartitionKernel:
    """Builds the partition kernel body; one method per stage of the docstring."""

    def __init__(self, shape: DecodeShape, model: FragmentModel, target: str, pv: str = "int8"):
        self.shape = shape
        self.model = model
        self.pv_kind = pv
        self.layout = DecodeKernelLayout(model)
        # PV's instruction: the same as QK's for INT8 PV, the bf16 one for the baseline.
        self.pv_layout = self.layout if pv == "int8" else DecodeKernelLayout(bf16_pv_model(target))
        self.instruction = model.instruction
        self.target = target
        self.waves = model.waves_per_partition
        self.threads = self.waves * self.instruction.wave_size
        self.partition_tokens = model.partition_tokens
        self.partitions = shape.partitions(self.partition_tokens)
        self.padded = self.partitions * self.partition_tokens

    @property
    def grid(self):
        return (self.partitions, self.shape.kv_heads, self.shape.batch)

    def build(self, args):
        s, d = self.shape, self.shape.head_dim
        lanes = self.lanes = Lanes(self.threads, self.instruction.wave_size)
        zero = lanes.index(0)
        b, h, p = workgroup_id(2), workgroup_id(1), workgroup_id(0)
        self.where = (b, h)
        kv = (s.batch, s.kv_heads)
        self.qq = binding(args[0], kv + (ROWS, d), "i8", zero)
        self.sq = binding(args[1], kv + (ROWS,), "f32", zero)
        self.k = binding(args[2], kv + (self.padded, d), "i8", zero)
        self.ks = binding(args[3], kv + (self.padded,), "f32", zero)
        self.vt = binding(args[4], kv + (d, self.padded), "i8", zero)
        self.vs = binding(args[5], kv + (self.padded,), "f32", zero)
        out_o = binding(args[6], kv + (self.partitions, ROWS, d), "f32", zero)
        out_m = binding(args[7], kv + (self.partitions, ROWS), "f32", zero)
        out_l = binding(args[8], kv + (self.partitions, ROWS), "f32", zero)
        self.wave_token0 = lanes.affine((p, self.partition_tokens),
                                        (lanes.wave, self.model.wave_tokens))
        scores = self.qk()
        row_classes = element_classes(self.layout.element_rows())
        m = self.wave_reduce(scores, row_classes, "max")
        e = [math.exp(arith.subf(x, m[self._class_of(row_classes, i)]))
             for i, x in enumerate(scores)]
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

    def _row_map(self, element):
        return self.layout.c_row(element % self.instruction.c.slots)

    def _token_in_wave(self, element):
        n, i = divmod(element, self.instruction.c.slots)
        return self.layout.c_col(i).shifted(n * self.instruction.n)

    # stages --------------------------------------------------------------------
    def qk(self):
        """Scores of the lane's C elements, f32, masked past the context."""
        lanes, inst, (b, h) = self.lanes, self.instruction, self.where
        a_runs = [(lanes.of_lane(row), lanes.of_lane(k), n) for row, k, n in self.layout.a_runs()]
        b_runs = [(lanes.of_lane(k), n) for k, n in self.layout.b_runs()]
        b_col = lanes.of_lane(self.layout.b_col())
        scores = []
        for n in range(self.layout.blocks):
            token = lanes.affine((self.wave_token0, 1), (b_col, 1), n * inst.n)
            acc = lanes.zeros(inst.c_vector, "i32")
            for step in range(self.shape.head_dim // inst.k):
                a = lanes.assemble([load_vector(self.qq, [b, h, row, lanes.plus(k, step * inst.k)],
                                                length, "i8") for row, k, length in a_runs],
                                   inst.a_vector)
                kb = lanes.assemble([load_vector(self.k, [b, h, token, lanes.plus(k, step * inst.k)],
                                                 length, "i8") for k, length in b_runs],
                                    inst.b_vector)
                acc = mma(inst, self.target, a, kb, acc)
            for i in range(inst.c.slots):
                element = n * inst.c.slots + i
                row = lanes.of_lane(self._row_map(element))
                token_e = lanes.affine((self.wave_token0, 1),
                                       (lanes.of_lane(self._token_in_wave(element)), 1))
                value = arith.sitofp(ir.F32Type.get(), c_element(acc, inst, i))
                value = arith.mulf(arith.mulf(value, memref.load(self.sq, [b, h, row])),
                                   memref.load(self.ks, [b, h, token_e]))
                value = arith.mulf(value, lanes.f32(self.shape.softmax_scale))
                live = arith.cmpi(arith.CmpIPredicate.ult, token_e,
                                  lanes.index(self.shape.tokens))
                scores.append(arith.select(live, value, lanes.f32(float("-inf"))))
        return scores

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
        lanes, (b, h) = self.lanes, self.where
        w = []
        for i, value in enumerate(e):
            p = arith.divf(value, l[self._class_of(classes, i)])
            token = lanes.affine((self.wave_token0, 1),
                                 (lanes.of_lane(self._token_in_wave(i)), 1))
            w.append(arith.mulf(p, memref.load(self.vs, [b, h, token])))
        return w

    def quantize(self, w):
        """Per (row, MMAC) scale; Wq bytes and sW to LDS for the PV operands.

        The scalar ops are the contract's (passes/quantize_contract.py), as in
        lower-quantize: a zero or tiny group gives Wq = 0, a NaN/Inf group Wq = 0
        and sW = NaN. The absmax is NaN-propagating in-lane and across the xor
        shuffles, so every lane of a group sees the same a.
        """
        lanes, layout = self.lanes, self.layout
        mmacs, wave_tokens = self.model.mmacs_per_wave, self.model.wave_tokens
        wq_lds = lanes.shared([self.waves, ROWS, wave_tokens], "i8")
        sw_lds = lanes.shared([self.waves, ROWS, mmacs], "f32")
        c = contract.quantize_constants(lanes.f32)
        for members in element_classes(layout.group_keys()):
            amax = c.zero
            for e in members:
                amax = contract.absmax_step(amax, w[e])
            amax = lanes.xor_reduce(amax, layout.group_max_offsets(), contract.absmax_merge)
            inverse = contract.quantize_inverse(amax, c)
            row = lanes.of_lane(self._row_map(members[0]))
            group = lanes.of_lane(layout.group_map(members[0]))
            memref.store(contract.quantize_scale(amax, c), sw_lds, [lanes.wave, row, group])
            for e in members:
                q = contract.quantize_value(w[e], inverse, c)
                token = lanes.of_lane(self._token_in_wave(e))
                memref.store(q, wq_lds, [lanes.wave, lanes.of_lane(self._row_map(e)), token])
        lanes.barrier()
        return wq_lds, sw_lds

    def pv(self, wq_lds, sw_lds):
        """O partial of the wave: per (row, head-dim) C elements, f32."""
        lanes, inst, layout, (b, h) = self.lanes, self.instruction, self.layout, self.where
        tiles = self.shape.head_dim // inst.n
        width = self.model.v_load.bytes_per_lane
        b_col = lanes.of_lane(layout.b_col())
        loads = [[load_vector(self.vt, [b, h, lanes.plus(b_col, tile * inst.n),
                                        lanes.affine((self.wave_token0, 1),
                                                     (lanes.of_lane(layout.v_load_start(u)), 1))],
                              width, "i8") for tile in range(tiles)]
                 for u in range(layout.v_loads())]
        o = [[None] * inst.c.slots for _ in range(tiles)]
        for t in range(self.model.mmacs_per_wave):
            a = lanes.assemble([load_vector(wq_lds, [lanes.wave, lanes.of_lane(row),
                                                     lanes.of_lane(token)], length, "i8")
                                for row, token, length in layout.a_token_runs(t)], inst.a_vector)
            for tile in range(tiles):
                bv = lanes.assemble([vector.extract_strided_slice(
                    vector_type(length, "i8"), loads[u][tile], [offset], [length], [1])
                    for u, offset, length in layout.v_runs_of_mmac(t)], inst.b_vector)
                acc = mma(inst, self.target, a, bv, lanes.zeros(inst.c_vector, "i32"))
                for i in range(inst.c.slots):
                    sw = memref.load(sw_lds, [lanes.wave, lanes.of_lane(layout.c_row(i)),
                                              lanes.index(t)])
                    term = arith.mulf(arith.sitofp(ir.F32Type.get(), c_element(acc, inst, i)), sw)
                    o[tile][i] = term if o[tile][i] is None else arith.addf(o[tile][i], term)
        return o

    def _v_loads(self, layout):
        lanes, (b, h), inst = self.lanes, self.where, layout.instruction
        b_col = lanes.of_lane(layout.b_col())
        tiles = self.shape.head_dim // inst.n
        return [[load_vector(self.vt, [b, h, lanes.plus(b_col, tile * inst.n),
                                       lanes.affine((self.wave_token0, 1),
                                                    (lanes.of_lane(layout.v_load_start(u)), 1))],
                             self.model.v_load.bytes_per_lane, "i8") for tile in range(tiles)]
                for u in range(layout.v_loads())]

    def stage_bf16(self, w):
        """The BF16-PV baseline: W rounded to bf16 into LDS (no scales)."""
        lanes = self.lanes
        w_lds = lanes.shared([self.waves, ROWS, self.model.wave_tokens], "bf16")
        bf16 = ir.BF16Type.get()
        for e, value in enumerate(w):
            memref.store(arith.truncf(bf16, value), w_lds,
                         [lanes.wave, lanes.of_lane(self._row_map(e)),
                          lanes.of_lane(self._token_in_wave(e))])
        lanes.barrier()
        return w_lds

    def pv_bf16(self, w_lds):
        """O partial with bf16 W x bf16(Vq) on the bf16 instruction, f32 accumulate."""
        lanes, layout = self.lanes, self.pv_layout
        inst, model = layout.instruction, layout.model
        loads = self._v_loads(layout)
        tiles = self.shape.head_dim // inst.n
        o = [[None] * inst.c.slots for _ in range(tiles)]
        for t in range(model.mmacs_per_wave):
            a = lanes.assemble([load_vector(w_lds, [lanes.wave, lanes.of_lane(row),
                                                    lanes.of_lane(token)], length, "bf16")
                                for row, token, length in layout.a_token_runs(t)], inst.a_vector)
            for tile in range(tiles):
                runs = []
                for u, offset, length in layout.v_runs_of_mmac(t):
                    piece = vector.extract_strided_slice(vector_type(length, "i8"), loads[u][tile],
                                                         [offset], [length], [1])
                    as_f32 = arith.sitofp(vector_type(length, "f32"), piece)
                    runs.append(arith.truncf(vector_type(length, "bf16"), as_f32))
                acc = mma(inst, self.target, a, lanes.assemble(runs, inst.b_vector),
                          lanes.zeros(inst.c_vector, "f32"))
                for i in range(inst.c.slots):
                    term = c_element(acc, inst, i)
                    o[tile][i] = term if o[tile][i] is None else arith.addf(o[tile][i], term)
        return o

    def store_partition(self, o, out_o, p):
        """Sum the waves' partials through LDS; all threads store a slice."""
        lanes, layout, (b, h) = self.lanes, self.pv_layout, self.where
        inst = layout.instruction
        d = self.shape.head_dim
        o_lds = lanes.shared([self.waves, ROWS, d], "f32")
        for tile, regs in enumerate(o):
            for i, value in enumerate(regs):
                col = lanes.plus(lanes.of_lane(layout.c_col(i)), tile * inst.n)
                memref.store(value, o_lds, [lanes.wave, lanes.of_lane(layout.c_row(i)), col])
        lanes.barrier()
        _, slots = thread_distribution(ROWS, d, self.threads)
        for row_map, col_map in slots:
            row = lanes.of_lane(row_map, of=lanes.thread)
            col = lanes.of_lane(col_map, of=lanes.thread)
            total = None
            for wave in range(self.waves):
                part = memref.load(o_lds, [lanes.index(wave), row, col])
                total = part if total is None else arith.addf(total, part)
            memref.store(total, out_o, [b, h, p, row, col])


class _MergeKernel:
    """out = sum_p e^(m_p - M) l_p O_p / sum_p e^(m_p - M) l_p over the partitions."""

    def __init__(self, shape: DecodeShape, model: FragmentModel, partitions: int):
        self.shape, self.model, self.partitions = shape, model, partitions
        self.threads = model.waves_per_partition * model.instruction.wave_size

    @property
    def grid(self):
        return (self.shape.kv_heads, self.shape.batch, 1)

    def build(self, args):
        s, d, parts = self.shape, self.shape.head_dim, self.partitions
        lanes = Lanes(self.threads, self.model.instruction.wave_size)
        zero = lanes.index(0)
        kv = (s.batch, s.kv_heads)
        o = binding(args[0], kv + (parts, ROWS, d), "f32", zero)
        m = binding(args[1], kv + (parts, ROWS), "f32", zero)
        l = binding(args[2], kv + (parts, ROWS), "f32", zero)
        out = binding(args[3], kv + (ROWS, d), "f32", zero)
        b, h = workgroup_id(1), workgroup_id(0)
        _, slots = thread_distribution(ROWS, d, self.threads)
        for row_map, col_map in slots:
            row = lanes.of_lane(row_map, of=lanes.thread)
            col = lanes.of_lane(col_map, of=lanes.thread)
            m_p = [memref.load(m, [b, h, lanes.index(p), row]) for p in range(parts)]
            m_all = m_p[0]
            for value in m_p[1:]:
                m_all = arith.maximumf(m_all, value)
            numerator = denominator = None
            for p in range(parts):
                weight = arith.mulf(math.exp(arith.subf(m_p[p], m_all)),
                                    memref.load(l, [b, h, lanes.index(p), row]))
                term = arith.mulf(weight, memref.load(o, [b, h, lanes.index(p), row, col]))
                numerator = term if numerator is None else arith.addf(numerator, term)
                denominator = weight if denominator is None else arith.addf(denominator, weight)
            memref.store(arith.divf(numerator, denominator), out, [b, h, row, col])


@dataclass(frozen=True)
class DecodeKernels:
    """The two executables of a decode graph, and what the host must pass them."""

    module: ir.Operation
    shape: DecodeShape
    partitions: int
    padded_tokens: int
    partition_grid: tuple[int, int, int]
    merge_grid: tuple[int, int, int]


PARTITION_KERNEL = "decode_partition"
MERGE_KERNEL = "decode_merge"


def build_decode_kernels(shape: DecodeShape, model: FragmentModel, target: str,
                         pv: str = "int8") -> DecodeKernels:
    """A module holding both stream.executables (needs an active context/location).

    `pv="bf16"` builds the BF16-PV baseline: everything identical but PV.
    """
    if shape.rows > ROWS:
        raise ValueError(f"{shape.rows} query heads per KV head do not fit one {ROWS}-row "
                         f"MMAC tile")
    inst = model.instruction
    if shape.head_dim % inst.k or shape.head_dim % inst.n:
        raise ValueError(f"head dim {shape.head_dim} must be a multiple of {inst.k} "
                         f"(the MMAC K) for the lane-level kernel")
    partition = _PartitionKernel(shape, model, target, pv)
    merge = _MergeKernel(shape, model, partition.partitions)
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        _executable(PARTITION_KERNEL, partition.grid, 9, partition.build, partition.threads,
                    inst.wave_size)
        _executable(MERGE_KERNEL, merge.grid, 4, merge.build, merge.threads, inst.wave_size)
    return DecodeKernels(module.operation, shape, partition.partitions, partition.padded,
                         partition.grid, merge.grid)
