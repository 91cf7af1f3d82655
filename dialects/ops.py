"""The `int8attn` ops as typed classes: accessors, a `build` classmethod, `verify`.

IREE's Python bindings cannot define dialects, so the ops stay unregistered in
MLIR (generic form); each one has an `ir.OpView` subclass registered for the
`int8attn` namespace, so `op.opview`, a block's operations, a value's `owner`
and the op handed to a rewrite pattern are instances of that class. A class
gives typed accessors for its operands and attributes (`AttentionOp.q`,
`.mode -> str`, `.softmax_scale -> float`, `GroupedPVOp.groups -> int64
[G, K]`, ...), builds the op (`AttentionOp.build(...)`) and verifies it
(`verify()` raises a `DiagnosticError` at the op's location). Accessors assume
a verified op. See `int8attn.dialects.int8attn` for the op table and semantics.

The classes live by family: `attention_ops` (attention, quantize, softmax_pv),
`pv_ops` (pv, folded_pv, group_quantize, grouped_pv, mmac_tiles, column_sums)
and `paged` (paged_attention, cache_write); their base class, the type helpers
and the verifier helper are in `op_base`. This module gathers the tensor ops'
classes, with the helpers, and their table `OPS`.
"""

from __future__ import annotations

from .attention_ops import AttentionOp, QuantizeOp, SoftmaxPVOp
from .op_base import (DYNAMIC, FLOAT_TYPES, MODES, Int8AttnOp, element_of,
                      groups_attr, groups_of, shape_of, tensor)
from .pv_ops import (ColumnSumsOp, FoldedPVOp, GroupedPVOp, GroupQuantizeOp,
                     MMACTilesOp, PVOp)

__all__ = [
    "OPS", "DYNAMIC", "FLOAT_TYPES", "MODES", "Int8AttnOp", "AttentionOp", "QuantizeOp",
    "SoftmaxPVOp", "PVOp", "FoldedPVOp", "GroupQuantizeOp", "GroupedPVOp", "MMACTilesOp",
    "ColumnSumsOp", "element_of", "groups_attr", "groups_of", "shape_of", "tensor",
]

OPS: dict[str, type[Int8AttnOp]] = {cls.OPERATION_NAME: cls for cls in (
    AttentionOp, QuantizeOp, SoftmaxPVOp, PVOp, FoldedPVOp, GroupQuantizeOp, GroupedPVOp,
    MMACTilesOp, ColumnSumsOp,
)}
