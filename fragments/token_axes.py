"""Token groups as a permutation of index digits: the copy-free view of V.

A groups table `groups[g, k] = token` (one row per MMAC, one column per K
slot) says which token of a block each K slot of each instruction consumes.
For every fragment model here that map is a permutation of the *bits* of the
token index: with the flat slot index `f = g*K + k`, each bit of `f` lands on
one bit of the token (gfx936, 256-token block: token = 64*wave + 16*r + 8*t
+ j, group = (wave, t), slot = (r, j)).

Then no copy of V is needed to feed a group's K slots: the token dimension of
V can be reshaped (`tensor.expand_shape`) into one dimension per run of bits,
the group and slot dimensions of Wq the same way, and one contraction whose
indexing maps name the group digits and the slot digits as separate loops
pairs each K slot with its token. `token_axes(groups)` derives those digits
from the table alone and checks them against it, raising
`NotADigitPermutation` when the table has no such form (a consumer then falls
back to gathering tokens through the table).

An axis is a run of adjacent token digits that is also a run of adjacent
group (or slot) digits in the same order; adjacent runs are merged, so the
gfx936 table above has four axes: wave, r, t, j (a 64-token block: r, t, j).
A block whose size is not a power of two (3 waves) keeps its odd factor in
the outermost axis.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

AxisRole = Literal["group", "slot"]


class NotADigitPermutation(ValueError):
    """The groups table is not a permutation of the token index's digits."""


@dataclass(frozen=True)
class TokenAxis:
    """One run of token digits: `size` values, `token_stride` apart in the
    token index, `stride` apart in the group index (role "group") or in the
    K slot index (role "slot")."""

    size: int
    token_stride: int
    role: AxisRole
    stride: int


@dataclass(frozen=True)
class TokenAxes:
    """`groups[g, k] = sum_a digit_a * token_stride_a`, where g and k are
    composed from the digits of the group axes and of the slot axes.

    `axes` is in token order (outermost first): the shape V's token
    dimension expands to. `group_order` / `slot_order` index `axes` in group
    (slot) order, outermost first: the shapes the G and K dimensions of Wq
    expand to, and the order of the group axes in the result.
    """

    groups: int
    slots: int
    axes: tuple[TokenAxis, ...]

    @property
    def tokens(self) -> int:
        return self.groups * self.slots

    @property
    def token_shape(self) -> list[int]:
        return [a.size for a in self.axes]

    def order(self, role: AxisRole) -> list[int]:
        """Indices into `axes` of the axes of `role`, outermost first."""
        chosen = [i for i, a in enumerate(self.axes) if a.role == role]
        return sorted(chosen, key=lambda i: -self.axes[i].stride)

    @property
    def group_order(self) -> list[int]:
        return self.order("group")

    @property
    def slot_order(self) -> list[int]:
        return self.order("slot")

    @property
    def group_shape(self) -> list[int]:
        return [self.axes[i].size for i in self.group_order]

    @property
    def slot_shape(self) -> list[int]:
        return [self.axes[i].size for i in self.slot_order]

    def table(self) -> np.ndarray:
        """int64 [groups, slots]: the groups table these axes describe."""
        table = np.zeros((self.groups, self.slots), dtype=np.int64)
        g = np.arange(self.groups)[:, None]
        k = np.arange(self.slots)[None, :]
        for axis in self.axes:
            index = g if axis.role == "group" else k
            table = table + (index // axis.stride) % axis.size * axis.token_stride
        return table


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def token_axes(groups) -> TokenAxes:
    """The digit decomposition of a groups table; raises NotADigitPermutation.

    Only the table is read: flat slot index f = g*K + k, T = G*K tokens,
    2^m the largest power of two dividing T. Bit i < m of f must map to one
    token bit (tok(2^i) a power of two below 2^m), f // 2^m to token // 2^m,
    and every entry must be the sum of its bits' images.
    """
    table = np.asarray(groups, dtype=np.int64)
    if table.ndim != 2 or table.size == 0:
        raise NotADigitPermutation(f"groups must be a non-empty [G, K] table, got shape "
                                   f"{list(table.shape)}")
    n_groups, n_slots = (int(s) for s in table.shape)
    tokens = n_groups * n_slots
    flat = table.ravel()
    if not np.array_equal(np.sort(flat), np.arange(tokens)):
        raise NotADigitPermutation(f"the groups table does not hold each of its {tokens} "
                                   "tokens exactly once")
    if not _is_power_of_two(n_slots):
        raise NotADigitPermutation(f"K={n_slots} slots is not a power of two")
    bits = (tokens & -tokens).bit_length() - 1          # 2^bits | tokens, maximal
    low = 1 << bits
    images = []
    for i in range(bits):
        image = int(flat[1 << i])
        if not (_is_power_of_two(image) and image < low):
            raise NotADigitPermutation(
                f"slot {1 << i} (group {(1 << i) // n_slots}, K slot {(1 << i) % n_slots}) "
                f"holds token {image}, not a single bit of the token index")
        images.append(image)
    f = np.arange(tokens, dtype=np.int64)
    predicted = f // low * low
    for i, image in enumerate(images):
        predicted = predicted + ((f >> i) & 1) * image
    mismatch = np.flatnonzero(predicted != flat)
    if mismatch.size:
        first = int(mismatch[0])
        raise NotADigitPermutation(
            f"group {first // n_slots}, K slot {first % n_slots} holds token {int(flat[first])}, "
            f"not the bit permutation's {int(predicted[first])}")

    # One axis per digit of f, then merge runs; (size, token stride, f stride).
    units = [(2, image, 1 << i) for i, image in enumerate(images)]
    if tokens // low > 1:
        units.append((tokens // low, low, low))
    units.sort(key=lambda u: -u[1])                      # token order, outermost first

    def role(f_stride: int) -> AxisRole:
        return "group" if f_stride >= n_slots else "slot"

    merged: list[tuple[int, int, int]] = []
    for size, t_stride, f_stride in units:
        if merged:
            o_size, o_t, o_f = merged[-1]
            if (o_t == t_stride * size and o_f == f_stride * size
                    and role(o_f) == role(f_stride)):
                merged[-1] = (o_size * size, t_stride, f_stride)
                continue
        merged.append((size, t_stride, f_stride))
    axes = tuple(
        TokenAxis(size, t_stride, role(f_stride),
                  f_stride // n_slots if role(f_stride) == "group" else f_stride)
        for size, t_stride, f_stride in merged)
    result = TokenAxes(n_groups, n_slots, axes)
    if not np.array_equal(result.table(), table):   # the decomposition, checked
        raise NotADigitPermutation("internal: the derived token axes do not rebuild the table")
    return result
