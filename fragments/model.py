"""Fragment models: an instruction plus the V load scheme; the MMAC token sets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args
from functools import cached_property

import numpy as np

from .instructions import (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16,
                           SM80_MMA_BF16, SM80_MMA_S8, MatrixInstruction)
from .token_axes import TokenAxes, token_axes

# The names of the fragment models (the matrix instruction plus load scheme a
# W scale group follows) and the two ways of choosing W scale groups.
FragmentModelName = Literal["gfx936", "gfx942", "cuda"]
# How the W scales are chosen: over the accumulator's tokens ("fragment", the only right
# one), or, to reproduce two mistakes the verifier refuses, over logical token runs
# ("contiguous") or over the first MMAC step of each chain only ("step").
ScaleGroupKind = Literal["fragment", "contiguous", "step"]
SCALE_GROUP_KINDS = get_args(ScaleGroupKind)
# MMAC K-steps chained into one int32 accumulator: the W group is the chain's tokens.
WChain = Literal[1, 2, 4]
W_CHAINS = get_args(WChain)
# The most tokens one decode partition or prefill KV tile may hold: the bound of the
# partition-tokens / tile-tokens options (passes/decode_split_kv.py), checked here too so
# that no caller builds a group table of an unbounded block.
MAX_BLOCK_TOKENS = 65536


@dataclass(frozen=True)
class VLoadScheme:
    """How a wave loads V from the token-innermost cache ([..., D, S]).

    Lanes that hold the same K rows of the B operand form a lane group; one
    load gives each lane `bytes_per_lane` consecutive tokens of one head-dim
    column. Successive loads of a lane continue after all lane groups' bytes.
    A lane's loaded bytes, in load order, feed its B registers: MMAC t takes
    bytes `slots*t .. slots*t + slots - 1`.
    """

    bytes_per_lane: int

    def token_of_byte(self, lane_group: int, lane_groups: int, byte: int) -> int:
        load, offset = divmod(byte, self.bytes_per_lane)
        return (load * lane_groups + lane_group) * self.bytes_per_lane + offset


@dataclass(frozen=True, eq=False)
class FragmentModel:
    """A target's matrix instruction plus the decode kernel's load scheme.

    `wave_tokens` tokens are processed by one wave; a decode partition is
    `waves_per_partition` waves. Token sets are published per wave
    (`wave_token_groups`, one row per MMAC) and per block of whole waves
    (`token_groups`, one row per accumulator).

    `chain` MMACs, consecutive in the order the kernel issues them (a wave's, then
    the next wave's), add into one int32 accumulator, converted to f32 once: a W group
    is that accumulator's tokens, the union of the chain's MMAC token sets, in K-slot
    order step after step (docs/design.md §4). `chained(c)` gives the model of chain c.
    """

    name: str
    instruction: MatrixInstruction
    v_load: VLoadScheme
    wave_tokens: int = 64
    waves_per_partition: int = 4
    chain: int = 1

    @property
    def group_size(self) -> int:
        """Tokens per W scale group: what one accumulator sums, `chain` x K."""
        return self.instruction.k * self.chain

    @property
    def partition_tokens(self) -> int:
        return self.wave_tokens * self.waves_per_partition

    @property
    def mmacs_per_wave(self) -> int:
        return self.wave_tokens // self.instruction.k

    @cached_property
    def wave_token_groups(self) -> np.ndarray:
        """int64 [mmacs_per_wave, K]: token (within the wave) of each K slot."""
        b = self.instruction.b
        lane_group = b.lane_groups(axis=0)
        lane_groups = int(lane_group.max()) + 1
        groups = np.full((self.mmacs_per_wave, self.instruction.k), -1, dtype=np.int64)
        for mmac in range(self.mmacs_per_wave):
            for lane in range(b.lanes):
                for slot in range(b.slots):
                    k_row, _ = b.element(lane, slot)
                    token = self.v_load.token_of_byte(
                        int(lane_group[lane]), lane_groups, mmac * b.slots + slot)
                    if groups[mmac, k_row] not in (-1, token):
                        raise ValueError(
                            f"{self.name}: lanes disagree on the token of K slot "
                            f"{k_row} of MMAC {mmac}")
                    groups[mmac, k_row] = token
        covered = np.sort(groups.ravel())
        if not np.array_equal(covered, np.arange(self.wave_tokens)):
            raise ValueError(f"{self.name}: the V load scheme with "
                             f"{self.v_load.bytes_per_lane}-byte loads does not cover "
                             f"the wave's {self.wave_tokens} tokens exactly once")
        return groups

    def mmac_token_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / K, K]: each MMAC's token set, in issue order."""
        if not 0 < block_tokens <= MAX_BLOCK_TOKENS:
            raise ValueError(f"a block of {block_tokens} tokens is outside 1..{MAX_BLOCK_TOKENS} "
                             f"(the most a decode partition or KV tile may hold)")
        if block_tokens % self.wave_tokens:
            raise ValueError(f"a block of {block_tokens} tokens is not a whole number "
                             f"of {self.wave_tokens}-token waves")
        waves = block_tokens // self.wave_tokens
        wave_offsets = np.arange(waves, dtype=np.int64)[:, None, None] * self.wave_tokens
        return (wave_offsets + self.wave_token_groups[None]).reshape(-1, self.instruction.k)

    def token_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / (chain K), chain K]: the accumulators' token sets of a
        block of whole waves (chain 1: the MMACs')."""
        mmacs = self.mmac_token_groups(block_tokens)
        if len(mmacs) % self.chain:
            raise ValueError(f"a block of {block_tokens} tokens holds {len(mmacs)} MMACs of "
                             f"K={self.instruction.k}, not a whole number of {self.chain}-MMAC "
                             f"chains (give it a multiple of {self.chain * self.instruction.k} "
                             f"tokens, or a shorter chain)")
        return mmacs.reshape(-1, self.group_size)

    def step_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / (chain K), K]: the first MMAC step's tokens of each
        chain. Scales over these are a chain's (wrong) W groups: one step's tokens where
        the accumulator sums the whole chain's; kept so that its damage can be reproduced
        and the verifier shown to reject it (chain 1: the fragment groups)."""
        self.token_groups(block_tokens)  # same validity rules
        return self.mmac_token_groups(block_tokens)[::self.chain]

    def contiguous_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / K, K]: logical token order cut into K-token runs.

        Not what any MMAC of this model consumes with its V-load scheme: these are
        contiguous (wrong) W groups (scales over tokens 0-31 / 32-63 of a wave), kept so that
        its damage can be reproduced and the verifier shown to reject it.
        """
        self.token_groups(block_tokens)  # same validity rules
        return np.arange(block_tokens, dtype=np.int64).reshape(-1, self.group_size)

    def scale_groups(self, block_tokens: int, kind: str) -> np.ndarray:
        """The groups W scales are computed over: "fragment" (correct), "contiguous" or
        "step" (the two wrong kinds)."""
        if kind == "fragment":
            return self.token_groups(block_tokens)
        if kind == "contiguous":
            return self.contiguous_groups(block_tokens)
        if kind == "step":
            return self.step_groups(block_tokens)
        raise ValueError(f"scale groups must be one of {', '.join(SCALE_GROUP_KINDS)}, "
                         f"got '{kind}'")

    def group_of_token(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens]: the group index consuming each token of a block."""
        groups = self.token_groups(block_tokens)
        owner = np.empty(block_tokens, dtype=np.int64)
        owner[groups.ravel()] = np.repeat(np.arange(groups.shape[0]), groups.shape[1])
        return owner

    def token_axes(self, block_tokens: int) -> TokenAxes:
        """`token_groups(block_tokens)` as digits of the token index (the
        copy-free view of V); raises `NotADigitPermutation` if it has none."""
        return token_axes(self.token_groups(block_tokens))

    def with_v_load(self, bytes_per_lane: int) -> "FragmentModel":
        return FragmentModel(self.name.split(CHAIN_SEPARATOR)[0], self.instruction,
                             VLoadScheme(bytes_per_lane), self.wave_tokens,
                             self.waves_per_partition).chained(self.chain)

    def chained(self, chain: int) -> "FragmentModel":
        """This model with `chain` MMACs per accumulator, named "<name> chain <c>"
        (`pv_model_named` reads it); one object per (chain-1 model, chain)."""
        if chain not in W_CHAINS:
            raise ValueError(f"a chain of {chain} MMACs per accumulator; the chains are "
                             f"{', '.join(map(str, W_CHAINS))}")
        root = self.__dict__.get("_root", self)
        if chain == 1:
            return root
        if chain not in root._chains:
            model = FragmentModel(f"{root.name}{CHAIN_SEPARATOR}{chain}", root.instruction,
                                  root.v_load, root.wave_tokens, root.waves_per_partition,
                                  chain)
            model.__dict__["_root"] = root
            root._chains[chain] = model
        return root._chains[chain]

    @cached_property
    def _chains(self) -> dict[int, "FragmentModel"]:
        return {}


# A chained model's name: the model's, this, the chain length ("gfx936 chain 2").
CHAIN_SEPARATOR = " chain "


FRAGMENT_MODELS: dict[str, FragmentModel] = {
    # The write-up's decode kernel: 16-byte V loads from the token-innermost cache.
    "gfx936": FragmentModel("gfx936", GFX936_MMAC, VLoadScheme(16)),
    "gfx942": FragmentModel("gfx942", GFX942_MFMA, VLoadScheme(16)),
    # NVIDIA: 4 warps of 32 lanes per 256-token partition, 64 tokens per warp.
    "cuda": FragmentModel("cuda", SM80_MMA_S8, VLoadScheme(16)),
}
assert tuple(FRAGMENT_MODELS) == get_args(FragmentModelName)


# Targets whose kernels can also run PV in bf16 (the write-up's BF16-PV baseline).
BF16_PV_INSTRUCTIONS = {"cuda": SM80_MMA_BF16}


def bf16_pv_model(name: str) -> FragmentModel:
    """The model with its bf16 PV instruction: the tokens each bf16 MMA
    consumes follow from the same V load scheme."""
    model = fragment_model(name)
    if name not in BF16_PV_INSTRUCTIONS:
        raise KeyError(f"{name} has no bf16 PV kernel (models with one: "
                       f"{', '.join(BF16_PV_INSTRUCTIONS)})")
    return FragmentModel(name, BF16_PV_INSTRUCTIONS[name], model.v_load,
                         model.wave_tokens, model.waves_per_partition)


# The matrix instructions each target's kernels may run PV on (its "PV atoms"),
# the target's own model's instruction first. An atom other than the first gives a
# PV-only model (`pv_model`): the same V load scheme and wave, another instruction,
# so another K and other W scale groups (docs/design.md §4).
# The INT8 PV instructions a kernel target offers (the first: its own, QK's too).
PVAtomName = Literal["v_mmac_i32_16x16x32_i8", "v_mfma_i32_16x16x32_i8",
                     "v_mfma_i32_32x32x16_i8", "mma.sync.m16n8k32.s8"]
PV_ATOMS: dict[str, tuple[str, ...]] = {
    "gfx936": (GFX936_MMAC.name,),
    "gfx942": (GFX942_MFMA.name, GFX942_MFMA_32X32X16.name),
    "cuda": (SM80_MMA_S8.name,),
}
assert all(atoms[0] == FRAGMENT_MODELS[t].instruction.name for t, atoms in PV_ATOMS.items())
assert {a for atoms in PV_ATOMS.values() for a in atoms} == set(get_args(PVAtomName))
_PV_INSTRUCTIONS = {inst.name: inst for inst in
                    (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16, SM80_MMA_S8)}
_PV_MODELS: dict[tuple[str, str], FragmentModel] = {}


def pv_model(target: str, atom: str | None = None, chain: int = 1) -> FragmentModel:
    """The fragment model of `target`'s PV on matrix instruction `atom` (a name in
    PV_ATOMS[target]) with `chain` MMACs per accumulator; None or the target's own
    instruction gives `fragment_model(target)` (chained). Another atom's model is named
    "target:atom", a chained one "<that> chain <c>" (`pv_model_named` reads both back);
    it is one object per (target, atom, chain)."""
    return _pv_atom_model(target, atom).chained(chain)


def _pv_atom_model(target: str, atom: str | None) -> FragmentModel:
    model = fragment_model(target)
    if atom is None or atom == model.instruction.name:
        return model
    if atom not in PV_ATOMS[target]:
        raise KeyError(f"{target} has no PV atom '{atom}' (its atoms: "
                       f"{', '.join(PV_ATOMS[target])})")
    key = (target, atom)
    if key not in _PV_MODELS:
        _PV_MODELS[key] = FragmentModel(f"{target}:{atom}", _PV_INSTRUCTIONS[atom], model.v_load,
                                        model.wave_tokens, model.waves_per_partition)
    return _PV_MODELS[key]


def pv_model_names() -> tuple[str, ...]:
    """Every PV model's name: the targets, and "target:atom" for their other atoms."""
    return tuple(FRAGMENT_MODELS) + tuple(f"{t}:{a}" for t, atoms in PV_ATOMS.items()
                                          for a in atoms[1:])


