"""decode-split-kv: split-KV softmax over fixed partitions, then the LSE merge.

Rewrites `int8attn.softmax_pv` (decode) into

    scores, v, v_scale  padded to N*T tokens (scores -inf, v and scales 0)
    m_p = max_t score;  e = exp2(score - m_p);  l_p = sum_t e;  P = e / l_p
    O_p = int8attn.pv(P, v, v_scale)                       per partition
    M = max_p m_p;  w_p = exp2(m_p - M) * l_p;  O = sum_p w_p O_p / sum_p w_p

T is `partition_tokens` (256 in the decode kernel: 4 waves of 64 tokens). Every
partition holds at least one real token, so m_p is finite and the padding
contributes exactly 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..dialects import int8attn as d
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from .rewrite import apply_patterns
from ..support.options import TypedOptions, option
from ..fragments import NUMPY_OPS, ceil_div
from ..fragments.model import MAX_BLOCK_TOKENS


def _max(x, acc):
    return arith.maximumf(acc, x)


def _add(x, acc):
    return arith.addf(acc, x)


def partition_softmax(scores: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
    """scores [B,Hkv,R,N,T] -> (m_p, l_p [B,Hkv,R,N], P [B,Hkv,R,N,T]) per partition."""
    probs_shape = d.shape_of(scores)
    stats = probs_shape[:4]
    m = build.generic([scores], ["bhrnt"], "bhrn",
                      build.full(stats, "f32", build.f32(float("-inf"))), _max)
    e = build.generic([scores, m], ["bhrnt", "bhrn"], "bhrnt", build.empty(probs_shape, "f32"),
                      lambda s, m_p, _: contract.exp2(arith.subf(s, m_p)))
    l = build.generic([e], ["bhrnt"], "bhrn", build.zeros(stats, "f32"), _add)
    p = build.generic([e, l], ["bhrnt", "bhrn"], "bhrnt", build.empty(probs_shape, "f32"),
                      lambda e_i, l_p, _: arith.divf(e_i, l_p))
    return m, l, p


def split_kv(op: d.SoftmaxPVOp, rewriter, partition_tokens: int):
    if op.mode != "decode":
        return True  # prefill: left for prefill-online-softmax
    scores, v, v_scale = op.scores, op.v, op.v_scale
    batch, kv_heads, rows, tokens = d.shape_of(scores)
    head_dim = d.shape_of(v)[-1]
    blocks = ceil_div(NUMPY_OPS, tokens, partition_tokens)
    padded = blocks * partition_tokens
    stats = [batch, kv_heads, rows, blocks]
    probs_shape = stats + [partition_tokens]
    with rewriter.ip, op.location:
        neg_inf = build.f32(float("-inf"))
        scores = build.expand(build.pad_dim(scores, 3, padded, neg_inf),
                              [[0], [1], [2], [3, 4]], probs_shape)
        v = build.expand(build.pad_dim(v, 2, padded, build.zero("i8")),
                         [[0], [1], [2, 3], [4]],
                         [batch, kv_heads, blocks, partition_tokens, head_dim])
        v_scale = build.expand(build.pad_dim(v_scale, 2, padded, build.zero("f32")),
                               [[0], [1], [2, 3]], [batch, kv_heads, blocks, partition_tokens])

        m, l, p = partition_softmax(scores)
        partial = d.pv(p, v, v_scale, build.zeros(stats + [head_dim], "f32"))

        rows_shape = [batch, kv_heads, rows]
        m_all = build.generic([m], ["bhrn"], "bhr", build.full(rows_shape, "f32", neg_inf), _max)
        weight = build.generic(
            [m, m_all, l], ["bhrn", "bhr", "bhrn"], "bhrn", build.empty(stats, "f32"),
            lambda m_p, m_max, l_p, _: arith.mulf(contract.exp2(arith.subf(m_p, m_max)), l_p))
        numerator = build.generic(
            [weight, partial], ["bhrn", "bhrnd"], "bhrd",
            build.zeros(rows_shape + [head_dim], "f32"),
            lambda w, o, acc: arith.addf(acc, arith.mulf(w, o)))
        denominator = build.generic([weight], ["bhrn"], "bhr", build.zeros(rows_shape, "f32"), _add)
        out = build.generic([numerator, denominator], ["bhrd", "bhr"], "bhrd",
                            build.empty(rows_shape + [head_dim], "f32"),
                            lambda num, den, _: arith.divf(num, den))
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class DecodeSplitKV(TypedOptions):
    """Split decode softmax+PV into `partition_tokens`-token partitions and merge."""

    argument: ClassVar[str] = "decode-split-kv"
    partition_tokens: int = option(256, "tokens per decode partition", minimum=1,
                                   maximum=MAX_BLOCK_TOKENS)

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.SOFTMAX_PV: lambda op, rw: split_kv(op, rw, self.partition_tokens)})
