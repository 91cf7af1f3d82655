"""int8-qk: INT8 QK scores in front of the softmax and PV.

Rewrites `int8attn.attention` into

    qq, sq  = int8attn.quantize(q)                     per query row
    acc     = sum_d i32(qq) * i32(k)                   int32 dot
    scores  = f32(acc) * sq * k_scale * softmax_scale
    o       = int8attn.softmax_pv(scores, v, v_scale)

Query heads are grouped by the KV head they read (GQA: head h reads KV head
h // (Hq/Hkv)), so everything after this pass sees rows [B, Hkv, R, ...]: the
G = Hq/Hkv heads in decode, the G*Sq (head, query token) pairs in prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith

from int8attn.dialects import int8attn as d
from int8attn.passes import builders as build
from int8attn.passes.rewrite import apply_patterns


def group_query_rows(q: ir.Value, kv_heads: int) -> ir.Value:
    """[B,Hq,D] -> [B,Hkv,G,D];  [B,Hq,Sq,D] -> [B,Hkv,G*Sq,D] (head-major rows)."""
    shape = d.shape_of(q)
    batch, q_heads, head_dim = shape[0], shape[1], shape[-1]
    group = q_heads // kv_heads
    if len(shape) == 3:
        return build.expand(q, [[0], [1, 2], [3]], [batch, kv_heads, group, head_dim])
    heads = build.expand(q, [[0], [1, 2], [3], [4]], [batch, kv_heads, group, shape[2], head_dim])
    return build.collapse(heads, [[0], [1], [2, 3], [4]])


def ungroup_query_rows(out: ir.Value, q_shape: list[int]) -> ir.Value:
    """Inverse of `group_query_rows` for the attention output."""
    if len(q_shape) == 3:
        return build.collapse(out, [[0], [1, 2], [3]])
    batch, kv_heads, rows, head_dim = d.shape_of(out)
    query_tokens = q_shape[2]
    heads = build.expand(out, [[0], [1], [2, 3], [4]],
                         [batch, kv_heads, rows // query_tokens, query_tokens, head_dim])
    return build.collapse(heads, [[0], [1, 2], [3], [4]])


def rewrite_attention(op: d.AttentionOp, rewriter):
    mode, softmax_scale = op.mode, op.softmax_scale
    q, k, k_scale, v, v_scale = op.q, op.k, op.k_scale, op.v, op.v_scale
    q_shape = d.shape_of(q)
    kv_heads = d.shape_of(k)[1]
    with rewriter.ip, op.location:
        if d.element_of(q) != "f32":
            q = arith.extf(d.tensor(q_shape, "f32"), q)
        grouped = group_query_rows(q, kv_heads)
        qq, sq = d.quantize(grouped)
        scores = int8_scores(qq, sq, k, k_scale, softmax_scale)
        out = d.softmax_pv(scores, v, v_scale, mode=mode,
                           query_tokens=q_shape[2] if mode == "prefill" else 1)
        result = ungroup_query_rows(out, q_shape)
    rewriter.replace_op(op, [result])


def int8_scores(qq: ir.Value, sq: ir.Value, k: ir.Value, k_scale: ir.Value,
                softmax_scale: float) -> ir.Value:
    """scores[b,h,r,s] = f32(sum_d qq*k) * sq * k_scale * softmax_scale (the contract's QK)."""
    batch, kv_heads, rows = d.shape_of(qq)[:3]
    tokens = d.shape_of(k)[2]
    acc = build.generic([qq, k], ["bhrd", "bhsd"], "bhrs",
                        build.zeros([batch, kv_heads, rows, tokens], "i32"), _int8_dot)
    scale = build.f32(softmax_scale)
    return build.generic(
        [acc, sq, k_scale], ["bhrs", "bhr", "bhs"], "bhrs",
        build.empty([batch, kv_heads, rows, tokens], "f32"),
        lambda a, s_q, s_k, _: arith.mulf(arith.mulf(arith.mulf(build.to_f32(a), s_q), s_k),
                                          scale))


def _int8_dot(lhs, rhs, acc):
    return arith.addi(acc, arith.muli(build.to_i32(lhs), build.to_i32(rhs)))


@dataclass(frozen=True)
class Int8QK:
    """Quantize query rows and compute attention scores with an int8 dot product."""

    argument: ClassVar[str] = "int8-qk"

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.ATTENTION: rewrite_attention})
