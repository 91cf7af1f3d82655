"""Applying rewrite patterns: plain functions `fn(op, rewriter)` keyed by op name.

`op` is the op's typed class (`op.opview`: `int8attn.dialects.ops.AttentionOp`,
... for int8attn ops), so a pattern reads operands and attributes through its
accessors (`op.q`, `op.mode`, `op.groups`, ...).
"""

from __future__ import annotations

from typing import Callable

from iree.compiler import ir, rewrite

from ..support.ir import walk

Pattern = Callable[[ir.OpView, "rewrite.PatternRewriter"], None]


def apply_patterns(module: ir.Operation, patterns: dict[str, Pattern]) -> None:
    """Rewrite every op named in `patterns` with the greedy driver.

    Exceptions raised by a pattern (`DiagnosticError`) propagate to the caller.
    """
    if not any(op.name in patterns for op in walk(module)):
        return
    pattern_set = rewrite.RewritePatternSet()
    for name, fn in patterns.items():
        pattern_set.add(name, _typed(fn))
    rewrite.apply_patterns_and_fold_greedily(module, pattern_set.freeze())


def _typed(fn: Pattern) -> Pattern:
    return lambda op, rewriter: fn(op.opview, rewriter)
