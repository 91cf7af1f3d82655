"""The host side of the decode kernels: a function with the graph's signature.

Dense (`int8attn.attention`, decode):
    K, scales padded to whole partitions; V padded and transposed to [.., D, S]
    flow.dispatch partition[P, Hkv, B], flow.dispatch merge[Hkv, B]
    rows [0, G) -> [B, Hq, D]
Prefill (`int8attn.attention`, prefill): K, scales, V padded to whole tiles, V
transposed; flow.dispatch prefill[row blocks, Hkv, B] -> [B, Hq, Sq, D].
Paged prefill (`int8attn.paged_attention`, q [B, Hq, Sq, D]): one dispatch
prefill[row blocks, Hkv, B] on the pool as it is.
Paged (`int8attn.paged_attention`): no copy of the pool; B, NB, MB come from
the arguments' shapes and the partition count P = ceil(MB * BS / 256) is
computed at run time, so one compiled module serves every batch.

The query rows are quantized inside the partition kernel. The V transpose of
the dense graph is a real copy per call (its cache is token-major); the paged
cache is token-innermost already.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import arith, func, linalg, tensor

from ..dialects import int8attn as d
from .abi import DENSE_INPUTS, PAGED_INPUTS, KernelABI
from .decode import DecodeKernels
from ..fragments import arith_ops, ceil_div
from .executable import dispatch
from .prefill import PrefillKernels
from ..dialects import builders as build

DYN = d.DYNAMIC


def _f32(value: ir.Value) -> ir.Value:
    if d.element_of(value) == "f32":
        return value
    return arith.extf(d.tensor(d.shape_of(value), "f32"), value)


def _real_rows(out: ir.Value, shape, rows_out: int, batch) -> ir.Value:
    """[B, Hkv, rows_out, D] -> [B, Hq, D]: the real query rows of each KV head."""
    b, hkv, g, dim = batch, shape.kv_heads, shape.rows, shape.head_dim
    static_b = b if isinstance(b, int) else DYN
    sizes = [] if isinstance(b, int) else [b]
    real = tensor.ExtractSliceOp(d.tensor([static_b, hkv, g, dim], "f32"), out, [], sizes, [],
                                 [0, 0, 0, 0], [static_b, hkv, g, dim], [1, 1, 1, 1]).result
    return build.collapse(real, [[0], [1, 2], [3]])


def _dense_cache_types(s, v_token_innermost: bool) -> list[ir.Type]:
    """k, k_scale, v, v_scale of a dense graph: [B, Hkv, S, D] (v [B, Hkv, D, S]
    with `v_token_innermost`) and [B, Hkv, S]."""
    cache = d.tensor([s.batch, s.kv_heads, s.tokens, s.head_dim], "i8")
    v_type = (d.tensor([s.batch, s.kv_heads, s.head_dim, s.tokens], "i8")
              if v_token_innermost else cache)
    scales = d.tensor([s.batch, s.kv_heads, s.tokens], "f32")
    return [cache, scales, v_type, scales]


def _padded_caches(k, k_scale, v, v_scale, padded: int, v_token_innermost: bool):
    """The dense cache padded to `padded` tokens, V token-innermost ([.., D, S])."""
    b, hkv, _, dim = d.shape_of(k)
    k = build.pad_dim(k, 2, padded, build.zero("i8"))
    k_scale = build.pad_dim(k_scale, 2, padded, build.zero("f32"))
    v_scale = build.pad_dim(v_scale, 2, padded, build.zero("f32"))
    if v_token_innermost:
        return k, k_scale, build.pad_dim(v, 3, padded, build.zero("i8")), v_scale
    v = build.pad_dim(v, 2, padded, build.zero("i8"))
    v_t = linalg.transpose(v, outs=[build.empty([b, hkv, dim, padded], "i8")],
                           permutation=[0, 1, 3, 2])
    # linalg.transpose's result is variadic: the bindings give an op or a result list
    if not isinstance(v_t, ir.Value):
        v_t = (v_t if isinstance(v_t, ir.OpResultList) else v_t.results)[0]
    return k, k_scale, v_t, v_scale


def build_host_function(kernels: DecodeKernels, name: str, q_type: ir.Type, *,
                        v_token_innermost: bool = False) -> None:
    """func.func @name(q, k, k_scale, v, v_scale) at the current insertion point.

    With `v_token_innermost`, v comes as [B, Hkv, D, S] (the kernel's layout, as
    a paged cache would hold it) and the per-call transpose disappears.
    """
    s = kernels.shape

    @func.FuncOp.from_py_func(q_type, *_dense_cache_types(s, v_token_innermost), name=name)
    def host(q, k, k_scale, v, v_scale):
        caches = _padded_caches(k, k_scale, v, v_scale, kernels.access.padded,
                                v_token_innermost)
        values = _run_abi(kernels.abi, {}, dict(zip(DENSE_INPUTS, [_f32(q), *caches])), [])
        return _real_rows(values["out"], s, kernels.rows_out, s.batch)


class _PagedArguments:
    """A paged function's seven arguments cast to the kernels' dynamic types
    (q as f32), and the run-time sizes B, NB and MB read off them."""

    def __init__(self, shape, arguments, q_dims):
        hkv, dim, bs = shape.kv_heads, shape.head_dim, shape.block_size
        dynamic = [d.tensor([DYN, *q_dims], "f32"), d.tensor([DYN, hkv, bs, dim], "i8"),
                   d.tensor([DYN, hkv, bs], "f32"), d.tensor([DYN, hkv, dim, bs], "i8"),
                   d.tensor([DYN, hkv, bs], "f32"), d.tensor([DYN, DYN], "i32"),
                   d.tensor([DYN], "i32")]
        self.values = [tensor.CastOp(t, a).result if a.type != t else a
                       for t, a in zip(dynamic, [_f32(arguments[0]), *arguments[1:]])]
        q, k, tables = self.values[0], self.values[1], self.values[5]
        self.batch = tensor.DimOp(q, build.index(0)).result
        self.blocks = tensor.DimOp(k, build.index(0)).result
        self.width = tensor.DimOp(tables, build.index(1)).result

    @property
    def dims(self) -> list[ir.Value]:
        """The dynamic dims of the seven tensors, in order (for flow.dispatch)."""
        b, nb = self.batch, self.blocks
        return [b, nb, nb, nb, nb, b, self.width, b]


def _cast(value: ir.Value, result_type: ir.Type) -> ir.Value:
    return tensor.CastOp(result_type, value).result if value.type != result_type else value


def _abi_dispatch(abi: KernelABI, sizes: dict[str, ir.Value], values: dict[str, ir.Value],
                  argument_dims: list[ir.Value],
                  written_dims: list[ir.Value] = ()) -> list[ir.Value]:
    """flow.dispatch of one kernel as its ABI declares it: the inputs by name (its
    counters zero-filled here, after the others), the index push constants, the grid,
    one result per output buffer, then one result tied to each input the kernel
    updates in place (`written_dims`: the dynamic dims of those but the counters, in
    order)."""
    size = lambda n: sizes[n] if isinstance(n, str) else build.index(n)
    counter_dims = [sizes[n] for b in abi.counters for n in b.shape if isinstance(n, str)]
    values = {**values, **{b.name: _zeroed(b, sizes) for b in abi.counters}}
    results = [d.tensor([n if isinstance(n, int) else DYN for n in b.shape], b.element)
               for b in abi.outputs] + [values[n].type for n in abi.writes_inputs]
    result_dims = [sizes[n] for b in abi.outputs for n in b.shape if isinstance(n, str)]
    tied = None
    if abi.writes_inputs:
        tied = [-1] * len(abi.outputs) + [abi.inputs.index(n) for n in abi.writes_inputs]
    return dispatch(abi.kernel, [size(g) for g in abi.workload], results,
                    [values[n] for n in abi.inputs] + [sizes[c] for c in abi.constants],
                    argument_dims=list(argument_dims) + counter_dims,
                    result_dims=result_dims + list(written_dims) + counter_dims, tied=tied)


def _zeroed(buffer, sizes: dict[str, ir.Value]) -> ir.Value:
    """A counter buffer, zero-filled (IREE fills it in place: no kernel)."""
    dynamic = iter(sizes[n] for n in buffer.shape if isinstance(n, str))
    empty = tensor.EmptyOp([n if isinstance(n, int) else next(dynamic) for n in buffer.shape],
                           ir.Type.parse(buffer.element)).result
    return linalg.fill(build.zero(buffer.element), outs=[empty])


def _run_abi(abis, sizes: dict[str, ir.Value], values: dict[str, ir.Value],
             input_dims: list[ir.Value]) -> dict[str, ir.Value]:
    """Every kernel of `abis` in order, each taking its inputs by name among `values`
    and the earlier kernels' outputs (`input_dims`: the dynamic dims of `values`'
    tensors in order; an output's come from `sizes`). Returns every buffer by name."""
    values, given = dict(values), iter(input_dims)
    dims = {name: [next(given) for n in d.shape_of(value) if n == DYN]
            for name, value in values.items()}
    for abi in abis:
        argument_dims = [x for n in abi.inputs if n in dims for x in dims[n]]
        for b, result in zip(abi.outputs, _abi_dispatch(abi, sizes, values, argument_dims)):
            values[b.name] = result
            dims[b.name] = [sizes[n] for n in b.shape if isinstance(n, str)]
    return values


