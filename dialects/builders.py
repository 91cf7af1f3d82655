"""Small IR builders shared by the rewrite patterns.

Every builder creates ops at the current insertion point and location, so a
pattern that opens `with rewriter.ip, op.location:` gives everything it builds
the location of the op it rewrites.

`generic` takes einsum-like dimension strings: `generic([a, b], ["bhgd",
"bhsd"], "bhgs", init, body)` builds a `linalg.generic` whose loops are the
output's letters (parallel) followed by the remaining letters (reduction).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from iree.compiler import ir
from iree.compiler.dialects import arith, linalg, tensor

from .int8attn import DYNAMIC, shape_of, tensor as tensor_type

# Loop names of a token index split into digits (single letters; b, h, r, n, d,
# k are the tiles' own): a token digit of axis i, and the group digit of an inner
# group axis i.
TOKEN_DIGITS = "ACEFGIJLMOPQSTUVWXYZ"
GROUP_DIGITS = "acefgijlmopqstuvwxyz"



def f32(value: float) -> ir.Value:
    return arith.constant(ir.F32Type.get(), float(value))


def index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), int(value))


def zero(element: str) -> ir.Value:
    t = ir.Type.parse(element)
    return arith.constant(t, 0.0 if isinstance(t, ir.FloatType) else 0)


def to_i32(value: ir.Value) -> ir.Value:
    """Sign-extend an integer scalar to i32."""
    return arith.extsi(ir.IntegerType.get_signless(32), value)


def to_f32(value: ir.Value) -> ir.Value:
    """Signed integer scalar to f32 (exact for int8 and the int32 ranges used here)."""
    return arith.sitofp(ir.F32Type.get(), value)


def empty(shape: Sequence[int], element: str, like: ir.Value | None = None) -> ir.Value:
    """`tensor.empty`; a dynamic dim i (DYNAMIC in `shape`) is `tensor.dim(like, i)`."""
    sizes = [tensor.DimOp(like, index(i)).result if n == DYNAMIC else n
             for i, n in enumerate(shape)]
    return tensor.EmptyOp(sizes, ir.Type.parse(element)).result


def full(shape: Sequence[int], element: str, value: ir.Value,
         like: ir.Value | None = None) -> ir.Value:
    return linalg.fill(value, outs=[empty(shape, element, like)])


def zeros(shape: Sequence[int], element: str, like: ir.Value | None = None) -> ir.Value:
    return full(shape, element, zero(element), like)


def generic(inputs: Sequence[ir.Value], input_dims: Sequence[str], output_dims: str,
            init: ir.Value | Sequence[ir.Value], body: Callable,
            loops: str | None = None) -> ir.Value:
    """`linalg.generic` over named loop dimensions; see the module docstring.

    `loops` orders the loops explicitly (every letter used, each once); by
    default the output's letters come first, then the inputs' in order.
    """
    inits = [init] if isinstance(init, ir.Value) else list(init)
    if loops is None:
        loops = list(output_dims)
        for dims in input_dims:
            loops += [d for d in dims if d not in loops]
    else:
        used = set(output_dims).union(*map(set, input_dims))
        if sorted(loops) != sorted(used):
            raise ValueError(f"loops '{loops}' must name each of {sorted(used)} once")
        loops = list(loops)
    position = {d: i for i, d in enumerate(loops)}

    def affine(dims: str) -> ir.AffineMap:
        return ir.AffineMap.get(len(loops), 0, [ir.AffineDimExpr.get(position[d]) for d in dims])

    maps = [affine(d) for d in input_dims] + [affine(output_dims)] * len(inits)
    iterators = [linalg.IteratorType.parallel if d in output_dims
                 else linalg.IteratorType.reduction for d in loops]
    result = linalg.generic(list(inputs), inits, maps, iterators)(body)
    return result


def loop_index(dim: int) -> ir.Value:
    """The current iteration index of loop `dim` inside a `generic` body."""
    return linalg.IndexOp(dim).result


def expand(value: ir.Value, reassociation: list[list[int]], shape: Sequence[int]) -> ir.Value:
    element = str(ir.RankedTensorType(value.type).element_type)
    return tensor.ExpandShapeOp(tensor_type(shape, element), value, reassociation,
                                [], list(shape)).result


def collapse(value: ir.Value, reassociation: list[list[int]]) -> ir.Value:
    source = shape_of(value)
    shape = []
    for group in reassociation:
        size = 1
        for d in group:
            size = DYNAMIC if DYNAMIC in (size, source[d]) else size * source[d]
        shape.append(size)
    element = str(ir.RankedTensorType(value.type).element_type)
    return tensor.CollapseShapeOp(tensor_type(shape, element), value, reassociation).result


def pad_dim(value: ir.Value, dim: int, size: int, padding: ir.Value) -> ir.Value:
    """Grow dimension `dim` of `value` to `size`, filling the tail with `padding`."""
    source = shape_of(value)
    if source[dim] == size:
        return value
    shape = list(source)
    shape[dim] = size
    element = str(ir.RankedTensorType(value.type).element_type)
    filled = full(shape, element, padding)
    rank = len(shape)
    return tensor.InsertSliceOp(value, filled, [], [], [], [0] * rank, source,
                                [1] * rank).result


def unit_slice(value: ir.Value, dim: int, position: ir.Value) -> ir.Value:
    """`value[..., position:position+1, ...]` along `dim`, keeping the unit dim."""
    shape = shape_of(value)
    sizes = list(shape)
    sizes[dim] = 1
    offsets = [0] * len(shape)
    offsets[dim] = ir.ShapedType.get_dynamic_stride_or_offset()
    element = str(ir.RankedTensorType(value.type).element_type)
    return tensor.ExtractSliceOp(tensor_type(sizes, element), value, [position], [], [],
                                 offsets, sizes, [1] * len(shape)).result


def insert_unit_slice(value: ir.Value, into: ir.Value, dim: int, position: ir.Value) -> ir.Value:
    """`into` with `value` (unit along `dim`) written at `position` of that dim."""
    sizes = shape_of(value)
    offsets = [0] * len(sizes)
    offsets[dim] = ir.ShapedType.get_dynamic_stride_or_offset()
    return tensor.InsertSliceOp(value, into, [position], [], [], offsets, sizes,
                                [1] * len(sizes)).result


def lookup_table(values) -> ir.Value:
    """A dense i64 constant, read in `generic` bodies with `lookup`."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    attr_type = tensor_type(values.shape, "i64")
    return arith.constant(attr_type, ir.DenseElementsAttr.get(values, type=attr_type))


