"""Linear layouts: index maps between named power-of-two dims, linear over GF(2).

A `LinearLayout` maps named *input* dims (register, lane, wave, load, ...), each
of size 2^k, to named *output* dims (row, col, token, head_dim, ...). Bit i of
input dim d has a *basis*: one value per output dim. The image of an input is
the XOR of the bases of its set bits, per output dim:

    L(x) = XOR_{d, i : bit i of x_d is 1} basis[d][i]

An ordinary strided map (token = 16*r + j) has one output bit per basis; a XOR
swizzle (col ^= row) is a basis with two bits set. The idea and the operations
follow Triton's LinearLayout (include/triton/Tools/LinearLayout.h); this is
this project's own, smaller implementation in numpy-friendly Python.

Flattening: input dims in order, the first dim in the lowest bits (and the same
for outputs). `reshape_ins` / `reshape_outs` re-split those flat bits; they are
what makes "MMAC t takes a lane's bytes 8t .. 8t+7" a layout.

Equality and hashing compare the maps (dims by name, size and bases), not the
order in which the dims are listed.

Index IR comes from `emit` (fragments/layout_emit.py): shifts, masks, xors.
"""

from __future__ import annotations

from itertools import product as _cartesian
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from .layout_solve import NotInvertible, SolveMixin

__all__ = ["LinearLayout", "NotLinear", "NotInvertible"]


class NotLinear(ValueError):
    """A table or function is not linear over GF(2) in its input bits."""


def _log2(size: int, what: str) -> int:
    if size < 1 or size & (size - 1):
        raise ValueError(f"{what}: size {size} is not a power of two")
    return size.bit_length() - 1


def _dims(dims) -> tuple[tuple[str, int], ...]:
    """Normalize {name: size} or [(name, size)] to ((name, log2 size), ...)."""
    items = list(dims.items()) if isinstance(dims, Mapping) else list(dims)
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"repeated dim names: {names}")
    return tuple((name, _log2(int(size), f"dim '{name}'")) for name, size in items)