def _paged_sizes(args: "_PagedArguments", shape, partition_tokens: int) -> dict:
    """B, NB, MB as read off the arguments, and P = ceil(MB * BS / partition tokens)."""
    tokens = arith.muli(args.width, build.index(shape.block_size))
    parts = ceil_div(arith_ops(build.index), tokens, partition_tokens)
    return {"B": args.batch, "NB": args.blocks, "MB": args.width, "P": parts}


def build_paged_host_function(kernels: DecodeKernels, name: str, argument_types,
                              result_type: ir.Type) -> None:
    """func.func @name(q, k_cache, k_scale, v_cache, v_scale, block_tables,
    context_lens) at the current insertion point; any of B, NB, MB may be static
    or dynamic in the signature. The dispatches follow `kernels.abi`."""
    s = kernels.shape

    @func.FuncOp.from_py_func(*argument_types, name=name)
    def host(*arguments):
        args = _PagedArguments(s, arguments, [s.q_heads, s.head_dim])
        sizes = _paged_sizes(args, s, kernels.access.partition_tokens)
        values = _run_abi(kernels.abi, sizes, dict(zip(PAGED_INPUTS, args.values)), args.dims)
        return _cast(_real_rows(values["out"], s, kernels.rows_out, args.batch), result_type)


def build_prefill_host_function(kernels: PrefillKernels, name: str, q_type: ir.Type, *,
                                v_token_innermost: bool = False) -> None:
    """func.func @name(q, k, k_scale, v, v_scale) of a causal prefill graph (v as
    [B, Hkv, D, S] with `v_token_innermost`)."""
    s = kernels.shape
    (prefill,) = kernels.abi

    @func.FuncOp.from_py_func(q_type, *_dense_cache_types(s, v_token_innermost), name=name)
    def host(q, k, k_scale, v, v_scale):
        caches = _padded_caches(k, k_scale, v, v_scale, kernels.access.padded,
                                v_token_innermost)
        (out,) = _abi_dispatch(prefill, {}, dict(zip(DENSE_INPUTS, [_f32(q), *caches])), [])
        return out


