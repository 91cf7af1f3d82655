"""One `TargetSpec` per kernel target: what the kernels, the host side and the
simulator read about a GPU.

A spec holds the target's matrix-instruction atoms (the QK/PV fragment model,
the other INT8 PV atoms it offers, the bf16 PV baseline's), how its backend
spells an MMA, its wave size, its capabilities (an asynchronous copy into LDS,
an occupancy hint) and the schedule chosen for it. Adding a target is one row
of `TARGET_SPECS`; adding an instruction to a target is one atom in its row.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
from iree.compiler import ir
from iree.compiler.dialects import amdgpu, llvm, vector

from ..contract import scalar_ir as contract
from ..contract.numerics import DIGIT_NUMERICS, Numerics
from ..fragments import (PV_ATOMS, FragmentModel, MatrixInstruction, bf16_pv_model,
                         fragment_model, pv_model)


@dataclass(frozen=True)
class DecodeTuning:
    """Schedule choices of the partition kernel that do not change its results."""

    v_early: bool = False    # issue the V loads right after QK, before the softmax
    v_first: bool = False    # issue the V loads before QK (in flight with K's)
    v_per_tile: bool = False  # load V for one 16-column tile just before its MMACs
    # Copy the partition's V into LDS asynchronously before QK (cuda: cp.async), so
    # that it streams in during QK and the softmax without holding registers; PV
    # reads it from LDS.
    v_async: bool = False
    # Ask the backend to fit this many workgroups per SM / CU (it caps the registers
    # per thread accordingly); 0 leaves the choice to it.
    workgroups_per_sm: int = 0
    # Two-term Q: both terms in one A tile (the second in padding rows) where the C
    # layout keeps a row and its shifted copy in one lane, so one MMA gives both sums.
    pack_q_terms: bool = True
    # Two-term W the same way in PV's A tile: the second term's rows below the first's.
    pack_w_terms: bool = True
    # Q and W staged in LDS in the MMA's register order (fragments/operand_staging.py):
    # each operand one load, no register copies before the MMA.
    a_register_order: bool = True
    merge_unroll: int = 8     # partitions each merge thread loads per loop iteration
    merge_splits: int = 1     # thread groups of the merge, each over every splits-th partition
    merge_chunks: int = 1     # merge workgroups per (KV head, sequence), each D / chunks columns
    # No merge kernel: the last partition workgroup of a (sequence, KV head) to finish
    # (an atomic count of arrivals) merges its partials, in `fused_splits` thread groups
    # loading `fused_unroll` partitions each per iteration. Off by default: it was slower
    # at every batch measured (benchmarks/results/2026-12-05-h100-paged-decode-fused-merge/).
    fused_merge: bool = False
    fused_splits: int = 4
    fused_unroll: int = 2
    # Two INT8 digits' MMA sums (two-term Q or W as digits) joined as integers, a
    # shift-add, and converted once, the MMAs starting from 0; False: each sum through
    # the round bias's bits and one FMA (`contract.join_digits_f32`). The same bits,
    # one instruction fewer per sum, one conversion more (TARGET_SPECS says which wins).
    digits_join_i32: bool = False

    def __post_init__(self):
        counts = ("merge_unroll", "merge_splits", "merge_chunks", "fused_splits",
                  "fused_unroll")
        if low := [f"{n}={getattr(self, n)}" for n in counts if getattr(self, n) < 1]:
            raise ValueError(f"DecodeTuning: {', '.join(low)}: each is a count, at least 1")
        if self.workgroups_per_sm < 0:
            raise ValueError(f"DecodeTuning: workgroups_per_sm={self.workgroups_per_sm}: "
                             f"0 (the backend's choice) or more")


def _vector_type(count: int, element: str) -> ir.VectorType:
    return ir.VectorType.get([count], ir.Type.parse(element))


def _accumulator_type(instruction: MatrixInstruction, c: ir.Value) -> ir.VectorType:
    element = ir.VectorType(c.type).element_type
    return ir.VectorType.get(list(instruction.c_vector), element)


def _mma_sync(instruction: MatrixInstruction, a, b, c) -> ir.Value:
    # nvgpu has no Python module: generic form (docs/design.md §9); mma.sync takes
    # the bf16 and int8 fragments alike.
    shape = ir.ArrayAttr.get([ir.IntegerAttr.get(ir.IntegerType.get_signless(64), d)
                              for d in (instruction.m, instruction.n, instruction.k)])
    return ir.Operation.create("nvgpu.mma.sync", results=[_accumulator_type(instruction, c)],
                               operands=[a, b, c], attributes={"mmaShape": shape}).result


def _mfma(instruction: MatrixInstruction, a, b, c) -> ir.Value:
    return amdgpu.MFMAOp(instruction.m, instruction.n, instruction.k, a, b, c).result


def _mmac_intrinsic(instruction: MatrixInstruction, a, b, c) -> ir.Value:
    # The DTK builtin takes the 8 bytes of A and B as one i64 each.
    def as_i64(fragment):
        packed = vector.BitCastOp(_vector_type(1, "i64"), fragment).result
        return vector.extract(packed, [], [0])

    return llvm.CallIntrinsicOp(_accumulator_type(instruction, c), instruction.intrinsic,
                                [as_i64(a), as_i64(b), c], [], []).result


# The hardware's exp2. PTX's ex2.approx.ftz.f32: a result below 2^-126 is +0 (the
# non-ftz form costs a compare and two multiplies around each MUFU.EX2 in SASS to keep
# subnormals). AMDGPU: LLVM's own llvm.exp2.f32, which its backend lowers to v_exp_f32
# (1 ulp; every LLVM a DCU toolchain ships has it, where math.exp2 became a call to the
# ROCm device library that the gfx936 route cannot link). A p that small adds nothing a
# tolerance sees. The simulator evaluates these as exp2, flushed below 2^-126.
EXP2_INTRINSICS = {"cuda": "llvm.nvvm.ex2.approx.ftz.f32", "amdgpu": "llvm.exp2.f32"}
FLUSHED_BELOW = np.float32(2.0 ** -126)
# The hardware's reciprocal, within 1 ulp: PTX's rcp.approx.ftz.f32 (MUFU.RCP), from
# which `contract.levels_over` makes W's 127 / a correctly rounded with no checked
# division's branch. The simulator evaluates it as the correctly rounded 1 / x, flushed.
RECIPROCAL_INTRINSICS = {"cuda": "llvm.nvvm.rcp.approx.ftz.f"}
# PTX's prmt.b32 (default mode): byte i of the result is byte (selector nibble i) of the
# eight bytes {b, a}. Four levels' low bytes into one word in three (SASS `PRMT`), where
# shifts and masks take seven; the simulator evaluates it (compute_ops).
BYTE_PERMUTE = "llvm.nvvm.prmt"
LOW_BYTES_OF_PAIR = 0x0040        # (a.byte0, b.byte0, a.byte0, a.byte0)
LOW_HALVES_OF_PAIR = 0x5410       # (a.byte0, a.byte1, b.byte0, b.byte1)

MmaEmitter = Callable[[MatrixInstruction, ir.Value, ir.Value, ir.Value], ir.Value]


@dataclass(frozen=True)
class TargetSpec:
    """A kernel target (module docstring)."""

    name: str
    model: FragmentModel            # QK's instruction and the V load scheme; the default PV atom
    emit_mma: MmaEmitter            # how the backend spells one MMA of any of the atoms
    pv_atoms: tuple[FragmentModel, ...] = ()   # further INT8 PV atoms (same V load scheme)
    bf16_pv: FragmentModel | None = None       # the BF16-PV baseline's atom, if any
    async_copy: bool = False                   # an asynchronous global -> LDS copy
    occupancy_attribute: str | None = None     # the kernel attribute of workgroups per SM
    tuning: DecodeTuning = field(default_factory=DecodeTuning)
    # Workgroups per SM of the decode partition by head dim: (largest head dim, INT8 PV's,
    # the BF16-PV twin's), first match, the last row's value above it.
    occupancy_by_head_dim: tuple[tuple[int, int, int], ...] = ()
    # The numerics its kernels build when none is given (docs/design.md §2c).
    numerics: Numerics = DIGIT_NUMERICS
    # The AMDGPU chip IREE's ROCm backend builds the kernels' LLVM IR for (the
    # `llvm` stage); for a chip IREE does not know, a sibling with the same wave
    # size, whose IR is then retargeted.
    llvm_proxy: str | None = None
    # An upstream intrinsic taking the target's MMA operands plus zero immediates,
    # which IREE's LLVM translates in place of the target's own (renamed back in
    # the IR the `llvm` stage writes): (name, number of trailing zero immediates).
    llvm_stand_in: tuple[str, int] | None = None
    # The hardware's exp2 (an LLVM intrinsic f32 -> f32), which the prefill's online
    # softmax and the decode partition's softmax take (the merge's few weights take the
    # contract's); None: the contract's `exp2` (a range reduction around math.exp,
    # which IREE expands into a polynomial).
    exp2_intrinsic: str | None = None
    # The hardware's approximate reciprocal (an LLVM intrinsic f32 -> f32, within 1
    # ulp), from which the W groups' inverses are divided without a branch
    # (`contract.levels_over`); None: the checked division.
    reciprocal_intrinsic: str | None = None
    # The prefill's digit sums joined as integers (DecodeTuning.digits_join_i32 says
    # what that is; the decode partition's choice is its tuning's).
    prefill_digits_join_i32: bool = False
    # The byte permute that packs four i32 levels' low bytes into an A register
    # (`pack_levels`); None: shifts and masks (`Lanes.pack_bytes`).
    byte_permute: str | None = None
    # The LLVM sync scope of every workgroup of a dispatch: the fences around the
    # arrival count of the fused merge (DecodeTuning.fused_merge) take it.
    device_scope: str = "agent"
    # Workgroups per SM the prefill kernel is built for (0: the backend's choice), and
    # the SMs of the GPU the choice was made on: a grid too small to fill that many per
    # SM is left to the backend (the cap only costs registers there).
    prefill_workgroups_per_sm: int = 0
    measured_sms: int = 0
    # The prefill's K/V tiles through a ring in LDS filled by the asynchronous copy
    # (kv_ring.KVRing), where it fits `ring_lds_bytes` (the LDS a workgroup may
    # take without opting in to more).
    prefill_kv_ring: bool = False
    ring_lds_bytes: int = 48 * 1024
    # Read Q's operands from LDS in every prefill tile instead of holding them in
    # registers (16 registers a lane, 32 with two-term Q; with the ring's barrier in
    # the loop the loads stay there): one LDS.128 per K step in register order
    # (fragments/operand_staging.py). cuda's choice from ptxas's counts, not yet timed
    # (benchmarks/results/2026-12-05-nogpu-sass-mix/).
    prefill_q_per_tile: bool = False

    @property
    def wave_size(self) -> int:
        return self.model.instruction.wave_size

    @property
    def tile_rows(self) -> int:
        """Query rows of a wave's MMA tile: the QK instruction's M."""
        return self.model.instruction.m

    def with_model(self, model: FragmentModel) -> "TargetSpec":
        """The same target generating from another model (tests of wrong layouts:
        the simulator keeps the target's real instruction semantics)."""
        return replace(self, model=model)

    def pv_model(self, pv: str, atom: str | None = None) -> FragmentModel:
        """PV's atom: the INT8 one named `atom` (default QK's), or the bf16 baseline's."""
        if pv == "bf16":
            if self.bf16_pv is None:
                raise ValueError(f"--target {self.name} has no bf16 PV kernel")
            return self.bf16_pv
        if atom is None or atom == self.model.instruction.name:
            return self.model
        for model in self.pv_atoms:
            if model.instruction.name == atom:
                return model
        known = [self.model.instruction.name] + [m.instruction.name for m in self.pv_atoms]
        raise ValueError(f"--target {self.name} has no PV atom {atom!r} (it has: "
                         f"{', '.join(known)})")

    def default_tuning(self, head_dim: int, pv: str = "int8") -> DecodeTuning:
        """The measured schedule for a head dim of `head_dim` and PV precision `pv`."""
        table = self.occupancy_by_head_dim
        if not table:
            return self.tuning
        row = next((row for row in table if head_dim <= row[0]), table[-1])
        return replace(self.tuning, workgroups_per_sm=row[1] if pv == "int8" else row[2])

    def check_tuning(self, tuning: DecodeTuning) -> None:
        v_schedules = [name for name in ("v_early", "v_first", "v_per_tile", "v_async")
                       if getattr(tuning, name)]
        if len(v_schedules) > 1:
            raise ValueError(f"the V loads take one schedule; {' and '.join(v_schedules)} "
                             f"are set: choose one")
        if tuning.v_async and not self.async_copy:
            raise ValueError(f"--target {self.name} has no asynchronous copy into LDS for "
                             f"the V stage (v_async; targets with one: "
                             f"{', '.join(n for n, s in TARGET_SPECS.items() if s.async_copy)})")
        if tuning.workgroups_per_sm and self.occupancy_attribute is None:
            raise ValueError(f"--target {self.name} has no occupancy hint for the kernel")

    def resolve_numerics(self, numerics: Numerics | None, head_dim: int) -> Numerics:
        """The numerics to build: as given, else the target's (checked for the head dim)."""
        numerics = numerics or self.numerics
        numerics.check_head_dim(head_dim)
        return numerics

    def exp2(self, x: ir.Value) -> ir.Value:
        """2^x as the target computes it fastest, for the softmax's x = s - m (scores in
        log2 units): the hardware's exp2 where it has one (a few ulps; the references'
        rounding-tie window covers W's), else the contract's (`contract.exp2`)."""
        if self.exp2_intrinsic is None:
            return contract.exp2(x)
        return llvm.CallIntrinsicOp(ir.F32Type.get(), self.exp2_intrinsic, [x], [], []).result

    def approximate_reciprocal(self) -> Callable[[ir.Value], ir.Value] | None:
        """The hardware's reciprocal as a builder (`reciprocal_intrinsic`), or None."""
        if self.reciprocal_intrinsic is None:
            return None
        return lambda x: llvm.CallIntrinsicOp(ir.F32Type.get(), self.reciprocal_intrinsic,
                                              [x], [], []).result

    def device_fence(self, ordering: str) -> None:
        """A fence ("release", "acquire") ordering this thread's global memory accesses
        for every workgroup of the dispatch (the target's `device_scope`)."""
        llvm.FenceOp(getattr(llvm.AtomicOrdering, ordering), syncscope=self.device_scope)

    def pack_levels(self, lanes, levels: list[ir.Value], shape) -> ir.Value:
        """i32 levels (each standing for its low byte) as an i8 operand vector of
        `shape`, row-major: by the target's byte permute, two pairs then the pair of
        pairs per word, else by shifts and masks."""
        if self.byte_permute is None:
            return lanes.pack_bytes(levels, shape)
        i32 = ir.IntegerType.get_signless(32)

        def permute(a, b, selector):
            return llvm.CallIntrinsicOp(i32, self.byte_permute, [a, b, lanes.i32(selector)],
                                        [], []).result

        words = [permute(permute(levels[w], levels[w + 1], LOW_BYTES_OF_PAIR),
                         permute(levels[w + 2], levels[w + 3], LOW_BYTES_OF_PAIR),
                         LOW_HALVES_OF_PAIR) for w in range(0, len(levels), 4)]
        return lanes.words_as_bytes(words, shape)

    def kernel_attributes(self, tuning: DecodeTuning) -> dict[str, str]:
        return self.occupancy_attributes(tuning.workgroups_per_sm)

    def prefill_attributes(self, workgroups: int | None) -> dict[str, str]:
        """The prefill kernel's occupancy hint for a grid of `workgroups` (None: known
        only at run time, a paged prefill's batch)."""
        wanted = self.prefill_workgroups_per_sm
        if workgroups is not None and workgroups < wanted * self.measured_sms:
            return {}
        return self.occupancy_attributes(wanted)

    def occupancy_attributes(self, workgroups_per_sm: int) -> dict[str, str]:
        """The kernel attribute asking for `workgroups_per_sm` (none for 0)."""
        if not workgroups_per_sm:
            return {}
        return {self.occupancy_attribute: f"{workgroups_per_sm} : i32"}


# cuda's schedule is chosen from timings on NVIDIA hardware (benchmarks/results/, e.g.
# 2026-12-03-h200-paged-decode/); the AMD targets take the target-independent choices
# only (nothing there has run on hardware).
# Digit sums joined as integers (DecodeTuning.digits_join_i32): fewer SASS instructions
# on cuda, but the conversion goes to the XU pipe, which MUFU shares. The prefill
# gains from it and the paged decode does not
# (benchmarks/results/2026-12-05-h200-prefill-digit-join/), so cuda's prefill joins as
# integers and its decode through the bias. Off on the AMD targets, untimed: llc's gfx942
# code is shorter, but LLVM's model gives v_cvt_f32_i32 the transcendentals'
# (quarter-rate) class.
TARGET_SPECS: dict[str, TargetSpec] = {
    "gfx936": TargetSpec("gfx936", fragment_model("gfx936"), _mmac_intrinsic,
                         tuning=DecodeTuning(merge_splits=4), llvm_proxy="gfx942",
                         # same operands (i64, i64, <4 x i32>) -> <4 x i32>, then cbsz,
                         # abid, blgp
                         llvm_stand_in=("llvm.amdgcn.mfma.i32.16x16x32.i8", 3),
                         exp2_intrinsic=EXP2_INTRINSICS["amdgpu"]),
    "gfx942": TargetSpec("gfx942", fragment_model("gfx942"), _mfma,
                         pv_atoms=tuple(pv_model("gfx942", a) for a in PV_ATOMS["gfx942"][1:]),
                         tuning=DecodeTuning(merge_splits=4), llvm_proxy="gfx942",
                         exp2_intrinsic=EXP2_INTRINSICS["amdgpu"]),
    "cuda": TargetSpec(
        "cuda", fragment_model("cuda"), _mma_sync, bf16_pv=bf16_pv_model("cuda"),
        async_copy=True, occupancy_attribute="nvvm.minctasm",
        # the merge in 16 chunks (8 columns a workgroup at D 128) rather than 4: faster
        # at B = 1 and no slower at B = 16
        # (benchmarks/results/2026-12-05-h100-prefill-reciprocal/)
        tuning=DecodeTuning(workgroups_per_sm=6, merge_chunks=16, merge_splits=16,
                            merge_unroll=2),
        # a lane's V loads and output accumulators grow with D: fewer workgroups fit
        # without spilling. INT8 at D <= 128: 8 (64 registers, no spills) beats 6 at D 128
        # and 7 at D 64 in every bench case; the BF16 twin spills at 8 and is slower there
        # at D 128 (benchmarks/results/2026-12-05-h100-paged-decode-stages/).
        occupancy_by_head_dim=((64, 8, 7), (128, 8, 6), (256, 4, 4)),
        exp2_intrinsic=EXP2_INTRINSICS["cuda"], byte_permute=BYTE_PERMUTE,
        reciprocal_intrinsic=RECIPROCAL_INTRINSICS["cuda"],
        device_scope="device",
        # the prefill kernel uncapped fits 2 workgroups; capped for 3 (better than 2 and
        # 4) it runs long prefills faster, but a grid of few workgroups (512 new tokens
        # over 8 KV heads: 256) slower, hence measured_sms
        # (benchmarks/results/2026-12-04-h200-prefill/)
        prefill_workgroups_per_sm=3, measured_sms=132, prefill_kv_ring=True,
        prefill_digits_join_i32=True,
        # Q in register order costs the loop no instruction and frees most of the
        # registers it spilled (benchmarks/results/2026-12-05-nogpu-sass-mix/)
        prefill_q_per_tile=True),
}


def target_spec(name: str) -> TargetSpec:
    try:
        return TARGET_SPECS[name]
    except KeyError:
        raise ValueError(f"no kernel target {name!r} (kernel targets: "
                         f"{', '.join(TARGET_SPECS)})") from None
