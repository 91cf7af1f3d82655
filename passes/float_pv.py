"""float-pv: the f32 and bf16 PV baselines.

Rewrites `int8attn.folded_pv(W, v, acc)` into a float contraction into acc

    O = acc + sum_t W' * f32(Vq)      W' = W (pv=f32) or f32(bf16(W)) (pv=bf16)

Everything before PV (INT8 QK, partitions, the V-scale fold) is shared with
the INT8 path, so the baselines differ from it only in PV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from iree.compiler import ir
from iree.compiler.dialects import arith

from ..dialects import int8attn as d
from ..dialects import builders as build
from .rewrite import apply_patterns
from ..support.options import TypedOptions, option

FloatPVKind = Literal["f32", "bf16"]


def round_to_bf16(x: ir.Value) -> ir.Value:
    """f32 -> nearest bf16 (ties to even), kept in f32.

    Written on the bits because canonicalization folds extf(truncf(x)) to x.
    """
    i32 = ir.IntegerType.get_signless(32)
    bits = arith.bitcast(i32, x)
    c = lambda value: arith.constant(i32, value)
    lsb = arith.andi(arith.shrui(bits, c(16)), c(1))
    rounded = arith.addi(bits, arith.addi(lsb, c(0x7FFF)))
    return arith.bitcast(ir.F32Type.get(), arith.andi(rounded, c(-65536)))


def float_contraction(op: d.FoldedPVOp, rewriter, pv: str):
    w, v = op.w, op.v
    def weight(w_i):
        return round_to_bf16(w_i) if pv == "bf16" else w_i

    with rewriter.ip, op.location:
        out = build.generic(
            [w, v], ["bhrnt", "bhntd"], "bhrnd", op.acc,
            lambda w_i, v_i, total: arith.addf(total, arith.mulf(weight(w_i), build.to_f32(v_i))))
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class FloatPV(TypedOptions):
    """Lower the folded PV contraction in f32, or with W rounded to bf16."""

    argument: ClassVar[str] = "float-pv"
    pv: FloatPVKind = option("f32", "precision of W in the contraction: f32 or bf16")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.FOLDED_PV: lambda op, rw: float_contraction(op, rw, self.pv)})
