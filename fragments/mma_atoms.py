"""MMA atoms: one matrix instruction with what a kernel needs to issue it.

An atom carries the instruction (name, ISA/PTX mnemonic, the IR op the kernels
emit, M/N/K, element types), where each operand comes from (registers, with a
layout; or shared memory through a matrix descriptor, with its swizzle mode),
its scope (a wave of 64 lanes, a warp of 32, or a warpgroup of 128 threads), the
synchronization it needs (none for MMAC, MFMA and mma.sync; fence, commit-group
and wait-group for wgmma) and the lane simulator's semantics that check it.

Register operands are `LinearLayout`s (register, lane) -> (row, col), `lane`
the thread's index within the scope (32 w + l in a warpgroup), built as products
of identities read off the ISA tables (docs/design.md §3). This is the one
source of the layouts: fragments/instructions.py derives its lane tables from
them; tests/test_mma_atoms.py checks them element by element against tables
written from the ISA text and against the simulator's independent tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .linear_layout import LinearLayout
from .smem_layouts import SWIZZLES, Swizzle, kmajor_layout, kmajor_offsets

I = LinearLayout.identity


def _operand(layout: LinearLayout) -> LinearLayout:
    return layout.transpose_ins(("register", "lane")).transpose_outs(("row", "col"))


@dataclass(frozen=True)
class Operand:
    """One operand's source. In registers: `layout` (register, lane) -> (row, col),
    `vector` the register shape the IR op takes and `registers` how many register
    slots the instruction uses (a prefix of the layout's, when that count is not a
    power of two). In shared memory: `swizzle`, the descriptor's mode; the tile
    layout follows from the descriptor's strides (`tile`)."""

    layout: LinearLayout | None = None
    vector: tuple[int, ...] = ()
    registers: int = 0
    swizzle: Swizzle | None = None

    @property
    def source(self) -> str:
        return "shared" if self.swizzle else "registers"

    def tile(self, rows: int, k_bytes: int, lbo: int | None = None,
             sbo: int | None = None) -> LinearLayout:
        """offset -> (row, k) of a K-major shared-memory tile (fragments/smem_layouts.py)."""
        if self.swizzle is None:
            raise ValueError("a register operand has no shared-memory tile")
        return kmajor_layout(self.swizzle, rows, k_bytes, lbo, sbo)

    def offsets(self, rows: int, k_bytes: int, lbo: int | None = None,
                sbo: int | None = None) -> LinearLayout:
        """(row, k) -> offset: where the descriptor finds each element."""
        if self.swizzle is None:
            raise ValueError("a register operand has no shared-memory tile")
        return kmajor_offsets(self.swizzle, rows, k_bytes, lbo, sbo)


def registers(layout: LinearLayout, vector: tuple[int, ...], count: int | None = None) -> Operand:
    layout = _operand(layout)
    return Operand(layout, vector, count or layout.in_size("register"))


def shared(swizzle: Swizzle) -> Operand:
    if swizzle not in SWIZZLES:
        raise ValueError(f"swizzle '{swizzle}' is not one of {', '.join(SWIZZLES)}")
    return Operand(swizzle=swizzle)


@dataclass(frozen=True)
class Scope:
    """The threads that issue one instruction together: `warps` consecutive warps
    (the first warp index a multiple of `warps`) of `threads` in all."""

    name: str
    threads: int
    warps: int = 1


WAVE64 = Scope("wave64", 64)
WARP = Scope("warp", 32)
WARPGROUP = Scope("warpgroup", 128, warps=4)


@dataclass(frozen=True)
class Sync:
    """The ops that order an asynchronous MMA with the registers around it: `fence`
    before the first MMA that reads registers written since (A, C), `commit` closes
    the group of MMAs issued so far, `wait` (wait_group N) returns when at most N
    groups are pending (NVVM dialect op names)."""

    fence: str
    commit: str
    wait: str


WGMMA_SYNC = Sync("nvvm.wgmma.fence.aligned", "nvvm.wgmma.commit.group.sync.aligned",
                  "nvvm.wgmma.wait.group.sync.aligned")


@dataclass(frozen=True)
class MmaAtom:
    """C[M x N] += A[M x K] * B[K x N] by one instruction (see the module doc).
    `semantics` names the lane simulator's model, written apart from fragments/ to
    check it: ("isa", a key of simulator/isa.py's TABLES) or ("wgmma", "m64nNk32")
    for simulator/wgmma.py; simulator/atoms.py's `simulate_atom` runs it."""

    name: str
    mnemonic: str
    intrinsic: str
    m: int
    n: int
    k: int
    types: tuple[str, str, str]          # A, B, C/D element types
    scope: Scope
    a: Operand
    b: Operand
    c: Operand
    sync: Sync | None
    semantics: tuple[str, str]

    def layout(self, operand: str) -> LinearLayout:
        """A register operand's (register, lane) -> (row, col)."""
        source = {"a": self.a, "b": self.b, "c": self.c}[operand.lower()]
        if source.layout is None:
            raise ValueError(f"{self.name}: operand {operand.upper()} is read from shared "
                             "memory (its tile layout comes from the descriptor: tile())")
        return source.layout


