"""quantize-w-groups: quantize W per MMAC-owned group of tokens.

Rewrites `int8attn.folded_pv(W, v, o)` into

    Wq, sW = int8attn.group_quantize(W) {groups}
    O      = int8attn.grouped_pv(Wq, sW, v, o) {groups}

`groups` is the fragment model's token table for a block: row g holds
the tokens (in K-slot order) that one MMAC consumes. There is one scale per
(query row, block, group); on gfx936 with 16-byte V loads the groups of a wave
are {0-7,16-23,32-39,48-55} and {8-15,24-31,40-47,56-63}.

Option `w-quant=u8` (docs/design.md §2c) quantizes W unsigned (W >= 0): 255
levels per group, Wq = u - 128 as s8, sW = a/255, and the offset compensated
exactly by the column sums of V over the same groups:

    Wq, sW = int8attn.group_quantize(W) {groups, w_quant = "u8"}
    cs     = int8attn.column_sums(v) {groups}              sum_k Vq, int32
    O      = int8attn.grouped_pv(Wq, sW, v, o, cs) {groups}   o + sum_g f32(acc + 128 cs) sW

Option `w-terms=2` (docs/design.md §2c, two-term W) adds a second, signed INT8 term
per group on the f32 residual of the first, read back in token order, and its
own MMAC tiles over the same groups:

    R        = W - level(Wq) * sW    per token (scalar_ir.w_residual; level =
                                     Wq, or Wq + 128 for u8), a linalg.generic over
                                     W's token digits that reads Wq, sW through views
                                     of their group / slot digits (a gather through
                                     the groups table where they are no digit
                                     permutation)
    Wq2, sW2 = int8attn.group_quantize(R) {groups}
    O1       = int8attn.grouped_pv(Wq, sW, v, o[, cs]) {groups}
    O        = int8attn.grouped_pv(Wq2, sW2, v, O1) {groups}     (the second term's
                                     groups go on into the first's chain)

verify-scale-groups proves each pair like the first (the residual is W's, in the
same token order, so the second term's groups are the MMAC's tokens too).

Option `w-chain=c` chains c MMAC K-steps into one int32 accumulator: a group is
the union of c consecutive MMAC token sets (the fragment model's `chained(c)`), c x K
tokens, with one scale (gfx936, c = 2: one group per 64-token wave, its two MMACs'
K slots step after step). A block whose MMACs are no whole number of chains is refused.

Option `scale-groups=contiguous` reproduces contiguous (wrong) W groups on purpose: scales
over logical tokens 0-31 / 32-63 of each wave applied to the fragment's real
interleaved sets (`scale_groups` differs from `groups`). verify-scale-groups
rejects it; without the verifier it compiles, so the damage can be measured.
`scale-groups=step` does the same for a chain: each scale over its chain's first
MMAC step only, applied to the whole accumulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import tensor

from ..support.diagnostics import DiagnosticError
from ..dialects import int8attn as d
from ..fragments import (FragmentModelName, NotADigitPermutation, ScaleGroupKind,
                         WChain, fragment_model, token_axes)
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from .rewrite import apply_patterns
from ..contract.constants import WQuant, WTerms
from ..contract.numerics import Numerics
from ..support.options import TypedOptions, option


def _inverse(groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group, slot) of every token of the block: groups[g[t], k[t]] == t."""
    count, size = groups.shape
    group_of = np.full(count * size, -1, np.int64)
    slot_of = np.full(count * size, -1, np.int64)
    group_of[groups.ravel()] = np.repeat(np.arange(count), size)
    slot_of[groups.ravel()] = np.tile(np.arange(size), count)
    if (group_of < 0).any():
        raise ValueError("the groups do not cover every token of the block")
    return group_of, slot_of


