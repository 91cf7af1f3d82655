"""What every int8attn op class is built from: the dialect, `Int8AttnOp`, helpers.

The `int8attn` dialect registration and the base class of the op classes
(`Int8AttnOp`: creation, and a `verify()` required of every subclass); the
type and attribute helpers (`tensor`, `shape_of`, `groups_of`, ...); the
property factories the classes declare their operands and attributes with
(`_operand`, `_string`, ...); and `_Check`, the verifier helper that raises the
first failed expectation as a `DiagnosticError` at the op's location. The op
classes are in `attention_ops`, `pv_ops` and `paged` (the table in `ops`).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects._ods_common import _cext

from ..support.diagnostics import DiagnosticError

MODES = ("decode", "prefill")
DYNAMIC = ir.ShapedType.get_dynamic_size()
FLOAT_TYPES = ("f32", "f16", "bf16")
# Every static dimension of an int8attn operand or result is below this (sizes, strides
# and token indices are then int64 products of int32-range factors, and numpy and
# IREE's index arithmetic handle them).
MAX_DIM = 2 ** 31


# ----------------------------------------------------------------------------
# Type and attribute helpers
# ----------------------------------------------------------------------------

def tensor(shape: Sequence[int], element: str) -> ir.RankedTensorType:
    return ir.RankedTensorType.get(list(shape), ir.Type.parse(element))


def shape_of(value: ir.Value) -> list[int]:
    return list(ir.RankedTensorType(value.type).shape)


def element_of(value: ir.Value) -> str:
    return str(ir.RankedTensorType(value.type).element_type)


def groups_attr(groups: np.ndarray) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.DenseI64ArrayAttr.get([int(t) for t in row]) for row in groups])


def groups_of(op, name: str = "groups") -> np.ndarray:
    """A groups attribute as an int64 [G, K] table (ValueError if malformed)."""
    attr = op.attributes[name]
    if not isinstance(attr, ir.ArrayAttr):
        raise ValueError("not an array attribute")
    rows = []
    for row in attr:
        if not isinstance(row, ir.DenseI64ArrayAttr):
            raise ValueError("not an array of array<i64: ...>")
        rows.append(list(row))
    if not rows or len({len(r) for r in rows}) != 1:
        raise ValueError("rows of different lengths")
    return np.array(rows, dtype=np.int64)


def _operand(index: int, doc: str) -> property:
    return property(lambda self: self.operation.operands[index], doc=doc)


def _result(index: int, doc: str) -> property:
    return property(lambda self: self.operation.results[index], doc=doc)


def _string(name: str) -> property:
    return property(lambda self: ir.StringAttr(self.attributes[name]).value,
                    doc=f"attribute '{name}' as a str")


def _groups(name: str) -> property:
    return property(lambda self: groups_of(self, name),
                    doc=f"attribute '{name}' as an int64 [G, K] token table")


# ----------------------------------------------------------------------------
# Verifier helper
# ----------------------------------------------------------------------------

class _Check:
    """Collects the first failed expectation of one op as a located error."""

    def __init__(self, op: ir.OpView):
        self.op = op

    def fail(self, message: str):
        raise DiagnosticError(self.op.location, f"'{self.op.name}' op {message}")

    def that(self, condition: bool, message: str):
        if not condition:
            self.fail(message)

    def arity(self, operands: int, results: int):
        self.that(len(self.op.operands) == operands,
                  f"expects {operands} operands, got {len(self.op.operands)}")
        self.that(len(self.op.results) == results,
                  f"expects {results} results, got {len(self.op.results)}")

    def ranked(self, value, what: str, rank: int | tuple[int, ...],
               elements: tuple[str, ...], dynamic: tuple[int, ...] = ()) -> list[int]:
        """The static shape of a ranked tensor operand; dims listed in `dynamic`
        may be `?` (returned as DYNAMIC)."""
        ranks = (rank,) if isinstance(rank, int) else rank
        if not isinstance(value.type, ir.RankedTensorType):
            self.fail(f"{what} must be a ranked tensor, got {value.type}")
        t = ir.RankedTensorType(value.type)
        if any(t.is_dynamic_dim(i) and i not in dynamic for i in range(t.rank)):
            may = (f" (only dims {', '.join(map(str, dynamic))} may be dynamic)" if dynamic
                   else "")
            self.fail(f"{what} must have a static shape{may}, got {value.type}")
        self.that(t.rank in ranks,
                  f"{what} must have rank {' or '.join(map(str, ranks))}, got {value.type}")
        self.that(str(t.element_type) in elements,
                  f"{what} must have element type {' or '.join(elements)}, got {value.type}")
        self.that(all(d > 0 or d == DYNAMIC for d in t.shape),
                  f"{what} has an empty dimension: {value.type}")
        self.that(all(d < MAX_DIM for d in t.shape),
                  f"{what} has a dimension of {max(t.shape)}; int8attn supports static "
                  f"dimensions below 2^31: {value.type}")
        return list(t.shape)

    def f32_attr(self, name: str, example: str) -> float:
        """A required f32 FloatAttr (an f64 or f16 one is refused: its value need not be
        an f32's, and the f32 range checks would not see it)."""
        attr = self.op.attributes[name] if name in self.op.attributes else None
        if not isinstance(attr, ir.FloatAttr) or str(attr.type) != "f32":
            got = "" if attr is None else f", got {attr}"
            self.fail(f"requires an f32 attribute '{name}' (e.g. {name} = {example} : f32)"
                      f"{got}")
        return ir.FloatAttr(attr).value

    def form(self, attributes: tuple[str, ...]) -> None:
        """No region, and no attribute but the op's own (`attributes`)."""
        regions = len(self.op.operation.regions)
        self.that(regions == 0, f"has {regions} region(s); int8attn ops have none")
        unknown = [name for name in self.op.operation.attributes if name not in attributes]
        if unknown:
            known = ", ".join(f"'{a}'" for a in attributes) or "none"
            self.fail(f"has unknown attribute '{unknown[0]}' (its attributes: {known})")

    def same(self, actual, expected, what: str):
        self.that(list(actual) == list(expected),
                  f"{what} has shape {_dims(actual)}, expected {_dims(expected)}")

    def string_attr(self, name: str, choices: tuple[str, ...]) -> str:
        attr = self.op.attributes[name] if name in self.op.attributes else None
        if attr is None or not isinstance(attr, ir.StringAttr):
            self.fail(f"requires a string attribute '{name}' "
                      f"(one of {', '.join(repr(c) for c in choices)})")
        value = ir.StringAttr(attr).value
        self.that(value in choices, f"attribute '{name}' is \"{value}\"; expected one of "
                  f"{', '.join(repr(c) for c in choices)}")
        return value

    def int_attr(self, name: str, choices: tuple[int, ...]) -> int:
        attr = self.op.attributes[name] if name in self.op.attributes else None
        if not isinstance(attr, ir.IntegerAttr) or str(attr.type) != "i64":
            self.fail(f"requires an i64 attribute '{name}' (one of "
                      f"{', '.join(map(str, choices))}), got {attr}")
        value = ir.IntegerAttr(attr).value
        self.that(value in choices, f"attribute '{name}' is {value}; expected one of "
                  f"{', '.join(map(str, choices))}")
        return value

    def scale_groups(self, tokens: int, count: int) -> np.ndarray:
        """'scale_groups': one row per group of tokens of the block, each token at most
        once per row (a row may cover fewer tokens than its group: a wrong choice the
        verifier refuses, which must still be expressible)."""
        try:
            rows = groups_of(self.op, "scale_groups")
        except (ValueError, TypeError) as error:
            self.fail(f"attribute 'scale_groups' must be a non-empty list of equally long "
                      f"array<i64: ...> rows ({error})")
        self.that(rows.shape[0] == count, f"attribute 'scale_groups' has {rows.shape[0]} "
                  f"rows; expected one per group ({count})")
        self.that(((rows >= 0) & (rows < tokens)).all() and
                  all(len(set(r.tolist())) == len(r) for r in rows),
                  f"attribute 'scale_groups' must name distinct tokens of the block "
                  f"(0..{tokens - 1}) in each row")
        return rows

    def groups(self, tokens: int, name: str = "groups") -> np.ndarray:
        if name not in self.op.attributes:
            self.fail(f"requires a '{name}' attribute ([array<i64: ...>, ...], one row per group)")
        try:
            groups = groups_of(self.op, name)
        except (ValueError, TypeError) as error:
            self.fail(f"attribute '{name}' must be a non-empty list of equally long "
                      f"array<i64: ...> rows ({error})")
        self.that(np.array_equal(np.sort(groups.ravel()), np.arange(tokens)),
                  f"attribute '{name}' must use each of the {tokens} tokens of a block "
                  f"exactly once")
        return groups

    def kv_operands(self, v, v_scale, blocked: bool) -> list[int]:
        if blocked:
            vs = self.ranked(v, "v", 5, ("i8",))
            if v_scale is not None:
                self.ranked(v_scale, "v_scale", 4, ("f32",))
                self.same(shape_of(v_scale), vs[:4], "v_scale")
        else:
            vs = self.ranked(v, "v", 4, ("i8",))
            if v_scale is not None:
                self.ranked(v_scale, "v_scale", 3, ("f32",))
                self.same(shape_of(v_scale), vs[:3], "v_scale")
        return vs

    def block_pv(self, weights_shape, v, v_scale, result):
        b, hkv, rows, blocks, tokens = weights_shape
        vs = self.kv_operands(v, v_scale, blocked=True)
        self.same(vs[:4], [b, hkv, blocks, tokens], "v's leading [B, Hkv, N, T]")
        self.ranked(result, "result", 5, ("f32",))
        self.same(shape_of(result), [b, hkv, rows, blocks, vs[4]], "result")

    def accumulator(self, acc, result) -> None:
        """The accumulator operand a PV op's result adds to: the result's type."""
        self.ranked(acc, "acc", 5, ("f32",))
        self.that(acc.type == result.type, f"acc {acc.type} must be the result's type "
                                           f"{result.type}")

    def optional_arity(self, operands: int, results: int) -> bool:
        """`operands` operands, or one more (an optional last operand): is it there?"""
        given = len(self.op.operands)
        self.that(given in (operands, operands + 1),
                  f"expects {operands} or {operands + 1} operands, got {given}")
        self.that(len(self.op.results) == results,
                  f"expects {results} results, got {len(self.op.results)}")
        return given == operands + 1

    def column_sums(self, sums, wq, v) -> None:
        """The optional column sums operand: i32 [B, Hkv, N, G, D] of wq's groups and v."""
        b, hkv, _, blocks, count, _ = shape_of(wq)
        self.ranked(sums, "column_sums", 5, ("i32",))
        self.same(shape_of(sums), [b, hkv, blocks, count, shape_of(v)[4]], "column_sums")

    def grouped_weights(self, wq, v) -> np.ndarray:
        b, hkv, rows, blocks, count, size = self.ranked(wq, "wq", 6, ("i8",))
        tokens = self.ranked(v, "v", 5, ("i8",))[3]
        groups = self.groups(tokens)
        self.same([count, size], groups.shape, "wq's trailing [G, K]")
        return groups


def _dims(shape) -> str:
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in shape) + "]"