def _amd_16x16x32(name: str, intrinsic: str, c: LinearLayout, key: str) -> MmaAtom:
    # A[l % 16][8(l / 16) + j], B[8(l / 16) + j][l % 16] (gfx936 MMAC and gfx942 MFMA)
    return MmaAtom(
        name, name, intrinsic, 16, 16, 32, ("i8", "i8", "i32"), WAVE64,
        a=registers(I("register", 8, "col") * I("lane", 16, "row") * I("lane", 4, "col"), (8,)),
        b=registers(I("register", 8, "row") * I("lane", 16, "col") * I("lane", 4, "row"), (8,)),
        c=registers(c, (4,)), sync=None, semantics=("isa", key))


# gfx936 DCU: C uses the "jump" layout C[l % 16][l / 16 + 4i] (Hygon CK: kCMLane=16, kCNLane=4).
GFX936_MMAC_ATOM = _amd_16x16x32(
    "v_mmac_i32_16x16x32_i8", "llvm.amdgcn.mmac.i32.16x16x32i8",
    I("lane", 16, "row") * I("lane", 4, "col") * I("register", 4, "col"), "gfx936")

# gfx942 CDNA3: same A/B, C[4(l / 16) + i][l % 16].
GFX942_MFMA_ATOM = _amd_16x16x32(
    "v_mfma_i32_16x16x32_i8", "llvm.amdgcn.mfma.i32.16x16x32.i8",
    I("register", 4, "row") * I("lane", 16, "col") * I("lane", 4, "row"), "gfx942")

# gfx942 CDNA3, the 32x32 shape: A[l % 32][8(l / 32) + j], B[8(l / 32) + j][l % 32],
# C[8(i / 4) + 4(l / 32) + i % 4][l % 32]. Source: AMD's matrix instruction calculator
# (github.com/ROCm/amd_matrix_instruction_calculator, matrix_calculator.py at 2ef9189,
# cdna3 v_mfma_i32_32x32x16_i8) and IREE's IREEGPUAttrs.cpp getSingleSubgroupLayout
# (MFMA_I32_32x32x16_I8); docs/design.md §3.
GFX942_MFMA_32X32X16_ATOM = MmaAtom(
    "v_mfma_i32_32x32x16_i8", "v_mfma_i32_32x32x16_i8", "llvm.amdgcn.mfma.i32.32x32x16.i8",
    32, 32, 16, ("i8", "i8", "i32"), WAVE64,
    a=registers(I("register", 8, "col") * I("lane", 32, "row") * I("lane", 2, "col"), (8,)),
    b=registers(I("register", 8, "row") * I("lane", 32, "col") * I("lane", 2, "row"), (8,)),
    c=registers(I("register", 4, "row") * I("lane", 32, "col") * I("lane", 2, "row")
                * I("register", 4, "row"), (16,)),
    sync=None, semantics=("isa", "gfx942-32x32x16"))

# PTX fragments (PTX ISA, "Matrix Fragments for mma.m16n8k32" / "mma.m16n8k16"):
# g = l / 4 (lane bits 2-4), t = l % 4 (lane bits 0-1).
# C of m16n8: c_i = (g + 8(i / 2), 2t + i % 2).
_PTX_C = (I("register", 2, "col") * I("lane", 4, "col") * I("lane", 8, "row")
          * I("register", 2, "row"))
# 8-bit A of m16n8k32: a_r byte j = (g + 8(r % 2), 16(r / 2) + 4t + j)
_PTX_A8 = (I("register", 4, "col") * I("lane", 4, "col") * I("lane", 8, "row")
           * I("register", 2, "row") * I("register", 2, "col"))

# NVIDIA sm_80+, 32-lane warps: b_r byte j = (16r + 4t + j, g)
SM80_MMA_S8_ATOM = MmaAtom(
    "mma.sync.m16n8k32.s8", "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32",
    "nvgpu.mma.sync", 16, 8, 32, ("s8", "s8", "s32"), WARP,
    a=registers(_PTX_A8, (4, 4)),
    b=registers(I("register", 4, "row") * I("lane", 4, "row") * I("register", 2, "row")
                * I("lane", 8, "col"), (2, 4)),
    c=registers(_PTX_C, (2, 2)), sync=None, semantics=("isa", "cuda"))