def pv_model_named(name: str) -> FragmentModel:
    """The model `pv_model` names `name`: a target ("gfx942") or "target:atom", either
    followed by " chain <c>" for c MMACs per accumulator ("gfx936 chain 2")."""
    unchained, separator, chain = name.partition(CHAIN_SEPARATOR)
    target, _, atom = unchained.partition(":")
    if unchained not in pv_model_names() or (
            separator and chain not in [str(c) for c in W_CHAINS[1:]]):
        raise KeyError(f"unknown PV fragment model '{name}'; known: "
                       f"{', '.join(pv_model_names())} (each may be followed by "
                       f"'{CHAIN_SEPARATOR.strip()} <c>', c in "
                       f"{', '.join(map(str, W_CHAINS[1:]))})")
    return pv_model(target, atom or None, int(chain) if separator else 1)


def fragment_model(name: str) -> FragmentModel:
    try:
        return FRAGMENT_MODELS[name]
    except KeyError:
        raise KeyError(f"unknown fragment model '{name}'; known models: "
                       f"{', '.join(sorted(FRAGMENT_MODELS))}") from None


def format_token_set(tokens) -> str:
    """Compact set notation: [0..7, 16..23] -> '{0-7,16-23}'."""
    values = sorted(int(t) for t in tokens)
    runs: list[str] = []
    start = prev = None
    for value in values + [None]:
        if start is not None and value is not None and value == prev + 1:
            prev = value
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = value
    return "{" + ",".join(runs) + "}"
