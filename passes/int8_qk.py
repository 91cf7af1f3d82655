"""int8-qk: INT8 QK scores in front of the softmax and PV.

Rewrites `int8attn.attention` (decode) into

    qq, sq  = int8attn.quantize(q)                     per query row
    acc     = sum_d i32(qq) * i32(k)                   int32 dot
    scores  = f32(acc) * sq * k_scale * softmax_scale
    o       = int8attn.softmax_pv(scores, v, v_scale)

Query heads are grouped by the KV head they read (GQA: head h reads KV head
h // (Hq/Hkv)), so everything after this pass sees rows [B, Hkv, R, ...].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith

from int8attn.diagnostics import DiagnosticError
from int8attn.dialects import int8attn as d
from int8attn.passes import builders as build
from int8attn.passes.rewrite import apply_patterns


def rewrite_attention(op, rewriter):
    mode = ir.StringAttr(op.attributes["mode"]).value
    if mode != "decode":
        raise DiagnosticError(
            op.location, f"'{op.name}' op with mode = \"{mode}\" is not supported by this "
            f"pipeline yet; only mode = \"decode\" lowers")
    q, k, k_scale, v, v_scale = op.operands
    softmax_scale = ir.FloatAttr(op.attributes["softmax_scale"]).value
    batch, q_heads, head_dim = d.shape_of(q)
    kv_heads, tokens = d.shape_of(k)[1:3]
    rows = q_heads // kv_heads
    with rewriter.ip, op.location:
        if d.element_of(q) != "f32":
            q = arith.extf(d.tensor(d.shape_of(q), "f32"), q)
        grouped = build.expand(q, [[0], [1, 2], [3]], [batch, kv_heads, rows, head_dim])
        qq, sq = d.quantize(grouped)
        acc = build.generic(
            [qq, k], ["bhrd", "bhsd"], "bhrs",
            build.zeros([batch, kv_heads, rows, tokens], "i32"),
            _int8_dot)
        scale = build.f32(softmax_scale)
        scores = build.generic(
            [acc, sq, k_scale], ["bhrs", "bhr", "bhs"], "bhrs",
            build.empty([batch, kv_heads, rows, tokens], "f32"),
            lambda a, s_q, s_k, _: arith.mulf(
                arith.mulf(arith.mulf(build.to_f32(a), s_q), s_k), scale))
        out = d.softmax_pv(scores, v, v_scale, mode=mode)
        result = build.collapse(out, [[0], [1, 2], [3]])
    rewriter.replace_op(op, [result])


def _int8_dot(lhs, rhs, acc):
    return arith.addi(acc, arith.muli(build.to_i32(lhs), build.to_i32(rhs)))


@dataclass(frozen=True)
class Int8QK:
    """Quantize query rows and compute attention scores with an int8 dot product."""

    argument: ClassVar[str] = "int8-qk"

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.ATTENTION: rewrite_attention})
