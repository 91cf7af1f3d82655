"""The CPU that `--target cpu` compiles for (`--target-cpu`), as IREE resolves it.

IREE's llvm-cpu backend takes an LLVM CPU name (`host`, `x86-64-v3`,
`znver4`, ...) and resolves it to a triple and a feature list. What the
project derives from that CPU — the register file the mmt4d tiles must fit
(`support.cpu_vectors`), whether this machine can run the code — is read
from IREE's own resolution, so it cannot disagree with what IREE compiles.
An unknown name, which IREE only warns about (and compiles for a generic
CPU), is refused.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from iree.compiler.tools.binaries import find_tool

from ..support.cpu_vectors import VectorISA, vector_isa_of

HOST = "host"
# IREE's data tiling packs the operands of every contraction it recognises into
# the CPU's mmt4d tiles: QK's i8 x i8 -> i32 dots then run on the integer
# dot-product instructions the CPU has (VNNI `vpdpwssd`, AVX2 `vpmaddwd`) where
# the plain generic multiplies in i32 (`vpmulld`). Opt-in only (the Python API's
# `iree_flags=DATA_TILING`): with it IREE 3.13 computes the paged decode and some
# dense prefills wrong (errors of ~5e-3 against the fragment-level reference in
# tests/test_paged_edge_cases.py and tests/test_w_chain.py), cause not yet found.
DATA_TILING = ("--iree-opt-data-tiling",)
# A module with one dispatch: enough for IREE to build the executable target.
_PROBE = """func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> {
  %r = arith.addf %a, %a : tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


class UnknownTargetCPU(ValueError):
    """A `--target-cpu` name LLVM does not know for this architecture."""


@dataclass(frozen=True)
class CPUTarget:
    name: str                      # as given (`host`, an LLVM CPU name)
    cpu: str                       # as IREE resolved it (`host` -> e.g. `rocketlake`)
    triple: str
    features: tuple[str, ...]      # enabled features, `+avx2` ..., sorted (a stable repr:
                                   # the module cache keys by it)

    @property
    def vector_isa(self) -> VectorISA:
        """The register file IREE caps vector tiles by (`sse` where it assumes none:
        the smallest, so a tile that fits it fits everywhere)."""
        return vector_isa_of(self.triple, set(self.features)) or "sse"

    def missing_on(self, other: "CPUTarget") -> list[str]:
        """Features this target's code may use that `other` lacks."""
        return sorted(f for f in self.features if f not in other.features)

    def iree_flags(self) -> tuple[str, ...]:
        return (f"--iree-llvmcpu-target-cpu={self.name}",)


# What `host` stands for when set: an LLVM CPU name. Runs everything that
# compiles for this machine (the test suite, `int8attn run`) as on that CPU,
# e.g. INT8ATTN_HOST_CPU=x86-64-v3 on an AVX-512 machine computes what an
# AVX2-only one would. `int8attn run` still refuses a CPU this machine cannot
# execute.
HOST_CPU_VARIABLE = "INT8ATTN_HOST_CPU"


def resolve(name: str = HOST) -> CPUTarget:
    """Ask IREE what `--iree-llvmcpu-target-cpu=name` compiles for (`host`: this
    machine's CPU, or $INT8ATTN_HOST_CPU where set)."""
    if name == HOST and os.environ.get(HOST_CPU_VARIABLE):
        chosen = os.environ[HOST_CPU_VARIABLE]
        try:
            return _resolve(chosen)
        except UnknownTargetCPU as error:   # the user gave no --target-cpu: say where it came from
            raise UnknownTargetCPU(f"${HOST_CPU_VARIABLE}={chosen} (what 'host' stands for "
                                   f"while it is set): {error}; unset it, or set it to an "
                                   f"LLVM CPU name") from None
    return _resolve(name)


@lru_cache(maxsize=None)
def _resolve(name: str) -> CPUTarget:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", name):
        raise UnknownTargetCPU(f"--target-cpu '{name}' is not a CPU name; give 'host' or an "
                               f"LLVM CPU name such as x86-64-v3 or znver4")
    result = subprocess.run(
        [find_tool("iree-compile"), "-", "--iree-hal-target-device=local",
         "--iree-hal-local-target-device-backends=llvm-cpu",
         f"--iree-llvmcpu-target-cpu={name}", "--compile-to=executable-sources"],
        input=_PROBE, capture_output=True, text=True)
    if "not a recognized processor" in result.stderr or result.returncode:
        accepted = re.search(r"List of accepted CPUs: (.*)", result.stderr)
        hint = f" LLVM accepts: {accepted.group(1)}" if accepted else ""
        raise UnknownTargetCPU(f"--target-cpu '{name}' is not a CPU that IREE's LLVM knows "
                               f"for this architecture; give 'host' or an LLVM CPU name.{hint}")
    cpu = re.search(r'cpu = "([^"]*)"', result.stdout)
    features = re.search(r'cpu_features = "([^"]*)"', result.stdout)
    triple = re.search(r'target_triple = "([^"]*)"', result.stdout)
    if not (cpu and features and triple):
        raise RuntimeError("IREE's executable target for the CPU probe has no cpu, "
                           "cpu_features or target_triple: the IREE version is not the "
                           "one this project was checked with (3.13)")
    enabled = tuple(sorted({f for f in features.group(1).split(",") if f.startswith("+")}))
    return CPUTarget(name, cpu.group(1), triple.group(1), enabled)


def check_runnable_here(target: CPUTarget) -> None:
    """Refuse to run code for a CPU whose features this machine lacks (it would
    die of an illegal instruction, not fail with a message)."""
    if target.name == HOST:
        return
    here = _resolve(HOST)
    missing = target.missing_on(here)
    if missing:
        raise UnknownTargetCPU(
            f"--target-cpu {target.name} code may use {', '.join(missing[:6])}"
            f"{' ...' if len(missing) > 6 else ''}, which this machine's CPU "
            f"({here.cpu}) lacks: it cannot run here. Compile it "
            f"(int8attn compile) and run it on such a CPU, or give a --target-cpu this "
            f"machine has (host)")


_MMT4D = re.compile(r"linalg\.(?:batch_)?mmt4d \{lowering_config = #iree_cpu\.lowering_config<"
                    r"([^>]*)>\}.*?outs\([^:]*: tensor<([0-9x]+)x[a-z]\w*>\)")
_LEVEL = re.compile(r"(vector_common_parallel|vector_reduction) = \[([0-9, ]*)\]")


def split_mmt4d_tiles(configured: str) -> list[str]:
    """The mmt4d ops of one configured executable (IREE's
    `--iree-hal-dump-executable-configurations-to` listing) whose inner tile
    IREE's vector tiling splits, described; empty if none.

    The mmt4d ukernel takes whole inner tiles: one whose (M0, N0, K0) tile is
    cut is called with the whole tile's strides and sums the wrong elements."""
    split = []
    for config, out_type in _MMT4D.findall(configured):
        *_, m0, n0 = (int(x) for x in out_type.split("x"))
        levels = {name: [int(x) for x in sizes.split(",")] for name, sizes in _LEVEL.findall(config)}
        parallel = levels.get("vector_common_parallel", [])
        inner = parallel[-3:-1] if len(parallel) >= 3 else []
        if any(size not in (0, whole) for size, whole in zip(inner, (m0, n0))):
            split.append(f"a {m0}x{n0} tile cut into {inner[0]}x{inner[1]}")
    return split
