"""pv-to-mmac: the grouped PV contraction as MMAC tiles plus the rescale.

Rewrites `int8attn.grouped_pv(Wq, sW, v, o[, cs]) {groups}` into

    acc = int8attn.mmac_tiles(Wq, v[, cs]) {groups, fragment_model}   int32, one K group each
    O   = o + sum_g f32(acc_g) * sW_g  one FMA per group into o, in order (contract.accumulate_pv)

With unsigned W the column sums `cs` go to the tiles, whose accumulator starts
at 128 * cs (acc = sum Wq*Vq + 128 sum Vq = sum u*Vq, still an s8 x s8 MMAC).

Each tile is one accumulator of the fragment model: the K extent of its matrix
instruction, or with `w-chain=c` c MMAC K-steps whose integer sums add in int32
before the one conversion and rescale (`{chain = c}`). int32 sums never cross
groups, so no int32 value ever mixes two scales. The head dim is the
instruction's N: a head dim that is not a whole number of N-wide tiles is
rejected (use a float PV baseline or pad D).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir

from ..support.diagnostics import DiagnosticError
from ..contract import scalar_ir as contract
from ..dialects import int8attn as d
from ..fragments import NUMPY_OPS, FragmentModelName, WChain, ceil_div, fragment_model
from ..dialects import builders as build
from .quantize_w_groups import QuantizeWGroups
from .rewrite import apply_patterns
from ..support.options import TypedOptions, option


def to_mmac_tiles(op: d.GroupedPVOp, rewriter, model_name: str, w_chain: int = 1):
    wq, sw, v, groups = op.wq, op.sw, op.v, op.groups
    model = fragment_model(model_name).chained(w_chain)
    instruction = model.instruction
    if groups.shape[1] != model.group_size:
        chain = f" x {w_chain} chained (w-chain)" if w_chain > 1 else ""
        raise DiagnosticError(
            op.location, f"'{op.name}' op has groups of {groups.shape[1]} tokens but "
            f"{model_name}'s {instruction.name} consumes K={instruction.k}{chain}")
    head_dim = d.shape_of(v)[-1]
    if head_dim % instruction.n:
        padded = ceil_div(NUMPY_OPS, head_dim, instruction.n) * instruction.n
        raise DiagnosticError(
            op.location, f"head dim {head_dim} is not a multiple of N={instruction.n} of "
            f"{model_name}'s {instruction.name}, which computes {instruction.n} head-dim columns "
            f"at a time; pad D to {padded} with zero columns, or use a float PV (--pv bf16 "
            f"or --pv f32)")
    with rewriter.ip, op.location:
        acc = d.mmac_tiles(wq, v, groups, fragment_model=model_name, chain=w_chain,
                           column_sums=op.column_sums)
        out = build.generic(
            [acc, sw], ["bhrngd", "bhrng"], "bhrnd",
            op.acc,
            lambda a, s, total: contract.accumulate_pv(total, build.to_f32(a), s))
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class PVToMMAC(TypedOptions):
    """Lower the grouped PV contraction to the fragment model's MMAC tiles and rescale by sW."""

    argument: ClassVar[str] = "pv-to-mmac"
    fragment_model: FragmentModelName = option(
        QuantizeWGroups.fragment_model, "matrix instruction whose K the groups must match")
    w_chain: WChain = option(QuantizeWGroups.w_chain, "MMAC K-steps per int32 accumulator: "
                             "the groups must be chain x K tokens")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.GROUPED_PV: lambda op, rw: to_mmac_tiles(
            op, rw, self.fragment_model, self.w_chain)})
