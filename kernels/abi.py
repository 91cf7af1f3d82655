"""How a host calls a compiled lane kernel: one declaration per kernel.

A `KernelABI` is data: the kernel's bindings in parameter order (the inputs a
host passes, then the buffers the kernel writes), its index push constants,
its grid and workgroup size, and the shapes of the buffers a host allocates
for it. Every caller reads it: the IREE host function's `flow.dispatch`
operands follow `inputs` and `constants`, and a launcher that calls the
kernel directly on a stream (serving/executors.py, the torch path) builds its
parameter list, grid and scratch buffers from it alone.

A kernel whose workgroups meet through global memory (the decode partition that
merges its sequence's partials in the last workgroup to finish) declares its
`counters`: inputs the caller passes zero-filled, which the kernel updates with
atomics and leaves zero again when it ends, so a launcher may keep one zeroed
buffer per stream instead of clearing it per call.

Sizes are named: a grid entry or a buffer dimension is an int or the name of
a run-time size (`B`, `NB`, `MB`, `P`, `T`, ...) that the caller evaluates
with `KernelABI.evaluate`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fragments import NUMPY_OPS, ceil_div

Size = int | str


@dataclass(frozen=True)
class Buffer:
    """A binding by name, shape (ints and size names) and element type."""

    name: str
    shape: tuple[Size, ...]
    element: str               # MLIR element type: f32, i8, i32

    def dims(self, sizes: dict[str, int]) -> tuple[int, ...]:
        return tuple(evaluate(d, sizes) for d in self.shape)


@dataclass(frozen=True)
class KernelABI:
    """One kernel's calling convention (module docstring)."""

    kernel: str                          # the export / entry point name
    inputs: tuple[str, ...]              # bindings the host passes, in order
    outputs: tuple[Buffer, ...]          # bindings the kernel writes, after the inputs
    constants: tuple[str, ...]           # index push constants, in order
    grid: tuple[Size, Size, Size]        # workgroup counts (x, y, z)
    threads: int                         # workgroup size (x)
    writes_inputs: tuple[str, ...] = ()  # inputs the kernel updates in place
    leading: int = 0                     # grid counts the export fixes itself (no workload),
    trailing: int = 0                    # before and after the workload's
    counters: tuple[Buffer, ...] = ()    # the last inputs: passed zeroed, left zero

    @property
    def workload(self) -> tuple[Size, ...]:
        """The grid counts a dispatch passes (the export returns the rest itself)."""
        return self.grid[self.leading:len(self.grid) - self.trailing]

    def grid_of(self, sizes: dict[str, int]) -> tuple[int, int, int]:
        x, y, z = (evaluate(g, sizes) for g in self.grid)
        return x, y, z

    def __post_init__(self):
        names = tuple(b.name for b in self.counters)
        if names and (self.inputs[-len(names):] != names
                      or not set(names) <= set(self.writes_inputs)):
            raise ValueError(f"kernel {self.kernel}: counters {names} must be its last inputs "
                             f"and among those it writes")

    def argument_types(self) -> list[str]:
        """The kernel function's parameters: a binding per input, an index per push
        constant, a binding per output (MLIR type names)."""
        return (["!stream.binding"] * len(self.inputs) + ["index"] * len(self.constants)
                + ["!stream.binding"] * len(self.outputs))

    def constant_values(self, sizes: dict[str, int]) -> list[int]:
        return [evaluate(c, sizes) for c in self.constants]

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "inputs": list(self.inputs),
                "outputs": [{"name": b.name, "shape": list(b.shape), "element": b.element}
                            for b in self.outputs],
                "constants": list(self.constants), "grid": list(self.grid),
                "threads": self.threads, "writes_inputs": list(self.writes_inputs),
                "leading": self.leading, "trailing": self.trailing,
                "counters": [{"name": b.name, "shape": list(b.shape), "element": b.element}
                             for b in self.counters]}

    @classmethod
    def from_json(cls, data: dict) -> "KernelABI":
        buffers = lambda key: tuple(Buffer(b["name"], tuple(b["shape"]), b["element"])
                                    for b in data.get(key, ()))
        return cls(data["kernel"], tuple(data["inputs"]), buffers("outputs"),
                   tuple(data["constants"]), tuple(data["grid"]), int(data["threads"]),
                   tuple(data.get("writes_inputs", ())), int(data.get("leading", 0)),
                   int(data.get("trailing", 0)), buffers("counters"))


def evaluate(size: Size, sizes: dict[str, int]) -> int:
    if isinstance(size, int):
        return size
    if size not in sizes:
        raise KeyError(f"run-time size {size!r} is not known to the caller "
                       f"(known: {', '.join(sorted(sizes))})")
    return int(sizes[size])


# A dense graph's arguments as its kernels take them (K, V and the scales padded
# to whole partitions or tiles, V token-innermost), in order.
DENSE_INPUTS = ("q", "k", "k_scale", "v", "v_scale")
# The paged caches' argument names, in the order every paged kernel binds them.
PAGED_INPUTS = ("q", "k_cache", "k_scale", "v_cache", "v_scale", "block_tables",
                "context_lens")


def paged_sizes(batch: int, blocks: int, width: int, block_size: int,
                partition_tokens: int) -> dict[str, int]:
    """B, NB, MB and the partition count P = ceil(MB * BS / partition tokens), as the
    paged host function computes them."""
    return {"B": batch, "NB": blocks, "MB": width,
            "P": ceil_div(NUMPY_OPS, width * block_size, partition_tokens)}
