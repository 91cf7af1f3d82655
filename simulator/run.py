"""Run one stream.executable of a module: its grid, its kernel, the buffers."""

from __future__ import annotations

import re

import numpy as np
from iree.compiler import ir

from ..reference.common import pad_tokens
from ..support.ir import walk
from .interpreter import Machine, SimulationError
from .memory import poisoned


def _executable(module: ir.Operation, name: str) -> ir.Operation:
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "stream.executable" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise SimulationError(f"no stream.executable @{name}")


def _grid(executable: ir.Operation, workload) -> tuple[int, ...]:
    """The export's workgroup count for the dispatch's workload values."""
    export = next(op for op in walk(executable) if op.name == "stream.executable.export")
    block = export.regions[0].blocks[0]
    if len(block.arguments) != len(workload):
        raise SimulationError(f"the export takes {len(block.arguments)} workload values, "
                              f"the host gave {len(workload)}")
    values = {a: int(w) for a, w in zip(block.arguments, workload)}
    for op in block.operations:
        op = op.operation
        if op.name == "arith.constant":
            values[op.result] = ir.IntegerAttr(op.attributes["value"]).value
        elif op.name == "stream.return":
            return tuple(values[v] for v in op.operands)
    raise SimulationError("the export's workgroup count is not its workload and constants")


def run_executable(module: ir.Operation, name: str, workload, arguments: list,
                   seed: int = 0) -> None:
    """Execute @name's kernel over the grid of `workload`; `arguments` are numpy
    buffers (bindings, output buffers written in place) and ints (index operands);
    `seed` orders the atomics of one op (`GlobalOrder`)."""
    executable = _executable(module, name)
    kernel = next(op for op in walk(executable) if op.name == "func.func")
    info = str(kernel.attributes["translation_info"])
    threads = int(re.search(r"workgroup_size = \[(\d+)", info).group(1))
    wave = int(re.search(r"subgroup_size = (\d+)", info).group(1))
    grid = _grid(executable, workload)
    if 0 in grid:          # no workgroup (an empty batch): the dispatch does nothing
        return
    Machine(kernel, arguments, grid, threads, wave, seed).run()


def dense_kernel_inputs(q, k, k_scale, v, v_scale, padded: int) -> list[np.ndarray]:
    """A dense graph's host work: K, V and scales padded to `padded` tokens with
    zeros, V transposed to the kernels' token-innermost [B, Hkv, D, S], q in f32."""
    return [np.asarray(q, np.float32), np.ascontiguousarray(pad_tokens(k, 2, padded, 0)),
            pad_tokens(k_scale, 2, padded, 0).astype(np.float32),
            np.ascontiguousarray(pad_tokens(v, 2, padded, 0).transpose(0, 1, 3, 2)),
            pad_tokens(v_scale, 2, padded, 0).astype(np.float32)]


ELEMENTS = {"f32": np.float32, "i8": np.int8, "i32": np.int32}


def run_abi(module: ir.Operation, abis, sizes: dict[str, int], tensors: dict,
            seed: int = 0) -> dict:
    """Each kernel of `abis` (KernelABI JSON, kernels/abi.py: the layout the driver
    records) in order, called as its ABI declares: its inputs by name among `tensors`
    and the earlier kernels' outputs, its counters (zeroed; an error if the kernel
    does not leave them zero), its index operands, its outputs (poisoned numpy
    buffers: NaN, or the integer minimum, where the kernel writes nothing); the grid
    from its workload; `seed` orders atomics. Returns every buffer by name."""
    from ..kernels.abi import KernelABI, evaluate

    buffers = dict(tensors)
    for data in abis:
        abi = KernelABI.from_json(data)
        for buffer in abi.outputs:
            buffers.setdefault(buffer.name, poisoned(buffer.dims(sizes),
                                                       ELEMENTS[buffer.element]))
        for counter in abi.counters:
            buffers[counter.name] = np.zeros(counter.dims(sizes), ELEMENTS[counter.element])
        run_executable(module, abi.kernel, [evaluate(g, sizes) for g in abi.workload],
                       [buffers[n] for n in abi.inputs] + abi.constant_values(sizes)
                       + [buffers[b.name] for b in abi.outputs], seed)
        for counter in abi.counters:
            if buffers[counter.name].any():
                raise SimulationError(f"kernel {abi.kernel} leaves its counter "
                                      f"{counter.name} nonzero (the next call would start "
                                      f"from it)")
    return buffers

