"""What the stages of one lane-level kernel read, and the fragments they pass.

A `StagePlan` is immutable: the builder of the kernel function (`Lanes`), the
target spec, the QK and PV layouts derived from their atoms, the numerics and
the shape. The stages (kernels/qk_stages.py, kernels/pv_stages.py) are plain
functions of a plan and named fragments, returning named fragments; a kernel
(decode, prefill) is a composition of them.

A lane's score elements are numbered `block * slots + slot` over the wave's
QK C tiles; which row and token an element holds is the layout's business
(`DecodeKernelLayout.element_*`), read here through lane maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from iree.compiler import ir
from iree.compiler.dialects import vector

from ..contract import scalar_ir as contract
from ..contract.numerics import Numerics
from ..fragments import (DecodeKernelLayout, LaneMap, OperandStaging, ScoreFeed,
                         element_classes)
from ..fragments.lane_maps import power_of_two_divisor
from .lanes import Lanes, load_vector, vector_type
from .target_spec import TargetSpec


@dataclass(frozen=True)
class StagePlan:
    """One kernel's builder, atoms, numerics and shape (module docstring)."""

    lanes: Lanes
    spec: TargetSpec
    layout: DecodeKernelLayout       # QK's atom (scores, W groups)
    pv_layout: DecodeKernelLayout    # PV's atom (QK's for INT8 PV, bf16 for the baseline)
    numerics: Numerics
    pv: str                          # "int8", or "bf16" for the baseline
    head_dim: int
    softmax_scale: float
    rows_out: int                    # rows of a wave's tile that hold query rows
    # Two-term Q in the padding rows of one A tile: (shift, {live C slot: the slot
    # of its second term}) (`DecodeKernelLayout.term_rows`), or None.
    q_packing: tuple | None = None
    # Two-term W in the padding rows of PV's A tile, the same way, or None.
    w_packing: tuple | None = None
    # W straight from QK's C registers into PV's A operand (fragments/score_feed.py;
    # `layout` then reads the K rows in the feed's token order), or None: through LDS.
    w_feed: ScoreFeed | None = None
    # The A tiles staged in LDS (Q, W) in register order where it holds
    # (fragments/operand_staging.py), else row-major.
    a_register_order: bool = False
    # Digit pairs' MMA sums joined as integers (DecodeTuning.digits_join_i32): the
    # kernel's choice, the decode's from its tuning, the prefill's from the target.
    join_digits_in_i32: bool = False
    # PV MMACs chained into one int32 accumulator, converted to f32 and scaled once
    # (docs/design.md §4): the W groups are `w_groups`' sets.
    w_chain: int = 1
    dead: frozenset = field(init=False)
    pv_dead: frozenset = field(init=False)

    def __post_init__(self):
        # C registers that hold padding rows on every lane are never computed.
        object.__setattr__(self, "dead", frozenset(self.layout.dead_c_slots(self.rows_out)))
        object.__setattr__(self, "pv_dead",
                           frozenset(self.pv_layout.dead_c_slots(self.rows_out)))

    @property
    def model(self):
        return self.layout.model

    @property
    def w_groups(self):
        """The fragment model of W's scale groups: PV's, its MMACs chained `w_chain` to an
        accumulator (chain 1: PV's own model)."""
        return self.pv_layout.model.chained(self.w_chain)

    def constants(self, unsigned: bool = False) -> contract.QuantizeConstants:
        """The contract's constants for this kernel (`Lanes` builds each once), its
        integer conversions through the round bias (`contract.to_int`, `exact_f32`)."""
        return contract.quantize_constants(self.lanes.f32, unsigned, self.lanes.i32)

    @property
    def instruction(self):
        return self.layout.instruction

    @property
    def waves(self) -> int:
        return self.model.waves_per_partition

    @property
    def tile_rows(self) -> int:
        return self.instruction.m

    @property
    def w_rows(self) -> int:
        """Rows of W in LDS: PV's A tile (its M), which may be taller than QK's."""
        return max(self.tile_rows, self.pv_layout.instruction.m)

    @property
    def column_sums(self):
        """Unsigned W: where each live C element finds sum Vq (a ones row of A), or
        None for one more MMAC with A all ones (`DecodeKernelLayout.column_sum_slots`)."""
        if not self.numerics.unsigned_w:
            return None
        c = self.instruction.c.coords
        written = set(c[:, self.live_slots(), 0].ravel().tolist())
        if self.w_packing is not None:
            written |= {row + self.w_packing[0] for row in written}
        return self.pv_layout.column_sum_slots(self.rows_out, reserved=written)

    def _staging(self, instruction, cols_of) -> OperandStaging:
        if self.a_register_order:
            return OperandStaging.register_order(instruction, cols_of)
        return OperandStaging.row_major(instruction, cols_of)

    @cached_property
    def q_staging(self) -> OperandStaging:
        """Where the quantized query rows sit in LDS (one operand per K step)."""
        return self._staging(self.instruction, self.layout.qk_head_dim_order(self.head_dim))

    @cached_property
    def w_staging(self) -> OperandStaging:
        """Where W sits in LDS (one operand per PV MMAC), for PV's instruction. The
        BF16-PV twin's stays row-major: in register order ptxas spills it at the
        decode's 80 registers (benchmarks/results/2026-12-05-nogpu-sass-mix/)."""
        pv = self.pv_layout
        if self.pv != "int8":
            return OperandStaging.row_major(pv.instruction, pv.model.wave_token_groups)
        return self._staging(pv.instruction, pv.model.wave_token_groups)

    def mma(self, layout: DecodeKernelLayout, a: ir.Value, b: ir.Value, c: ir.Value):
        return self.spec.emit_mma(layout.instruction, a, b, c)

    # score elements ------------------------------------------------------------
    def live_slots(self) -> list[int]:
        """QK's C registers that hold a query row on some lane."""
        return [i for i in range(self.instruction.c.slots) if i not in self.dead]

    def pv_live_slots(self) -> list[int]:
        """PV's C registers that hold a query row on some lane."""
        return [i for i in range(self.pv_layout.instruction.c.slots) if i not in self.pv_dead]

    def live_classes(self, keys) -> list[list[int]]:
        """Element classes with equal keys on every lane, padding-row classes left out."""
        return [c for c in element_classes(keys)
                if self.layout.element_slot(c[0]) not in self.dead]

    def row_classes(self) -> list[list[int]]:
        """The lane's live score elements by the row they hold."""
        return self.live_classes(self.layout.element_rows())

    def row_map(self, element: int) -> LaneMap:
        return self.layout.c_row(self.layout.element_slot(element))

    def token_in_wave(self, element: int) -> LaneMap:
        return self.layout.element_token(element)

    def live_elements(self, block: int) -> list[int]:
        """The lane's computed score elements of QK C tile `block`."""
        return [self.layout.element(block, i) for i in self.live_slots()]


