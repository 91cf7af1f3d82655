"""lower-cache-write: new tokens quantized and scattered into the paged cache, in place.

Rewrites `int8attn.cache_write` (T new tokens, NB blocks of BS; both may be
dynamic) into

    kq, sk = int8attn.quantize(f32(k_new) [- k_bias[h]])   per (token, KV head) row, [T,Hkv,D]
    vq, sv = int8attn.quantize(f32(v_new))
    for each token t, head h (d: each of D), with s = slot_mapping[t]:
      k_cache[s // BS, h, s % BS, :]  = kq[t, h, :]         iree_linalg_ext.scatter,
      k_scale[s // BS, h, s % BS]     = sk[t, h]            one per cache, whose
      v_cache[s // BS, h, d, s % BS]  = vq[t, h, d]         `outs` is the cache
      v_scale[s // BS, h, s % BS]     = sv[t, h]

The optional `k_bias` [Hkv, D] is subtracted in f32 from each new key of KV
head h before it is quantized (a conditioned K cache, reference/key_bias.py).

A token with s < 0 (vLLM's padding) is skipped: its index points at slot 0
and its update is a value quantize never produces (-128 for the int8 rows,
-1.0 for the scales); the scatter's region keeps the cache's value for it.
The scatters are `unique_indices(false)`, so updates apply one after the
other and a skipped token writing back what slot 0 holds is exact whatever
the order (two real tokens never share a slot: the driver refuses that).

In place: each scatter is one dispatch tied to its cache operand, so IREE
writes the T tokens into the cache's own buffer (a loop of `tensor.insert_slice`
copies the whole cache once per token in IREE 3.13). A cache that is an
argument of a public function is imported with ownership transfer: the
argument becomes a `!hal.buffer_view` and `hal.tensor.import consume` makes it
the function's tensor ("a transfer of ownership", HALOps.td), so the update
happens in the caller's buffer and the result returned is that same buffer.
The Python runtime passes numpy caches without a copy (`runtime.module`:
`import_host_allocation`); the cost of a call does not grow with NB
(docs/python-api.md, *Writing in place*).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith, tensor

from ..dialects import int8attn as d
from ..dialects import builders as build
from ..fragments.cache_layout import CacheLayout, arith_ops
from .rewrite import apply_patterns
from ..support.ir import walk

SKIP_Q = -128          # never a quantized value (they are clamped to [-127, 127])
SKIP_SCALE = -1.0      # never a scale (max|row|/127 >= 0, or NaN)


def _i32(value: int) -> ir.Value:
    return arith.constant(ir.IntegerType.get_signless(32), value)


def _dims(value: ir.Value) -> list:
    """The sizes of `value`: ints, or `tensor.dim` values where dynamic."""
    return [tensor.DimOp(value, build.index(i)).result if n == d.DYNAMIC else n
            for i, n in enumerate(d.shape_of(value))]


def _empty(sizes: list, element: str) -> ir.Value:
    return tensor.EmptyOp(sizes, ir.Type.parse(element)).result


def _skip_masked(values: ir.Value, slots: ir.Value, sentinel: ir.Value) -> ir.Value:
    """values [T, ...] with `sentinel` in the rows of skipped tokens (slot < 0)."""
    shape = d.shape_of(values)
    dims = "thd"[:len(shape)]

    def body(x, slot, _):
        skip = arith.cmpi(arith.CmpIPredicate.slt, slot, _i32(0))
        return arith.select(skip, sentinel, x)

    return build.generic([values, slots], [dims, "t"], dims,
                         _empty(_dims(values), d.element_of(values)), body)


def _indices(slots: ir.Value, sizes: list, layout: CacheLayout, order: tuple) -> ir.Value:
    """i32 [T, Hkv, (D,) depth]: per update the cache coordinates, `order` naming them
    (b block, h head, d head-dim element, o offset in the block: a prefix of one of the
    layout's index tuples); slot 0 for a skip."""
    depth = len(order)
    dims = "thd"[:len(sizes)] + "j"

    def body(slot, _):
        # The layout's slot rules on i32 (signed: a skipped slot is negative).
        rules = layout.rules(arith_ops(_i32, signed=True))
        slot = arith.select(rules.kept(slot), slot, _i32(0))
        loop = lambda dim: arith.index_cast(ir.IntegerType.get_signless(32),
                                            build.loop_index(dim))
        coordinate = {"b": lambda: rules.slot_block(slot), "o": lambda: rules.slot_offset(slot),
                      "h": lambda: loop(1), "d": lambda: loop(2)}
        j = build.loop_index(len(sizes))
        value = coordinate[order[-1]]()
        for position in range(depth - 2, -1, -1):
            here = arith.cmpi(arith.CmpIPredicate.eq, j, build.index(position))
            value = arith.select(here, coordinate[order[position]](), value)
        return value

    return build.generic([slots], ["t"], dims, _empty(sizes + [depth], "i32"), body)


def _scattered(index: tuple) -> tuple:
    """The coordinates an update is scattered at: a cache index tuple without its
    trailing head-dim element, which a row update ([..., D]) covers."""
    return index[:-1] if index[-1] == "d" else index


def _scatter(updates: ir.Value, indices: ir.Value, cache: ir.Value) -> ir.Value:
    """`iree_linalg_ext.scatter` of `updates` [N, ...] at `indices` [N, depth] into
    `cache`, keeping the cache's value where the update is the skip sentinel."""
    depth = d.shape_of(indices)[1]
    op = ir.Operation.create(
        "iree_linalg_ext.scatter", results=[cache.type], operands=[updates, indices, cache],
        attributes={"dimension_map": ir.DenseI64ArrayAttr.get(list(range(depth))),
                    "unique_indices": ir.BoolAttr.get(False)}, regions=1)
    element = ir.RankedTensorType(cache.type).element_type
    block = op.regions[0].blocks.append(element, element)
    with ir.InsertionPoint(block):
        new, old = block.arguments
        if isinstance(element, ir.FloatType):
            skip = arith.cmpf(arith.CmpFPredicate.OLT, new, build.f32(0.0))
        else:
            skip = arith.cmpi(arith.CmpIPredicate.eq, new,
                              arith.constant(element, SKIP_Q))
        ir.Operation.create("iree_linalg_ext.yield", operands=[arith.select(skip, old, new)])
    return op.results[0]


def _flatten(value: ir.Value) -> ir.Value:
    """[T, Hkv, ..., X] -> [T * Hkv * ..., X] (or [N] for rank 2)."""
    rank = len(d.shape_of(value))
    if rank == 2:
        return build.collapse(value, [[0, 1]])
    return build.collapse(value, [list(range(rank - 1)), [rank - 1]])


def _updates(values: ir.Value, order: tuple) -> ir.Value:
    """values [T, Hkv(, D)] as the scatter's updates at indices of `order`: one element
    each where the order names the head-dim element, else rows [T*Hkv(, D)]."""
    if "d" in order:
        return build.collapse(values, [list(range(len(d.shape_of(values))))])
    return _flatten(values)


def lower_cache_write(op: d.CacheWriteOp, rewriter):
    block_size = op.block_size
    with rewriter.ip, op.location:
        slots = op.slot_mapping
        rows = []
        for x, bias in ((op.k_new, op.k_bias), (op.v_new, None)):
            if d.element_of(x) != "f32":
                x = arith.extf(ir.RankedTensorType.get(d.shape_of(x), ir.F32Type.get()), x)
            if bias is not None:
                x = build.generic([x, bias], ["thd", "hd"], "thd", _empty(_dims(x), "f32"),
                                  lambda xi, b, _: arith.subf(xi, b))
            rows.append(d.quantize(x))
        (kq, ks), (vq, vs) = rows
        sizes = _dims(kq)                                       # [T, Hkv, D]
        q_skip = arith.constant(ir.IntegerType.get_signless(8), SKIP_Q)
        s_skip = build.f32(SKIP_SCALE)
        kq, vq = (_skip_masked(x, slots, q_skip) for x in (kq, vq))
        ks, vs = (_skip_masked(x, slots, s_skip) for x in (ks, vs))
        # Where each cache's updates go, from the layout's index tuples: K rows and the
        # scales per (token, head), V token-innermost per element.
        layout = CacheLayout.paged(block_size)
        names = ("b", "h", "o", "d")
        k_at, v_at = (_scattered(index(*names)) for index in (layout.k_index, layout.v_index))
        scale_at = layout.scale_index(*names[:3])
        indices = {}
        for order in (k_at, scale_at, v_at):       # [T*Hkv(*D), depth], once per order
            if order not in indices:
                extent = sizes if "d" in order else sizes[:2]
                indices[order] = _flatten(_indices(slots, extent, layout, order))
        k_cache = _scatter(_updates(kq, k_at), indices[k_at], op.k_cache)
        k_scale = _scatter(_updates(ks, scale_at), indices[scale_at], op.k_scale)
        v_cache = _scatter(_updates(vq, v_at), indices[v_at], op.v_cache)
        v_scale = _scatter(_updates(vs, scale_at), indices[scale_at], op.v_scale)
    rewriter.replace_op(op, [k_cache, k_scale, v_cache, v_scale])


def import_argument_caches(module: ir.Operation) -> None:
    """Caches that are arguments of a public function -> `!hal.buffer_view` arguments
    imported with `hal.tensor.import consume` (the in-place ABI; module docstring)."""
    for func in module.regions[0].blocks[0].operations:
        func = func.operation
        if func.name != "func.func" or "sym_visibility" in func.attributes:
            continue
        entry = func.regions[0].blocks[0]
        names = {}
        for op in walk(func):
            if op.name == d.CACHE_WRITE:
                for name, value in zip(d.CacheWriteOp.CACHES, op.opview.caches):
                    if isinstance(value, ir.BlockArgument) and value.owner == entry:
                        names.setdefault(value.arg_number, name)
        if not names:
            continue
        view = ir.Type.parse("!hal.buffer_view")
        first = entry.operations[0] if len(entry.operations) else None
        for number, name in sorted(names.items()):
            argument = entry.arguments[number]
            tensor_type = ir.RankedTensorType(argument.type)
            uses = [(use.owner, use.operand_number) for use in argument.uses]
            argument.set_type(view)
            with ir.InsertionPoint(first), func.location:
                dims = [ir.Operation.create(
                    "hal.buffer_view.dim", results=[ir.IndexType.get()], operands=[argument],
                    attributes={"index": ir.IntegerAttr.get(ir.IndexType.get(), i)}).result
                    for i in range(tensor_type.rank) if tensor_type.is_dynamic_dim(i)]
                imported = ir.Operation.create(
                    "hal.tensor.import", results=[tensor_type], operands=[argument, *dims],
                    attributes={"consume": ir.UnitAttr.get(), "name": ir.StringAttr.get(name),
                                "target_encoding": ir.TypeAttr.get(tensor_type),
                                "operandSegmentSizes": ir.DenseI32ArrayAttr.get(
                                    [1, len(dims), 0, 0])}).result
            for owner, position in uses:
                owner.operands[position] = imported
        function_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        inputs = [a.type for a in entry.arguments]
        func.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(inputs, list(function_type.results)))


@dataclass(frozen=True)
class LowerCacheWrite:
    """Quantize new tokens and scatter them into the paged cache, in the caller's buffers."""

    argument: ClassVar[str] = "lower-cache-write"

    def run(self, module: ir.Operation) -> None:
        if not any(op.name == d.CACHE_WRITE for op in walk(module)):
            return
        import_argument_caches(module)
        apply_patterns(module, {d.CACHE_WRITE: lower_cache_write})
