"""The `int8attn` ops as typed classes: accessors, a `build` classmethod, `verify`.

IREE's Python bindings cannot define dialects, so the ops stay unregistered in
MLIR (generic form); each one has an `ir.OpView` subclass registered for the
`int8attn` namespace, so `op.opview`, a block's operations, a value's `owner`
and the op handed to a rewrite pattern are instances of that class. A class
gives typed accessors for its operands and attributes (`AttentionOp.q`,
`.mode -> str`, `.softmax_scale -> float`, `GroupedPVOp.groups -> int64
[G, K]`, ...), builds the op (`AttentionOp.build(...)`) and verifies it
(`verify()` raises a `DiagnosticError` at the op's location). Accessors assume
a verified op. See `int8attn.dialects.int8attn` for the op table and semantics.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects._ods_common import _cext

from int8attn.fragments import pv_model_named, pv_model_names
from int8attn.contract.constants import W_QUANTS
from int8attn.support.diagnostics import DiagnosticError

MODES = ("decode", "prefill")
DYNAMIC = ir.ShapedType.get_dynamic_size()
FLOAT_TYPES = ("f32", "f16", "bf16")


# ----------------------------------------------------------------------------
# Type and attribute helpers
# ----------------------------------------------------------------------------

def tensor(shape: Sequence[int], element: str) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.Type.parse(element))


def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def element_of(value: ir.Value) -> str:
    return str(ir.RankedTensorType(value.type).element_type)


def groups_attr(groups: np.ndarray) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get([int(t) for t in row]) for row in groups])


def groups_of(op, name: str = "groups") -> np.ndarray:
    """A groups attribute as an int64 [G, K] table (ValueError if malformed)."""
    attr = op.attributes[name]
    if not isinstance(attr, ir.ArrayAttr):
        raise ValueError("not an array attribute")
    rows = []
    for row in attr:
        if not isinstance(row, ir.DenseI64ArrayAttr):
            raise ValueError("not an array of array<i64: ...>")
        rows.append(list(row))
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("rows of different lengths")
    return np.array(rows, dtype=np.int64)


def _operand(index: int, doc: str) -> property:
    return property(lambda self: self.operation.operands[index], doc=doc)


def _result(index: int, doc: str) -> property:
    return property(lambda self: self.operation.results[index], doc=doc)


def _string(name: str) -> property:
    return property(lambda self: ir.StringAttr(self.attributes[name]).value,
                    doc=f"attribute '{name}' as a str")


def _groups(name: str) -> property:
    return property(lambda self: groups_of(self, name),
                    doc=f"attribute '{name}' as an int64 [G, K] token table")


# ----------------------------------------------------------------------------
# Verifier helper
# ----------------------------------------------------------------------------

class _Check:
    """Collects the first failed expectation of one op as a located error."""

    def __init__(self, op: ir.OpView):
        self.op = op

    def fail(self, message: str):
        raise DiagnosticError(self.op.location, f"'{self.op.name}' op {message}")

    def that(self, condition: bool, message: str):
        if not condition:
            self.fail(message)

    def arity(self, operands: int, results: int):
        self.that(len(self.op.operands) == operands,
                  f"expects {operands} operands, got {len(self.op.operands)}")
        self.that(len(self.op.results) == results,
                  f"expects {results} results, got {len(self.op.results)}")

    def ranked(self, value, what: str, rank: int | tuple[int, ...],
               elements: tuple[str, ...], dynamic: tuple[int, ...] = ()) -> list[int]:
        """The static shape of a ranked tensor operand; dims listed in `dynamic`
        may be `?` (returned as DYNAMIC)."""
        ranks = (rank,) if isinstance(rank, int) else rank
        if not isinstance(value.type, ir.RankedTensorType):
            self.fail(f"{what} must be a ranked tensor, got {value.type}")
        t = ir.RankedTensorType(value.type)
        if any(t.is_dynamic_dim(i) and i not in dynamic for i in range(t.rank)):
            may = (f" (only dims {', '.join(map(str, dynamic))} may be dynamic)" if dynamic
                   else "")
            self.fail(f"{what} must have a static shape{may}, got {value.type}")
        self.that(t.rank in ranks,
                  f"{what} must have rank {' or '.join(map(str, ranks))}, got {value.type}")
        self.that(str(t.element_type) in elements,
                  f"{what} must have element type {' or '.join(elements)}, got {value.type}")
        self.that(all(d > 0 or d == DYNAMIC for d in t.shape),
                  f"{what} has an empty dimension: {value.type}")
        return list(t.shape)

    def same(self, actual, expected, what: str):
        self.that(list(actual) == list(expected),
                  f"{what} has shape {_dims(actual)}, expected {_dims(expected)}")

    def string_attr(self, name: str, choices: tuple[str, ...]) -> str:
        attr = self.op.attributes[name] if name in self.op.attributes else None
        if attr is None or not isinstance(attr, ir.StringAttr):
            self.fail(f"requires a string attribute '{name}' "
                      f"(one of {', '.join(repr(c) for c in choices)})")
        value = ir.StringAttr(attr).value
        self.that(value in choices, f"attribute '{name}' is \"{value}\"; expected one of "
                  f"{', '.join(repr(c) for c in choices)}")
        return value

    def groups(self, tokens: int, name: str = "groups") -> np.ndarray:
        if name not in self.op.attributes:
            self.fail(f"requires a '{name}' attribute ([array<i64: ...>, ...], one row per group)")
        try:
            groups = groups_of(self.op, name)
        except (ValueError, TypeError) as error:
            self.fail(f"attribute '{name}' must be a non-empty list of equally long "
                      f"array<i64: ...> rows ({error})")
        self.that(np.array_equal(np.sort(groups.ravel()), np.arange(tokens)),
                  f"attribute '{name}' must use each of the {tokens} tokens of a block "
                  f"exactly once")
        return groups

    def kv_operands(self, v, v_scale, blocked: bool) -> list[int]:
        if blocked:
            vs = self.ranked(v, "v", 5, ("i8",))
            if v_scale is not None:
                self.ranked(v_scale, "v_scale", 4, ("f32",))
                self.same(shape_of(v_scale), vs[:4], "v_scale")
        else:
            vs = self.ranked(v, "v", 4, ("i8",))
            if v_scale is not None:
                self.ranked(v_scale, "v_scale", 3, ("f32",))
                self.same(shape_of(v_scale), vs[:3], "v_scale")
        return vs

    def block_pv(self, weights_shape, v, v_scale, result):
        b, hkv, rows, blocks, tokens = weights_shape
        vs = self.kv_operands(v, v_scale, blocked=True)
        self.same(vs[:4], [b, hkv, blocks, tokens], "v's leading [B, Hkv, N, T]")
        self.ranked(result, "result", 5, ("f32",))
        self.same(shape_of(result), [b, hkv, rows, blocks, vs[4]], "result")

    def optional_arity(self, operands: int, results: int) -> bool:
        """`operands` operands, or one more (an optional last operand): is it there?"""
        given = len(self.op.operands)
        self.that(given in (operands, operands + 1),
                  f"expects {operands} or {operands + 1} operands, got {given}")
        self.that(len(self.op.results) == results,
                  f"expects {results} results, got {len(self.op.results)}")
        return given == operands + 1

    def column_sums(self, sums, wq, v) -> None:
        """The optional column sums operand: i32 [B, Hkv, N, G, D] of wq's groups and v."""
        b, hkv, _, blocks, count, _ = shape_of(wq)
        self.ranked(sums, "column_sums", 5, ("i32",))
        self.same(shape_of(sums), [b, hkv, blocks, count, shape_of(v)[4]], "column_sums")

    def grouped_weights(self, wq, v) -> np.ndarray:
        b, hkv, rows, blocks, count, size = self.ranked(wq, "wq", 6, ("i8",))
        tokens = self.ranked(v, "v", 5, ("i8",))[3]
        groups = self.groups(tokens)
        self.same([count, size], groups.shape, "wq's trailing [G, K]")
        return groups


