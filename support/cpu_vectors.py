"""The SIMD register file of a CPU target, as IREE's llvm-cpu backend sees it.

IREE 3.13 caps every vector tile so that the tiles of all of an op's operands
fit in the target's SIMD register space at once (KernelDispatch.cpp,
`getRegisterSpaceBitsIfKnown` / `limitVectorTileSizes`: x86 with +avx512f 32
x 512 bits, with +avx or +avx2 16 x 256, other x86 16 x 128; AArch64 32 x 128).
For a `linalg.batch_mmt4d` that cap can split the inner (M0, N0) tile, and its
mmt4d ukernel is then called on part of a tile with the whole tile's strides:
wrong sums, silently (seen on x86-64-v3: 8x16x2 i16 tiles split into 4x16).
So the mmt4d form of lower-mmac-tiles sizes its tiles to fit the register
space of the CPU it is compiled for (`passes/mmac_tiles_mmt4d.py`), and the
driver names that CPU's register file from the features IREE resolves for
`--target-cpu` (`driver/cpu_target.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

VectorISA = Literal["sse", "avx", "avx512", "neon"]


@dataclass(frozen=True)
class RegisterFile:
    """`count` SIMD registers of `bits` bits each."""

    bits: int
    count: int

    @property
    def space_bytes(self) -> int:
        return self.bits * self.count // 8

    @property
    def i32_lanes(self) -> int:
        return self.bits // 32


# One row per register file IREE distinguishes. "sse" (the x86-64 baseline) is
# the safe choice on every x86-64 CPU: a tile that fits 16 x 128 bits fits all.
REGISTER_FILES: dict[str, RegisterFile] = {
    "sse": RegisterFile(128, 16),
    "avx": RegisterFile(256, 16),
    "avx512": RegisterFile(512, 32),
    "neon": RegisterFile(128, 32),
}


def vector_isa_of(triple: str, features: set[str]) -> VectorISA | None:
    """The register file IREE assumes for a target (LLVM triple, +features), or None
    where IREE assumes none (then it does not cap vector tiles)."""
    if triple.startswith(("x86_64", "i686", "i386")):
        if "+avx512f" in features:
            return "avx512"
        return "avx" if {"+avx", "+avx2"} & features else "sse"
    if triple.startswith(("aarch64", "arm64")):
        return "neon"
    return None
