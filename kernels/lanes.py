"""IR helpers for lane-level kernels: thread ids, lane maps, LDS, shuffles, MMA.

A `Lanes` object builds inside one kernel function. Per-lane indices come in
as `LaneMap`s from the fragment model and are emitted as shifts, masks,
multiplies and adds of the lane id; nothing here knows a layout.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import amdgpu, arith, gpu, llvm, memref, scf, stream, vector

from ..fragments import CallableBuilder, IndexOps, LaneMap, MatrixInstruction, arith_ops


def index_type() -> ir.Type:
    return ir.IndexType.get()


def vector_type(count: int, element: str) -> ir.VectorType:
    return ir.VectorType.get([count], ir.Type.parse(element))


def memref_type(shape, element: str, workgroup: bool = False) -> ir.MemRefType:
    space = ir.Attribute.parse("#gpu.address_space<workgroup>") if workgroup else None
    return ir.MemRefType.get(list(shape), ir.Type.parse(element), memory_space=space)


class Lanes:
    """Builds per-lane values of a workgroup of `threads` threads in waves."""

    def __init__(self, threads: int, wave_size: int):
        self.threads = threads
        self.wave_size = wave_size
        self._constants: dict[tuple[str, object], ir.Value] = {}
        self.thread = gpu.thread_id(gpu.Dimension.x, upper_bound=threads)
        # Constants and LDS allocations go before the thread id, at the top of
        # the kernel, so that they dominate every region built later (scf.if,
        # scf.for bodies) however often they are reused.
        self._head = ir.InsertionPoint(self.thread.owner)
        self.lane = arith.andi(self.thread, self.index(wave_size - 1))
        self.wave = arith.shrui(self.thread, self.index(wave_size.bit_length() - 1))

    @property
    def ops(self) -> IndexOps:
        """The index rules' builder (fragments/index_rules.py) on this kernel's values."""
        return arith_ops(self.index)

    @property
    def layout_builder(self) -> CallableBuilder:
        """`LinearLayout.emit`'s builder (fragments/layout_emit.py) on index values."""
        constant = self.index
        return CallableBuilder(
            const=constant, and_=lambda v, m: arith.andi(v, constant(m)),
            shl=lambda v, s: arith.shli(v, constant(s)),
            shru=lambda v, s: arith.shrui(v, constant(s)), or_=arith.ori, xor=arith.xori)

    # constants -------------------------------------------------------------
    def index(self, value: int) -> ir.Value:
        return self._constant("index", int(value))

    def f32(self, value: float) -> ir.Value:
        return self._constant("f32", float(value))

    def i32(self, value: int) -> ir.Value:
        return self._constant("i32", int(value))

    def i8(self, value: int) -> ir.Value:
        return self._constant("i8", int(value))

    def _constant(self, element: str, value) -> ir.Value:
        key = (element, value)
        if key not in self._constants:
            with self._head:
                self._constants[key] = arith.constant(ir.Type.parse(element), value)
        return self._constants[key]

    def zeros(self, shape, element: str) -> ir.Value:
        return self.splat(shape, element, 0)

    def splat(self, shape, element: str, value) -> ir.Value:
        """A constant vector of `shape` holding `value` everywhere."""
        scalar = ir.Type.parse(element)
        t = ir.VectorType.get(list(shape) if not isinstance(shape, int) else [shape], scalar)
        attr = (ir.FloatAttr.get(scalar, float(value)) if isinstance(scalar, ir.FloatType)
                else ir.IntegerAttr.get(scalar, int(value)))
        key = (str(t), value)
        if key not in self._constants:
            with self._head:
                self._constants[key] = arith.constant(t, ir.DenseElementsAttr.get_splat(t, attr))
        return self._constants[key]

    def assemble(self, pieces, shape) -> ir.Value:
        """Register runs (1-D vectors) as the instruction's operand vector."""
        if len(shape) == 1:
            (piece,) = pieces
            return piece
        value = self.zeros(shape, str(ir.VectorType(pieces[0].type).element_type))
        for r, piece in enumerate(pieces):
            value = vector.InsertOp(piece, value, [], [r]).result
        return value

    def from_elements(self, values, shape) -> ir.Value:
        """Scalars (in row-major order) as an operand vector of `shape`."""
        *outer, inner = shape
        rows = [vector.from_elements(vector_type(inner, str(values[0].type)),
                                     values[r * inner:(r + 1) * inner])
                for r in range(len(values) // inner)]
        return self.assemble(rows, shape) if outer else rows[0]

    def pack_bytes(self, levels, shape) -> ir.Value:
        """i32 levels (each standing for its low byte) as an i8 operand vector of
        `shape`, row-major, four bytes to a word by shifts and ors: an i8 element
        would cost two conversions on NVPTX, which holds it in 16 bits."""
        words = []
        for w in range(0, len(levels), 4):
            word = None
            for j, level in enumerate(levels[w:w + 4]):
                byte = level if j == 3 else arith.andi(level, self.i32(0xFF))
                byte = arith.shli(byte, self.i32(8 * j)) if j else byte
                word = byte if word is None else arith.ori(word, byte)
            words.append(word)
        return self.words_as_bytes(words, shape)

    def words_as_bytes(self, words, shape) -> ir.Value:
        """i32 words (four bytes each, little-endian) as an i8 vector of `shape`."""
        *outer, inner = shape
        per_row = inner // 4
        rows = []
        for r in range(len(words) // per_row):
            packed = vector.from_elements(vector_type(per_row, "i32"),
                                          words[r * per_row:(r + 1) * per_row])
            rows.append(vector.bitcast(vector_type(inner, "i8"), packed))
        return self.assemble(rows, shape) if outer else rows[0]

    # lane maps ---------------------------------------------------------------
    def of_lane(self, lane_map: LaneMap, of=None) -> ir.Value:
        """`lane_map` evaluated on the lane id (or on `of`, e.g. the thread id)."""
        source = self.lane if of is None else of
        value = None
        for lo, width, scale in lane_map.runs:
            bits = arith.andi(arith.shrui(source, self.index(lo)), self.index((1 << width) - 1))
            term = bits if scale == 1 else arith.muli(bits, self.index(scale))
            value = term if value is None else arith.addi(value, term)
        if value is None:
            return self.index(lane_map.offset)
        return value if lane_map.offset == 0 else arith.addi(value, self.index(lane_map.offset))

    def plus(self, value: ir.Value, amount: int) -> ir.Value:
        return value if amount == 0 else arith.addi(value, self.index(amount))

    def affine(self, *terms) -> ir.Value:
        """sum of (value, scale) pairs and plain ints."""
        total, constant = None, 0
        for term in terms:
            if isinstance(term, int):
                constant += term
                continue
            value, scale = term
            part = value if scale == 1 else arith.muli(value, self.index(scale))
            total = part if total is None else arith.addi(total, part)
        if total is None:
            return self.index(constant)
        return self.plus(total, constant)

    # cross-lane --------------------------------------------------------------
    def xor_reduce(self, value: ir.Value, offsets, combine) -> ir.Value:
        """Butterfly reduction over the lanes that differ in the `offsets` bits."""
        for offset in offsets:
            other = gpu.shuffle(value, self.i32(offset), self.i32(self.wave_size),
                                gpu.ShuffleMode.XOR)[0]
            value = combine(value, other)
        return value

    def barrier(self) -> None:
        gpu.barrier()

    def shared(self, shape, element: str) -> ir.Value:
        with self._head:
            return memref.AllocOp(memref_type(shape, element, workgroup=True), [], [],
                                  alignment=16).result

    # asynchronous copies into LDS (cuda: cp.async) -----------------------------
    # nvgpu has no Python module: generic form (docs/design.md §9).
    ASYNC_TOKEN = "!nvgpu.device.async.token"

    def async_copy(self, source: ir.Value, source_indices, target: ir.Value, target_indices,
                   count: int) -> ir.Value:
        """Start copying `count` elements from global memory into LDS, past L1
        where the copy is 16 bytes (cp.async.cg takes no other size; 4 and 8 go
        through L1); the token joins a group (`async_group`) that `async_wait`
        completes."""
        source_indices, target_indices = list(source_indices), list(target_indices)
        segments = [1, len(target_indices), 1, len(source_indices), 0]
        element = ir.MemRefType(target.type).element_type
        bits = ir.IntegerType(element).width if isinstance(element, ir.IntegerType) \
            else ir.FloatType(element).width
        attributes = {"dstElements": ir.IntegerAttr.get(index_type(), count),
                      "operandSegmentSizes": ir.DenseI32ArrayAttr.get(segments)}
        if count * bits == 128:
            attributes["bypassL1"] = ir.UnitAttr.get()
        return ir.Operation.create(
            "nvgpu.device_async_copy", results=[ir.Type.parse(self.ASYNC_TOKEN)],
            operands=[target, *target_indices, source, *source_indices],
            attributes=attributes).result

    def async_group(self, copies) -> ir.Value:
        return ir.Operation.create("nvgpu.device_async_create_group",
                                   results=[ir.Type.parse(self.ASYNC_TOKEN)],
                                   operands=list(copies)).result

    def async_wait(self, group: ir.Value) -> None:
        """Until the group's copies have landed (for the thread that issued them)."""
        ir.Operation.create("nvgpu.device_async_wait", results=[], operands=[group],
                            attributes={"numGroups": ir.IntegerAttr.get(
                                ir.IntegerType.get_signless(32), 0)})

    # control flow ------------------------------------------------------------
    def when(self, condition: ir.Value):
        """`with lanes.when(c):` builds into an scf.if without results."""
        branch = scf.IfOp(condition)
        return _Region(branch.then_block)

    def branch(self, condition: ir.Value, then, otherwise: list) -> list:
        """An scf.if yielding `then()` (built in its then block) where `condition`
        holds and `otherwise` (values built before it) where not: work the lanes
        skip when none of a warp needs it, where a select would run it always."""
        branch = scf.IfOp(condition, [v.type for v in otherwise], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp(list(then()))
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp(list(otherwise))
        return list(branch.results)

    def loop(self, lower: ir.Value, upper: ir.Value, carried, step: int = 1):
        """scf.for lower..upper step `step` carrying `carried`; returns the op, whose
        body the caller fills and ends with `scf.yield`."""
        return scf.ForOp(lower, upper, self.index(step), list(carried))


class _Region:
    def __init__(self, block):
        self.block = block

    def __enter__(self):
        self.ip = ir.InsertionPoint(self.block)
        self.ip.__enter__()
        return self.block

    def __exit__(self, *exc):
        if exc[0] is None:
            scf.YieldOp([])
        self.ip.__exit__(*exc)


def workgroup_id(dimension: int) -> ir.Value:
    return stream.DispatchWorkgroupIDOp(dimension).result


def binding(argument: ir.Value, shape, element: str, zero: ir.Value) -> ir.Value:
    """A memref view of a binding; a dimension given as an index Value is dynamic."""
    static = [s if isinstance(s, int) else ir.ShapedType.get_dynamic_size() for s in shape]
    dynamic = [s for s in shape if not isinstance(s, int)]
    return stream.BindingSubspanOp(memref_type(static, element), argument, zero, dynamic).result


def load_vector(base: ir.Value, indices, count: int, element: str,
                alignment: int | None = None) -> ir.Value:
    """`count` elements from `base`[indices]; `alignment`: the bytes the address is
    known to be a multiple of (the fragment model's proof), so the backend need not
    infer it (NVPTX splits a load it cannot prove aligned into bytes)."""
    return vector.LoadOp(vector_type(count, element), base, list(indices),
                         alignment=alignment).result


def c_element(acc: ir.Value, instruction: MatrixInstruction, i: int) -> ir.Value:
    """Register i of a C fragment (row-major over the instruction's C vector)."""
    position = [int(p) for p in np.unravel_index(i, instruction.c_vector)]
    return vector.extract(acc, [], position)


def c_fragment(values: dict, instruction: MatrixInstruction, fill: ir.Value) -> ir.Value:
    """A C fragment holding values[i] in register i (`c_element`'s order), `fill` in
    the registers not given."""
    count = int(np.prod(instruction.c_vector))
    return vector.from_elements(ir.VectorType.get(list(instruction.c_vector), fill.type),
                                [values.get(i, fill) for i in range(count)])


def mma(instruction: MatrixInstruction, target: str, a: ir.Value, b: ir.Value,
        c: ir.Value) -> ir.Value:
    """One int8 matrix instruction on its A/B/C operand vectors."""
    acc_element = ir.VectorType(c.type).element_type
    acc_type = ir.VectorType.get(list(instruction.c_vector), acc_element)
    if target == "cuda":
        # nvgpu has no Python module: generic form (docs/design.md §9).
        shape = ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d)
                                  for d in (instruction.m, instruction.n, instruction.k)])
        # mma.sync takes the bf16 and int8 fragments alike in the generic form
        return ir.Operation.create("nvgpu.mma.sync", results=[acc_type], operands=[a, b, c],
                                   attributes={"mmaShape": shape}).result
    if target == "gfx942":
        return amdgpu.MFMAOp(instruction.m, instruction.n, instruction.k, a, b, c).result
    # gfx936: the DTK builtin takes the 8 bytes of A and B as one i64 each.
    def as_i64(fragment):
        packed = vector.BitCastOp(vector_type(1, "i64"), fragment).result
        return vector.extract(packed, [], [0])

    return llvm.CallIntrinsicOp(acc_type, instruction.intrinsic, [as_i64(a), as_i64(b), c],
                                [], []).result