def build_paged_prefill_host_function(kernels: PrefillKernels, name: str, argument_types,
                                      result_type: ir.Type) -> None:
    """func.func @name(q [B, Hq, Sq, D], k_cache, k_scale, v_cache, v_scale, block_tables,
    context_lens) of a chunked prefill over the block pool: one dispatch (`kernels.abi`),
    the pool as it is; any of B, NB, MB may be static or dynamic in the signature."""
    s = kernels.shape
    (prefill,) = kernels.abi

    @func.FuncOp.from_py_func(*argument_types, name=name)
    def host(*arguments):
        args = _PagedArguments(s, arguments, [s.q_heads, s.query_tokens, s.head_dim])
        sizes = {"B": args.batch, "NB": args.blocks, "MB": args.width}
        (out,) = _abi_dispatch(prefill, sizes, dict(zip(PAGED_INPUTS, args.values)), args.dims)
        return _cast(out, result_type)


def build_cache_write_host_function(kernels, name: str, argument_types,
                                    result_types) -> None:
    """func.func @name(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale
    [, k_bias]) -> the four caches, updated in place by one dispatch (`kernels.abi`);
    T and NB static or dynamic in the signature, f16/bf16 new rows widened to f32
    first (the kernel reads f32, as `lower-cache-write` quantizes in f32)."""
    (write,) = kernels.abi
    s = kernels.shape
    hkv, dim, bs = s.kv_heads, s.head_dim, s.block_size
    dynamic = [d.tensor([DYN, hkv, dim], "f32"), d.tensor([DYN, hkv, dim], "f32"),
               d.tensor([DYN], "i32"), d.tensor([DYN, hkv, bs, dim], "i8"),
               d.tensor([DYN, hkv, bs], "f32"), d.tensor([DYN, hkv, dim, bs], "i8"),
               d.tensor([DYN, hkv, bs], "f32")] + [d.tensor([hkv, dim], "f32")] * s.k_bias

    @func.FuncOp.from_py_func(*argument_types, name=name)
    def host(*arguments):
        rows = [_f32(a) for a in arguments[:2]]
        values = [_cast(a, t) for a, t in zip(rows + list(arguments[2:]), dynamic)]
        tokens = tensor.DimOp(values[0], build.index(0)).result
        blocks = tensor.DimOp(values[3], build.index(0)).result
        caches = _abi_dispatch(write, {"T": tokens, "NB": blocks},
                               dict(zip(write.inputs, values)),
                               [tokens, tokens, tokens] + [blocks] * 4, [blocks] * 4)
        return tuple(_cast(c, t) for c, t in zip(caches, result_types))
