"""int8-qk: INT8 QK scores in front of the softmax and PV.

Rewrites `int8attn.attention` into

    qq, sq  = int8attn.quantize(q)                     per query row
    acc     = sum_d i32(qq) * i32(k)                   int32 dot
    scores  = (f32(acc) * (sq * c)) * k_scale          c = softmax_scale * log2 e
    o       = int8attn.softmax_pv(scores, v, v_scale)

The scores are in log2 units (the softmax takes exp2 of them): c, rounded once
to f32 (`contract.constants.score_scale`), is folded into each row's scale, so
a score costs two multiplies.

With `q-terms=2` (docs/design.md §2c) q is quantized in two INT8 terms, the second
quantizing the f32 residual, and each term has its own int32 dot:

    qq1, s1 = int8attn.quantize(q);  qq2, s2 = int8attn.quantize(q - f32(qq1) * s1)
    scores  = fma(f32(acc1), s1 * c, f32(acc2) * (s2 * c)) * k_scale

Query heads are grouped by the KV head they read (GQA: head h reads KV head
h // (Hq/Hkv)), so everything after this pass sees rows [B, Hkv, R, ...]: the
G = Hq/Hkv heads in decode, the G*Sq (head, query token) pairs in prefill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..dialects import int8attn as d
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from .rewrite import apply_patterns
from ..contract.constants import QTerms, score_scale
from ..contract.numerics import Numerics
from ..support.options import TypedOptions, option


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


def rewrite_attention(op: d.AttentionOp, rewriter, q_terms: int = 1):
    mode, softmax_scale = op.mode, op.softmax_scale
    q, k, k_scale, v, v_scale = op.q, op.k, op.k_scale, op.v, op.v_scale
    q_shape = d.shape_of(q)
    kv_heads = d.shape_of(k)[1]
    with rewriter.ip, op.location:
        if d.element_of(q) != "f32":
            q = arith.extf(d.tensor(q_shape, "f32"), q)
        grouped = group_query_rows(q, kv_heads)
        scores = int8_scores(quantize_q(grouped, q_terms), k, k_scale, softmax_scale)
        out = d.softmax_pv(scores, v, v_scale, mode=mode,
                           query_tokens=q_shape[2] if mode == "prefill" else 1)
        result = ungroup_query_rows(out, q_shape)
    rewriter.replace_op(op, [result])


def quantize_q(rows: ir.Value, q_terms: int) -> list[tuple[ir.Value, ir.Value]]:
    """[(qq1, s1)] = quantize(rows); with two terms also (qq2, s2) = quantize(rows - f32(qq1)*s1),
    the residual rounded once (math.fma, as reference.quantize_q states it)."""
    terms = [d.quantize(rows)]
    if q_terms == 2:
        qq, sq = terms[0]
        residual = build.generic(
            [rows, qq, sq], ["bhrd", "bhrd", "bhr"], "bhrd",
            build.empty(d.shape_of(rows), "f32"),
            lambda x, q_i, s_i, _: contract.q_residual(x, q_i, s_i))
        terms.append(d.quantize(residual))
    return terms


def int8_scores(terms: Sequence[tuple[ir.Value, ir.Value]], k: ir.Value, k_scale: ir.Value,
                softmax_scale: float) -> ir.Value:
    """scores[b,h,r,s] = f32(sum_d qq1*k) * (s1*c) * k_scale, or with two terms
    fma(f32(sum_d qq1*k), s1*c, f32(sum_d qq2*k) * (s2*c)) * k_scale (`contract.score_terms`),
    c = softmax_scale * log2 e (the contract's QK, in log2 units; `terms` from
    `quantize_q`)."""
    batch, kv_heads, rows = d.shape_of(terms[0][0])[:3]
    tokens = d.shape_of(k)[2]
    sums = [int8_dot(qq, k) for qq, _ in terms]
    c = build.f32(score_scale(softmax_scale))
    row_scales = [build.generic([sq], ["bhr"], "bhr", build.empty(d.shape_of(sq), "f32"),
                                lambda s_q, _: contract.score_row_scale(s_q, c))
                  for _, sq in terms]

    def body(*args):
        *pairs, s_k, _ = args
        sums = [build.to_f32(a) for a in pairs[0::2]]
        return arith.mulf(contract.score_terms(sums, list(pairs[1::2])), s_k)

    inputs = [x for acc, sq in zip(sums, row_scales) for x in (acc, sq)]
    return build.generic(
        [*inputs, k_scale], ["bhrs", "bhr"] * len(terms) + ["bhs"], "bhrs",
        build.empty([batch, kv_heads, rows, tokens], "f32"), body)


def int8_dot(qq: ir.Value, k: ir.Value) -> ir.Value:
    """acc[b,h,r,s] = sum_d i32(qq[b,h,r,d]) * i32(k[b,h,s,d]), as a contraction with one
    batch dim (b*h): the form IREE's data tiling packs onto the CPU's mmt4d tiles and
    integer dot-product instructions (it leaves a contraction with two batch dims as a
    generic, multiplied in i32)."""
    batch, kv_heads, rows, _ = d.shape_of(qq)
    tokens = d.shape_of(k)[2]
    if d.DYNAMIC in (batch, kv_heads, rows, tokens):
        return build.generic([qq, k], ["bhrd", "bhsd"], "bhrs",
                             build.zeros([batch, kv_heads, rows, tokens], "i32"), _int8_dot)
    merged = [[0, 1], [2], [3]]
    acc = build.generic([build.collapse(qq, merged), build.collapse(k, merged)],
                        ["brd", "bsd"], "brs",
                        build.zeros([batch * kv_heads, rows, tokens], "i32"), _int8_dot)
    return build.expand(acc, merged, [batch, kv_heads, rows, tokens])


def _int8_dot(lhs, rhs, acc):
    return arith.addi(acc, arith.muli(build.to_i32(lhs), build.to_i32(rhs)))


@dataclass(frozen=True)
class Int8QK(TypedOptions):
    """Quantize query rows and compute attention scores with an int8 dot product."""

    argument: ClassVar[str] = "int8-qk"
    # The contract's default (`Numerics()`), as the named pipelines'.
    q_terms: QTerms = option(Numerics().q_terms, "INT8 terms of q: 1, or 2 (the second "
                             "quantizes the f32 residual q - Qq1*s1; one more int8 dot)")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.ATTENTION: lambda op, rw: rewrite_attention(
            op, rw, self.q_terms)})
