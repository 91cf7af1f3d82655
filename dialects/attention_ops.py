"""The attention ops: `int8attn.attention` and its first lowering, `quantize` and `softmax_pv`.

`attention` is the graph-level op (INT8 K/V cache with per-token scales);
`int8-qk` rewrites it into `quantize` of the queries, int32 dots and scores, and
`softmax_pv` (softmax of the scores times the INT8 V cache); `quantize` also
quantizes the new rows of `cache_write`. Typed classes as described in `ops`.
"""

from __future__ import annotations

from iree.compiler import ir
from iree.compiler.dialects._ods_common import _cext

from ..contract.constants import softmax_scale_problem
from .op_base import (DYNAMIC, FLOAT_TYPES, MODES, Int8AttnOp, _Check,
                      _Dialect, _operand, _result, _string, shape_of, tensor)


@_cext.register_operation(_Dialect)
class AttentionOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.attention"
    ATTRIBUTES = ("mode", "softmax_scale")
    q = _operand(0, "queries f32/f16/bf16 [B,Hq,D] (decode) or [B,Hq,Sq,D] (prefill)")
    k = _operand(1, "keys i8 [B,Hkv,S,D]")
    k_scale = _operand(2, "key scales f32 [B,Hkv,S]")
    v = _operand(3, "values i8 [B,Hkv,S,D]")
    v_scale = _operand(4, "value scales f32 [B,Hkv,S]")
    mode = _string("mode")

    @property
    def softmax_scale(self) -> float:
        return ir.FloatAttr(self.attributes["softmax_scale"]).value

    @classmethod
    def build(cls, q, k, k_scale, v, v_scale, *, mode: str, softmax_scale: float,
              loc=None) -> AttentionOp:
        attrs = {"mode": ir.StringAttr.get(mode),
                 "softmax_scale": ir.FloatAttr.get(ir.F32Type.get(), softmax_scale)}
        return cls._create([tensor(shape_of(q), "f32")], [q, k, k_scale, v, v_scale], attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(5, 1)
        q, k, k_scale, v, v_scale = self.q, self.k, self.k_scale, self.v, self.v_scale
        mode = c.string_attr("mode", MODES)
        q_rank = 3 if mode == "decode" else 4
        qs = c.ranked(q, "q", q_rank, FLOAT_TYPES)
        ks = c.ranked(k, "k", 4, ("i8",))
        vs = c.ranked(v, "v", 4, ("i8",))
        c.ranked(k_scale, "k_scale", 3, ("f32",))
        c.ranked(v_scale, "v_scale", 3, ("f32",))
        batch, kv_heads, tokens, head_dim = ks
        c.same(vs, ks, "v")
        c.same(shape_of(k_scale), ks[:3], "k_scale")
        c.same(shape_of(v_scale), ks[:3], "v_scale")
        c.that(qs[0] == batch, f"q has batch {qs[0]} but k has batch {batch}")
        c.that(qs[-1] == head_dim, f"q has head dim {qs[-1]} but k has head dim {head_dim}")
        c.that(qs[1] % kv_heads == 0,
               f"query heads ({qs[1]}) must be a multiple of KV heads ({kv_heads}) for GQA")
        if mode == "prefill":
            c.that(qs[2] <= tokens,
                   f"prefill has {qs[2]} query tokens but only {tokens} KV tokens; "
                   f"the queries must be the last Sq of the S tokens")
        scale = c.f32_attr("softmax_scale", "0.088")
        problem = softmax_scale_problem(scale)
        c.that(problem is None, f"attribute 'softmax_scale' {problem}")
        c.ranked(self.result, "result", q_rank, ("f32",))
        c.same(shape_of(self.result), qs, "result")
        return True


@_cext.register_operation(_Dialect)
class QuantizeOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.quantize"
    ATTRIBUTES = ()
    x = _operand(0, "input float [..., X]")
    xq = _result(0, "quantized rows i8 [..., X]")
    scale = _result(1, "row scales f32 [...]")

    @classmethod
    def build(cls, x, *, loc=None) -> QuantizeOp:
        shape = shape_of(x)
        return cls._create([tensor(shape, "i8"), tensor(shape[:-1], "f32")], [x], loc=loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(1, 2)
        # Leading (row) dims may be dynamic (cache_write's new tokens); the row may not.
        rows = tuple(range(7))
        xs = c.ranked(self.x, "input", tuple(range(1, 9)), FLOAT_TYPES, dynamic=rows)
        c.that(xs[-1] != DYNAMIC, f"input must have a static last (row) dimension, got "
               f"{self.x.type}")
        c.ranked(self.xq, "result #0", len(xs), ("i8",), dynamic=rows)
        c.same(shape_of(self.xq), xs, "result #0")
        c.ranked(self.scale, "result #1", len(xs) - 1, ("f32",), dynamic=rows)
        c.same(shape_of(self.scale), xs[:-1], "result #1")
        return True


@_cext.register_operation(_Dialect)
class SoftmaxPVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.softmax_pv"
    ATTRIBUTES = ("mode", "query_tokens")
    scores = _operand(0, "scores f32 [B,Hkv,R,S], in log2 units")
    v = _operand(1, "values i8 [B,Hkv,S,D]")
    v_scale = _operand(2, "value scales f32 [B,Hkv,S]")
    mode = _string("mode")

    @property
    def query_tokens(self) -> int:
        """Sq (prefill's attribute 'query_tokens'); 1 in decode, where it is absent."""
        if "query_tokens" not in self.attributes:
            return 1
        return ir.IntegerAttr(self.attributes["query_tokens"]).value

    @classmethod
    def build(cls, scores, v, v_scale, *, mode: str, query_tokens: int = 1,
              loc=None) -> SoftmaxPVOp:
        b, hkv, rows, _ = shape_of(scores)
        out = tensor([b, hkv, rows, shape_of(v)[-1]], "f32")
        attrs = {"mode": ir.StringAttr.get(mode)}
        if mode == "prefill":
            attrs["query_tokens"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                       query_tokens)
        return cls._create([out], [scores, v, v_scale], attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(3, 1)
        mode = c.string_attr("mode", MODES)
        b, hkv, rows, tokens = c.ranked(self.scores, "scores", 4, ("f32",))
        vs = c.kv_operands(self.v, self.v_scale, blocked=False)
        c.same(vs[:3], [b, hkv, tokens], "v's leading [B, Hkv, S]")
        if mode == "prefill":
            attr = self.attributes["query_tokens"] if "query_tokens" in self.attributes else None
            if not isinstance(attr, ir.IntegerAttr):
                c.fail("with mode = \"prefill\" requires an integer attribute 'query_tokens' (Sq)")
            sq = self.query_tokens
            c.that(0 < sq <= tokens, f"query_tokens = {sq} must be in [1, {tokens}] (S)")
            c.that(rows % sq == 0, f"{rows} rows are not whole groups of query_tokens = {sq}")
        c.ranked(self.result, "result", 4, ("f32",))
        c.same(shape_of(self.result), [b, hkv, rows, vs[3]], "result")
        return True
