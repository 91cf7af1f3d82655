"""Index arithmetic as a builder, and the index rules that are no lane layout.

Every rule that turns an index into another (the paged cache's addresses in
cache_layout.py, the packed query rows and the rounding up here) is written once
against `IndexOps`, in the style of `layout_emit.CallableBuilder`: `NUMPY_OPS`
evaluates it on Python ints, numpy arrays or torch tensors, `TEXT_OPS` writes it
out, and `arith_ops` emits it as `arith` ops on IR values (a kernel passes
`lanes.ops`, a lowering `arith_ops(build.index)`).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class IndexOps:
    """Index arithmetic as functions (any value type): the builder the rules are written
    against. `div`, `rem`, `min` and `lt` are of the builder's signedness (the rules
    apply them to non-negative values, where both agree); `sge` and `slt` are signed."""

    const: Callable[[int], Any]
    add: Callable[[Any, Any], Any]
    sub: Callable[[Any, Any], Any]
    mul: Callable[[Any, Any], Any]
    div: Callable[[Any, Any], Any]
    rem: Callable[[Any, Any], Any]
    min: Callable[[Any, Any], Any]
    lt: Callable[[Any, Any], Any]
    sge: Callable[[Any, Any], Any]
    slt: Callable[[Any, Any], Any]
    and_: Callable[[Any, Any], Any]
    or_: Callable[[Any, Any], Any]


NUMPY_OPS = IndexOps(
    const=lambda c: c, add=operator.add, sub=operator.sub, mul=operator.mul,
    div=operator.floordiv, rem=operator.mod, min=np.minimum, lt=operator.lt,
    sge=operator.ge, slt=operator.lt, and_=operator.and_, or_=operator.or_)
"""Python ints, numpy arrays (elementwise) and, but for `min`, torch tensors."""

TEXT_OPS = IndexOps(
    const=str, add=lambda a, b: f"({a} + {b})", sub=lambda a, b: f"({a} - {b})",
    mul=lambda a, b: f"({a} * {b})", div=lambda a, b: f"({a} / {b})",
    rem=lambda a, b: f"({a} % {b})", min=lambda a, b: f"min({a}, {b})",
    lt=lambda a, b: f"({a} < {b})", sge=lambda a, b: f"({a} >= {b})",
    slt=lambda a, b: f"({a} < {b})", and_=lambda a, b: f"({a} & {b})",
    or_=lambda a, b: f"({a} | {b})")


def arith_ops(const: Callable[[int], Any], *, signed: bool = False) -> IndexOps:
    """The rules as `arith` ops on IR values at the current insertion point; `const(n)`
    makes the constants (the caller's: `lanes.index` hoists and reuses them, a
    lowering's `build.index` writes one in place; their type is the values' type)."""
    from iree.compiler.dialects import arith

    predicate = arith.CmpIPredicate

    def compare(which):
        return lambda a, b: arith.cmpi(which, a, b)

    return IndexOps(
        const=const, add=arith.addi, sub=arith.subi, mul=arith.muli,
        div=arith.divsi if signed else arith.divui,
        rem=arith.remsi if signed else arith.remui,
        min=arith.minsi if signed else arith.minui,
        lt=compare(predicate.slt if signed else predicate.ult),
        sge=compare(predicate.sge), slt=compare(predicate.slt), and_=arith.andi,
        or_=arith.ori)


def ceil_div(ops: IndexOps, count, unit: int):
    """ceil(count / unit) of a count >= 0: blocks of a length, partitions or tiles of it."""
    return ops.div(ops.add(count, ops.const(unit - 1)), ops.const(unit))


def floor_div(ops: IndexOps, count, unit: int):
    """floor(count / unit) of a count >= 0: the whole units (tiles) of a length."""
    return ops.div(count, ops.const(unit))


@dataclass(frozen=True)
class TileRing:
    """A loop's tiles staged through `stages` buffers in turn: tile t in stage
    t % stages, and the tile copied while t is computed, the next one (the last, of
    `count`, copies itself again: no branch)."""

    stages: int

    def stage(self, ops: IndexOps, tile):
        return ops.rem(tile, ops.const(self.stages))

    def following(self, ops: IndexOps, tile, count):
        return ops.min(ops.add(tile, ops.const(1)), ops.sub(count, ops.const(1)))


@dataclass(frozen=True)
class PackedRows:
    """A KV head's query rows packed token-major into the MMA's M: row r is query
    token r // group, head r % group of the GQA group."""

    group: int

    def split(self, ops: IndexOps, row):
        """(query token, head in the group) of packed row `row`."""
        return ops.div(row, ops.const(self.group)), ops.rem(row, ops.const(self.group))


@dataclass(frozen=True)
class PackedTerms:
    """A second term packed into the padding rows of the first's A tile: staged row r
    (< `live`) holds its second term at row r + `shift`, so the first term is stored
    outside rows shift .. shift + live - 1 and the second from the live rows only."""

    shift: int
    live: int

    def stores(self, ops: IndexOps, row, term: int):
        """Does the thread of staged row `row` store its term `term` (0 or 1)?"""
        if term == 1:
            return ops.lt(row, ops.const(self.live))
        return ops.or_(ops.lt(row, ops.const(self.shift)),
                       ops.lt(ops.const(self.shift + self.live - 1), row))


@dataclass(frozen=True)
class HeadMajorRows:
    """The tensor-level pipeline's rows of a KV head: row r is head r // query_tokens
    of the GQA group, query token r % query_tokens (its scores [B, Hkv, G * Sq, T])."""

    query_tokens: int

    def query_token(self, ops: IndexOps, row):
        return ops.rem(row, ops.const(self.query_tokens))