def _dims(shape) -> str:
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in shape) + "]"


# ----------------------------------------------------------------------------
# The dialect and its ops
# ----------------------------------------------------------------------------

@_cext.register_dialect
class _Dialect(ir.Dialect):
    DIALECT_NAMESPACE = "int8attn"


class Int8AttnOp(ir.OpView):
    """Base of the int8attn op classes (not registered itself)."""

    OPERATION_NAME: str
    _ODS_REGIONS = (0, True)

    @classmethod
    def _create(cls, results, operands, attributes=None, loc=None):
        return ir.Operation.create(cls.OPERATION_NAME, results=list(results),
                                   operands=list(operands), attributes=attributes or {},
                                   loc=loc).opview

    def __init_subclass__(cls, **kwargs):
        # Every op class carries its own verifier (OpView's would verify nothing for
        # an unregistered op): a class without one is a definition error, at import.
        super().__init_subclass__(**kwargs)
        if "verify" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must define verify(), raising a "
                            f"DiagnosticError at the op's location unless it is well formed")


def _block_output(weights, v) -> ir.RankedTensorType:
    b, hkv, rows, blocks = shape_of(weights)[:4]
    return tensor([b, hkv, rows, blocks, shape_of(v)[-1]], "f32")


@_cext.register_operation(_Dialect)
class AttentionOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.attention"
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
        attr = self.attributes["softmax_scale"] if "softmax_scale" in self.attributes else None
        if attr is None or not isinstance(attr, ir.FloatAttr):
            c.fail("requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32)")
        scale = self.softmax_scale
        c.that(np.isfinite(scale) and scale > 0,
               f"attribute 'softmax_scale' must be positive and finite, got {scale}")
        c.ranked(self.result, "result", q_rank, ("f32",))
        c.same(shape_of(self.result), qs, "result")
        return True


