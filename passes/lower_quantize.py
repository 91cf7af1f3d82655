"""lower-quantize: symmetric int8 quantization in standard dialects.

Rewrites `int8attn.quantize(x)` (per row, last dimension) into

    a = max_j |x_j|;   s = a == inf ? NaN : a / 127   (a NaN: s = NaN)
    inv = (a >= QUANTIZE_MIN_ABSMAX and a < inf) ? 127 / a : 0
    q = fptosi(inv == 0 ? 0 : clamp(roundeven(x * inv), -127, 127))

and `int8attn.group_quantize(W) {groups}` into the same per-row quantization
over each group's K tokens, with Wq in [..., G, K] (the fragment order of
`groups`). Where `groups` is a permutation of the token index's digits
(`fragments.token_axes`, every fragment model here), W is read in place: its
token dim viewed as those digits, the absmax reducing the slot digits and Wq
written in group order by the loops' order, no copy of W. Otherwise (or with
`tokens=gather`, or with `scale_groups`, whose absmax comes from a second
gather over those token sets) W is first gathered into [..., G, K]. An
all-zero or tiny row gives q = 0; a row holding NaN or Inf gives q = 0, s = NaN
(never a poison fptosi). `group_quantize {w_quant = "u8"}` uses the unsigned
rule (255 levels, Wq = u - 128, sW = a/255; u = 0 where a row is skipped).
The scalar ops come from contract/scalar_ir.py, which the lane-level
kernels share.
Leading (row) dimensions of `quantize` may be dynamic (cache_write's T new tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir

from ..dialects import int8attn as d
from ..fragments import NotADigitPermutation, TokenAxes, token_axes
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from .lower_mmac_tiles import TokenAccess, gather_tokens
from .rewrite import apply_patterns
from ..support.options import TypedOptions, option


def row_absmax(x: ir.Value) -> ir.Value:
    shape = d.shape_of(x)
    dims = "abcdefghij"[:len(shape)]
    return build.generic([x], [dims], dims[:-1], build.zeros(shape[:-1], "f32", like=x),
                         lambda xi, acc: contract.absmax_step(acc, xi))


def _value_rule(c, unsigned: bool, own_absmax: bool = True):
    """The contract's scalar quantize of one element (signed, or unsigned W), against
    its own row's absmax or another's (`own_absmax`)."""
    rule = contract.quantize_unsigned_value if unsigned else contract.quantize_value
    return lambda xi, inv, _: rule(xi, inv, c, own_absmax=own_absmax)


def quantize_rows(x: ir.Value, amax: ir.Value | None = None,
                  unsigned: bool = False) -> tuple[ir.Value, ir.Value]:
    """Per-row int8 of `x`; the scale is `amax`/127 (default: the row's own absmax),
    or `amax`/255 with Wq = u - 128 (`unsigned`)."""
    shape = d.shape_of(x)
    dims = "abcdefghij"[:len(shape)]
    row, row_shape = dims[:-1], shape[:-1]
    own_absmax = amax is None
    amax = row_absmax(x) if own_absmax else amax
    c = contract.quantize_constants(build.f32, unsigned)
    scale = build.generic([amax], [row], row, build.empty(row_shape, "f32", like=x),
                          lambda a, _: contract.quantize_scale(a, c, unsigned))
    inverse = build.generic([amax], [row], row, build.empty(row_shape, "f32", like=x),
                            lambda a, _: contract.quantize_inverse(a, c, unsigned))
    q = build.generic([x, inverse], [dims, row], dims, build.empty(shape, "i8", like=x),
                      _value_rule(c, unsigned, own_absmax))
    return q, scale


def lower_quantize(op: d.QuantizeOp, rewriter):
    with rewriter.ip, op.location:
        q, scale = quantize_rows(op.x)
    rewriter.replace_op(op, [q, scale])


# Loop names of the token digits (the leading dims use lower-case letters).
_TOKEN_DIGIT = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def quantize_groups_in_place(w: ir.Value, axes: TokenAxes,
                             unsigned: bool = False) -> tuple[ir.Value, ir.Value]:
    """group_quantize on a view of W's token dim split into the groups' digits:
    the absmax reduces the slot digits, Wq is written in [G, K] order straight
    from W (a permutation of loops, no gather)."""
    shape = d.shape_of(w)
    t = len(shape) - 1
    lead = "abcdefghijklmnopqrstuvwxyz"[:t]
    token = _TOKEN_DIGIT[:len(axes.axes)]
    group = "".join(token[i] for i in axes.group_order)
    slot = "".join(token[i] for i in axes.slot_order)
    c = contract.quantize_constants(build.f32, unsigned)
    w_view = build.split_dim(w, t, axes.token_shape)
    amax = build.generic([w_view], [lead + token], lead + group,
                         build.zeros(shape[:t] + axes.group_shape, "f32"),
                         lambda x, acc: contract.absmax_step(acc, x))
    amax = build.merge_dims(amax, t, len(group))
    rows, row_shape = lead + "G", shape[:t] + [axes.groups]
    scale = build.generic([amax], [rows], rows, build.empty(row_shape, "f32"),
                          lambda a, _: contract.quantize_scale(a, c, unsigned))
    inverse = build.generic([amax], [rows], rows, build.empty(row_shape, "f32"),
                            lambda a, _: contract.quantize_inverse(a, c, unsigned))
    q = build.generic([w_view, build.split_dim(inverse, t, axes.group_shape)],
                      [lead + token, lead + group], lead + group + slot,
                      build.empty(shape[:t] + axes.group_shape + axes.slot_shape, "i8"),
                      _value_rule(c, unsigned))
    q = build.merge_dims(build.merge_dims(q, t + len(group), len(slot)), t, len(group))
    return q, scale


def lower_group_quantize(op: d.GroupQuantizeOp, rewriter, tokens: str = "in-place"):
    w = op.w
    token_dim = len(d.shape_of(w)) - 1
    groups, scale_groups = op.groups, op.scale_groups
    own_scales = scale_groups.shape == groups.shape and (scale_groups == groups).all()
    unsigned = op.w_quant == "u8"
    axes = None
    if (tokens == "in-place" and own_scales
            and d.DYNAMIC not in d.shape_of(w)):
        try:
            axes = token_axes(groups)
        except NotADigitPermutation:
            pass
    with rewriter.ip, op.location:
        if axes is not None:
            q, scale = quantize_groups_in_place(w, axes, unsigned)
            rewriter.replace_op(op, [q, scale])
            return
        grouped = gather_tokens(w, token_dim, groups)
        amax = None
        if not own_scales:  # contiguous (wrong) W groups or a chain's one step, on request
            amax = row_absmax(gather_tokens(w, token_dim, scale_groups))
        q, scale = quantize_rows(grouped, amax, unsigned)
    rewriter.replace_op(op, [q, scale])


@dataclass(frozen=True)
class LowerQuantize(TypedOptions):
    """Lower `int8attn.quantize` and `int8attn.group_quantize` to linalg."""

    argument: ClassVar[str] = "lower-quantize"
    tokens: TokenAccess = option(
        "in-place", "read W's tokens in group order through a view where the groups "
        "allow it, or always gather them through the groups table (the reference form)")

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.QUANTIZE: lower_quantize,
                                d.GROUP_QUANTIZE: lambda op, rw: lower_group_quantize(
                                    op, rw, self.tokens)})
