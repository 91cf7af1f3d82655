"""Attention in an imported ONNX graph, matched by what its ops compute.

`match_attention(softmax)` follows an `onnx.Softmax` (IREE's ONNX import:
`torch.operator "onnx.X"` on `!torch.vtensor`) back to q and to the int8
values and per-token scales of K and V, and forward to the MatMul with V;
it returns a `Match`, or raises `NotRaised` saying what does not fit
(raise-int8-attention's remark). What it accepts is listed in
`passes/raise_int8_attention.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from iree.compiler import ir

from .onnx_ops import (
                       constant, int_attr, ints_attr, onnx_name, onnx_op, scalar, shape, vtensor,
                       )

MASKED = -1e9   # a mask entry at or below this (after the scalar factors) excludes its token
HEAD_DIM_MULTIPLE = 16   # the INT8 PV tiles take head-dim columns 16 at a time


class NotRaised(Exception):
    """Why an attention was not raised (the remark's text). `dynamic`: because of a
    dynamic dim, which static shapes fix."""

    def __init__(self, reason: str, dynamic: bool = False):
        super().__init__(reason)
        self.dynamic = dynamic


def require(condition: bool, reason: str) -> None:
    if not condition:
        raise NotRaised(reason)


def require_static(dims: list | None, what: str, names: str) -> None:
    """`dims` static, of the rank of `names` ("[B, H, Sq, S]"); a dynamic dim is named
    as the reason (it hides every other check: shapes are compared statically).
    `what` ends in its verb: "the scores are", "K's scale is"."""
    labels = names.strip("[]").split(", ")
    reason = f"{what} not a static {len(labels)}-d tensor {names}: {dims}"
    require(dims is not None and len(dims) == len(labels), reason)
    dynamic = [label for label, dim in zip(labels, dims) if dim is None]
    if dynamic:
        raise NotRaised(f"{reason} ({'dims' if len(dynamic) > 1 else 'dim'} "
                        f"{', '.join(dynamic)} {'are' if len(dynamic) > 1 else 'is'} dynamic; "
                        "int8attn raises static shapes only)",
                        dynamic=True)


@dataclass(frozen=True)
class Cache:
    """K or V traced back to its int8 values and per-token scales."""

    values: ir.Value          # si8 [B, Hkv, S, D]
    scales: ir.Value          # f32 [B, Hkv, S] or [B, Hkv, S, 1]
    group: int                # query heads per KV head (GQA)
    factor: float             # scalar factors met on the way


@dataclass(frozen=True)
class Match:
    output: ir.Value          # what the attention replaces: the PV MatMul's result, or
                              # onnx.Attention's
    q: ir.Value
    k: Cache
    v: Cache
    group: int                # query heads per int8 KV head
    softmax_scale: float
    mode: str


def describe(value: ir.Value) -> str:
    op = onnx_op(value)
    if op is not None:
        return f"onnx.{onnx_name(op)}"
    return "a function argument" if isinstance(value, ir.BlockArgument) else \
        f"'{value.owner.operation.name}'"


def positive(c: float | None, op: ir.Operation) -> float:
    require(c is not None and np.isfinite(c) and c > 0,
            f"onnx.{onnx_name(op)} scales by {c}, not a positive finite number")
    return c


def peel_scalars(value: ir.Value) -> tuple[ir.Value, float]:
    """Strip Mul / Div by scalar constants: (what is scaled, the product of factors)."""
    factor = 1.0
    while (op := onnx_op(value, "Mul", "Div")) is not None:
        a, b = op.operands
        if onnx_name(op) == "Div" and scalar(b) is not None:
            value, factor = a, factor / positive(scalar(b), op)
        elif onnx_name(op) == "Mul" and scalar(b) is not None:
            value, factor = a, factor * positive(scalar(b), op)
        elif onnx_name(op) == "Mul" and scalar(a) is not None:
            value, factor = b, factor * positive(scalar(a), op)
        else:
            break
    return value, factor


def scores_of(value: ir.Value) -> tuple[ir.Operation, float, np.ndarray | None]:
    """(the QK MatMul, the scalar factor on the scores, the tokens the mask keeps)."""
    factor, keep = 1.0, None
    while True:
        value, f = peel_scalars(value)
        factor *= f
        op = onnx_op(value)
        kind = onnx_name(op) if op is not None else None
        if kind == "MatMul":
            return op, factor, keep
        if kind in ("Mul", "Div"):   # peel_scalars stops at a factor that is not a scalar
            raise NotRaised(scaled_by(op))
        require(kind in ("Add", "Where"), f"the scores come from {describe(value)}, not a "
                "MatMul of queries and keys (with scalar factors and a mask)")
        require(keep is None, "the scores have two masks")
        keep, value = mask_of(op, factor)


def scaled_by(op: ir.Operation) -> str:
    """Why a Mul / Div on the scores that peel_scalars left is not a softmax_scale."""
    scores, factor = op.operands
    if onnx_name(op) == "Mul" and (constant(scores) is not None or
                                   (constant(factor) is None and _size(scores) < _size(factor))):
        scores, factor = factor, scores   # the constant, or the smaller (broadcast) one
    if constant(factor) is not None:
        return (f"the scores are scaled by a constant of shape {shape(factor)}, not by a "
                "scalar")
    return (f"the scores are scaled by a value computed at run time ({_named(factor)}, not a "
            f"constant); softmax_scale is fixed at compile time: make the factor a constant "
            "(an initializer or a Constant node)")


def _size(value: ir.Value) -> float:
    dims = shape(value)
    return np.inf if dims is None or None in dims else int(np.prod(dims))


def _named(value: ir.Value) -> str:
    """describe(value), with a graph input's ONNX name where the importer kept it."""
    if isinstance(value, ir.BlockArgument):
        func = value.owner.owner
        names = func.attributes["int8attn.input_names"] \
            if "int8attn.input_names" in func.attributes else None
        if names is not None and value.arg_number < len(names):
            return f"the graph input '{ir.StringAttr(names[value.arg_number]).value}'"
    return describe(value)


def additive_keep(mask: np.ndarray | None, factor: float) -> np.ndarray:
    """The tokens an additive constant mask keeps (0), given the factor applied after it."""
    require(mask is not None, "the scores get an Add of a value computed at run time "
            "(a mask or bias that is not a constant)")
    effective = mask.astype(np.float64) * factor
    require(bool(np.all((effective == 0) | (effective <= MASKED))),
            f"the scores get an added constant with values other than 0 and <= {MASKED:g} "
            "(a bias, not a mask)")
    return effective == 0


def mask_of(op: ir.Operation, factor: float) -> tuple[np.ndarray, ir.Value]:
    """(the tokens a constant mask keeps, the masked value) for Add or Where."""
    if onnx_name(op) == "Add":
        a, b = op.operands
        mask, value = (constant(b), a) if constant(b) is not None else (constant(a), b)
        return additive_keep(mask, factor), value
    condition, x, y = op.operands
    keep = constant(condition)
    require(keep is not None and keep.dtype == np.bool_,
            "the Where on the scores has a condition that is not a boolean constant")
    fill, value, keep = ((scalar(y), x, keep) if scalar(y) is not None else
                         (scalar(x), y, ~keep))
    require(fill is not None and fill * factor <= MASKED,
            f"the Where on the scores fills with {fill}, not a value <= {MASKED:g}")
    return keep, value


def cache_of(value: ir.Value, role: str, transposed: bool) -> Cache:
    """Trace K (transposed) or V back to Cast(int8) × per-token scale."""
    swapped, group, factor = False, 1, 1.0
    while True:
        op = onnx_op(value)
        kind = onnx_name(op) if op is not None else None
        if kind == "Transpose" and transposed and not swapped:
            require(ints_attr(op, "perm") == [0, 1, 3, 2], f"{role} is transposed by "
                    f"{ints_attr(op, 'perm')}, not by swapping its last two axes")
            value, swapped = op.operands[0], True
        elif kind == "Reshape" and group == 1:
            value, group = kv_heads_repeated(op, role)
        elif kind == "Tile":
            raise NotRaised(f"{role}'s KV heads are repeated with Tile: query head h reads KV "
                            "head h mod Hkv, int8attn's GQA reads KV head h // (Hq/Hkv)")
        elif kind == "Mul" and dequantized(op) is not None:
            require(swapped == transposed, f"{role} is not transposed for the QK MatMul")
            values, scales = dequantized(op)
            require_static(shape(values), f"{role}'s int8 cache is", "[B, Hkv, S, D]")
            return Cache(values, per_token_scales(scales, values, role), group, factor)
        elif kind in ("Mul", "Div"):
            unscaled, f = peel_scalars(value)
            require(unscaled != value, f"{role} is scaled by a tensor, not a scalar")
            value, factor = unscaled, factor * f
        else:
            raise NotRaised(f"{role} is not dequantized from int8 (Cast(int8) × a scale per "
                            f"token): it comes from {describe(value)}")


def dequantized(op: ir.Operation) -> tuple[ir.Value, ir.Value] | None:
    """(int8 values, scales) of Mul(Cast(int8 -> f32), scales), in either order."""
    for cast, scales in (op.operands, reversed(list(op.operands))):
        c = onnx_op(cast, "Cast")
        if c is not None and int_attr(c, "to") == 1 and vtensor(c.operands[0]) is not None \
                and vtensor(c.operands[0])[1] == "si8":
            return c.operands[0], scales
    return None


def per_token_scales(scales: ir.Value, values: ir.Value, role: str) -> ir.Value:
    """The [B, Hkv, S] (or [B, Hkv, S, 1]) scales, or why they are not per token."""
    b, hkv, s, dim = shape(values)
    found = shape(scales)
    require(found is not None and vtensor(scales)[1] == "f32",
            f"{role}'s scale is not a static f32 tensor")
    if None in found:
        names = {4: "[B, Hkv, S, 1]", 3: "[B, Hkv, S]"}.get(len(found)) or \
            "[" + ", ".join(f"d{i}" for i in range(len(found))) + "]"
        require_static(found, f"{role}'s scale is", names)
    size = int(np.prod(found))
    require(size != 1, f"{role} has one scale for the whole tensor (per tensor), not one "
            "per token")
    require(not (found[-1] == dim and dim != 1 and len(found) >= 2 and found[-2] == 1),
            f"{role}'s scale {found} varies along the head dim (per channel), not per token")
    require(found == [b, hkv, s, 1], f"{role}'s scale has shape {found}, not one per token "
            f"per KV head ([{b}, {hkv}, {s}, 1])")
    unsqueeze = onnx_op(scales, "Unsqueeze")
    if unsqueeze is not None and shape(unsqueeze.operands[0]) == [b, hkv, s]:
        return unsqueeze.operands[0]
    return scales


def kv_heads_repeated(reshape: ir.Operation, role: str) -> tuple[ir.Value, int]:
    """GQA: Reshape([B,Hkv·g,..]) of Expand([B,Hkv,g,..]) of a unit axis 2 -> (KV, g)."""
    expand = onnx_op(reshape.operands[0], "Expand")
    wide = shape(expand.results[0]) if expand is not None else None
    require(wide is not None and len(wide) == 5, f"{role} is reshaped, but not from an "
            "Expand of KV heads")
    b, hkv, g, x, y = wide
    unit_dims = shape(expand.operands[0])
    if unit_dims is not None and len(unit_dims) == 5 and None in unit_dims:
        # an Expand to a static shape hides the dynamic dim from the scores
        require_static(unit_dims, f"{role} before its Expand is", "[B, Hkv, 1, S, D]")
    require(shape(reshape.results[0]) == [b, hkv * g, x, y],
            f"{role}'s Reshape {shape(reshape.results[0])} does not merge the KV heads with "
            f"their {g} copies")
    unit = onnx_op(expand.operands[0], "Unsqueeze", "Reshape")
    require(shape(expand.operands[0]) == [b, hkv, 1, x, y] and unit is not None and
            shape(unit.operands[0]) == [b, hkv, x, y],
            f"{role}'s Expand does not repeat each KV head next to itself (a unit axis 2)")
    return unit.operands[0], g


def causal(query_tokens: int, tokens: int) -> np.ndarray:
    """int8attn's prefill mask: query i is token S - Sq + i and sees tokens up to it."""
    return np.arange(tokens)[None, :] <= (tokens - query_tokens + np.arange(query_tokens))[:, None]


def check_mask(keep: np.ndarray | None, dims: list[int], tokens: int) -> None:
    batch, heads, query_tokens, _ = dims
    expected = causal(query_tokens, tokens)
    if keep is None:
        require(query_tokens == 1, f"{query_tokens} query tokens attend without a mask "
                "(bidirectional); int8attn's prefill is causal")
        return
    try:
        keep = np.broadcast_to(keep, (batch, heads, query_tokens, tokens))
    except ValueError:
        raise NotRaised(f"the mask's shape {list(keep.shape)} does not broadcast to the "
                        f"scores {dims}") from None
    wrong = np.argwhere(keep != expected)
    if len(wrong):
        *_, i, j = wrong[0]
        sees = "sees" if keep[tuple(wrong[0])] else "does not see"
        raise NotRaised(f"the mask is not causal: query token {i} (position "
                        f"{tokens - query_tokens + i}) {sees} token {j}")


def match_attention(softmax: ir.Operation) -> Match:
    """MatMul(Softmax(scores), V) over a dequantized cache, from its Softmax."""
    opset = softmax.parent.attributes["torch.onnx_meta.opset_version"] \
        if "torch.onnx_meta.opset_version" in softmax.parent.attributes else None
    dims = shape(softmax.results[0])
    axis = int_attr(softmax, "axis", -1 if opset is None or ir.IntegerAttr(opset).value >= 13
                    else 1)
    require_static(dims, "the scores are", "[B, H, Sq, S]")
    require(axis in (-1, 3), f"the Softmax is over axis {axis}, not the keys' (last) axis")
    users = [u.owner.operation for u in softmax.results[0].uses]
    pv = next((u for u in users if onnx_name(u) == "MatMul" and u.operands[0] ==
               softmax.results[0]), None)
    require(pv is not None, "the Softmax's result is not multiplied into V by a MatMul")
    qk, factor, keep = scores_of(softmax.operands[0])
    q, q_factor = peel_scalars(qk.operands[0])
    k = cache_of(qk.operands[1], "K", transposed=True)
    v = cache_of(pv.operands[1], "V", transposed=False)
    require(k.group == v.group, "K and V repeat their KV heads differently")
    return checked(pv.results[0], q, k, v, k.group, factor * q_factor, keep)


def match_attention_op(op: ir.Operation) -> Match:
    """ONNX's `Attention` (opset 23), 4-d: q [B,Hq,Sq,D], K and V [B,Hk,S,D]; query
    head h reads K head h // (Hq/Hk); `is_causal` aligns the mask upper left."""
    absent = lambda v: (isinstance(v, ir.OpResult) and
                        v.owner.operation.name == "torch.constant.none")
    operands = list(op.operands)
    require(all(absent(v) for v in operands[4:]), "the Attention op takes past_key / "
            "past_value / nonpad_kv_seqlen (append the cache in the graph instead)")
    require(not any(list(r.uses) for r in op.results[1:]), "the Attention op's present_key, "
            "present_value or qk_matmul_output is used")
    require("torch.onnx.softcap" not in op.attributes or
            ir.FloatAttr(op.attributes["torch.onnx.softcap"]).value == 0,
            "the Attention op caps its scores (softcap)")
    q, q_factor = peel_scalars(operands[0])
    k = cache_of(operands[1], "K", transposed=False)
    v = cache_of(operands[2], "V", transposed=False)
    dims, heads = shape(op.results[0]), shape(operands[1])
    require(dims is not None and len(dims) == 4 and heads is not None and len(heads) == 4 and
            dims[1] % heads[1] == 0, f"the Attention op is not 4-d GQA: {dims}, K {heads}")
    require(k.group == v.group, "K and V repeat their KV heads differently")
    tokens = shape(k.values)[2]
    keep = np.ones((dims[2], tokens), bool)
    if int_attr(op, "is_causal", 0):
        require(dims[2] == tokens, f"is_causal with {dims[2]} query tokens over {tokens} keys: "
                "ONNX aligns that mask upper left (query i sees keys <= i), int8attn's "
                "prefill bottom right (keys <= S - Sq + i)")
        keep &= np.arange(tokens)[None, :] <= np.arange(dims[2])[:, None]
    if len(operands) > 3 and not absent(operands[3]):
        mask = constant(operands[3])
        keep = keep & (mask if mask is not None and mask.dtype == np.bool_ else
                       additive_keep(mask, 1.0))
    scale = ir.FloatAttr(op.attributes["torch.onnx.scale"]).value \
        if "torch.onnx.scale" in op.attributes else dims[3] ** -0.5
    require(np.isfinite(scale) and scale > 0, f"the Attention op scales by {scale}")
    return checked(op.results[0], q, k, v, k.group * (dims[1] // heads[1]),
                   scale * q_factor, keep if not keep.all() else None)


def checked(output: ir.Value, q: ir.Value, k: Cache, v: Cache, group: int, factor: float,
            keep: np.ndarray | None) -> Match:
    """The Match, once q, the caches and the mask agree with int8attn.attention."""
    dims = shape(output)
    require_static(dims, "the attention's result is", "[B, Hq, Sq, D]")
    batch, heads, query_tokens, head_dim = dims
    q_type = vtensor(q)
    require(q_type is not None and q_type[1] == "f32" and q_type[0] == dims,
            f"q is not an f32 {dims} tensor: {q.type}")
    tokens = shape(k.values)[2]
    for cache, role in ((k, "K"), (v, "V")):
        expected = [batch, heads // group, tokens, head_dim]
        require(shape(cache.values) == expected and group * expected[1] == heads,
                f"{role}'s int8 cache {shape(cache.values)} does not give {heads} query heads "
                f"[{batch}, {heads}, {tokens}, {head_dim}]")
    require(head_dim % HEAD_DIM_MULTIPLE == 0, f"head dim {head_dim} is not a multiple of "
            f"{HEAD_DIM_MULTIPLE} (the INT8 PV tiles' columns)")
    check_mask(keep, [batch, heads, query_tokens, tokens], tokens)
    return Match(output, q, k, v, group, factor * k.factor * v.factor,
                 "decode" if query_tokens == 1 else "prefill")


def summary(m: Match) -> str:
    b, hkv, s, dim = shape(m.k.values)
    rows = shape(m.q)[2]
    tokens = f"{s} tokens" if m.mode == "decode" else f"{rows} query tokens of {s}"
    return (f"raised to int8attn.attention ({m.mode}, {hkv * m.group} query heads over "
            f"{hkv} KV heads, {tokens}, head dim {dim}, softmax_scale {m.softmax_scale:.6g})")
