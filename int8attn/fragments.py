"""The fragment model: matrix-instruction operand layouts and load schemes as data.

This is the single place where lane, register-slot and token indices are
related to each other. Everything that needs to know which tokens one matrix
instruction consumes -- the W scale groups, the token gathers of the
tensor-level lowering, the verifier and the numpy fragment-level reference --
reads it from a `FragmentModel` here.

Each operand layout is a table `coords[lane, slot] = (row, col)` written from
the ISA lane tables (DESIGN.md section 3). A `VLoadScheme` says which token
each byte of a lane's V registers holds. Composing the B layout with the load
scheme gives, for every MMAC of a wave, the token behind each of its K slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np

SCALE_GROUP_KINDS = ("fragment", "contiguous")

__all__ = [
    "SCALE_GROUP_KINDS",
    "OperandLayout",
    "MatrixInstruction",
    "VLoadScheme",
    "FragmentModel",
    "GFX936_MMAC",
    "GFX942_MFMA",
    "SM80_MMA_S8",
    "SM80_MMA_BF16",
    "bf16_pv_model",
    "TARGETS",
    "fragment_model",
    "format_token_set",
    "LaneMap",
    "DecodeKernelLayout",
    "xor_reduction_offsets",
    "element_classes",
    "thread_distribution",
]


@dataclass(frozen=True, eq=False)
class OperandLayout:
    """Which matrix element each (lane, register slot) of one operand holds."""

    name: str
    coords: np.ndarray  # int64 [lanes, slots, 2]: (row, col)

    @staticmethod
    def from_table(name: str, lanes: int, slots: int,
                   element: Callable[[int, int], tuple[int, int]]) -> "OperandLayout":
        table = np.array([[element(lane, slot) for slot in range(slots)]
                          for lane in range(lanes)], dtype=np.int64)
        return OperandLayout(name, table)

    @property
    def lanes(self) -> int:
        return self.coords.shape[0]

    @property
    def slots(self) -> int:
        return self.coords.shape[1]

    def element(self, lane: int, slot: int) -> tuple[int, int]:
        row, col = self.coords[lane, slot]
        return int(row), int(col)

    def runs(self, axis: int) -> list[tuple[int, int]]:
        """(first slot, length) of the slot runs that are consecutive along `axis`
        (the other coordinate fixed) on every lane: one vector load each."""
        coords = self.coords
        other = 1 - axis
        starts = [0]
        for slot in range(1, self.slots):
            step = coords[:, slot] - coords[:, slot - 1]
            if not ((step[:, axis] == 1) & (step[:, other] == 0)).all():
                starts.append(slot)
        bounds = starts + [self.slots]
        return [(a, b - a) for a, b in zip(bounds, bounds[1:])]

    def lane_groups(self, axis: int) -> np.ndarray:
        """int [lanes]: rank of each lane's set of `axis` coordinates (lanes that
        hold the same K rows of B form one group), ordered by the smallest."""
        keys = [tuple(sorted(set(self.coords[l, :, axis].tolist()))) for l in range(self.lanes)]
        order = {key: rank for rank, key in enumerate(sorted(set(keys)))}
        return np.array([order[key] for key in keys], dtype=np.int64)

    def owner(self) -> dict[tuple[int, int], tuple[int, int]]:
        """Inverse map: matrix element (row, col) -> (lane, slot)."""
        return {self.element(l, s): (l, s)
                for l in range(self.lanes) for s in range(self.slots)}


@dataclass(frozen=True, eq=False)
class MatrixInstruction:
    """An int8 x int8 -> int32 matrix instruction: C[MxN] += A[MxK] * B[KxN].

    `a_vector`, `b_vector`, `c_vector` are the operand register shapes the
    instruction's IR op takes (e.g. vector<8xi8>, or vector<4x4xi8> for PTX).
    """

    name: str
    intrinsic: str
    m: int
    n: int
    k: int
    wave_size: int
    a: OperandLayout
    b: OperandLayout
    c: OperandLayout
    a_vector: tuple[int, ...] = (8,)
    b_vector: tuple[int, ...] = (8,)
    c_vector: tuple[int, ...] = (4,)


def _wave64_16x16x32(name: str, intrinsic: str,
                     c_element: Callable[[int, int], tuple[int, int]]) -> MatrixInstruction:
    # A and B are shared by gfx936 MMAC and gfx942 MFMA 16x16x32 (DESIGN.md s3).
    return MatrixInstruction(
        name=name, intrinsic=intrinsic, m=16, n=16, k=32, wave_size=64,
        a=OperandLayout.from_table("A", 64, 8, lambda l, j: (l % 16, 8 * (l // 16) + j)),
        b=OperandLayout.from_table("B", 64, 8, lambda l, j: (8 * (l // 16) + j, l % 16)),
        c=OperandLayout.from_table("C", 64, 4, c_element),
    )


# gfx936 DCU: C uses the "jump" layout (Hygon CK: kCMLane=16, kCNLane=4).
GFX936_MMAC = _wave64_16x16x32(
    "v_mmac_i32_16x16x32_i8", "llvm.amdgcn.mmac.i32.16x16x32i8",
    lambda l, i: (l % 16, l // 16 + 4 * i))

# gfx942 CDNA3: same A/B, C rows in blocks of four.
GFX942_MFMA = _wave64_16x16x32(
    "v_mfma_i32_16x16x32_i8", "llvm.amdgcn.mfma.i32.16x16x32.i8",
    lambda l, i: (4 * (l // 16) + i, l % 16))


def _ptx_m16n8k32_a(l: int, s: int) -> tuple[int, int]:
    # registers a0..a3 of 4 bytes: rows {g, g+8, g, g+8}, k {4t.., 4t.., 16+4t.., 16+4t..}
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return g + 8 * (reg % 2), 16 * (reg // 2) + 4 * t + byte


def _ptx_m16n8k32_b(l: int, s: int) -> tuple[int, int]:
    # registers b0, b1 of 4 bytes: k {4t.., 16+4t..}, column g
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return 16 * reg + 4 * t + byte, g


def _ptx_m16n8_c(l: int, i: int) -> tuple[int, int]:
    # c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    g, t = l // 4, l % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def _ptx_m16n8k16_a(l: int, s: int) -> tuple[int, int]:
    # bf16 registers a0..a3 of 2 elements: rows {g, g+8, g, g+8}, k {2t.., 2t.., 2t+8.., 2t+8..}
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return g + 8 * (reg % 2), 8 * (reg // 2) + 2 * t + element


def _ptx_m16n8k16_b(l: int, s: int) -> tuple[int, int]:
    # bf16 registers b0, b1 of 2 elements: k {2t.., 2t+8..}, column g
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return 8 * reg + 2 * t + element, g


# NVIDIA sm_80+: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, 32-lane warps.
SM80_MMA_S8 = MatrixInstruction(
    name="mma.sync.m16n8k32.s8", intrinsic="nvgpu.mma.sync", m=16, n=8, k=32, wave_size=32,
    a=OperandLayout.from_table("A", 32, 16, _ptx_m16n8k32_a),
    b=OperandLayout.from_table("B", 32, 8, _ptx_m16n8k32_b),
    c=OperandLayout.from_table("C", 32, 4, _ptx_m16n8_c),
    a_vector=(4, 4), b_vector=(2, 4), c_vector=(2, 2))

# The BF16-PV baseline's instruction: mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32.
SM80_MMA_BF16 = MatrixInstruction(
    name="mma.sync.m16n8k16.bf16", intrinsic="nvgpu.mma.sync", m=16, n=8, k=16, wave_size=32,
    a=OperandLayout.from_table("A", 32, 8, _ptx_m16n8k16_a),
    b=OperandLayout.from_table("B", 32, 4, _ptx_m16n8k16_b),
    c=OperandLayout.from_table("C", 32, 4, _ptx_m16n8_c),
    a_vector=(4, 2), b_vector=(2, 2), c_vector=(2, 2))


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
    (`wave_token_groups`) and per block of whole waves (`token_groups`).
    """

    target: str
    instruction: MatrixInstruction
    v_load: VLoadScheme
    wave_tokens: int = 64
    waves_per_partition: int = 4

    @property
    def group_size(self) -> int:
        """Tokens per W scale group: the K extent of one instruction."""
        return self.instruction.k

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
                            f"{self.target}: lanes disagree on the token of K slot "
                            f"{k_row} of MMAC {mmac}")
                    groups[mmac, k_row] = token
        covered = np.sort(groups.ravel())
        if not np.array_equal(covered, np.arange(self.wave_tokens)):
            raise ValueError(f"{self.target}: the V load scheme with "
                             f"{self.v_load.bytes_per_lane}-byte loads does not cover "
                             f"the wave's {self.wave_tokens} tokens exactly once")
        return groups

    def token_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / K, K]: token sets of a block of whole waves."""
        if block_tokens % self.wave_tokens:
            raise ValueError(f"a block of {block_tokens} tokens is not a whole number "
                             f"of {self.wave_tokens}-token waves")
        waves = block_tokens // self.wave_tokens
        wave_offsets = np.arange(waves, dtype=np.int64)[:, None, None] * self.wave_tokens
        return (wave_offsets + self.wave_token_groups[None]).reshape(-1, self.instruction.k)

    def contiguous_groups(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens / K, K]: logical token order cut into K-token runs.

        Not what any MMAC of this model consumes with its V-load scheme: this is
        the seed's bug (scales over tokens 0-31 / 32-63 of a wave), kept so that
        its damage can be reproduced and the verifier shown to reject it.
        """
        self.token_groups(block_tokens)  # same validity rules
        return np.arange(block_tokens, dtype=np.int64).reshape(-1, self.instruction.k)

    def scale_groups(self, block_tokens: int, kind: str) -> np.ndarray:
        """The groups W scales are computed over: "fragment" (correct) or "contiguous"."""
        if kind == "fragment":
            return self.token_groups(block_tokens)
        if kind == "contiguous":
            return self.contiguous_groups(block_tokens)
        raise ValueError(f"scale groups must be 'fragment' or 'contiguous', got '{kind}'")

    def group_of_token(self, block_tokens: int) -> np.ndarray:
        """int64 [block_tokens]: the group index consuming each token of a block."""
        groups = self.token_groups(block_tokens)
        owner = np.empty(block_tokens, dtype=np.int64)
        owner[groups.ravel()] = np.repeat(np.arange(groups.shape[0]), groups.shape[1])
        return owner

    def with_v_load(self, bytes_per_lane: int) -> "FragmentModel":
        return FragmentModel(self.target, self.instruction, VLoadScheme(bytes_per_lane),
                             self.wave_tokens, self.waves_per_partition)


