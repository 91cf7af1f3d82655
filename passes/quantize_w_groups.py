"""quantize-w-groups: quantize W per MMAC-owned group of tokens.

Rewrites `int8attn.folded_pv(W, v)` into

    Wq, sW = int8attn.group_quantize(W) {groups}
    O      = int8attn.grouped_pv(Wq, sW, v) {groups}

`groups` is the fragment model's token table for a block: row g holds
the tokens (in K-slot order) that one MMAC consumes. There is one scale per
(query row, block, group); on gfx936 with 16-byte V loads the groups of a wave
are {0-7,16-23,32-39,48-55} and {8-15,24-31,40-47,56-63}.

Option `w-quant=u8` (DESIGN.md §2c) quantizes W unsigned (W >= 0): 255
levels per group, Wq = u - 128 as s8, sW = a/255, and the offset compensated
exactly by the column sums of V over the same groups:

    Wq, sW = int8attn.group_quantize(W) {groups, w_quant = "u8"}
    cs     = int8attn.column_sums(v) {groups}              sum_k Vq, int32
    O      = int8attn.grouped_pv(Wq, sW, v, cs) {groups}   sum_g f32(acc + 128 cs) sW

Option `scale-groups=contiguous` reproduces the seed's bug on purpose: scales
over logical tokens 0-31 / 32-63 of each wave applied to the fragment's real
interleaved sets (`scale_groups` differs from `groups`). verify-scale-groups
rejects it; without the verifier it compiles, so the damage can be measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir

from int8attn.support.diagnostics import DiagnosticError
from int8attn.dialects import int8attn as d
from int8attn.fragments import FragmentModelName, ScaleGroupKind, fragment_model
from int8attn.passes.rewrite import apply_patterns
from int8attn.reference.common import WQuant
from int8attn.support.options import TypedOptions, option


def quantize_groups(op: d.FoldedPVOp, rewriter, model_name: str, scale_groups: str,
                    w_quant: str = "s8"):
    w, v = op.w, op.v
    block_tokens = d.shape_of(w)[-1]
    model = fragment_model(model_name)
    try:
        groups = model.token_groups(block_tokens)
        scales = model.scale_groups(block_tokens, scale_groups)
    except ValueError as error:
        raise DiagnosticError(op.location, f"'{op.name}' op: {error} ({model_name})") from None
    with rewriter.ip, op.location:
        wq, sw = d.group_quantize(
            w, groups, scale_groups=None if scale_groups == "fragment" else scales,
            w_quant=w_quant)
        sums = d.column_sums(v, groups) if w_quant == "u8" else None
        out = d.grouped_pv(wq, sw, v, groups, column_sums=sums)
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class QuantizeWGroups(TypedOptions):
    """Quantize W with one scale per group of tokens one MMAC of the fragment model consumes."""

    argument: ClassVar[str] = "quantize-w-groups"
    fragment_model: FragmentModelName = option(
        "gfx936", "matrix instruction and V-load scheme whose MMAC token sets are the groups")
    scale_groups: ScaleGroupKind = option(
        "fragment", "token sets of the W scales: fragment (the MMAC's) or contiguous (the "
        "seed's bug, for the verifier to reject)")
    w_quant: WQuant = option(
        "s8", "W per group: s8 (symmetric, 127 levels) or u8 (255 levels, stored as u - 128, "
        "offset compensated by 128 * sum Vq)")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.FOLDED_PV: lambda op, rw: quantize_groups(
            op, rw, self.fragment_model, self.scale_groups, self.w_quant)})
