"""lower-quantize: symmetric int8 quantization in standard dialects.

Rewrites `int8attn.quantize(x)` (per row, last dimension) into

    a = max_j |x_j|;   s = a == inf ? NaN : a / 127   (a NaN: s = NaN)
    inv = (a >= QUANTIZE_MIN_ABSMAX and a < inf) ? 127 / a : 0
    q = fptosi(inv == 0 ? 0 : clamp(roundeven(x * inv), -127, 127))

and `int8attn.group_quantize(W) {groups}` into a token gather of W into
[..., G, K] (the fragment order of `groups`) followed by the same per-row
quantization over K (with `scale_groups`, the absmax comes from a second
gather over those token sets instead). An all-zero or tiny row gives q = 0; a
row holding NaN or Inf gives q = 0, s = NaN (never a poison fptosi). The scalar
ops come from passes/quantize_contract.py, which the lane-level kernels share.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir

from int8attn.dialects import int8attn as d
from int8attn.passes import builders as build
from int8attn.passes import quantize_contract as contract
from int8attn.passes.lower_mmac_tiles import gather_tokens
from int8attn.passes.rewrite import apply_patterns


def row_absmax(x: ir.Value) -> ir.Value:
    shape = d.shape_of(x)
    dims = "abcdefghij"[:len(shape)]
    return build.generic([x], [dims], dims[:-1], build.zeros(shape[:-1], "f32"),
                         lambda xi, acc: contract.absmax_step(acc, xi))


def quantize_rows(x: ir.Value, amax: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """Per-row int8 of `x`; the scale is `amax`/127 (default: the row's own absmax)."""
    shape = d.shape_of(x)
    dims = "abcdefghij"[:len(shape)]
    row, row_shape = dims[:-1], shape[:-1]
    amax = row_absmax(x) if amax is None else amax
    c = contract.quantize_constants(build.f32)
    scale = build.generic([amax], [row], row, build.empty(row_shape, "f32"),
                          lambda a, _: contract.quantize_scale(a, c))
    inverse = build.generic([amax], [row], row, build.empty(row_shape, "f32"),
                            lambda a, _: contract.quantize_inverse(a, c))
    q = build.generic([x, inverse], [dims, row], dims, build.empty(shape, "i8"),
                      lambda xi, inv, _: contract.quantize_value(xi, inv, c))
    return q, scale


def lower_quantize(op: d.QuantizeOp, rewriter):
    with rewriter.ip, op.location:
        q, scale = quantize_rows(op.x)
    rewriter.replace_op(op, [q, scale])


def lower_group_quantize(op: d.GroupQuantizeOp, rewriter):
    w = op.w
    token_dim = len(d.shape_of(w)) - 1
    groups, scale_groups = op.groups, op.scale_groups
    with rewriter.ip, op.location:
        grouped = gather_tokens(w, token_dim, groups)
        amax = None
        if not (scale_groups == groups).all():  # the seed's bug, on request
            amax = row_absmax(gather_tokens(w, token_dim, scale_groups))
        q, scale = quantize_rows(grouped, amax)
    rewriter.replace_op(op, [q, scale])


@dataclass(frozen=True)
class LowerQuantize:
    """Lower `int8attn.quantize` and `int8attn.group_quantize` to linalg."""

    argument: ClassVar[str] = "lower-quantize"

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.QUANTIZE: lower_quantize,
                                d.GROUP_QUANTIZE: lower_group_quantize})