TARGETS: dict[str, FragmentModel] = {
    # The seed's decode kernel: 16-byte V loads from the token-innermost cache.
    "gfx936": FragmentModel("gfx936", GFX936_MMAC, VLoadScheme(16)),
    "gfx942": FragmentModel("gfx942", GFX942_MFMA, VLoadScheme(16)),
    # NVIDIA: 4 warps of 32 lanes per 256-token partition, 64 tokens per warp.
    "cuda": FragmentModel("cuda", SM80_MMA_S8, VLoadScheme(16)),
}


# Targets whose kernels can also run PV in bf16 (the seed's BF16-PV baseline).
BF16_PV_INSTRUCTIONS = {"cuda": SM80_MMA_BF16}


def bf16_pv_model(target: str) -> FragmentModel:
    """The target's model with its bf16 PV instruction: the tokens each bf16 MMA
    consumes follow from the same V load scheme."""
    model = fragment_model(target)
    if target not in BF16_PV_INSTRUCTIONS:
        raise KeyError(f"{target} has no bf16 PV kernel (targets with one: "
                       f"{', '.join(BF16_PV_INSTRUCTIONS)})")
    return FragmentModel(target, BF16_PV_INSTRUCTIONS[target], model.v_load,
                         model.wave_tokens, model.waves_per_partition)


