"""raise-int8-attention: attention of an imported ONNX graph over an INT8 cache ->
`int8attn.attention`.

Starting from each `onnx.Softmax` (IREE's ONNX import: `torch.operator
"onnx.X"`), it matches, by what the ops compute rather than their names:

    O  = MatMul(Softmax(scores, axis=-1), V)
    scores = MatMul(q·c, K^T) · c ... with at most one causal mask: Add(0 / ≤ -1e9)
             or Where(keep, ·, ≤ -1e9), both constants
    K, V   = Cast(int8 → f32) × scale[B, Hkv, S, 1]      one scale per token per KV head
             then, for GQA, Unsqueeze(axis 2) / Expand [B,Hkv,g,..] / Reshape [B,Hkv·g,..]
             (query head h reads KV head h // g); K transposed by Transpose(0,1,3,2)

or ONNX's `Attention` op (opset 23, 4-d: q [B,Hq,Sq,D], K and V as above; GQA
its own, query head h reading K head h // (Hq/Hk); a constant `attn_mask`;
`is_causal` only where its upper-left alignment is int8attn's, Sq = S; no
past_key/value inputs), and rewrites O into `int8attn.attention(q, Kq, sK, Vq, sV)` between
`torch_c` casts: decode where Sq = 1 (no mask, or one that masks nothing),
prefill where the mask is exactly int8attn's causal one (query i, the token
at S − Sq + i, sees tokens 0 … S − Sq + i). softmax_scale is the product of
the positive scalar factors on q, K and the scores. Everything else stays
ONNX for IREE's torch input conversion.

Each Softmax and Attention op gets a remark: `[Passed]` naming the attention raised, or
`[Missed]` saying why not (a scale per tensor or per channel, a mask that is
not causal, KV heads repeated in another order, a float cache, a dynamic dim,
...); such an attention is left as it is: IREE compiles the MatMul/Softmax form
in float, but has no lowering of an `onnx.Attention` op (iree-compile fails on
it), which the remark says.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir

from ..dialects import int8attn as d
from ..dialects import builders as build
from .attention_match import (
                              Match, NotRaised, match_attention, match_attention_op, summary,
                              )
from .onnx_ops import erase_dead, from_builtin, onnx_name, shape, to_builtin
from ..support.ir import walk
from ..support.remarks import missed, passed

NAME = "raise-int8-attention"
# Where an attention is recognized from: its Softmax, or ONNX's Attention op.
MATCHERS = {"Softmax": match_attention, "Attention": match_attention_op}


def raise_attention(m: Match) -> None:
    """Replace the attention's result with int8attn.attention between torch_c casts."""
    result = m.output
    owner = result.owner.operation
    with ir.InsertionPoint(owner), owner.location:
        q = to_builtin(m.q)
        if m.mode == "decode":
            q = build.collapse(q, [[0], [1], [2, 3]])
        operands = [q]
        for cache in (m.k, m.v):
            values, scales = to_builtin(cache.values), to_builtin(cache.scales)
            if len(d.shape_of(scales)) == 4:
                scales = build.collapse(scales, [[0], [1], [2, 3]])
            operands += [values, scales]
        out = d.attention(*operands, mode=m.mode, softmax_scale=m.softmax_scale,
                          loc=owner.location)
        if m.mode == "decode":
            out = build.expand(out, [[0], [1], [2, 3]], shape(result))
        result.replace_all_uses_with(from_builtin(out, result.type))


def consequence(kind: str, dynamic: bool) -> str:
    """What becomes of an attention left unraised, and the fix (the remark's tail)."""
    if kind == "Attention":
        # IREE (3.13) has no lowering of onnx.Attention: iree-compile fails on it
        # ("failed to legalize ... onnx.Attention"), so the remark says so first.
        fix = ("give the model static shapes" if dynamic else "make it raisable, or export "
               "the attention as MatMul, Softmax, MatMul (which IREE compiles in float)")
        return ("IREE cannot compile an onnx.Attention that is not raised (iree-compile "
                f"fails to legalize it), so this model will not compile: {fix}")
    return "IREE compiles this attention in float" + \
        (" (give the model static shapes to raise it)" if dynamic else "")


@dataclass(frozen=True)
class RaiseInt8Attention:
    """Raise ONNX attention over an int8 cache with per-token scales to int8attn.attention."""

    argument: ClassVar[str] = NAME

    def run(self, module: ir.Operation) -> None:
        for func in [op for op in walk(module) if op.name == "func.func"]:
            ops = list(walk(func))
            found = [(op, MATCHERS[onnx_name(op)]) for op in ops if onnx_name(op) in MATCHERS]
            if not found and any(onnx_name(op) for op in ops):
                missed(func.location, NAME, "no attention (no onnx.Softmax or onnx.Attention) "
                       f"in @{ir.StringAttr(func.attributes['sym_name']).value}; IREE "
                       "compiles the whole graph")
            for op, match_at in found:
                try:
                    match = match_at(op)
                except NotRaised as reason:
                    missed(op.location, NAME, f"not raised: {reason}; "
                           f"{consequence(onnx_name(op), reason.dynamic)}")
                    continue
                raise_attention(match)
                passed(op.location, NAME, summary(match))
            erase_dead(func.regions[0].blocks[0])
