"""The `int8attn` dialect: graph and algorithm ops, their builders and verifiers.

IREE's Python bindings cannot define dialects, so these are unregistered ops in
generic form. Each op is a typed class (`int8attn.dialects.ops`: an `ir.OpView`
subclass registered for the `int8attn` namespace, so `op.opview` and the ops a
pattern receives are `AttentionOp`, `QuantizeOp`, ...) with typed accessors for
its operands and attributes, a `build` classmethod, and its verifier as a
method `verify()`. This module is the public API: the classes, the op names
(`ATTENTION`, ...), the builders (`attention(...)`, `quantize(...)`, ...,
returning values) and `verify(module)`, which runs every op's verifier and
raises a `DiagnosticError` at the first offending op's location.

Shape names used below: B batch, Hq/Hkv query/KV heads, R query rows per KV
head (decode: the Hq/Hkv heads; prefill: (head, query token) pairs, head-major,
so row r is query token r % Sq), S tokens, D head dim, N blocks (partitions or tiles) of T tokens, G
scale groups of K tokens each.

| op | operands -> results |
|---|---|
| attention       | q [B,Hq,D] or [B,Hq,Sq,D], k i8 [B,Hkv,S,D], k_scale f32 [B,Hkv,S], v i8, v_scale f32 -> f32 q-shape |
| paged_attention | q [B,Hq,D], k_cache i8 [NB,Hkv,BS,D], k_scale f32 [NB,Hkv,BS], v_cache i8 [NB,Hkv,D,BS], v_scale, block_tables i32 [B,MB], context_lens i32 [B] -> f32 [B,Hq,D] (B, NB, MB may be dynamic; `dialects/paged.py`) |
| cache_write     | k_new, v_new float [T,Hkv,D], slot_mapping i32 [T], k_cache, k_scale, v_cache, v_scale (as paged_attention's)[, k_bias f32 [Hkv,D] subtracted from k_new] -> the four caches, updated {block_size} (T, NB may be dynamic; a slot < 0 skips its token) |
| quantize        | x float [..., X] -> (i8 [..., X], f32 [...]) per-row symmetric int8 |
| softmax_pv      | scores f32 [B,Hkv,R,S] (log2 units: the softmax is exp2 of them), v, v_scale {mode[, query_tokens]} -> f32 [B,Hkv,R,D] |
| pv              | p f32 [B,Hkv,R,N,T], v i8 [B,Hkv,N,T,D], v_scale f32 [B,Hkv,N,T], acc f32 [B,Hkv,R,N,D] -> f32 acc-shape |
| folded_pv       | w f32 [B,Hkv,R,N,T], v i8 [B,Hkv,N,T,D], acc -> f32 acc-shape |
| group_quantize  | w f32 [..., T] {groups[, scale_groups]} -> (i8 [..., G, K], f32 [..., G]) |
| grouped_pv      | wq i8 [B,Hkv,R,N,G,K], sw f32 [B,Hkv,R,N,G], v, acc[, column_sums] {groups} -> f32 acc-shape |
| mmac_tiles      | wq i8 [B,Hkv,R,N,G,K], v[, column_sums] {groups, fragment_model[, chain]} -> i32 [B,Hkv,R,N,G,D] |
| column_sums     | v i8 [B,Hkv,N,T,D] {groups} -> i32 [B,Hkv,N,G,D]: sum of v over each group's tokens |

The PV ops accumulate into their `acc` operand (destination-passing, as linalg's
outs): the result is acc plus the block's sums, each group's added by one FMA in the
contract's order (docs/design.md §2). A decode partition starts from zeros, a prefill
tile from α·o, a second W term from the first's result.

Unsigned W (`group_quantize {w_quant = "u8"}`, docs/design.md §2c): per group
`a = max|W|` (= max W, W >= 0), `u = clamp(rne(W*(255/a)), 0, 255)`, Wq = u - 128
(s8), sW = a/255; its consumer (`grouped_pv`, `mmac_tiles`) then takes the
`column_sums` of v over the same groups as a last operand and accumulates
`sum_k Wq*Vq + 128 * column_sums` (int32), i.e. sum_k u*Vq: the MMAC's
accumulator starts at 128 * sum Vq. verify-scale-groups proves the column sums
cover exactly the MMAC's tokens.

`groups` is a table `[array<i64: ...>, ...]`: row g lists the tokens of a
block that scale group g (one MMAC) consumes, in K-slot order. It always
comes from the fragment model (`int8attn.fragments`).

quantize / group_quantize of a row x: `a = max|x|`, `s = a/127` (NaN when `a`
is not finite), `q = clamp(rne(x*(127/a)), -127, 127)`, except `q = 0` when
`a < QUANTIZE_MIN_ABSMAX` (0 included) or `a` is NaN/Inf. The threshold keeps
127/a finite and every value that rounds to a nonzero q a normal f32, so the
result does not depend on flush-to-zero; a non-finite row poisons only its own
results through the NaN scale (docs/numerics.md, *Non-finite and extreme inputs*).
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from ..support.diagnostics import DiagnosticError
from ..support.ir import walk
from ..contract.constants import QUANTIZE_MIN_ABSMAX
from .ops import OPS as _TENSOR_OPS
from .paged import CacheWriteOp, PagedAttentionOp, cache_write, paged_attention
from .ops import (
                  DYNAMIC, FLOAT_TYPES, MODES, AttentionOp, FoldedPVOp, GroupedPVOp, GroupQuantizeOp, Int8AttnOp,
                  MMACTilesOp, ColumnSumsOp, PVOp, QuantizeOp, SoftmaxPVOp, element_of, groups_attr,
                  groups_of, shape_of,
                  tensor,
                  )

__all__ = [
    "ATTENTION", "QUANTIZE", "SOFTMAX_PV", "PV", "FOLDED_PV", "GROUP_QUANTIZE", "GROUPED_PV",
    "MMAC_TILES", "COLUMN_SUMS", "OPS", "MODES", "FLOAT_TYPES", "QUANTIZE_MIN_ABSMAX",
    "Int8AttnOp", "AttentionOp", "QuantizeOp", "SoftmaxPVOp", "PVOp", "FoldedPVOp",
    "GroupQuantizeOp", "GroupedPVOp", "MMACTilesOp", "ColumnSumsOp", "column_sums",
    "PagedAttentionOp", "PAGED_ATTENTION",
    "paged_attention", "CacheWriteOp", "CACHE_WRITE", "cache_write", "DYNAMIC",
    "attention", "quantize", "softmax_pv", "pv", "folded_pv", "group_quantize", "grouped_pv",
    "mmac_tiles", "verify", "walk", "tensor", "shape_of", "element_of", "groups_attr",
    "groups_of",
]

OPS = {**_TENSOR_OPS, PagedAttentionOp.OPERATION_NAME: PagedAttentionOp,
       CacheWriteOp.OPERATION_NAME: CacheWriteOp}

# Op names (pattern keys); the classes' OPERATION_NAME.
ATTENTION = AttentionOp.OPERATION_NAME
PAGED_ATTENTION = PagedAttentionOp.OPERATION_NAME
CACHE_WRITE = CacheWriteOp.OPERATION_NAME
QUANTIZE = QuantizeOp.OPERATION_NAME
SOFTMAX_PV = SoftmaxPVOp.OPERATION_NAME
PV = PVOp.OPERATION_NAME
FOLDED_PV = FoldedPVOp.OPERATION_NAME
GROUP_QUANTIZE = GroupQuantizeOp.OPERATION_NAME
GROUPED_PV = GroupedPVOp.OPERATION_NAME
MMAC_TILES = MMACTilesOp.OPERATION_NAME
COLUMN_SUMS = ColumnSumsOp.OPERATION_NAME


# ----------------------------------------------------------------------------
# Builders: the classes' `build`, returning the op's result value(s)
# ----------------------------------------------------------------------------

def attention(q, k, k_scale, v, v_scale, *, mode: str, softmax_scale: float,
              loc=None) -> ir.Value:
    return AttentionOp.build(q, k, k_scale, v, v_scale, mode=mode, softmax_scale=softmax_scale,
                             loc=loc).result


def quantize(x, *, loc=None) -> tuple[ir.Value, ir.Value]:
    op = QuantizeOp.build(x, loc=loc)
    return op.xq, op.scale


def softmax_pv(scores, v, v_scale, *, mode: str, query_tokens: int = 1, loc=None) -> ir.Value:
    return SoftmaxPVOp.build(scores, v, v_scale, mode=mode, query_tokens=query_tokens,
                             loc=loc).result


def pv(p, v, v_scale, acc, *, loc=None) -> ir.Value:
    return PVOp.build(p, v, v_scale, acc, loc=loc).result


def folded_pv(w, v, acc, *, loc=None) -> ir.Value:
    return FoldedPVOp.build(w, v, acc, loc=loc).result


def group_quantize(w, groups: np.ndarray, *, scale_groups: np.ndarray | None = None,
                   w_quant: str = "s8", loc=None) -> tuple[ir.Value, ir.Value]:
    """Wq[..., g, k] = W[..., groups[g, k]] / sW[g] (u8: minus 128); sW[g] over
    `scale_groups[g]`.

    `scale_groups` defaults to `groups` (the only correct choice); a different
    table expresses contiguous (wrong) W groups, for the verifier to reject.
    """
    op = GroupQuantizeOp.build(w, groups, scale_groups=scale_groups, w_quant=w_quant, loc=loc)
    return op.wq, op.sw


def grouped_pv(wq, sw, v, acc, groups: np.ndarray, *, column_sums=None, loc=None) -> ir.Value:
    return GroupedPVOp.build(wq, sw, v, acc, groups, column_sums=column_sums, loc=loc).result


def mmac_tiles(wq, v, groups: np.ndarray, *, fragment_model: str, chain: int = 1,
               column_sums=None, loc=None) -> ir.Value:
    return MMACTilesOp.build(wq, v, groups, fragment_model=fragment_model, chain=chain,
                             column_sums=column_sums, loc=loc).result


def column_sums(v, groups: np.ndarray, *, loc=None) -> ir.Value:
    return ColumnSumsOp.build(v, groups, loc=loc).result


# ----------------------------------------------------------------------------
# Verification
# ----------------------------------------------------------------------------

def verify(module: ir.Operation) -> None:
    """Verify every int8attn op in `module`; unknown int8attn ops are errors."""
    for op in walk(module):
        if not op.name.startswith("int8attn."):
            continue
        view = op.opview
        if not isinstance(view, Int8AttnOp):
            raise DiagnosticError(
                op.location, f"unknown op '{op.name}'; the int8attn dialect has "
                f"{', '.join(sorted(OPS))}")
        view.verify()
