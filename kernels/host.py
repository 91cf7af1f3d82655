"""The host side of the decode kernels: a function with the graph's signature.

    q -> rows per KV head -> int8attn.quantize -> rows padded to 16
    K, scales padded to whole partitions; V padded and transposed to [.., D, S]
    flow.dispatch partition kernel, flow.dispatch merge kernel
    rows [0, G) -> [B, Hq, D]

The V transpose is a real copy per call (the graph's cache is token-major);
it shows in the module, where a paged token-innermost cache would remove it.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects import flow, func, linalg, tensor

from int8attn.dialects import int8attn as d
from int8attn.kernels.decode import MERGE_KERNEL, PARTITION_KERNEL, ROWS, DecodeKernels
from int8attn.passes import builders as build


def _dispatch(executable: str, results, arguments):
    entry = ir.Attribute.parse(f"[@{executable}::@{executable}]")
    op = flow.DispatchOp(results, [], entry, arguments, [], [])
    return list(op.results)


def build_host_function(kernels: DecodeKernels, name: str, q_type: ir.Type, *,
                        v_token_innermost: bool = False) -> None:
    """func.func @name(q, k, k_scale, v, v_scale) at the current insertion point.

    With `v_token_innermost`, v comes as [B, Hkv, D, S] (the kernel's layout, as
    a paged cache would hold it) and the per-call transpose disappears.
    """
    s = kernels.shape
    b, hkv, rows, dim, padded = s.batch, s.kv_heads, s.rows, s.head_dim, kernels.padded_tokens
    cache = d.tensor([b, hkv, s.tokens, dim], "i8")
    v_type = d.tensor([b, hkv, dim, s.tokens], "i8") if v_token_innermost else cache
    scales = d.tensor([b, hkv, s.tokens], "f32")

    @func.FuncOp.from_py_func(q_type, cache, scales, v_type, scales, name=name)
    def host(q, k, k_scale, v, v_scale):
        if d.element_of(q) != "f32":
            from iree.compiler.dialects import arith

            q = arith.extf(d.tensor(d.shape_of(q), "f32"), q)
        grouped = build.expand(q, [[0], [1, 2], [3]], [b, hkv, rows, dim])
        qq, sq = d.quantize(grouped)
        qq = build.pad_dim(qq, 2, ROWS, build.zero("i8"))
        sq = build.pad_dim(sq, 2, ROWS, build.zero("f32"))
        k = build.pad_dim(k, 2, padded, build.zero("i8"))
        k_scale = build.pad_dim(k_scale, 2, padded, build.zero("f32"))
        v_scale = build.pad_dim(v_scale, 2, padded, build.zero("f32"))
        if v_token_innermost:
            v_t = build.pad_dim(v, 3, padded, build.zero("i8"))
        else:
            v = build.pad_dim(v, 2, padded, build.zero("i8"))
            v_t = linalg.transpose(v, outs=[build.empty([b, hkv, dim, padded], "i8")],
                                   permutation=[0, 1, 3, 2])
            v_t = v_t if isinstance(v_t, ir.Value) else v_t.result
        parts = [b, hkv, kernels.partitions, ROWS]
        o_part, m_part, l_part = _dispatch(
            PARTITION_KERNEL,
            [d.tensor(parts + [dim], "f32"), d.tensor(parts, "f32"), d.tensor(parts, "f32")],
            [qq, sq, k, k_scale, v_t, v_scale])
        (out,) = _dispatch(MERGE_KERNEL, [d.tensor([b, hkv, ROWS, dim], "f32")],
                           [o_part, m_part, l_part])
        real = tensor.ExtractSliceOp(d.tensor([b, hkv, rows, dim], "f32"), out, [], [], [],
                                     [0, 0, 0, 0], [b, hkv, rows, dim], [1, 1, 1, 1]).result
        return build.collapse(real, [[0], [1, 2], [3]])


def build_kernel_entries(kernels: DecodeKernels) -> None:
    """@partition(qq, sq, k, k_scale, v_t, v_scale) -> (o, m, l) and @merge(o, m, l) -> out:
    the two kernels alone, for checking each against the lane simulator on a device."""
    s = kernels.shape
    b, hkv, dim, padded = s.batch, s.kv_heads, s.head_dim, kernels.padded_tokens
    parts = [b, hkv, kernels.partitions, ROWS]
    outs = [d.tensor(parts + [dim], "f32"), d.tensor(parts, "f32"), d.tensor(parts, "f32")]
    inputs = [d.tensor([b, hkv, ROWS, dim], "i8"), d.tensor([b, hkv, ROWS], "f32"),
              d.tensor([b, hkv, padded, dim], "i8"), d.tensor([b, hkv, padded], "f32"),
              d.tensor([b, hkv, dim, padded], "i8"), d.tensor([b, hkv, padded], "f32")]

    @func.FuncOp.from_py_func(*inputs, name="partition")
    def partition(*args):
        return tuple(_dispatch(PARTITION_KERNEL, outs, list(args)))

    @func.FuncOp.from_py_func(*outs, name="merge")
    def merge(o, m, l):
        return _dispatch(MERGE_KERNEL, [d.tensor([b, hkv, ROWS, dim], "f32")], [o, m, l])[0]
