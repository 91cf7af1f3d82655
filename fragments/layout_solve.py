"""GF(2) solving for LinearLayout: rank, kernel, preimage, invert.

The layout is a matrix over GF(2): one column per flat input bit (input dims in
order, first dim lowest), holding that bit's image as a flat output value.
Gaussian elimination over the columns in input order gives the independent
(pivot) columns and a basis of the kernel; solving uses pivots only, so the
inverse of a surjective, non-injective layout leaves the dependent input bits 0.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


class NotInvertible(ValueError):
    """A layout without the inverse asked for (not surjective)."""


class SolveMixin:
    """Methods of LinearLayout that solve L(x) = y (needs `_columns`, `_ins`, `_outs`,
    `_split`, `_from_columns`)."""

    def _eliminate(self):
        """Gaussian elimination over the columns, in input order: (pivots, kernel).
        pivots: [(reduced column, leading bit, flat input combination)] of the
        independent columns; kernel: flat inputs of a basis of the null space."""
        pivots: list[tuple[int, int, int]] = []
        kernel: list[int] = []
        for index, column in enumerate(self._columns()):
            combo = 1 << index
            for value, lead, pivot_combo in pivots:
                if column >> lead & 1:
                    column ^= value
                    combo ^= pivot_combo
            if column:
                pivots.append((column, column.bit_length() - 1, combo))
            else:
                kernel.append(combo)
        return pivots, kernel

    @property
    def rank(self) -> int:
        return len(self._eliminate()[0])

    def is_surjective(self) -> bool:
        return self.rank == self.total_out_bits

    def is_injective(self) -> bool:
        return self.rank == self.total_in_bits

    def is_bijective(self) -> bool:
        return self.is_surjective() and self.is_injective()

    def _solve(self, flat_out: int) -> int | None:
        """A flat input mapping to flat_out (pivot inputs only), or None."""
        pivots, _ = self._eliminate()
        combo = 0
        for value, lead, pivot_combo in pivots:   # each pivot clears no earlier lead
            if flat_out >> lead & 1:
                flat_out ^= value
                combo ^= pivot_combo
        return None if flat_out else combo

    def kernel(self) -> list[dict[str, int]]:
        """A basis of the inputs that map to 0 (the broadcast / reduction directions)."""
        return [self._split(flat, self._ins) for flat in self._eliminate()[1]]

    def preimage(self, outputs: Mapping | None = None, **kwargs) -> dict[str, np.ndarray]:
        """Every input that maps to `outputs` (out dims left out must be 0; use
        `sublayout` to ignore some): a solution plus the span of the kernel, as
        {in_dim: int64 array}, sorted by flat input. Empty arrays if none."""
        outputs = {**(outputs or {}), **kwargs}
        unknown = set(outputs) - set(self.out_dims)
        if unknown:
            raise ValueError(f"unknown output dims {sorted(unknown)}")
        flat_out, shift = 0, 0
        for name, bits in self._outs:
            value = int(outputs.get(name, 0))
            if not 0 <= value < 1 << bits:
                raise ValueError(f"{name}={value} is outside 0..{(1 << bits) - 1}")
            flat_out |= value << shift
            shift += bits
        solution = self._solve(flat_out)
        flats = np.zeros(0 if solution is None else 1, dtype=np.int64) + (solution or 0)
        for direction in self._eliminate()[1]:
            flats = np.concatenate([flats, flats ^ direction])
        return self._split(np.sort(flats), self._ins)

    def invert(self) -> "LinearLayout":
        """The inverse (outputs -> inputs) of a bijective layout; of a surjective one,
        the right inverse that picks, for each output, the preimage whose
        dependent input bits are 0 (L(L.invert()(y)) = y). NotInvertible otherwise."""
        if self.rank < self.total_out_bits:
            missing = [f"{name} bit {i}" for name, i in self._flat_out_names()
                       if not self._solvable_bit(name, i)]
            raise NotInvertible(
                f"not surjective (rank {self.rank} < {self.total_out_bits} output bits): "
                f"no input reaches {', '.join(missing[:4])}; {self!r}")
        columns = []
        for name, bits in self._outs:
            for i in range(bits):
                columns.append(self._solve(self._flat_of(name, 1 << i)))
        return type(self)._from_columns(self._outs, self._ins, columns)

    def _flat_out_names(self):
        return [(name, i) for name, bits in self._outs for i in range(bits)]

    def _flat_of(self, out_dim: str, value: int) -> int:
        shift = 0
        for name, bits in self._outs:
            if name == out_dim:
                return value << shift
            shift += bits
        raise KeyError(out_dim)

    def _solvable_bit(self, name: str, bit: int) -> bool:
        return self._solve(self._flat_of(name, 1 << bit)) is not None
