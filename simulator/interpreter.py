"""Executes lane-level kernel IR on the CPU: every thread of every workgroup at once.

Each SSA value is a numpy array with a leading thread axis (all workgroups'
threads, in order), or a broadcastable uniform. Threads run in lockstep op by
op; a `gpu.barrier` starts a new interval, and an LDS access that another
thread's access in the same interval would race with on the hardware (one of
them a write; an asynchronous copy counts from its issue) is an error, as is a
barrier that some threads of a workgroup skip. Global and LDS memory are flat
arrays (LDS one region per workgroup, poisoned until written); stores that put
different values at one address in the same op are reported as races, loads out
of bounds as errors. Workgroups that meet through global memory (atomics, fences)
follow `global_order`: one op's atomics land in a seeded random order, and a read
of another workgroup's store needs its release and a later acquire.

This module is the machine: its threads and workgroups, the block walk, the
structured control flow under active masks, the kernel environment, memory
and asynchronous copies. The memory model is `memory`; the arithmetic, vector
and matrix-instruction handlers are `compute_ops.ComputeOps`, mixed in.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import arith, llvm

from .compute_ops import ComputeOps
from .global_order import GlobalOrder, atomic_add
from .memory import DTYPES, SimulationError, _element, _Memory, poisoned

__all__ = ["Machine", "SimulationError"]


class Machine(ComputeOps):
    """Runs one kernel function over a grid with the given argument buffers."""

    def __init__(self, kernel: ir.Operation, buffers: list[np.ndarray], grid, threads: int,
                 wave_size: int, seed: int = 0):
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
        self.interval = 0                       # barriers passed (LDS hazards)
        self.pending_copies: list = []          # async copies not yet in a group
        self.copy_groups: list = []             # groups not yet waited for, oldest first
        self.order = GlobalOrder(groups)        # workgroups meeting in global memory
        self.rng = np.random.default_rng(seed)  # the order of an op's atomics

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
            self.order.tick()
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
        """Each region under its threads' mask; a result is the then region's yield
        in the threads that took it, the else region's in the others."""
        outer = self.active
        taken = np.broadcast_to(np.asarray(operands[0], np.bool_), (self.thread_count,))
        yields = []
        for region, mask in ((op.regions[0], taken), (op.regions[1], ~taken)):
            self.active = self._masked_from(outer, mask)
            ran = len(region.blocks) and self.active.any()
            yields.append(self._run_block(region.blocks[0]) if ran else None)
        self.active = outer
        if not len(op.results):
            return None
        then, otherwise = (y if y is not None else z for y, z in (yields, yields[::-1]))
        merged = []
        for a, b in zip(then, otherwise):
            # values are [threads, ...] or broadcast to it (uniform: [1, ...] or scalars)
            tail = np.broadcast_shapes(np.shape(a)[1:], np.shape(b)[1:])
            full = (self.thread_count,) + tail
            merged.append(np.where(taken.reshape((-1,) + (1,) * len(tail)),
                                   np.broadcast_to(a, full), np.broadcast_to(b, full)))
        return merged[0] if len(merged) == 1 else tuple(merged)

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
        return _Memory(buffer.reshape(-1), shape,
                       element_bytes=_element_bytes(ir.MemRefType(op.result.type)),
                       binding=operands[0])

    def op_memref_alloc(self, op, _):
        t = ir.MemRefType(op.result.type)
        size = int(np.prod(t.shape))
        dtype = DTYPES[_element(t)]
        groups = int(np.prod(self.grid))
        element_bytes = _element_bytes(t)
        alignment = (ir.IntegerAttr(op.attributes["alignment"]).value
                     if "alignment" in op.attributes else element_bytes)
        return _Memory(poisoned(groups * size, dtype), t.shape, size,
                       element_bytes, base_alignment=alignment)

    def op_gpu_barrier(self, op, _):
        if self.active is not None:
            per_group = self.active.reshape(-1, self.threads)
            if (per_group.any(axis=1) & ~per_group.all(axis=1)).any():
                raise SimulationError("a barrier that some threads of a workgroup do not "
                                      "reach (divergent control flow)")
        self.interval += 1

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

    def op_memref_atomic_rmw(self, op, operands):
        """Global atomics (addi), in a random order of the issuing threads; the
        result is what each thread saw before its own."""
        kind = ir.IntegerAttr(op.attributes["kind"]).value
        value, memory, indices = operands[0], operands[1], operands[2:]
        if kind != int(arith.AtomicRMWKind.addi) or memory.binding is None:
            raise SimulationError(f"the simulator models atomic addi on global memory "
                                  f"only, not {arith.AtomicRMWKind(kind).name}")
        where, threads = memory._active(memory.addresses(indices, self), self)
        groups = self.workgroup_index[threads]
        addend = np.broadcast_to(value, (self.thread_count,))[threads]
        seen = np.zeros(self.thread_count, memory.buffer.dtype)
        seen[threads] = atomic_add(memory.buffer, where, addend.astype(memory.buffer.dtype),
                                   self.rng)
        self.order.stored(memory.binding, memory.buffer.size, where, groups)
        return seen

    def op_llvm_fence(self, op, _):
        ordering = llvm.AtomicOrdering(ir.IntegerAttr(op.attributes["ordering"]).value).name
        scope = op.attributes["syncscope"] if "syncscope" in op.attributes else None
        threads = np.flatnonzero(self._masked(True))
        self.order.fence(np.unique(self.workgroup_index[threads]), ordering,
                         None if scope is None else ir.StringAttr(scope).value)

    def op_vector_load(self, op, operands):
        count = ir.VectorType(op.result.type).shape[0]
        if "alignment" in op.attributes:
            operands[0].check_alignment(operands[1:], self,
                                        ir.IntegerAttr(op.attributes["alignment"]).value)
        return operands[0].load(operands[1:], self, count)

    def op_vector_store(self, op, operands):
        count = ir.VectorType(op.operands[0].type).shape[0]
        operands[1].store(operands[0], operands[2:], self, count)

    # asynchronous copies: they land at the wait that completes their group, visible
    # to the issuing thread (another thread's read needs a barrier after the wait,
    # as on the hardware); a read of their elements before it is an error. ------
    def op_nvgpu_device_async_copy(self, op, operands):
        count = ir.IntegerAttr(op.attributes["dstElements"]).value
        target_rank = ir.MemRefType(op.operands[0].type).rank
        target, target_indices = operands[0], operands[1:1 + target_rank]
        source, source_indices = operands[1 + target_rank], operands[2 + target_rank:]
        # cp.async reads and writes its 4, 8 or 16 bytes aligned to their size
        size = count * target.element_bytes
        for memory, indices in ((source, source_indices), (target, target_indices)):
            memory.check_alignment(indices, self, size)
        values = source.load(source_indices, self, count)
        target.start_copy(target_indices, self, count)
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
                target.store(values, indices, self, count, landing=True)
        self.active = active


def _element_bytes(t: ir.MemRefType) -> int:
    """Bytes of one element as the hardware stores it (bf16: 2, though the simulator
    holds it in an f32 array)."""
    element = t.element_type
    width = (ir.IntegerType(element).width if isinstance(element, ir.IntegerType)
             else ir.FloatType(element).width)
    return width // 8