_TOKEN_DIGIT = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def w_residual_tokens(w: ir.Value, wq: ir.Value, sw: ir.Value, groups: np.ndarray,
                      unsigned: bool) -> ir.Value:
    """R[b,h,r,n,t] = w_residual(W[b,h,r,n,t], Wq[b,h,r,n,g,k], sW[b,h,r,n,g]) with
    (g, k) the token's group and slot: the residual in W's own token order.

    Where `groups` is a permutation of the token index's digits (every fragment
    model) and the shapes are static, Wq and sW are read through views of their
    group and slot digits, the loops running over W's token digits (no gather,
    as lower-quantize reads W); otherwise through (group, slot) tables."""
    shape = d.shape_of(w)
    if d.DYNAMIC not in shape:
        try:
            axes = token_axes(groups)
        except NotADigitPermutation:
            axes = None
        if axes is not None:
            lead = "abcdefghijklmnopqrstuvwxyz"[:4]
            token = _TOKEN_DIGIT[:len(axes.axes)]
            group = "".join(token[i] for i in axes.group_order)
            slot = "".join(token[i] for i in axes.slot_order)
            wq_view = build.split_dim(build.split_dim(wq, 5, axes.slot_shape), 4,
                                      axes.group_shape)
            residual = build.generic(
                [build.split_dim(w, 4, axes.token_shape), wq_view,
                 build.split_dim(sw, 4, axes.group_shape)],
                [lead + token, lead + group + slot, lead + group], lead + token,
                build.empty(shape[:4] + axes.token_shape, "f32"),
                lambda w_t, level_q, scale, _: contract.w_residual(w_t, level_q, scale,
                                                                  unsigned))
            return build.merge_dims(residual, 4, len(token))
    group_of, slot_of = _inverse(groups)
    group_table, slot_table = build.lookup_table(group_of), build.lookup_table(slot_of)

    def body(w_t, _):
        b, h, r, n, t = (build.loop_index(i) for i in range(5))
        g, k = build.lookup(group_table, [t]), build.lookup(slot_table, [t])
        level_q = tensor.ExtractOp(wq, [b, h, r, n, g, k]).result
        scale = tensor.ExtractOp(sw, [b, h, r, n, g]).result
        return contract.w_residual(w_t, level_q, scale, unsigned)

    return build.generic([w], ["bhrnt"], "bhrnt", build.empty(d.shape_of(w), "f32", like=w),
                         body)


def quantize_groups(op: d.FoldedPVOp, rewriter, model_name: str, scale_groups: str,
                    w_quant: str = "s8", w_terms: int = 1, w_chain: int = 1):
    w, v = op.w, op.v
    block_tokens = d.shape_of(w)[-1]
    model = fragment_model(model_name).chained(w_chain)
    try:
        groups = model.token_groups(block_tokens)
        scales = model.scale_groups(block_tokens, scale_groups)
    except ValueError as error:
        block = "" if model.chain == 1 else (
            "; the block is a decode partition (partition-tokens) or a prefill KV tile "
            "(tile-tokens)")
        raise DiagnosticError(op.location, f"'{op.name}' op: {error} ({model.name}){block}") \
            from None
    with rewriter.ip, op.location:
        wq, sw = d.group_quantize(
            w, groups, scale_groups=None if scale_groups == "fragment" else scales,
            w_quant=w_quant)
        sums = d.column_sums(v, groups) if w_quant == "u8" else None
        out = d.grouped_pv(wq, sw, v, op.acc, groups, column_sums=sums)
        if w_terms == 2:
            residual = w_residual_tokens(w, wq, sw, groups, w_quant == "u8")
            wq2, sw2 = d.group_quantize(residual, groups)
            out = d.grouped_pv(wq2, sw2, v, out, groups)
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class QuantizeWGroups(TypedOptions):
    """Quantize W with one scale per group of tokens one MMAC of the fragment model consumes."""

    argument: ClassVar[str] = "quantize-w-groups"
    fragment_model: FragmentModelName = option(
        "gfx936", "matrix instruction and V-load scheme whose MMAC token sets are the groups")
    scale_groups: ScaleGroupKind = option(
        "fragment", "token sets of the W scales: fragment (the accumulator's), or, for the "
        "verifier to reject, contiguous (logical token runs) or step (each chain's first "
        "MMAC step only)")
    # The numerics default to the contract's (`Numerics()`), as the named pipelines'.
    w_quant: WQuant = option(
        Numerics().w_quant, "W per group: s8 (symmetric, 127 levels) or u8 (255 levels, stored as u - 128, "
        "offset compensated by 128 * sum Vq)")
    w_terms: WTerms = option(
        Numerics().w_terms, "INT8 terms of W per group: 1, or 2 (a second, signed term quantizes the f32 "
        "residual W - level*sW1 over the same tokens: one more MMAC per group)")

    w_chain: WChain = option(
        1, "MMAC K-steps chained into one int32 accumulator before its one conversion to "
        "f32: the W groups are the chain's tokens (chain x K; fragments.FragmentModel)")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.FOLDED_PV: lambda op, rw: quantize_groups(
            op, rw, self.fragment_model, self.scale_groups, self.w_quant, self.w_terms,
            self.w_chain)})
