"""The `int8attn` dialect: graph and algorithm ops, their builders and verifiers.

IREE's Python bindings cannot define dialects, so these are unregistered ops in
generic form. Each op has a builder (`attention(...)`, `quantize(...)`, ...)
and a verifier registered in `VERIFIERS`; `verify(module)` runs them all and
raises a `DiagnosticError` at the first offending op's location.

Shape names used below: B batch, Hq/Hkv query/KV heads, R query rows per KV
head (decode: the Hq/Hkv heads; prefill: (head, query token) pairs, head-major,
so row r is query token r % Sq), S tokens, D head dim, N blocks (partitions or tiles) of T tokens, G
scale groups of K tokens each.

| op | operands -> results |
|---|---|
| attention       | q [B,Hq,D] or [B,Hq,Sq,D], k i8 [B,Hkv,S,D], k_scale f32 [B,Hkv,S], v i8, v_scale f32 -> f32 q-shape |
| quantize        | x float [..., X] -> (i8 [..., X], f32 [...]) per-row symmetric int8 |
| softmax_pv      | scores f32 [B,Hkv,R,S], v, v_scale {mode[, query_tokens]} -> f32 [B,Hkv,R,D] |
| pv              | p f32 [B,Hkv,R,N,T], v i8 [B,Hkv,N,T,D], v_scale f32 [B,Hkv,N,T] -> f32 [B,Hkv,R,N,D] |
| folded_pv       | w f32 [B,Hkv,R,N,T], v i8 [B,Hkv,N,T,D] -> f32 [B,Hkv,R,N,D] |
| group_quantize  | w f32 [..., T] {groups[, scale_groups]} -> (i8 [..., G, K], f32 [..., G]) |
| grouped_pv      | wq i8 [B,Hkv,R,N,G,K], sw f32 [B,Hkv,R,N,G], v {groups} -> f32 [B,Hkv,R,N,D] |
| mmac_tiles      | wq i8 [B,Hkv,R,N,G,K], v {groups, fragment_model} -> i32 [B,Hkv,R,N,G,D] |

`groups` is a table `[array<i64: ...>, ...]`: row g lists the tokens of a
block that scale group g (one MMAC) consumes, in K-slot order. It always
comes from the fragment model (`int8attn.fragments`).

quantize / group_quantize of a row x: `a = max|x|`, `s = a/127` (NaN when `a`
is not finite), `q = clamp(rne(x*(127/a)), -127, 127)`, except `q = 0` when
`a < QUANTIZE_MIN_ABSMAX` (0 included) or `a` is NaN/Inf. The threshold keeps
127/a finite and every value that rounds to a nonzero q a normal f32, so the
result does not depend on flush-to-zero; a non-finite row poisons only its own
results through the NaN scale (README: non-finite and extreme inputs).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from iree.compiler import ir

from int8attn.support.diagnostics import DiagnosticError
from int8attn.support.ir import walk
from int8attn.reference.common import QUANTIZE_MIN_ABSMAX  # the contract's one definition
from int8attn.fragments import FRAGMENT_MODELS

ATTENTION = "int8attn.attention"
QUANTIZE = "int8attn.quantize"
SOFTMAX_PV = "int8attn.softmax_pv"
PV = "int8attn.pv"
FOLDED_PV = "int8attn.folded_pv"
GROUP_QUANTIZE = "int8attn.group_quantize"
GROUPED_PV = "int8attn.grouped_pv"
MMAC_TILES = "int8attn.mmac_tiles"

MODES = ("decode", "prefill")
FLOAT_TYPES = ("f32", "f16", "bf16")


# ----------------------------------------------------------------------------
# Type helpers
# ----------------------------------------------------------------------------

def tensor(shape: Sequence[int], element: str) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.Type.parse(element))


def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def element_of(value: ir.Value) -> str:
    return str(ir.RankedTensorType(value.type).element_type)


def groups_attr(groups: np.ndarray) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get([int(t) for t in row]) for row in groups])


def scale_groups_of(op: ir.Operation) -> np.ndarray:
    """The token sets a group_quantize computes its scales over."""
    if "scale_groups" in op.attributes:
        return groups_of(op, "scale_groups")
    return groups_of(op)


def groups_of(op: ir.Operation, name: str = "groups") -> np.ndarray:
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


def _create(name: str, results, operands, attributes=None, loc=None) -> ir.Operation:
    return ir.Operation.create(name, results=list(results), operands=list(operands),
                               attributes=attributes or {}, loc=loc)


# ----------------------------------------------------------------------------
# Builders
# ----------------------------------------------------------------------------

def attention(q, k, k_scale, v, v_scale, *, mode: str, softmax_scale: float,
              loc=None) -> ir.Value:
    attrs = {"mode": ir.StringAttr.get(mode),
             "softmax_scale": ir.FloatAttr.get(ir.F32Type.get(), softmax_scale)}
    return _create(ATTENTION, [tensor(shape_of(q), "f32")],
                   [q, k, k_scale, v, v_scale], attrs, loc).result


def quantize(x, *, loc=None) -> tuple[ir.Value, ir.Value]:
    shape = shape_of(x)
    op = _create(QUANTIZE, [tensor(shape, "i8"), tensor(shape[:-1], "f32")], [x], loc=loc)
    return op.results[0], op.results[1]


def softmax_pv(scores, v, v_scale, *, mode: str, query_tokens: int = 1, loc=None) -> ir.Value:
    b, hkv, rows, _ = shape_of(scores)
    out = tensor([b, hkv, rows, shape_of(v)[-1]], "f32")
    attrs = {"mode": ir.StringAttr.get(mode)}
    if mode == "prefill":
        attrs["query_tokens"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), query_tokens)
    return _create(SOFTMAX_PV, [out], [scores, v, v_scale], attrs, loc).result


def query_tokens_of(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["query_tokens"]).value


def _block_output(weights, v) -> ir.RankedTensorType:
    b, hkv, rows, blocks = shape_of(weights)[:4]
    return tensor([b, hkv, rows, blocks, shape_of(v)[-1]], "f32")


def pv(p, v, v_scale, *, loc=None) -> ir.Value:
    return _create(PV, [_block_output(p, v)], [p, v, v_scale], loc=loc).result


def folded_pv(w, v, *, loc=None) -> ir.Value:
    return _create(FOLDED_PV, [_block_output(w, v)], [w, v], loc=loc).result


def group_quantize(w, groups: np.ndarray, *, scale_groups: np.ndarray | None = None,
                   loc=None) -> tuple[ir.Value, ir.Value]:
    """Wq[..., g, k] = W[..., groups[g, k]] / sW[g]; sW[g] over `scale_groups[g]`.

    `scale_groups` defaults to `groups` (the only correct choice); a different
    table is how the seed's bug is expressed, for the verifier to reject.
    """
    lead = shape_of(w)[:-1]
    count, size = groups.shape
    attrs = {"groups": groups_attr(groups)}
    if scale_groups is not None:
        attrs["scale_groups"] = groups_attr(scale_groups)
    op = _create(GROUP_QUANTIZE,
                 [tensor(lead + [count, size], "i8"), tensor(lead + [count], "f32")],
                 [w], attrs, loc)
    return op.results[0], op.results[1]


def grouped_pv(wq, sw, v, groups: np.ndarray, *, loc=None) -> ir.Value:
    return _create(GROUPED_PV, [_block_output(wq, v)], [wq, sw, v],
                   {"groups": groups_attr(groups)}, loc).result


def mmac_tiles(wq, v, groups: np.ndarray, *, fragment_model: str, loc=None) -> ir.Value:
    out = shape_of(wq)[:-1] + [shape_of(v)[-1]]
    return _create(MMAC_TILES, [tensor(out, "i32")], [wq, v],
                   {"groups": groups_attr(groups),
                    "fragment_model": ir.StringAttr.get(fragment_model)},
                   loc).result


# ----------------------------------------------------------------------------
# Verifiers
# ----------------------------------------------------------------------------

class _Check:
    """Collects the first failed expectation of one op as a located error."""

    def __init__(self, op: ir.Operation):
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
               elements: tuple[str, ...]) -> list[int]:
        ranks = (rank,) if isinstance(rank, int) else rank
        if not isinstance(value.type, ir.RankedTensorType):
            self.fail(f"{what} must be a ranked tensor, got {value.type}")
        t = ir.RankedTensorType(value.type)
        if not t.has_static_shape:
            self.fail(f"{what} must have a static shape, got {value.type}")
        self.that(t.rank in ranks,
                  f"{what} must have rank {' or '.join(map(str, ranks))}, got {value.type}")
        self.that(str(t.element_type) in elements,
                  f"{what} must have element type {' or '.join(elements)}, got {value.type}")
        self.that(all(d > 0 for d in t.shape), f"{what} has an empty dimension: {value.type}")
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


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _verify_attention(op):
    c = _Check(op)
    c.arity(5, 1)
    q, k, k_scale, v, v_scale = op.operands
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
    attr = op.attributes["softmax_scale"] if "softmax_scale" in op.attributes else None
    if attr is None or not isinstance(attr, ir.FloatAttr):
        c.fail("requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32)")
    scale = ir.FloatAttr(attr).value
    c.that(np.isfinite(scale) and scale > 0,
           f"attribute 'softmax_scale' must be positive and finite, got {scale}")
    c.ranked(op.result, "result", q_rank, ("f32",))
    c.same(shape_of(op.result), qs, "result")


def _verify_quantize(op):
    c = _Check(op)
    c.arity(1, 2)
    xs = c.ranked(op.operands[0], "input", tuple(range(1, 9)), FLOAT_TYPES)
    c.ranked(op.results[0], "result #0", len(xs), ("i8",))
    c.same(shape_of(op.results[0]), xs, "result #0")
    c.ranked(op.results[1], "result #1", len(xs) - 1, ("f32",))
    c.same(shape_of(op.results[1]), xs[:-1], "result #1")


def _kv_operands(c: _Check, v, v_scale, blocked: bool) -> list[int]:
    if blocked:
        vs = c.ranked(v, "v", 5, ("i8",))
        if v_scale is not None:
            c.ranked(v_scale, "v_scale", 4, ("f32",))
            c.same(shape_of(v_scale), vs[:4], "v_scale")
    else:
        vs = c.ranked(v, "v", 4, ("i8",))
        if v_scale is not None:
            c.ranked(v_scale, "v_scale", 3, ("f32",))
            c.same(shape_of(v_scale), vs[:3], "v_scale")
    return vs


def _verify_softmax_pv(op):
    c = _Check(op)
    c.arity(3, 1)
    mode = c.string_attr("mode", MODES)
    b, hkv, rows, tokens = c.ranked(op.operands[0], "scores", 4, ("f32",))
    vs = _kv_operands(c, op.operands[1], op.operands[2], blocked=False)
    c.same(vs[:3], [b, hkv, tokens], "v's leading [B, Hkv, S]")
    if mode == "prefill":
        attr = op.attributes["query_tokens"] if "query_tokens" in op.attributes else None
        if not isinstance(attr, ir.IntegerAttr):
            c.fail("with mode = \"prefill\" requires an integer attribute 'query_tokens' (Sq)")
        sq = ir.IntegerAttr(attr).value
        c.that(0 < sq <= tokens, f"query_tokens = {sq} must be in [1, {tokens}] (S)")
        c.that(rows % sq == 0, f"{rows} rows are not whole groups of query_tokens = {sq}")
    c.ranked(op.result, "result", 4, ("f32",))
    c.same(shape_of(op.result), [b, hkv, rows, vs[3]], "result")


def _verify_block_pv(c: _Check, weights_shape, v, v_scale, result):
    b, hkv, rows, blocks, tokens = weights_shape
    vs = _kv_operands(c, v, v_scale, blocked=True)
    c.same(vs[:4], [b, hkv, blocks, tokens], "v's leading [B, Hkv, N, T]")
    c.ranked(result, "result", 5, ("f32",))
    c.same(shape_of(result), [b, hkv, rows, blocks, vs[4]], "result")


def _verify_pv(op):
    c = _Check(op)
    c.arity(3, 1)
    ws = c.ranked(op.operands[0], "p", 5, ("f32",))
    _verify_block_pv(c, ws, op.operands[1], op.operands[2], op.result)


def _verify_folded_pv(op):
    c = _Check(op)
    c.arity(2, 1)
    ws = c.ranked(op.operands[0], "w", 5, ("f32",))
    _verify_block_pv(c, ws, op.operands[1], None, op.result)


def _verify_group_quantize(op):
    c = _Check(op)
    c.arity(1, 2)
    ws = c.ranked(op.operands[0], "w", tuple(range(1, 9)), ("f32",))
    count, size = c.groups(ws[-1]).shape
    if "scale_groups" in op.attributes:
        c.that(c.groups(ws[-1], "scale_groups").shape == (count, size),
               "attribute 'scale_groups' must have the shape of 'groups'")
    c.ranked(op.results[0], "result #0", len(ws) + 1, ("i8",))
    c.same(shape_of(op.results[0]), ws[:-1] + [count, size], "result #0")
    c.ranked(op.results[1], "result #1", len(ws), ("f32",))
    c.same(shape_of(op.results[1]), ws[:-1] + [count], "result #1")


def _grouped_weights(c: _Check, wq, v) -> np.ndarray:
    b, hkv, rows, blocks, count, size = c.ranked(wq, "wq", 6, ("i8",))
    tokens = c.ranked(v, "v", 5, ("i8",))[3]
    groups = c.groups(tokens)
    c.same([count, size], groups.shape, "wq's trailing [G, K]")
    return groups


def _verify_grouped_pv(op):
    c = _Check(op)
    c.arity(3, 1)
    wq, sw, v = op.operands
    _grouped_weights(c, wq, v)
    c.ranked(sw, "sw", 5, ("f32",))
    c.same(shape_of(sw), shape_of(wq)[:5], "sw")
    _verify_block_pv(c, shape_of(wq)[:4] + [shape_of(v)[3]], v, None, op.result)


def _verify_mmac_tiles(op):
    c = _Check(op)
    c.arity(2, 1)
    wq, v = op.operands
    groups = _grouped_weights(c, wq, v)
    model = FRAGMENT_MODELS[c.string_attr("fragment_model", tuple(sorted(FRAGMENT_MODELS)))]
    k = model.instruction.k
    c.that(groups.shape[1] == k,
           f"groups of {groups.shape[1]} tokens do not match the K={k} of {model.name}'s "
           f"{model.instruction.name}")
    c.that(shape_of(v)[:3] == shape_of(wq)[:2] + [shape_of(wq)[3]],
           "v's leading [B, Hkv, N] do not match wq's")
    c.ranked(op.result, "result", 6, ("i32",))
    c.same(shape_of(op.result), shape_of(wq)[:5] + [shape_of(v)[4]], "result")


VERIFIERS: dict[str, Callable[[ir.Operation], None]] = {
    ATTENTION: _verify_attention,
    QUANTIZE: _verify_quantize,
    SOFTMAX_PV: _verify_softmax_pv,
    PV: _verify_pv,
    FOLDED_PV: _verify_folded_pv,
    GROUP_QUANTIZE: _verify_group_quantize,
    GROUPED_PV: _verify_grouped_pv,
    MMAC_TILES: _verify_mmac_tiles,
}


def verify(module: ir.Operation) -> None:
    """Verify every int8attn op in `module`; unknown int8attn ops are errors."""
    for op in walk(module):
        if not op.name.startswith("int8attn."):
            continue
        verifier = VERIFIERS.get(op.name)
        if verifier is None:
            raise DiagnosticError(
                op.location, f"unknown op '{op.name}'; the int8attn dialect has "
                f"{', '.join(sorted(VERIFIERS))}")
        verifier(op)
