"""Executes lane-level kernel IR on the CPU: every thread of every workgroup at once.

Each SSA value is a numpy array with a leading thread axis (all workgroups'
threads, in order), or a broadcastable uniform. Threads run in lockstep op by
op, so `gpu.barrier` orders LDS accesses by construction. Global and LDS
memory are flat arrays (LDS one region per workgroup, poisoned until written);
stores that put different values at one address in the same op are reported
as races, loads out of bounds as errors.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from int8attn.simulator.isa import matrix_instruction, table_for

# bf16 values live in f32 arrays, rounded where the IR truncates to bf16.
DTYPES = {"i1": np.bool_, "i8": np.int8, "i32": np.int32, "i64": np.int64, "index": np.int64,
          "f32": np.float32, "bf16": np.float32}
INTRINSICS = {"llvm.amdgcn.mmac.i32.16x16x32i8": "gfx936"}
CMPI = {0: np.equal, 1: np.not_equal, 2: np.less, 3: np.less_equal, 4: np.greater,
        5: np.greater_equal, 6: np.less, 7: np.less_equal, 8: np.greater, 9: np.greater_equal}
CMPF = {1: np.equal, 2: np.greater, 3: np.greater_equal, 4: np.less, 5: np.less_equal}


class SimulationError(RuntimeError):
    pass


class _Memory:
    """A memref view: flat buffer, shape, row-major strides, per-workgroup or global."""

    def __init__(self, buffer: np.ndarray, shape, per_workgroup_size: int = 0):
        self.buffer, self.shape = buffer, tuple(shape)
        self.strides = tuple(int(np.prod(self.shape[i + 1:])) for i in range(len(self.shape)))
        self.per_workgroup_size = per_workgroup_size

    def addresses(self, indices, machine, count: int = 1) -> np.ndarray:
        """Linear addresses per thread; threads outside the active mask (an
        scf.if branch or loop they do not run) address element 0 unchecked."""
        linear = np.zeros(machine.thread_count, dtype=np.int64)
        active = machine.active
        last = len(self.shape) - 1
        for axis, (index, stride, extent) in enumerate(zip(indices, self.strides, self.shape)):
            index = np.broadcast_to(index, (machine.thread_count,))
            if active is not None:
                index = np.where(active, index, 0)
            if (index < 0).any() or (index + (count if axis == last else 1) > extent).any():
                raise SimulationError(f"index out of bounds for memref of shape {self.shape}: "
                                      f"{int(index.min())}..{int(index.max())} vs {extent}")
            linear = linear + index * stride
        if self.per_workgroup_size:
            linear = linear + machine.workgroup_index * self.per_workgroup_size
        return linear[:, None] + np.arange(count) if count > 1 else linear

    def load(self, indices, machine, count: int = 1) -> np.ndarray:
        return self.buffer[self.addresses(indices, machine, count)]

    def store(self, value, indices, machine, count: int = 1) -> None:
        where = self.addresses(indices, machine, count)
        value = np.broadcast_to(value, (machine.thread_count,) + ((count,) if count > 1 else ()))
        if machine.active is not None:
            where, value = where[machine.active], value[machine.active]
        where, value = where.ravel(), value.ravel()
        order = np.argsort(where, kind="stable")
        same = where[order][1:] == where[order][:-1]
        clash = same & ~_equal(value[order][1:], value[order][:-1])
        if clash.any():
            raise SimulationError(f"race: threads store different values to one address of "
                                  f"memref {self.shape} in the same op")
        self.buffer[where] = value


def _equal(a, b):
    return (a == b) | (np.isnan(a) & np.isnan(b)) if a.dtype.kind == "f" else a == b


def _element(t: ir.Type) -> str:
    return str(t.element_type) if isinstance(t, (ir.VectorType, ir.MemRefType)) else str(t)


class Machine:
    """Runs one kernel function over a grid with the given argument buffers."""

    def __init__(self, kernel: ir.Operation, buffers: list[np.ndarray], grid, threads: int,
                 wave_size: int):
        self.kernel, self.buffers, self.grid = kernel, buffers, tuple(grid)
        self.threads, self.wave_size = threads, wave_size
        groups = int(np.prod(self.grid))
        self.thread_count = groups * threads
        self.workgroup_index = np.repeat(np.arange(groups), threads)
        gx, gy, _ = self.grid
        self.workgroup_id = (self.workgroup_index % gx, self.workgroup_index // gx % gy,
                             self.workgroup_index // (gx * gy))
        self.thread_id = np.tile(np.arange(threads), groups)
        self.values: dict = {}
        self.active: np.ndarray | None = None   # threads running the current region
        self.pending_copies: list = []          # async copies not yet in a group
        self.copy_groups: list = []             # groups not yet waited for, oldest first

    def run(self) -> None:
        """Bindings are buffer numbers, index arguments uniform scalars."""
        block = self.kernel.regions[0].blocks[0]
        for i, argument in enumerate(block.arguments):
            if str(argument.type) == "index":
                self.values[argument] = np.array([int(self.buffers[i])], np.int64)
            else:
                self.values[argument] = i
        self._run_block(block)

    def _run_block(self, block) -> list:
        """Execute a block's ops; returns the operands of its terminator."""
        for op in block.operations:
            op = op.operation
            if op.name in ("func.return", "scf.yield"):
                return [self.values[v] for v in op.operands]
            handler = getattr(self, "op_" + op.name.replace(".", "_"), None)
            if handler is None:
                raise SimulationError(f"the simulator does not know '{op.name}'")
            results = handler(op, [self.values[v] for v in op.operands])
            if len(op.results) == 1:
                results = (results,)
            for value, result in zip(op.results, results or ()):
                self.values[value] = result
        return []

    # structured control flow: lockstep threads under an active mask ----------
    def _masked(self, condition) -> np.ndarray:
        mask = np.broadcast_to(np.asarray(condition, np.bool_), (self.thread_count,))
        return mask if self.active is None else mask & self.active

    def op_scf_if(self, op, operands):
        if len(op.results):
            raise SimulationError("scf.if with results is not simulated")
        outer = self.active
        self.active = self._masked(operands[0])
        if self.active.any():
            self._run_block(op.regions[0].blocks[0])
        if len(op.regions[1].blocks):
            self.active = self._masked(~np.asarray(operands[0], np.bool_))
            if self.active.any():
                self._run_block(op.regions[1].blocks[0])
        self.active = outer
        return None

    def op_scf_for(self, op, operands):
        """Each thread runs its own trip count; carried values of finished threads
        keep their last value."""
        lower, upper, step, *carried = operands
        body = op.regions[0].blocks[0]
        shape = (self.thread_count,)
        carried = [np.array(np.broadcast_to(c, shape + np.shape(c)[1:])) for c in carried]
        outer = self.active
        iv = np.broadcast_to(lower, shape).astype(np.int64)
        while True:
            self.active = self._masked_from(outer, iv < np.broadcast_to(upper, shape))
            if not self.active.any():
                break
            self.values[body.arguments[0]] = iv
            for argument, value in zip(list(body.arguments)[1:], carried):
                self.values[argument] = value
            yielded = self._run_block(body)
            carried = [np.where(self.active.reshape((-1,) + (1,) * (np.ndim(c) - 1)),
                                np.broadcast_to(y, c.shape), c) for y, c in zip(yielded, carried)]
            iv = iv + np.broadcast_to(step, shape)
        self.active = outer
        # _run_block wraps a single result itself.
        return carried[0] if len(carried) == 1 else tuple(carried)

    @staticmethod
    def _masked_from(outer, mask):
        return mask if outer is None else mask & outer

    # kernel environment ------------------------------------------------------
    def op_gpu_thread_id(self, op, _):
        return self.thread_id

    def op_stream_dispatch_workgroup_id(self, op, _):
        return self.workgroup_id[ir.IntegerAttr(op.attributes["dimension"]).value]

    def op_stream_binding_subspan(self, op, operands):
        buffer = self.buffers[operands[0]]
        dynamic = iter(int(np.asarray(d).ravel()[0]) for d in operands[2:])
        shape = [next(dynamic) if ir.ShapedType.is_dynamic_size(n) else n
                 for n in ir.MemRefType(op.result.type).shape]
        if buffer.size != int(np.prod(shape)):
            raise SimulationError(f"binding {operands[0]} has {buffer.size} elements, the "
                                  f"kernel views it as {shape}")
        return _Memory(buffer.reshape(-1), shape)

    def op_memref_alloc(self, op, _):
        t = ir.MemRefType(op.result.type)
        size = int(np.prod(t.shape))
        dtype = DTYPES[_element(t)]
        groups = int(np.prod(self.grid))
        poison = np.nan if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
        return _Memory(np.full(groups * size, poison, dtype=dtype), t.shape, size)

    def op_gpu_barrier(self, op, _):
        return None

    def op_gpu_shuffle(self, op, operands):
        value, offset, width = operands
        mode = str(op.attributes["mode"])
        if "xor" not in mode:
            raise SimulationError(f"unsupported shuffle mode {mode}")
        lane = self.thread_id % self.wave_size
        partner = lane ^ int(np.asarray(offset).ravel()[0])
        if (partner >= int(np.asarray(width).ravel()[0])).any():
            raise SimulationError("xor shuffle leaves its width")
        source = np.arange(self.thread_count) - lane + partner
        return np.broadcast_to(value, (self.thread_count,))[source], np.ones(1, np.bool_)

    # memory -----------------------------------------------------------------
    def op_memref_load(self, op, operands):
        return operands[0].load(operands[1:], self)

    def op_memref_store(self, op, operands):
        operands[1].store(operands[0], operands[2:], self)

    def op_vector_load(self, op, operands):
        count = ir.VectorType(op.result.type).shape[0]
        return operands[0].load(operands[1:], self, count)

    def op_vector_store(self, op, operands):
        count = ir.VectorType(op.operands[0].type).shape[0]
        operands[1].store(operands[0], operands[2:], self, count)

    # asynchronous copies: they land at the wait that completes their group, so a
    # read before it sees LDS's poison. (Hardware makes them visible to the issuing
    # thread only; another thread's read also needs a barrier, which this model
    # does not demand.) ---------------------------------------------------------
    def op_nvgpu_device_async_copy(self, op, operands):
        count = ir.IntegerAttr(op.attributes["dstElements"]).value
        target_rank = ir.MemRefType(op.operands[0].type).rank
        target, target_indices = operands[0], operands[1:1 + target_rank]
        source, source_indices = operands[1 + target_rank], operands[2 + target_rank:]
        values = source.load(source_indices, self, count)
        self.pending_copies.append((target, target_indices, values, self.active, count))
        return np.zeros(1, np.int64)

    def op_nvgpu_device_async_create_group(self, op, operands):
        self.copy_groups.append(self.pending_copies)
        self.pending_copies = []
        return np.zeros(1, np.int64)

    def op_nvgpu_device_async_wait(self, op, operands):
        keep = ir.IntegerAttr(op.attributes["numGroups"]).value
        landing = self.copy_groups[:len(self.copy_groups) - keep]
        self.copy_groups = self.copy_groups[len(landing):]
        active = self.active
        for group in landing:
            for target, indices, values, self.active, count in group:
                target.store(values, indices, self, count)
        self.active = active

    # arithmetic -------------------------------------------------------------
    def op_arith_constant(self, op, _):
        t, attr = op.result.type, op.attributes["value"]
        dtype = DTYPES[_element(t)]
        if isinstance(t, ir.VectorType):
            splat = ir.DenseElementsAttr(attr).get_splat_value()
            scalar = splat.value
            return np.full((1,) + tuple(t.shape), scalar, dtype=dtype)
        return np.array([attr.value], dtype=dtype)

    def _binary(fn):
        def handler(self, op, operands):
            with np.errstate(all="ignore"):
                result = fn(*operands)
            return result.astype(DTYPES[_element(op.result.type)], copy=False)
        return handler

    op_arith_addi = _binary(np.add)
    op_arith_subi = _binary(np.subtract)
    op_arith_muli = _binary(np.multiply)
    op_arith_divui = _binary(np.floor_divide)
    op_arith_remui = _binary(np.remainder)
    op_arith_minui = _binary(np.minimum)
    op_arith_negf = _binary(np.negative)
    op_arith_trunci = _binary(lambda x: np.asarray(x))   # the cast wraps, as LLVM's trunc

    def op_math_fma(self, op, operands):
        # a*b is exact in float64 for f32 operands; one rounding of the sum, as the
        # contract's residual (reference.quantize_q) is computed.
        a, b, c = (np.asarray(x, np.float64) for x in operands)
        with np.errstate(all="ignore"):
            return (a * b + c).astype(np.float32)
    op_arith_andi = _binary(np.bitwise_and)
    op_arith_shrui = _binary(np.right_shift)
    op_arith_addf = _binary(np.add)
    op_arith_subf = _binary(np.subtract)
    op_arith_mulf = _binary(np.multiply)
    op_arith_divf = _binary(np.divide)
    op_arith_maximumf = _binary(np.maximum)
    op_arith_minimumf = _binary(np.minimum)
    op_math_exp = _binary(np.exp)
    op_math_absf = _binary(np.abs)
    op_math_roundeven = _binary(np.rint)

    def op_arith_cmpi(self, op, operands):
        return CMPI[ir.IntegerAttr(op.attributes["predicate"]).value](*operands)

    def op_arith_cmpf(self, op, operands):
        return CMPF[ir.IntegerAttr(op.attributes["predicate"]).value](*operands)

    def op_arith_select(self, op, operands):
        return np.where(*operands)

    def op_arith_sitofp(self, op, operands):
        return operands[0].astype(np.float32)

    def op_arith_truncf(self, op, operands):
        if _element(op.result.type) != "bf16":
            raise SimulationError(f"unsupported truncf to {op.result.type}")
        from int8attn.reference.common import round_to_bf16

        return round_to_bf16(np.asarray(operands[0], np.float32))

    def op_arith_fptosi(self, op, operands):
        # NaN, Inf or an out-of-range value is poison in LLVM: an error here, not a number.
        x = np.asarray(operands[0])
        dtype = DTYPES[_element(op.result.type)]
        limits = np.iinfo(dtype)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (np.trunc(x) < limits.min) | (np.trunc(x) > limits.max)
        if bad.any():
            raise SimulationError(f"arith.fptosi of {x[bad].ravel()[0]!r} to {dtype.__name__} is "
                                  f"poison ({int(bad.sum())} lanes)")
        return np.trunc(x).astype(dtype)

    def op_arith_index_cast(self, op, operands):
        return operands[0].astype(DTYPES[_element(op.result.type)])

    # vectors and matrix instructions -----------------------------------------
    def op_vector_extract(self, op, operands):
        position = tuple(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
        source = operands[0]
        return source[(slice(None),) + position]

    def op_vector_insert(self, op, operands):
        position = tuple(ir.DenseI64ArrayAttr(op.attributes["static_position"]))
        value, dest = operands
        shape = (self.thread_count,) + tuple(ir.VectorType(op.result.type).shape)
        out = np.array(np.broadcast_to(dest, shape))
        out[(slice(None),) + position] = value
        return out

    def op_vector_to_elements(self, op, operands):
        # Canonicalization's form of "extract every element": one result each, row-major.
        source = np.asarray(operands[0])
        rank = len(ir.VectorType(op.operands[0].type).shape)
        flat = source.reshape(source.shape[:source.ndim - rank] + (-1,))
        return tuple(flat[..., i] for i in range(flat.shape[-1]))

    def op_vector_from_elements(self, op, operands):
        shape = tuple(ir.VectorType(op.result.type).shape)
        elements = np.broadcast_arrays(*[np.asarray(x) for x in operands])
        return np.stack(elements, axis=-1).reshape(elements[0].shape + shape)

    def op_vector_extract_strided_slice(self, op, operands):
        offset = ir.IntegerAttr(ir.ArrayAttr(op.attributes["offsets"])[0]).value
        size = ir.IntegerAttr(ir.ArrayAttr(op.attributes["sizes"])[0]).value
        return operands[0][..., offset:offset + size]

    def op_vector_bitcast(self, op, operands):
        dtype = DTYPES[_element(op.result.type)]
        source = np.ascontiguousarray(operands[0])
        return source.view(dtype)

    def _matrix(self, target, a, b, c):
        waves = self.thread_count // self.wave_size

        def per_wave(x):
            x = np.broadcast_to(x, (self.thread_count,) + x.shape[1:])
            return x.reshape(waves, self.wave_size, -1)

        out = matrix_instruction(target, per_wave(a), per_wave(b), per_wave(c))
        return out.reshape((self.thread_count,) + c.shape[1:])

    def op_nvgpu_mma_sync(self, op, operands):
        shape = tuple(ir.IntegerAttr(d).value for d in ir.ArrayAttr(op.attributes["mmaShape"]))
        kinds = {(16, 8, 32): "cuda", (16, 8, 16): "cuda-bf16"}
        if shape not in kinds:
            raise SimulationError(f"unsupported nvgpu.mma.sync shape {shape}")
        return self._matrix(kinds[shape], *operands)

    def op_llvm_call_intrinsic(self, op, operands):
        name = ir.StringAttr(op.attributes["intrin"]).value
        if name not in INTRINSICS:
            raise SimulationError(f"unknown intrinsic {name}")
        a, b, c = operands
        as_bytes = lambda x: np.ascontiguousarray(np.broadcast_to(x, (self.thread_count,))).view(np.int8).reshape(-1, 8)
        return self._matrix(INTRINSICS[name], as_bytes(a), as_bytes(b), c)

    def op_amdgpu_mfma(self, op, operands):
        shape = tuple(ir.IntegerAttr(op.attributes[k]).value for k in ("m", "n", "k"))
        try:
            table = table_for("gfx942", shape)
        except KeyError:
            raise SimulationError(f"unsupported amdgpu.mfma shape {shape}") from None
        return self._matrix(table, *operands)