@_cext.register_operation(_Dialect)
class QuantizeOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.quantize"
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
    scores = _operand(0, "scores f32 [B,Hkv,R,S]")
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


@_cext.register_operation(_Dialect)
class PVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.pv"
    p = _operand(0, "probabilities f32 [B,Hkv,R,N,T]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")
    v_scale = _operand(2, "value scales f32 [B,Hkv,N,T]")

    @classmethod
    def build(cls, p, v, v_scale, *, loc=None) -> PVOp:
        return cls._create([_block_output(p, v)], [p, v, v_scale], loc=loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(3, 1)
        ws = c.ranked(self.p, "p", 5, ("f32",))
        c.block_pv(ws, self.v, self.v_scale, self.result)
        return True


@_cext.register_operation(_Dialect)
class FoldedPVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.folded_pv"
    w = _operand(0, "weights P * sV, f32 [B,Hkv,R,N,T]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")

    @classmethod
    def build(cls, w, v, *, loc=None) -> FoldedPVOp:
        return cls._create([_block_output(w, v)], [w, v], loc=loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(2, 1)
        ws = c.ranked(self.w, "w", 5, ("f32",))
        c.block_pv(ws, self.v, None, self.result)
        return True


@_cext.register_operation(_Dialect)
class GroupQuantizeOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.group_quantize"
    w = _operand(0, "weights f32 [..., T]")
    wq = _result(0, "quantized groups i8 [..., G, K] (u8: u - 128)")
    sw = _result(1, "group scales f32 [..., G]")
    groups = _groups("groups")

    @property
    def w_quant(self) -> str:
        """'s8' (symmetric, the default) or 'u8' (unsigned, stored as s8 u - 128)."""
        attr = self.attributes["w_quant"] if "w_quant" in self.attributes else None
        return "s8" if attr is None else ir.StringAttr(attr).value

    @property
    def scale_groups(self) -> np.ndarray:
        """The token sets the scales are computed over ('scale_groups', default 'groups')."""
        return groups_of(self, "scale_groups" if "scale_groups" in self.attributes else "groups")

    @classmethod
    def build(cls, w, groups: np.ndarray, *, scale_groups: np.ndarray | None = None,
              w_quant: str = "s8", loc=None) -> GroupQuantizeOp:
        lead = shape_of(w)[:-1]
        count, size = groups.shape
        attrs = {"groups": groups_attr(groups)}
        if scale_groups is not None:
            attrs["scale_groups"] = groups_attr(scale_groups)
        if w_quant != "s8":
            attrs["w_quant"] = ir.StringAttr.get(w_quant)
        return cls._create([tensor(lead + [count, size], "i8"), tensor(lead + [count], "f32")],
                           [w], attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(1, 2)
        ws = c.ranked(self.w, "w", tuple(range(1, 9)), ("f32",))
        count, size = c.groups(ws[-1]).shape
        if "scale_groups" in self.attributes:
            c.that(c.groups(ws[-1], "scale_groups").shape == (count, size),
                   "attribute 'scale_groups' must have the shape of 'groups'")
        if "w_quant" in self.attributes:
            c.string_attr("w_quant", W_QUANTS)
        c.ranked(self.wq, "result #0", len(ws) + 1, ("i8",))
        c.same(shape_of(self.wq), ws[:-1] + [count, size], "result #0")
        c.ranked(self.sw, "result #1", len(ws), ("f32",))
        c.same(shape_of(self.sw), ws[:-1] + [count], "result #1")
        return True


@_cext.register_operation(_Dialect)
class GroupedPVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.grouped_pv"
    wq = _operand(0, "quantized weights i8 [B,Hkv,R,N,G,K]")
    sw = _operand(1, "weight scales f32 [B,Hkv,R,N,G]")
    v = _operand(2, "values i8 [B,Hkv,N,T,D]")
    groups = _groups("groups")

    @property
    def column_sums(self) -> ir.Value | None:
        """i32 [B,Hkv,N,G,D] sum of Vq over each group (unsigned W's offset), or None."""
        operands = self.operation.operands
        return operands[3] if len(operands) == 4 else None

    @classmethod
    def build(cls, wq, sw, v, groups: np.ndarray, *, column_sums=None, loc=None) -> GroupedPVOp:
        sums = [] if column_sums is None else [column_sums]
        return cls._create([_block_output(wq, v)], [wq, sw, v, *sums],
                           {"groups": groups_attr(groups)}, loc)

    def verify(self) -> bool:
        c = _Check(self)
        has_sums = c.optional_arity(3, 1)
        wq, sw, v = self.wq, self.sw, self.v
        c.grouped_weights(wq, v)
        if has_sums:
            c.column_sums(self.column_sums, wq, v)
        c.ranked(sw, "sw", 5, ("f32",))
        c.same(shape_of(sw), shape_of(wq)[:5], "sw")
        c.block_pv(shape_of(wq)[:4] + [shape_of(v)[3]], v, None, self.result)
        return True


@_cext.register_operation(_Dialect)
class MMACTilesOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.mmac_tiles"
    wq = _operand(0, "quantized weights i8 [B,Hkv,R,N,G,K]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")
    groups = _groups("groups")
    fragment_model = _string("fragment_model")

    @property
    def column_sums(self) -> ir.Value | None:
        """i32 [B,Hkv,N,G,D]: the accumulator starts at 128 * this (unsigned W), or None."""
        operands = self.operation.operands
        return operands[2] if len(operands) == 3 else None

    @classmethod
    def build(cls, wq, v, groups: np.ndarray, *, fragment_model: str, column_sums=None,
              loc=None) -> MMACTilesOp:
        out = shape_of(wq)[:-1] + [shape_of(v)[-1]]
        sums = [] if column_sums is None else [column_sums]
        return cls._create([tensor(out, "i32")], [wq, v, *sums],
                           {"groups": groups_attr(groups),
                            "fragment_model": ir.StringAttr.get(fragment_model)}, loc)

    def verify(self) -> bool:
        c = _Check(self)
        has_sums = c.optional_arity(2, 1)
        wq, v = self.wq, self.v
        groups = c.grouped_weights(wq, v)
        if has_sums:
            c.column_sums(self.column_sums, wq, v)
        model = pv_model_named(c.string_attr("fragment_model", tuple(sorted(pv_model_names()))))
        k = model.instruction.k
        c.that(groups.shape[1] == k,
               f"groups of {groups.shape[1]} tokens do not match the K={k} of {model.name}'s "
               f"{model.instruction.name}")
        c.that(shape_of(v)[:3] == shape_of(wq)[:2] + [shape_of(wq)[3]],
               "v's leading [B, Hkv, N] do not match wq's")
        c.ranked(self.result, "result", 6, ("i32",))
        c.same(shape_of(self.result), shape_of(wq)[:5] + [shape_of(v)[4]], "result")
        return True


@_cext.register_operation(_Dialect)
class ColumnSumsOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.column_sums"
    v = _operand(0, "values i8 [B,Hkv,N,T,D]")
    groups = _groups("groups")

    @classmethod
    def build(cls, v, groups: np.ndarray, *, loc=None) -> ColumnSumsOp:
        b, hkv, blocks, _, head_dim = shape_of(v)
        return cls._create([tensor([b, hkv, blocks, groups.shape[0], head_dim], "i32")], [v],
                           {"groups": groups_attr(groups)}, loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(1, 1)
        b, hkv, blocks, tokens, head_dim = c.ranked(self.v, "v", 5, ("i8",))
        count = c.groups(tokens).shape[0]
        c.ranked(self.result, "result", 5, ("i32",))
        c.same(shape_of(self.result), [b, hkv, blocks, count, head_dim], "result")
        return True


OPS: dict[str, type[Int8AttnOp]] = {cls.OPERATION_NAME: cls for cls in (
    AttentionOp, QuantizeOp, SoftmaxPVOp, PVOp, FoldedPVOp, GroupQuantizeOp, GroupedPVOp,
    MMACTilesOp, ColumnSumsOp,
)}
