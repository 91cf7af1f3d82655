"""fold-v-scale: move the per-token V scale into the weights.

Rewrites `int8attn.pv(P, v, v_scale, acc)` into

    W = P * v_scale                       (W_i = P_i * sV_i)
    O = int8attn.folded_pv(W, v, acc)     (O = acc + sum_i W_i * Vq_i)

so the remaining contraction has int8 V and a weight that can be quantized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..dialects import int8attn as d
from ..dialects import builders as build
from .rewrite import apply_patterns


def fold_scale(op: d.PVOp, rewriter):
    p, v, v_scale = op.p, op.v, op.v_scale
    with rewriter.ip, op.location:
        w = build.generic([p, v_scale], ["bhrnt", "bhnt"], "bhrnt",
                          build.empty(d.shape_of(p), "f32"),
                          lambda p_i, s_v, _: arith.mulf(p_i, s_v))
        out = d.folded_pv(w, v, op.acc)
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class FoldVScale:
    """Fold the V scale into the probabilities: W = P * sV."""

    argument: ClassVar[str] = "fold-v-scale"

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.PV: fold_scale})
