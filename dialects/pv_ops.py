"""The PV chain: `pv`, `folded_pv`, `group_quantize`, `grouped_pv`, `mmac_tiles`, `column_sums`.

The ops that `decode-split-kv` / `prefill-online-softmax` through `pv-to-mmac`
produce from softmax_pv's `P·V` on blocks of T tokens: `pv` (P, Vq, sV),
`folded_pv` (W = P·sV, Vq), `group_quantize` (W into INT8 groups of the
fragment model's token sets), `grouped_pv` (the groups times Vq), `mmac_tiles`
(the matrix-instruction tiles) and `column_sums` (unsigned W's offset). Typed
classes as described in `ops`.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects._ods_common import _cext

from ..contract.constants import W_QUANTS
from .op_base import (Int8AttnOp, _Check, _Dialect, _groups, _operand,
                      _result, _string, groups_attr, groups_of, shape_of,
                      tensor)
from ..fragments import W_CHAINS, pv_model_named, pv_model_names


_ACC = "the O the block's sums accumulate into, f32 [B,Hkv,R,N,D]"


@_cext.register_operation(_Dialect)
class PVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.pv"
    ATTRIBUTES = ()
    p = _operand(0, "probabilities f32 [B,Hkv,R,N,T]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")
    v_scale = _operand(2, "value scales f32 [B,Hkv,N,T]")
    acc = _operand(3, _ACC)

    @classmethod
    def build(cls, p, v, v_scale, acc, *, loc=None) -> PVOp:
        return cls._create([acc.type], [p, v, v_scale, acc], loc=loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(4, 1)
        ws = c.ranked(self.p, "p", 5, ("f32",))
        c.block_pv(ws, self.v, self.v_scale, self.result)
        c.accumulator(self.acc, self.result)
        return True


@_cext.register_operation(_Dialect)
class FoldedPVOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.folded_pv"
    ATTRIBUTES = ()
    w = _operand(0, "weights P * sV, f32 [B,Hkv,R,N,T]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")
    acc = _operand(2, _ACC)

    @classmethod
    def build(cls, w, v, acc, *, loc=None) -> FoldedPVOp:
        return cls._create([acc.type], [w, v, acc], loc=loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(3, 1)
        ws = c.ranked(self.w, "w", 5, ("f32",))
        c.block_pv(ws, self.v, None, self.result)
        c.accumulator(self.acc, self.result)
        return True


@_cext.register_operation(_Dialect)
class GroupQuantizeOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.group_quantize"
    ATTRIBUTES = ("groups", "scale_groups", "w_quant")
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
            c.scale_groups(ws[-1], count)
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
    ATTRIBUTES = ("groups",)
    wq = _operand(0, "quantized weights i8 [B,Hkv,R,N,G,K]")
    sw = _operand(1, "weight scales f32 [B,Hkv,R,N,G]")
    v = _operand(2, "values i8 [B,Hkv,N,T,D]")
    acc = _operand(3, _ACC)
    groups = _groups("groups")

    @property
    def column_sums(self) -> ir.Value | None:
        """i32 [B,Hkv,N,G,D] sum of Vq over each group (unsigned W's offset), or None."""
        operands = self.operation.operands
        return operands[4] if len(operands) == 5 else None

    @classmethod
    def build(cls, wq, sw, v, acc, groups: np.ndarray, *, column_sums=None,
              loc=None) -> GroupedPVOp:
        sums = [] if column_sums is None else [column_sums]
        return cls._create([acc.type], [wq, sw, v, acc, *sums],
                           {"groups": groups_attr(groups)}, loc)

    def verify(self) -> bool:
        c = _Check(self)
        has_sums = c.optional_arity(4, 1)
        wq, sw, v = self.wq, self.sw, self.v
        c.grouped_weights(wq, v)
        if has_sums:
            c.column_sums(self.column_sums, wq, v)
        c.ranked(sw, "sw", 5, ("f32",))
        c.same(shape_of(sw), shape_of(wq)[:5], "sw")
        c.block_pv(shape_of(wq)[:4] + [shape_of(v)[3]], v, None, self.result)
        c.accumulator(self.acc, self.result)
        return True


@_cext.register_operation(_Dialect)
class MMACTilesOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.mmac_tiles"
    ATTRIBUTES = ("groups", "fragment_model", "chain")
    wq = _operand(0, "quantized weights i8 [B,Hkv,R,N,G,K]")
    v = _operand(1, "values i8 [B,Hkv,N,T,D]")
    groups = _groups("groups")
    fragment_model = _string("fragment_model")

    @property
    def chain(self) -> int:
        """MMACs chained into each group's one int32 accumulator ('chain', default 1):
        a row of `groups` is their K slots, step after step."""
        return ir.IntegerAttr(self.attributes["chain"]).value \
            if "chain" in self.attributes else 1

    @property
    def model(self):
        """The fragment model whose accumulators the tiles are (`fragments.pv_model_named`
        of `fragment_model`, chained `chain` times)."""
        return pv_model_named(self.fragment_model).chained(self.chain)

    @property
    def column_sums(self) -> ir.Value | None:
        """i32 [B,Hkv,N,G,D]: the accumulator starts at 128 * this (unsigned W), or None."""
        operands = self.operation.operands
        return operands[2] if len(operands) == 3 else None

    @classmethod
    def build(cls, wq, v, groups: np.ndarray, *, fragment_model: str, chain: int = 1,
              column_sums=None, loc=None) -> MMACTilesOp:
        out = shape_of(wq)[:-1] + [shape_of(v)[-1]]
        sums = [] if column_sums is None else [column_sums]
        attrs = {"groups": groups_attr(groups),
                 "fragment_model": ir.StringAttr.get(fragment_model)}
        if chain != 1:
            attrs["chain"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), chain)
        return cls._create([tensor(out, "i32")], [wq, v, *sums], attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        has_sums = c.optional_arity(2, 1)
        wq, v = self.wq, self.v
        groups = c.grouped_weights(wq, v)
        if has_sums:
            c.column_sums(self.column_sums, wq, v)
        model = pv_model_named(c.string_attr("fragment_model", tuple(sorted(pv_model_names()))))
        chain = c.int_attr("chain", W_CHAINS) if "chain" in self.attributes else 1
        k = model.instruction.k
        c.that(groups.shape[1] == k * chain,
               f"groups of {groups.shape[1]} tokens do not match the K={k} of {model.name}'s "
               f"{model.instruction.name}" + (f" times its chain of {chain}" if chain > 1
                                              else ""))
        c.that(shape_of(v)[:3] == shape_of(wq)[:2] + [shape_of(wq)[3]],
               "v's leading [B, Hkv, N] do not match wq's")
        c.ranked(self.result, "result", 6, ("i32",))
        c.same(shape_of(self.result), shape_of(wq)[:5] + [shape_of(v)[4]], "result")
        return True


@_cext.register_operation(_Dialect)
class ColumnSumsOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.column_sums"
    ATTRIBUTES = ("groups",)
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