def lookup(table: ir.Value, indices: Sequence[ir.Value]) -> ir.Value:
    """`table[indices]` as an index value."""
    entry = tensor.ExtractOp(table, list(indices)).result
    return arith.index_cast(ir.IndexType.get(), entry)


def split_dim(value: ir.Value, dim: int, sizes: Sequence[int]) -> ir.Value:
    """Dimension `dim` of `value` viewed as `sizes` (tensor.expand_shape; no copy).

    `sizes` may have one entry (no-op) or none (the dim must be 1 and is dropped).
    """
    shape = shape_of(value)
    sizes = list(sizes)
    if len(sizes) == 1:
        return value
    if not sizes:
        if len(shape) == 1:
            raise ValueError("cannot drop the only dimension")
        keep = dim - 1 if dim else 0
        return collapse(value, _reassociation(len(shape) - 1, keep, 2))
    return expand(value, _reassociation(len(shape), dim, len(sizes)),
                  shape[:dim] + sizes + shape[dim + 1:])


def merge_dims(value: ir.Value, dim: int, count: int) -> ir.Value:
    """Dimensions dim .. dim+count-1 of `value` as one (count 0 inserts a unit dim)."""
    shape = shape_of(value)
    if count == 1:
        return value
    if count == 0:
        return split_dim(value, dim - 1, [shape[dim - 1], 1]) if dim else \
            split_dim(value, 0, [1, shape[0]])
    return collapse(value, _reassociation(len(shape) - count + 1, dim, count))


def _reassociation(rank: int, dim: int, count: int) -> list[list[int]]:
    """Reassociation for a rank-`rank` side whose dim `dim` spans `count` dims of the other."""
    return ([[i] for i in range(dim)] + [list(range(dim, dim + count))]
            + [[i + count - 1] for i in range(dim + 1, rank)])


def has_no_uses(value: ir.Value) -> bool:
    return next(iter(value.uses), None) is None
