"""Index rules that are no lane layout: mixed-radix packings and rounding.

Like the layouts' `emit_layout`, each rule is written once over a small
builder, so numpy, Python ints and the kernels' IR share it: the builder has
`plus(v, int)`, `div(v, int)` and `rem(v, int)` on index values (`INT_RULES`
evaluates on ints or numpy arrays; a kernel passes its `Lanes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class IntRules:
    """The rules' builder on Python ints and numpy integer arrays."""

    plus: Callable[[Any, int], Any] = lambda v, n: v + n
    div: Callable[[Any, int], Any] = lambda v, n: v // n
    rem: Callable[[Any, int], Any] = lambda v, n: v % n


INT_RULES = IntRules()


def ceil_div(builder, value, divisor: int):
    """ceil(value / divisor) of a non-negative value: whole tiles covering it."""
    return builder.div(builder.plus(value, divisor - 1), divisor)


@dataclass(frozen=True)
class PackedRows:
    """A KV head's query rows packed token-major into the MMA's M: row r is query
    token r // group, head r % group of the GQA group."""

    group: int

    def split(self, builder, row):
        """(query token, head in the group) of packed row `row`."""
        return builder.div(row, self.group), builder.rem(row, self.group)