# The BF16-PV baseline's: a_r element j = (g + 8(r % 2), 8(r / 2) + 2t + j); b_r = (8r + 2t + j, g)
SM80_MMA_BF16_ATOM = MmaAtom(
    "mma.sync.m16n8k16.bf16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "nvgpu.mma.sync", 16, 8, 16, ("bf16", "bf16", "f32"), WARP,
    a=registers(I("register", 2, "col") * I("lane", 4, "col") * I("lane", 8, "row")
                * I("register", 2, "row") * I("register", 2, "col"), (4, 2)),
    b=registers(I("register", 2, "row") * I("lane", 4, "row") * I("register", 2, "row")
                * I("lane", 8, "col"), (2, 2)),
    c=registers(_PTX_C, (2, 2)), sync=None, semantics=("isa", "cuda-bf16"))

ATOMS: dict[str, MmaAtom] = {atom.name: atom for atom in (
    GFX936_MMAC_ATOM, GFX942_MFMA_ATOM, GFX942_MFMA_32X32X16_ATOM,
    SM80_MMA_S8_ATOM, SM80_MMA_BF16_ATOM)}


def mma_atom(name: str) -> MmaAtom:
    """The atom of a warp/wave instruction by name (wgmma atoms: `wgmma_atom`)."""
    try:
        return ATOMS[name]
    except KeyError:
        raise KeyError(f"no MMA atom '{name}' (known: {', '.join(ATOMS)}; "
                       "wgmma: wgmma_atom(n, ...))") from None


# -- wgmma.mma_async m64nNk32, s8/u8 -> s32 (sm_90a) -----------------------------------

# PTX ISA section 9.7.15.5.1.1.3 ("Matrix Fragments for wgmma.mma_async.m64nNk32"): an .s32
# accumulator takes N = 8i (i = 1..4) or 16i (i = 3..16).
WGMMA_S32_N = (8, 16, 24, 32) + tuple(range(48, 257, 16))
WGMMA_8BIT_TYPES = ("s8", "u8")
WGMMA_OPERAND_SOURCES = ("registers",) + SWIZZLES


@lru_cache(maxsize=None)
def wgmma_atom(n: int, a: str = "registers", b: Swizzle = "none", a_type: str = "s8",
               b_type: str = "s8") -> MmaAtom:
    """`wgmma.mma_async.sync.aligned.m64n{n}k32.s32.{a_type}.{b_type}`: A from registers
    (`a="registers"`, the RS form) or shared memory with swizzle `a` (SS), B from
    shared memory with swizzle `b`; both K-major. Warp w of the warpgroup holds rows
    16w .. 16w + 15 of A and D; within a warp, mma.sync m16n8k32's fragments
    (PTX ISA Figures 152, 153; CUTLASS cute/atom/mma_traits_sm90_gmma.hpp
    ALayout_64x32 and CLayout_64xN): A byte 4r + j = (16w + g + 8(r % 2),
    16(r / 2) + 4t + j); D register 4j + i = (16w + g + 8(i / 2), 8j + 2t + i % 2)."""
    if n not in WGMMA_S32_N:
        raise ValueError(f"wgmma m64nNk32 with an s32 accumulator takes N in "
                         f"{{8, 16, 24, 32, 48, 64, ..., 256}} (16i from 48), not {n}")
    for what, value, choices in (("A source", a, WGMMA_OPERAND_SOURCES),
                                 ("B swizzle", b, SWIZZLES),
                                 ("A type", a_type, WGMMA_8BIT_TYPES),
                                 ("B type", b_type, WGMMA_8BIT_TYPES)):
        if value not in choices:
            raise ValueError(f"wgmma {what} '{value}' is not one of {', '.join(choices)}")
    warp_rows = I("lane", 4, "row")                      # lane bits 5-6: the warp, 16 rows
    blocks = 1 << (n // 8 - 1).bit_length()              # C column blocks, to a power of two
    c = _PTX_C * warp_rows * I("register", blocks, "col")
    form = "RS" if a == "registers" else "SS"
    return MmaAtom(
        f"wgmma.m64n{n}k32.{a_type}.{b_type}.{form}",
        f"wgmma.mma_async.sync.aligned.m64n{n}k32.s32.{a_type}.{b_type}",
        "nvvm.wgmma.mma_async", 64, n, 32, (a_type, b_type, "s32"), WARPGROUP,
        a=registers(_PTX_A8 * warp_rows, (4, 4)) if a == "registers" else shared(a),
        b=shared(b), c=registers(c, (n // 2,), count=n // 2),
        sync=WGMMA_SYNC, semantics=("wgmma", "m64nNk32"))
