"""Index IR from a LinearLayout: shifts, masks and xors through a small builder.

For each output dim, every (input bit i -> output bit j) wire of the bases is
grouped by (input dim, shift j - i); each group is one term
`(x & mask) << shift` (or `>>`), and the terms are combined with `or` where
their output bits are disjoint and `xor` where they overlap (a swizzle). A plain
strided map is so one and-shift per run of bits, as `LaneMap` emitted them.

The builder is any object with these methods on index values (or a
`CallableBuilder` of functions): `const(int)`, `and_(v, int)`, `shl(v, int)`,
`shru(v, int)`, `or_(v, w)`, `xor(v, w)`. `INT_BUILDER` evaluates on Python ints
or numpy arrays and `TEXT_BUILDER` writes expressions, so nothing here needs IR;
a kernel passes one over `arith` ops (tests/test_linear_layout.py builds one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping


@dataclass(frozen=True)
class CallableBuilder:
    """A builder made of functions (any value type)."""

    const: Callable[[int], Any]
    and_: Callable[[Any, int], Any]
    shl: Callable[[Any, int], Any]
    shru: Callable[[Any, int], Any]
    or_: Callable[[Any, Any], Any]
    xor: Callable[[Any, Any], Any]


INT_BUILDER = CallableBuilder(
    const=lambda c: c, and_=lambda v, m: v & m, shl=lambda v, s: v << s,
    shru=lambda v, s: v >> s, or_=lambda a, b: a | b, xor=lambda a, b: a ^ b)

TEXT_BUILDER = CallableBuilder(
    const=str, and_=lambda v, m: f"({v} & {m})", shl=lambda v, s: f"({v} << {s})",
    shru=lambda v, s: f"({v} >> {s})", or_=lambda a, b: f"({a} | {b})",
    xor=lambda a, b: f"({a} ^ {b})")


def layout_terms(layout, out_dim: str) -> list[tuple[str, int, int]]:
    """(input dim, input mask, shift) of each term of `out_dim`, in input order;
    shift > 0 is a left shift. Output = XOR of ((x & mask) shifted)."""
    groups: dict[tuple[str, int], int] = {}
    for in_dim in layout.in_dims:
        for i, basis in enumerate(layout.bases(in_dim)):
            value, j = basis[out_dim], 0
            while value:
                if value & 1:
                    groups[(in_dim, j - i)] = groups.get((in_dim, j - i), 0) | 1 << i
                value >>= 1
                j += 1
    order = {name: n for n, name in enumerate(layout.in_dims)}
    return [(d, mask, shift) for (d, shift), mask in
            sorted(groups.items(), key=lambda item: (order[item[0][0]], -item[0][1]))]


def emit_layout(layout, builder, inputs: Mapping, outs: Iterable[str] | None = None,
                assume_in_range: bool = False) -> dict:
    """{out dim: value} built from {in dim: value}; a missing input dim is 0 (its
    terms are dropped). `assume_in_range` drops the `and` of a term that keeps
    every bit of its input (the value is known to be below the dim's size)."""
    result = {}
    for out_dim in (layout.out_dims if outs is None else outs):
        value, covered = None, 0
        for in_dim, mask, shift in layout_terms(layout, out_dim):
            if in_dim not in inputs:
                continue
            term = inputs[in_dim]
            if not (assume_in_range and mask == layout.in_size(in_dim) - 1 and shift >= 0):
                term = builder.and_(term, mask)
            if shift > 0:
                term = builder.shl(term, shift)
            elif shift < 0:
                term = builder.shru(term, -shift)
            bits = mask << shift if shift >= 0 else mask >> -shift
            value = term if value is None else (
                builder.xor(value, term) if covered & bits else builder.or_(value, term))
            covered |= bits
        result[out_dim] = builder.const(0) if value is None else value
    return result
