"""A hand-built kernel as a `stream.executable`, and its `flow.dispatch`.

The grid is the dispatch's workload: the export's `workgroups(...)` region
returns the workload values as the (x, y, z) workgroup counts, so a host that
computes them at run time (a paged batch's partition count) dispatches the
same compiled kernel for every shape. Kernel arguments are the dispatch's
operands in order (tensors as `!stream.binding`, index values as push
constants), then one binding per result.
"""

from __future__ import annotations

from typing import Callable, Sequence

from iree.compiler import ir
from iree.compiler.dialects import arith, flow, func, stream


def translation_info(threads: int, wave_size: int) -> ir.Attribute:
    return ir.Attribute.parse(
        "#iree_codegen.translation_info<pipeline = #iree_gpu.pipeline<BaseLowering> "
        f"workgroup_size = [{threads}, 1, 1] subgroup_size = {wave_size}>")


def build_kernel(abi, body: Callable[[list[ir.Value]], None], wave_size: int,
                 attributes: dict[str, str] | None = None) -> ir.Operation:
    """The executable of a kernel as its `KernelABI` declares it: the parameters, the
    workload (the grid counts the export does not fix itself), the workgroup size."""
    fixed = [int(count) for count in abi.grid[:abi.leading]]
    return build_executable(abi.kernel, [ir.Type.parse(t) for t in abi.argument_types()],
                            len(abi.workload), body, abi.threads, wave_size, attributes,
                            leading=fixed)


def build_executable(name: str, argument_types: Sequence[ir.Type], workload_rank: int,
                     body: Callable[[list[ir.Value]], None], threads: int,
                     wave_size: int, attributes: dict[str, str] | None = None,
                     leading: Sequence[int] = ()) -> ir.Operation:
    """stream.executable @name { export @name workgroups(w0..) ; func @name(args) };
    `attributes` go on the kernel function (e.g. an occupancy hint for the backend);
    `leading` are constant workgroup counts before the workload's (a kernel's own
    split of its work, which the host need not know)."""
    exe = stream.ExecutableOp(name, sym_visibility="private")
    exe.body.blocks.append()
    index = ir.IndexType.get()
    with ir.InsertionPoint(exe.body.blocks[0]):
        export = stream.ExecutableExportOp(name, name)
        counts = export.workgroup_count.blocks.append(*([index] * workload_rank))
        with ir.InsertionPoint(counts):
            fixed = [arith.constant(index, n) for n in leading]
            one = arith.constant(index, 1)
            rest = 3 - len(fixed) - workload_rank
            stream.ReturnOp(fixed + list(counts.arguments) + [one] * rest)
        inner = ir.Operation.create("builtin.module", regions=1)
        inner.regions[0].blocks.append()
        with ir.InsertionPoint(inner.regions[0].blocks[0]):
            kernel = func.FuncOp(name, ir.FunctionType.get(list(argument_types), []))
            kernel.attributes["translation_info"] = translation_info(threads, wave_size)
            for key, value in (attributes or {}).items():
                kernel.attributes[key] = ir.Attribute.parse(value)
            entry = kernel.add_entry_block()
            with ir.InsertionPoint(entry):
                body(list(entry.arguments))
                func.ReturnOp([])
        stream.ExecutableEndOp()
    return exe


def dispatch(executable: str, workload: Sequence[ir.Value], results: Sequence[ir.Type],
             arguments: Sequence[ir.Value], argument_dims: Sequence[ir.Value] = (),
             result_dims: Sequence[ir.Value] = (),
             tied: Sequence[int] | None = None) -> list[ir.Value]:
    """flow.dispatch @executable::@executable[workload](arguments) -> results; the
    dims list every dynamic dimension of the tensor arguments / results in order;
    `tied[i]` is the argument result i updates in place (-1: a new tensor)."""
    entry = ir.Attribute.parse(f"[@{executable}::@{executable}]")
    attributes = {}
    if tied is not None:
        attributes["tied_operands"] = ir.Attribute.parse(
            "[" + ", ".join(f"{i} : index" for i in tied) + "]")
    op = flow.DispatchOp(list(results), list(workload), entry, list(arguments),
                         list(argument_dims), list(result_dims), **attributes)
    return list(op.results)