# ----------------------------------------------------------------------------
# The dialect and the ops' base class
# ----------------------------------------------------------------------------

@_cext.register_dialect
class _Dialect(ir.Dialect):
    DIALECT_NAMESPACE = "int8attn"


class Int8AttnOp(ir.OpView):
    """Base of the int8attn op classes (not registered itself).

    `ATTRIBUTES` names the attributes an op may carry; every verifier first refuses
    another attribute and any region (`_Check.form`), so a misspelt or foreign
    attribute (`causal = true`) is an error, not silently ignored."""

    OPERATION_NAME: str
    ATTRIBUTES: tuple[str, ...] | None = None
    _ODS_REGIONS = (0, True)

    @classmethod
    def _create(cls, results, operands, attributes=None, loc=None):
        return ir.Operation.create(cls.OPERATION_NAME, results=list(results),
                                   operands=list(operands), attributes=attributes or {},
                                   loc=loc).opview

    def __init_subclass__(cls, **kwargs):
        # Every op class carries its own verifier (OpView's would verify nothing for
        # an unregistered op): a class without one is a definition error, at import.
        super().__init_subclass__(**kwargs)
        if "verify" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must define verify(), raising a "
                            f"DiagnosticError at the op's location unless it is well formed")
        own = cls.__dict__["verify"]

        @functools.wraps(own)
        def verify(self):
            if type(self).ATTRIBUTES is None:
                raise TypeError(f"{type(self).__name__} must declare ATTRIBUTES, the "
                                f"attributes its op may carry")
            _Check(self).form(type(self).ATTRIBUTES)
            return own(self)

        cls.verify = verify