def load_operand(plan: StagePlan, base: ir.Value, prefix: list, staging: OperandStaging,
                 operand: int, element: str,
                 row: Callable[[ir.Value], ir.Value] = lambda r: r) -> ir.Value:
    """A lane's A operand `operand` read from the tile staged in `base`[*prefix, row,
    col] as `staging` placed it; `row` maps a staged row to the array's."""
    lanes, inst = plan.lanes, staging.instruction
    shape = inst.a_vector
    width = ir.MemRefType(base.type).shape[-1]
    element_bytes = 2 if element == "bf16" else 1
    pieces = []
    for row_map, col_map, length in staging.loads(operand):
        alignment = None
        if staging.in_register_order:    # the whole operand, at a multiple of its size
            alignment = min(power_of_two_divisor(width), col_map.alignment(),
                            power_of_two_divisor(length)) * element_bytes
        loaded = load_vector(base, list(prefix) + [row(lanes.of_lane(row_map)),
                                                    lanes.of_lane(col_map)],
                             length, element, alignment)
        inner = shape[-1]
        if len(shape) == 1 or length == inner:
            pieces.append(loaded)
            continue
        pieces += [vector.extract_strided_slice(vector_type(inner, element), loaded,
                                                [first], [inner], [1])
                   for first in range(0, length, inner)]
    return lanes.assemble(pieces, shape)


def class_of(classes: list[list[int]], element: int) -> int:
    return next(c for c, members in enumerate(classes) if element in members)


@dataclass(frozen=True)
class StagedQ:
    """The quantized query rows in LDS, one (Qq [rows, D] i8, sQ [rows] f32) per term
    (a low digit's sQ is None: its scale is the first term's rows')."""

    terms: tuple[tuple[ir.Value, ir.Value], ...]


@dataclass(frozen=True)
class QOperands:
    """Per term, the A operand of each K step; sQ of the rows the lane's C
    elements hold, by (term, row map)."""

    a_steps: tuple[tuple[ir.Value, ...], ...]
    sq_of_row: dict


@dataclass(frozen=True)
class Scores:
    """A wave's scores {element: f32} (-inf where dead), whether each counts (None:
    no mask, every element counts), and the V scale of its token."""

    values: dict
    live: dict
    v_scales: dict


@dataclass(frozen=True)
class StagedW:
    """Quantized W in LDS [wave, row, token] and its scales [wave, row, group]
    (bf16 baseline: W in bf16, no scales); two-term W's second term in LDS of its
    own, or None (one term, or packed into the first's padding rows). Fed from
    registers (`StagePlan.w_feed`): `fragments`, PV's A operand per MMAC, and
    `sw`, {(C row map, MMAC): scale}, instead of LDS."""

    w: ir.Value | None = None
    scales: ir.Value | None = None
    second: "StagedW | None" = None
    fragments: tuple | None = None
    sw: dict | None = None


@dataclass(frozen=True)
class VSource:
    """Where PV finds the lane's V bytes: loaded already ([load][tile]), staged
    into LDS by asynchronous copies (LDS, copy group), or loaded per tile."""

    loaded: list | None = None
    staged: tuple | None = None
    per_tile: bool = False