def fragment_model(target: str) -> FragmentModel:
    try:
        return TARGETS[target]
    except KeyError:
        raise KeyError(f"unknown target '{target}'; known targets: "
                       f"{', '.join(sorted(TARGETS))}") from None


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


# ----------------------------------------------------------------------------
# Lane maps: per-lane quantities of the lane-level kernels, as data
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class LaneMap:
    """value(lane) = offset + sum over runs of ((lane >> lo) & (2**width - 1)) * scale.

    Every per-lane index of the kernels (an operand row, a token, an LDS
    offset) is one of these, fitted from a fragment table; the kernel
    generator only turns runs into shifts, masks and multiplies.
    """

    offset: int
    runs: tuple[tuple[int, int, int], ...]  # (lo_bit, width, scale)

    @staticmethod
    def fit(table) -> "LaneMap":
        table = [int(v) for v in table]
        bits = (len(table) - 1).bit_length()
        if len(table) != 1 << bits:
            raise ValueError(f"a lane table needs a power-of-two length, got {len(table)}")
        offset = table[0]
        basis = [table[1 << b] - offset for b in range(bits)]
        for lane, value in enumerate(table):
            if value != offset + sum(basis[b] for b in range(bits) if lane >> b & 1):
                raise ValueError(f"lane table is not linear in the lane bits: {table}")
        runs: list[tuple[int, int, int]] = []
        for b, scale in enumerate(basis):
            if scale == 0:
                continue
            if runs and runs[-1][0] + runs[-1][1] == b and runs[-1][2] << runs[-1][1] == scale:
                lo, width, first = runs[-1]
                runs[-1] = (lo, width + 1, first)
            else:
                runs.append((b, 1, scale))
        return LaneMap(offset, tuple(runs))

    def __call__(self, lane):
        lane = np.asarray(lane)
        value = np.full(lane.shape, self.offset, dtype=np.int64)
        for lo, width, scale in self.runs:
            value = value + ((lane >> lo) & ((1 << width) - 1)) * scale
        return value

    def shifted(self, amount: int) -> "LaneMap":
        return LaneMap(self.offset + amount, self.runs)


