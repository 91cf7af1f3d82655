"""Reading ONNX graphs as IREE's importer writes them, and crossing into builtin tensors.

`iree-import-onnx` turns every ONNX node into `torch.operator "onnx.<Op>"`
on `!torch.vtensor<[dims],dtype>` values, attributes as `torch.onnx.<name>`,
constants and initializers as `torch.operator "onnx.Constant"` holding
`torch.onnx.value`. This module answers what a value is (which node makes
it, its static shape and dtype, its constant contents) and builds the
`torch_c` casts between vtensors and builtin tensors, so int8attn ops can sit
inside an imported graph and IREE's torch input conversion lowers the rest.
"""

from __future__ import annotations

import re

import numpy as np
from iree.compiler import ir

_VTENSOR = re.compile(r"!torch\.vtensor<\[(?P<dims>[^\]]*)\],(?P<dtype>\w+)>")
# torch's signed integer types are the builtin signless ones once converted.
_BUILTIN_ELEMENT = {"si8": "i8", "si32": "i32", "si64": "i64"}


def onnx_op(value: ir.Value, *names: str) -> ir.Operation | None:
    """The `onnx.<name>` node producing `value` (any node if no names given)."""
    if not isinstance(value, ir.OpResult):
        return None
    op = value.owner.operation
    kind = onnx_name(op)
    return op if kind is not None and (not names or kind in names) else None


def onnx_name(op: ir.Operation) -> str | None:
    """`MatMul` for `torch.operator "onnx.MatMul"`, else None."""
    if op.name != "torch.operator":
        return None
    name = ir.StringAttr(op.attributes["name"]).value
    return name[len("onnx."):] if name.startswith("onnx.") else None


def int_attr(op: ir.Operation, name: str, default: int | None = None) -> int | None:
    key = f"torch.onnx.{name}"
    return ir.IntegerAttr(op.attributes[key]).value if key in op.attributes else default


def ints_attr(op: ir.Operation, name: str) -> list[int] | None:
    key = f"torch.onnx.{name}"
    if key not in op.attributes:
        return None
    return [ir.IntegerAttr(a).value for a in ir.ArrayAttr(op.attributes[key])]


def vtensor(value: ir.Value | ir.Type) -> tuple[list[int | None], str] | None:
    """(shape, dtype) of a `!torch.vtensor` value or type (None for a `?` dim), or None."""
    match = _VTENSOR.fullmatch(str(value if isinstance(value, ir.Type) else value.type))
    if match is None:
        return None
    dims = [None if d == "?" else int(d) for d in match["dims"].split(",") if d]
    return dims, match["dtype"]


def shape(value: ir.Value) -> list[int | None] | None:
    described = vtensor(value)
    return None if described is None else described[0]


def constant(value: ir.Value) -> np.ndarray | None:
    """The contents of an `onnx.Constant` (dense attribute), else None.

    `dense_resource` blobs cannot be read from Python; the ONNX import of the
    driver writes constants as dense attributes (`driver.onnx_import`).
    """
    op = onnx_op(value, "Constant")
    if op is None or "torch.onnx.value" not in op.attributes:
        return None
    attr = op.attributes["torch.onnx.value"]
    if not isinstance(attr, (ir.DenseFPElementsAttr, ir.DenseIntElementsAttr)):
        return None
    return np.array(attr)


def scalar(value: ir.Value) -> float | None:
    """A constant holding one number, as a float."""
    array = constant(value)
    return float(array.reshape(())) if array is not None and array.size == 1 else None


def builtin_type(value: ir.Value | ir.Type) -> ir.RankedTensorType:
    """The builtin tensor type `torch_c.to_builtin_tensor` gives a vtensor."""
    dims, dtype = vtensor(value)
    dims = [ir.ShapedType.get_dynamic_size() if n is None else n for n in dims]
    return ir.RankedTensorType.get(dims, ir.Type.parse(_BUILTIN_ELEMENT.get(dtype, dtype)),
                                   loc=ir.Location.unknown())


def to_builtin(value: ir.Value) -> ir.Value:
    """`torch_c.to_builtin_tensor` at the current insertion point and location."""
    return ir.Operation.create("torch_c.to_builtin_tensor", results=[builtin_type(value)],
                               operands=[value]).result


def from_builtin(value: ir.Value, vtensor_type: ir.Type) -> ir.Value:
    return ir.Operation.create("torch_c.from_builtin_tensor", results=[vtensor_type],
                               operands=[value]).result


def erase_dead(block: ir.Block) -> None:
    """Erase the ONNX ops of `block` whose results nothing uses, chains included.

    `torch.operator` is not known to be free of side effects, so nothing else
    removes the float attention a rewrite replaced. Uses follow definitions in
    a block, so one sweep from the end removes whole dead chains."""
    for op in reversed(list(block.operations)):
        op = op.operation
        if onnx_name(op) is not None and not any(list(r.uses) for r in op.results):
            op.erase()