class LinearLayout(SolveMixin):
    """An XOR-linear map from named input dims to named output dims (see module doc).

    `bases[in_dim]` lists one basis per bit of that dim (so the dim has size
    2^len); a basis is a {out_dim: value} mapping (absent = 0) or a tuple in
    the order of `outs`. `outs` gives the output dims and sizes; left out, each
    size is the smallest power of two holding every basis value.
    """

    __slots__ = ("_ins", "_outs", "_bases")

    def __init__(self, bases: Mapping[str, Sequence], outs=None):
        if outs is None:
            names: list[str] = []
            top: dict[str, int] = {}
            for vectors in bases.values():
                for vector in vectors:
                    if not isinstance(vector, Mapping):
                        raise ValueError("tuple bases need `outs` to name the output dims")
                    for name, value in vector.items():
                        if name not in top:
                            names.append(name)
                        top[name] = top.get(name, 0) | int(value)
            outs = [(name, 1 << top[name].bit_length()) for name in names]
        self._outs = _dims(outs)
        self._ins = tuple((name, len(vectors)) for name, vectors in bases.items())
        out_names = [name for name, _ in self._outs]
        normalized: dict[str, tuple[tuple[int, ...], ...]] = {}
        for in_dim, vectors in bases.items():
            rows = []
            for vector in vectors:
                if isinstance(vector, Mapping):
                    unknown = set(vector) - set(out_names)
                    if unknown:
                        raise ValueError(f"basis of '{in_dim}' names unknown output dims "
                                         f"{sorted(unknown)} (outputs: {out_names})")
                    row = tuple(int(vector.get(name, 0)) for name in out_names)
                else:
                    row = tuple(int(v) for v in vector)
                    if len(row) != len(out_names):
                        raise ValueError(f"basis {row} of '{in_dim}' needs {len(out_names)} "
                                         "values")
                for (name, bits), value in zip(self._outs, row):
                    if not 0 <= value < 1 << bits:
                        raise ValueError(f"basis of '{in_dim}': {name}={value} is outside "
                                         f"0..{(1 << bits) - 1}")
                rows.append(row)
            normalized[in_dim] = tuple(rows)
        self._bases = normalized

    # -- construction ------------------------------------------------------------------

    @staticmethod
    def identity(in_dim: str, size: int, out_dim: str | None = None) -> "LinearLayout":
        """in_dim -> out_dim (default: the same name), x -> x."""
        return LinearLayout.strided(in_dim, size, out_dim or in_dim, 1)

    @staticmethod
    def strided(in_dim: str, size: int, out_dim: str, stride: int) -> "LinearLayout":
        """x -> stride * x (stride a power of two), output size stride * size."""
        bits = _log2(size, in_dim)
        _log2(stride, "stride")
        return LinearLayout({in_dim: [(stride << i,) for i in range(bits)]},
                            [(out_dim, stride * size)])

    @staticmethod
    def zeros(in_dim: str, size: int, outs=()) -> "LinearLayout":
        """Every value of in_dim -> 0 (a broadcast: all of in_dim share an output)."""
        out_dims = _dims(outs)
        return LinearLayout({in_dim: [(0,) * len(out_dims)] * _log2(size, in_dim)},
                            [(name, 1 << bits) for name, bits in out_dims])

    @staticmethod
    def empty() -> "LinearLayout":
        return LinearLayout({}, [])

    @staticmethod
    def from_function(ins, outs, function: Callable[..., Mapping[str, int]]) -> "LinearLayout":
        """Fit the layout of `function(**inputs) -> {out: value}` and check it on every
        input; raises NotLinear if some value is not the XOR of its bits' images."""
        in_dims, out_dims = _dims(ins), _dims(outs)
        out_names = [name for name, _ in out_dims]
        zero = {name: 0 for name, _ in in_dims}
        if any(function(**zero).get(name, 0) for name in out_names):
            raise NotLinear(f"the function does not map 0 to 0: {function(**zero)}")
        bases = {name: [function(**{**zero, name: 1 << i}) for i in range(bits)]
                 for name, bits in in_dims}
        layout = LinearLayout({n: [{o: v.get(o, 0) for o in out_names} for v in vs]
                               for n, vs in bases.items()},
                              [(name, 1 << bits) for name, bits in out_dims])
        for values in _cartesian(*[range(1 << bits) for _, bits in in_dims]):
            inputs = dict(zip(zero, values))
            got, want = layout.apply(inputs), function(**inputs)
            if any(got[o] != want.get(o, 0) for o in out_names):
                raise NotLinear(f"at {inputs} the function gives {dict(want)}, the XOR of "
                                f"its bits' images {got}")
        return layout

    # -- shape -------------------------------------------------------------------------

    @property
    def in_dims(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._ins)

    @property
    def out_dims(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._outs)

    def in_bits(self, dim: str) -> int:
        return dict(self._ins)[dim]

    def out_bits(self, dim: str) -> int:
        return dict(self._outs)[dim]

    def in_size(self, dim: str) -> int:
        return 1 << self.in_bits(dim)

    def out_size(self, dim: str) -> int:
        return 1 << self.out_bits(dim)

    @property
    def in_shape(self) -> dict[str, int]:
        return {name: 1 << bits for name, bits in self._ins}

    @property
    def out_shape(self) -> dict[str, int]:
        return {name: 1 << bits for name, bits in self._outs}

    @property
    def total_in_bits(self) -> int:
        return sum(bits for _, bits in self._ins)

    @property
    def total_out_bits(self) -> int:
        return sum(bits for _, bits in self._outs)

    def bases(self, in_dim: str) -> list[dict[str, int]]:
        """The bases of in_dim's bits, lowest first, as {out_dim: value}."""
        return [dict(zip(self.out_dims, row)) for row in self._bases[in_dim]]

    def basis(self, in_dim: str, bit: int) -> dict[str, int]:
        return self.bases(in_dim)[bit]

    # -- evaluation --------------------------------------------------------------------

    def apply(self, inputs: Mapping | None = None, **kwargs) -> dict:
        """{out_dim: value} for {in_dim: value}; values are ints or integer numpy arrays
        (broadcast together). Input dims left out are 0."""
        inputs = {**(inputs or {}), **kwargs}
        unknown = set(inputs) - set(self.in_dims)
        if unknown:
            raise ValueError(f"unknown input dims {sorted(unknown)} (inputs: {self.in_dims})")
        out = {name: 0 for name in self.out_dims}
        for name, bits in self._ins:
            if name not in inputs:
                continue
            x = inputs[name]
            if isinstance(x, (int, np.integer)):
                if not 0 <= x < 1 << bits:
                    raise ValueError(f"{name}={x} is outside 0..{(1 << bits) - 1}")
            else:
                x = np.asarray(x, dtype=np.int64)
                if x.size and (x.min() < 0 or x.max() >= 1 << bits):
                    raise ValueError(f"{name} has values outside 0..{(1 << bits) - 1}")
            for i, row in enumerate(self._bases[name]):
                bit = (x >> i) & 1
                for out_name, value in zip(self.out_dims, row):
                    if value:
                        out[out_name] = out[out_name] ^ (bit * value)
        return out

    __call__ = apply

    def table(self, in_order: Sequence[str] | None = None,
              out_order: Sequence[str] | None = None) -> np.ndarray:
        """int64 [*in sizes, len(outs)]: the image of every input, enumerated."""
        in_order = list(in_order or self.in_dims)
        out_order = list(out_order or self.out_dims)
        grids = np.meshgrid(*[np.arange(self.in_size(d)) for d in in_order], indexing="ij")
        values = self.apply(dict(zip(in_order, grids)))
        shape = tuple(self.in_size(d) for d in in_order)
        return np.stack([np.broadcast_to(values[o], shape) for o in out_order], axis=-1)

    def emit(self, builder, inputs: Mapping, outs: Iterable[str] | None = None,
             assume_in_range: bool = False) -> dict:
        """Index IR for the outputs from the input Values (see fragments/layout_emit.py)."""
        from .layout_emit import emit_layout
        return emit_layout(self, builder, inputs, outs, assume_in_range)

    # -- GF(2) matrix view -------------------------------------------------------------

    def _columns(self) -> list[int]:
        """One flat output value per flat input bit (the matrix's columns)."""
        shifts, total = [], 0
        for _, bits in self._outs:
            shifts.append(total)
            total += bits
        return [sum(v << s for v, s in zip(row, shifts))
                for name, _ in self._ins for row in self._bases[name]]

    @staticmethod
    def _from_columns(ins, outs, columns: Sequence[int]) -> "LinearLayout":
        """ins, outs: ((name, bits), ...); inverse of `_columns`."""
        columns = list(columns)
        bases = {}
        for name, bits in ins:
            rows = []
            for _ in range(bits):
                flat, row = columns.pop(0), []
                for _, out_bits in outs:
                    row.append(flat & ((1 << out_bits) - 1))
                    flat >>= out_bits
                rows.append(tuple(row))
            bases[name] = rows
        return LinearLayout(bases, [(name, 1 << bits) for name, bits in outs])

    def _split(self, flat, dims) -> dict:
        out = {}
        for name, bits in dims:
            out[name] = flat & ((1 << bits) - 1)
            flat = flat >> bits
        return out

    # -- algebra -----------------------------------------------------------------------

    def compose(self, outer: "LinearLayout") -> "LinearLayout":
        """outer ∘ self: self's outputs feed outer's inputs of the same names (each at
        most that input's size; outer inputs self does not produce are 0)."""
        for name, bits in self._outs:
            if name not in outer.in_dims:
                raise ValueError(f"compose: output '{name}' is not an input of the outer "
                                 f"layout (inputs: {outer.in_dims})")
            if bits > outer.in_bits(name):
                raise ValueError(f"compose: output '{name}' of size {1 << bits} does not "
                                 f"fit the outer input of size {outer.in_size(name)}")
        bases = {name: [outer.apply(dict(zip(self.out_dims, row))) for row in rows]
                 for name, rows in self._bases.items()}
        return LinearLayout({n: [tuple(v[o] for o in outer.out_dims) for v in vs]
                             for n, vs in bases.items()},
                            [(name, 1 << bits) for name, bits in outer._outs])

    def __mul__(self, outer: "LinearLayout") -> "LinearLayout":
        """Product: dims in one layout only sit side by side; a dim in both has this
        layout's bits low and outer's high (inputs and outputs alike, like Triton's
        `*`): identity(lane,16,row) * identity(lane,4,col) splits lane in two."""
        ins = dict(self._ins)
        for name, bits in outer._ins:
            ins[name] = ins.get(name, 0) + bits
        outs = dict(self._outs)
        for name, bits in outer._outs:
            outs[name] = outs.get(name, 0) + bits
        out_names = list(outs)
        shift = {name: (dict(self._outs).get(name, 0)) for name in out_names}
        bases: dict[str, list[tuple[int, ...]]] = {name: [] for name in ins}
        for name, rows in self._bases.items():
            for row in rows:
                values = dict(zip(self.out_dims, row))
                bases[name].append(tuple(values.get(o, 0) for o in out_names))
        for name, rows in outer._bases.items():
            for row in rows:
                values = dict(zip(outer.out_dims, row))
                bases[name].append(tuple(values.get(o, 0) << shift[o] for o in out_names))
        return LinearLayout(bases, [(name, 1 << bits) for name, bits in outs.items()])

    def sublayout(self, ins: Iterable[str], outs: Iterable[str]) -> "LinearLayout":
        """Only the input dims `ins` (the others fixed at 0) and the outputs `outs`."""
        ins, outs = list(ins), list(outs)
        for name in ins:
            self.in_bits(name)
        index = [self.out_dims.index(name) for name in outs]
        return LinearLayout({name: [tuple(row[i] for i in index) for row in self._bases[name]]
                             for name in ins},
                            [(name, self.out_size(name)) for name in outs])

    def rename(self, ins: Mapping[str, str] | None = None,
               outs: Mapping[str, str] | None = None) -> "LinearLayout":
        ins, outs = ins or {}, outs or {}
        return LinearLayout({ins.get(n, n): rows for n, rows in self._bases.items()},
                            [(outs.get(n, n), 1 << b) for n, b in self._outs])

    def transpose_ins(self, order: Sequence[str]) -> "LinearLayout":
        if sorted(order) != sorted(self.in_dims):
            raise ValueError(f"transpose_ins: {list(order)} is not an order of {self.in_dims}")
        return LinearLayout({name: self._bases[name] for name in order}, self._outs_sizes())

    def transpose_outs(self, order: Sequence[str]) -> "LinearLayout":
        if sorted(order) != sorted(self.out_dims):
            raise ValueError(f"transpose_outs: {list(order)} is not an order of "
                             f"{self.out_dims}")
        return self.sublayout(self.in_dims, order)

    def reshape_ins(self, dims) -> "LinearLayout":
        """Re-split the flat input bits (first dim lowest) into `dims`."""
        new = _dims(dims)
        if sum(b for _, b in new) != self.total_in_bits:
            raise ValueError(f"reshape_ins: {dict(dims)} has not the {1 << self.total_in_bits}"
                             f" inputs of {self.in_shape}")
        return LinearLayout._from_columns(new, self._outs, self._columns())

    def reshape_outs(self, dims) -> "LinearLayout":
        """Re-split the flat output bits (first dim lowest) into `dims`."""
        new = _dims(dims)
        if sum(b for _, b in new) != self.total_out_bits:
            raise ValueError(f"reshape_outs: {dict(dims)} has not the "
                             f"{1 << self.total_out_bits} outputs of {self.out_shape}")
        return LinearLayout._from_columns(self._ins, new, self._columns())

    def _outs_sizes(self):
        return [(name, 1 << bits) for name, bits in self._outs]

    # -- comparison and printing -------------------------------------------------------

    def _key(self):
        return (frozenset((n, b, tuple(frozenset((o, v) for o, v in zip(self.out_dims, row)
                                                  if v) for row in self._bases[n]))
                          for n, b in self._ins),
                frozenset(self._outs))

    def __eq__(self, other) -> bool:
        return isinstance(other, LinearLayout) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        lines = []
        for name, bits in self._ins:
            cells = []
            for row in self._bases[name]:
                parts = [f"{o}={v}" for o, v in zip(self.out_dims, row) if v]
                cells.append("(" + ", ".join(parts or ["0"]) + ")")
            lines.append(f"  {name}[{1 << bits}]: " + (" ".join(cells) or "-"))
        outs = ", ".join(f"{name}[{1 << bits}]" for name, bits in self._outs)
        return "LinearLayout(\n" + "\n".join(lines) + f"\n  -> {outs})"