def xor_reduction_offsets(keys: np.ndarray) -> tuple[int, ...]:
    """Lane xor offsets that never change `keys[lane, element]` (reduce over them)."""
    lanes = keys.shape[0]
    offsets = []
    for b in range((lanes - 1).bit_length()):
        partner = np.arange(lanes) ^ (1 << b)
        if np.array_equal(keys[partner], keys):
            offsets.append(1 << b)
    return tuple(offsets)


def element_classes(keys: np.ndarray) -> list[list[int]]:
    """Partition a lane's elements into classes with equal keys on every lane."""
    classes: list[list[int]] = []
    for e in range(keys.shape[1]):
        for members in classes:
            same = keys[:, members[0]] == keys[:, e]
            if same.all():
                members.append(e)
                break
            if same.any():
                raise ValueError("element keys coincide on some lanes only")
        else:
            classes.append([e])
    return classes


@dataclass(frozen=True, eq=False)
class DecodeKernelLayout:
    """Everything the decode kernel generator needs, derived from one FragmentModel.

    A wave's scores are `blocks` MMAC C tiles (16 rows x n tokens each); element
    (n, i) of lane l is row `c_row[i](l)`, wave token `n*N + c_col[i](l)`.
    """

    model: FragmentModel

    @property
    def instruction(self) -> MatrixInstruction:
        return self.model.instruction

    @property
    def blocks(self) -> int:
        return self.model.wave_tokens // self.instruction.n

    # QK: A = query rows x head dim, B = head dim x tokens. Operands load as
    # runs of slots consecutive along K; each run is one vector load.
    def a_runs(self) -> list[tuple[LaneMap, LaneMap, int]]:
        """(row, first K, length) of each A run, in register order."""
        coords = self.instruction.a.coords
        return [(LaneMap.fit(coords[:, first, 0]), LaneMap.fit(coords[:, first, 1]), length)
                for first, length in self.instruction.a.runs(axis=1)]

    def b_runs(self) -> list[tuple[LaneMap, int]]:
        """(first K, length) of each B run, in register order."""
        coords = self.instruction.b.coords
        return [(LaneMap.fit(coords[:, first, 0]), length)
                for first, length in self.instruction.b.runs(axis=0)]

    def b_col(self) -> LaneMap:
        cols = self.instruction.b.coords[:, :, 1]
        if not (cols == cols[:, :1]).all():
            raise ValueError("a lane's B slots span several columns")
        return LaneMap.fit(cols[:, 0])

    def c_row(self, i: int) -> LaneMap:
        return LaneMap.fit(self.instruction.c.coords[:, i, 0])

    def c_col(self, i: int) -> LaneMap:
        return LaneMap.fit(self.instruction.c.coords[:, i, 1])

    def element_tokens(self) -> np.ndarray:
        """int [lanes, blocks*slots]: wave token of score element (n, i)."""
        c = self.instruction.c.coords
        return np.concatenate([n * self.instruction.n + c[:, :, 1] for n in range(self.blocks)], 1)

    def element_rows(self) -> np.ndarray:
        c = self.instruction.c.coords
        return np.concatenate([c[:, :, 0]] * self.blocks, 1)

    def element_groups(self) -> np.ndarray:
        return self.model.group_of_token(self.model.wave_tokens)[self.element_tokens()]

    def group_map(self, element: int) -> LaneMap:
        return LaneMap.fit(self.element_groups()[:, element])

    def row_max_offsets(self) -> tuple[int, ...]:
        return xor_reduction_offsets(self.element_rows())

    def group_keys(self) -> np.ndarray:
        return self.element_rows() * self.model.mmacs_per_wave + self.element_groups()

    def group_max_offsets(self) -> tuple[int, ...]:
        return xor_reduction_offsets(self.group_keys())

    # PV: A = Wq rows x the group's tokens (from LDS), B = V tokens x head dim.
    def a_token_runs(self, mmac: int) -> list[tuple[LaneMap, LaneMap, int]]:
        """(row, first wave token, length) of each A run of PV MMAC `mmac`: the
        run's K slots must be consecutive tokens, i.e. consecutive LDS bytes."""
        groups = self.model.wave_token_groups[mmac]
        coords = self.instruction.a.coords
        runs = []
        for first, length in self.instruction.a.runs(axis=1):
            tokens = groups[coords[:, first:first + length, 1]]
            if not np.array_equal(tokens, tokens[:, :1] + np.arange(length)):
                raise ValueError("an A run's K slots are not consecutive tokens in LDS")
            runs.append((LaneMap.fit(coords[:, first, 0]), LaneMap.fit(tokens[:, 0]), length))
        return runs

    def v_loads(self) -> int:
        return self.model.mmacs_per_wave * self.instruction.b.slots // \
            self.model.v_load.bytes_per_lane

    def v_load_start(self, load: int) -> LaneMap:
        """Wave token of the first byte of a lane's `load`-th V load."""
        lane_group = self.instruction.b.lane_groups(axis=0)
        groups = int(lane_group.max()) + 1
        width = self.model.v_load.bytes_per_lane
        return LaneMap.fit([self.model.v_load.token_of_byte(int(g), groups, load * width)
                            for g in lane_group])

    def v_runs_of_mmac(self, mmac: int) -> list[tuple[int, int, int]]:
        """(load, byte offset in it, length) of each B run of PV MMAC `mmac`."""
        width = self.model.v_load.bytes_per_lane
        runs = []
        for first, length in self.instruction.b.runs(axis=0):
            load, offset = divmod(mmac * self.instruction.b.slots + first, width)
            if offset + length > width:
                raise ValueError("a B run straddles two V loads")
            runs.append((load, offset, length))
        return runs


def thread_distribution(rows: int, cols: int, threads: int) -> tuple[int, list[tuple[LaneMap, LaneMap]]]:
    """Row-major split of a rows x cols tile over threads: per slot u, (row, col) maps."""
    total = rows * cols
    if total % threads:
        raise ValueError(f"{rows}x{cols} does not split over {threads} threads")
    per = total // threads
    thread = np.arange(threads)
    maps = []
    for u in range(per):
        element = thread * per + u
        maps.append((LaneMap.fit(element // cols), LaneMap.fit(element % cols)))
    return per, maps
