"""Per-lane quantities of the lane-level kernels, derived from a fragment model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .instructions import MatrixInstruction
from .lane_maps import LaneMap, power_of_two_divisor
from .linear_layout import LinearLayout
from .mma_layouts import (MmaLayouts, mma_layouts, score_group_layout,
                          score_layout, xor_partners)
from .model import FragmentModel
from .operand_staging import OperandStaging

# The widest vector load of every target (bytes per lane): K rows are read in
# loads of this width.
K_LOAD_BYTES = 16


@dataclass(frozen=True, eq=False)
class DecodeKernelLayout:
    """Everything the decode kernel generator needs, derived from one FragmentModel.

    A wave's scores are `blocks` MMAC C tiles (16 rows x n tokens each); element
    (n, i) of lane l is row `c_row[i](l)`, wave token `n*N + c_col[i](l)`. The
    operand lane maps, the scores' rows, tokens and W groups and the shuffle
    partners come from the linear layouts (fragments/mma_layouts.py): the
    instruction's operands composed with the V load scheme.
    """

    model: FragmentModel
    # QK's token order (fragments/score_feed.py): C column position p of the wave's
    # score tiles holds wave token order(p); None: token p.
    token_order: LinearLayout | None = None

    @property
    def layouts(self) -> MmaLayouts:
        return mma_layouts(self.instruction)

    def _lane_map(self, operand: str, register: int, out: str) -> LaneMap:
        lanes = np.arange(self.instruction.wave_size)
        return LaneMap.fit(self.layouts.operand(operand).apply(register=register,
                                                                lane=lanes)[out])

    def _scores(self, layout, out: str) -> np.ndarray:
        """int [lanes, blocks*slots]: output `out` of score element (n, i) of each lane."""
        table = layout.table(["lane", "block", "register"], [out])
        return table.reshape(table.shape[0], -1)

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
        if any(basis["col"] for basis in self.layouts.b.bases("register")):
            raise ValueError("a lane's B slots span several columns")
        return self._lane_map("b", 0, "col")

    def c_row(self, i: int) -> LaneMap:
        return self._lane_map("c", i, "row")

    def c_col(self, i: int) -> LaneMap:
        return self._lane_map("c", i, "col")

    # A lane's score elements: element (n, i) = register i of C tile n, numbered
    # n * slots + i; the one place that numbering is made and taken apart.
    def element(self, block: int, slot: int) -> int:
        return block * self.instruction.c.slots + slot

    def element_slot(self, element: int) -> int:
        return element % self.instruction.c.slots

    def element_token(self, element: int) -> LaneMap:
        """Wave token of score element `element`, as a lane map."""
        if self.token_order is not None:
            return LaneMap.fit(self.element_tokens()[:, element])
        block, slot = divmod(element, self.instruction.c.slots)
        return self.c_col(slot).shifted(block * self.instruction.n)

    def element_tokens(self) -> np.ndarray:
        """int [lanes, blocks*slots]: wave token of score element (n, i)."""
        return self._scores(self.score_layout, "token")

    def element_rows(self) -> np.ndarray:
        return self._scores(self.score_layout, "row")

    @cached_property
    def score_layout(self) -> LinearLayout:
        return score_layout(self.model, self.token_order)

    def b_token(self, block: int) -> LaneMap:
        """Wave token whose K row a lane loads as its B column of QK C tile `block`."""
        position = self.b_col()(np.arange(self.instruction.wave_size)) + \
            block * self.instruction.n
        if self.token_order is None:
            return LaneMap.fit(position)
        return LaneMap.fit(self.token_order.apply(token=position)["token"])

    # W scale groups: the tokens one PV MMAC consumes, of PV's model (by default
    # this layout's own; another PV atom's when PV runs on a second instruction).
    def element_groups(self, pv: FragmentModel | None = None) -> np.ndarray:
        return self._scores(score_group_layout(self.model, pv, self.token_order), "group")

    def group_map(self, element: int, pv: FragmentModel | None = None) -> LaneMap:
        return LaneMap.fit(self.element_groups(pv)[:, element])

    def uniform_group(self, element: int, pv: FragmentModel | None = None) -> int:
        """The W group (PV MMAC) of score element `element`, the same on every lane (as
        a register feed makes it: the element is one A register of one MMAC)."""
        groups = self.element_groups(pv)[:, element]
        if (groups != groups[0]).any():
            raise ValueError(f"score element {element} is in different W groups on "
                             "different lanes")
        return int(groups[0])

    def row_max_offsets(self) -> tuple[int, ...]:
        """Lanes that hold the same rows (softmax max and sum)."""
        return xor_partners(self.score_layout, ["row"])

    def group_keys(self, pv: FragmentModel | None = None) -> np.ndarray:
        mmacs = (pv or self.model).mmacs_per_wave
        return self.element_rows() * mmacs + self.element_groups(pv)

    def group_max_offsets(self, pv: FragmentModel | None = None) -> tuple[int, ...]:
        """Lanes that hold the same rows and W groups (the absmax per group)."""
        return xor_partners(score_group_layout(self.model, pv, self.token_order),
                            ["row", "group"])

    # QK in lane-contiguous head-dim order. The dot product over D does not care
    # which d each (K step, K slot) pair multiplies, as long as A and B agree:
    # d(step, k) = group(k) * steps * slots + step * slots + rank of k in its
    # group, where a group is the K rows one lane of B holds. Then every lane's
    # K bytes for all steps are one contiguous run of the token's row, read in
    # K_LOAD_BYTES-wide loads, and Q is read from LDS through the same map.
    # (Interleaving the lane groups per load, so that each load instruction reads
    # whole 32-byte sectors, gains nothing: the second load of a run hits L1.)
    def qk_b_width(self, head_dim: int) -> int:
        """Bytes of each K load of a lane: the widest that divides its run."""
        return math.gcd(K_LOAD_BYTES, head_dim // self.instruction.k * self.instruction.b.slots)

    def k_load_alignment(self, head_dim: int) -> int:
        """Bytes every K load of a lane is aligned to, in a cache of `head_dim`-byte
        rows: its width, where each load starts at a multiple of it."""
        return min(self.qk_b_width(head_dim), power_of_two_divisor(head_dim),
                   *(start.alignment() for start in self.qk_b_loads(head_dim)))

    def qk_head_dim_order(self, head_dim: int) -> np.ndarray:
        """int [steps, K]: the head-dim index multiplied at (step, k)."""
        inst = self.instruction
        steps, slots = head_dim // inst.k, inst.b.slots
        groups = inst.b.lane_groups(axis=0)
        order = np.full((steps, inst.k), -1, dtype=np.int64)
        for lane in range(inst.b.lanes):
            ks = sorted(set(inst.b.coords[lane, :, 0].tolist()))
            if len(ks) != slots:
                raise ValueError("a lane of B holds one K row twice")
            for rank, k in enumerate(ks):
                for step in range(steps):
                    order[step, k] = (groups[lane] * steps + step) * slots + rank
        if not np.array_equal(np.sort(order.ravel()), np.arange(head_dim)):
            raise ValueError(f"B's lane groups do not tile the head dim {head_dim}")
        return order

    def qk_b_loads(self, head_dim: int) -> list[LaneMap]:
        """The first head-dim index of each of a lane's K loads, in run order."""
        width, order = self.qk_b_width(head_dim), self.qk_head_dim_order(head_dim)
        b = self.instruction.b
        firsts = {}
        for step in range(order.shape[0]):
            for slot, p in enumerate(self.qk_b_slots(head_dim, step)):
                if p % width == 0:
                    firsts[p // width] = order[step, b.coords[:, slot, 0]]
        return [LaneMap.fit(firsts[u]) for u in sorted(firsts)]

    def qk_b_slots(self, head_dim: int, step: int) -> list[int]:
        """Position in the lane's run (its loads, concatenated) of each B slot at
        `step`, in slot order."""
        b = self.instruction.b
        ranks = []
        for lane in range(b.lanes):
            ks = sorted(set(b.coords[lane, :, 0].tolist()))
            ranks.append([step * b.slots + ks.index(k) for k in b.coords[lane, :, 0].tolist()])
        ranks = np.array(ranks)
        if not (ranks == ranks[:1]).all():
            raise ValueError("B lanes disagree on the positions of their slots")
        return ranks[0].tolist()

    def qk_b_pieces(self, head_dim: int, step: int) -> list[tuple[int, int, int]]:
        """(K load, first byte in it, length) of each B run at `step`, in register
        order: the slices of the lane's K loads that make the B operand."""
        width, slots = self.qk_b_width(head_dim), self.qk_b_slots(head_dim, step)
        pieces = []
        for first, length in self.instruction.b.runs(axis=0):
            load, start = divmod(slots[first], width)
            if start + length > width:
                raise ValueError("a B run straddles two K loads")
            pieces.append((load, start, length))
        return pieces

    def qk_a_runs(self, head_dim: int, step: int) -> list[tuple[LaneMap, LaneMap, int]]:
        """(row, first head-dim index, length) of each A run at `step`, in register
        order: the Q tile's row-major loads (`OperandStaging.loads`)."""
        staging = OperandStaging.row_major(self.instruction, self.qk_head_dim_order(head_dim))
        return staging.loads(step)

    def dead_c_slots(self, rows: int) -> list[int]:
        """C registers whose row is >= `rows` on every lane (padding rows only)."""
        c = self.instruction.c.coords
        return [i for i in range(c.shape[1]) if (c[:, i, 0] >= rows).all()]

    def term_rows(self, rows: int, real: int) -> tuple[int, dict[int, int]] | None:
        """Where a second Q term fits in the padding rows of the same A tile: (shift,
        {live slot: slot}) such that the slot holds row + shift of the live slot's row,
        in the same column and lane, on every lane, and rows shift .. shift + real - 1
        are padding (>= `rows`, below M). One MMA then gives both terms' sums of each
        score in one lane. None where no shift does (every row live, or C puts a row's
        shift in another lane, as gfx936's one-row-per-lane layout does)."""
        c = self.instruction.c.coords
        live = [i for i in range(c.shape[1]) if i not in self.dead_c_slots(rows)]
        for shift in range(rows, self.instruction.m - real + 1):
            partner = {}
            for i in live:
                same = [j for j in range(c.shape[1])
                        if (c[:, j, 1] == c[:, i, 1]).all()
                        and (c[:, j, 0] == c[:, i, 0] + shift).all()]
                if not same:
                    break
                partner[i] = same[0]
            else:
                return shift, partner
        return None

    def column_sum_slots(self, rows: int,
                         reserved=frozenset()) -> tuple[dict[int, int], list[int]] | None:
        """Unsigned W's column sums for free: ({live slot: dead slot in the same
        lane holding the same column on every lane}, the rows of those dead
        slots). With those rows of the A tile all ones, the MMAC puts sum Vq
        over its K tokens next to each live element. None where a live slot has
        no such partner (e.g. every row real): the kernel then runs one more
        MMAC with A all ones. `reserved`: rows of the A tile that hold W (those of
        another atom's scores, when PV runs on a second instruction)."""
        c = self.instruction.c.coords
        dead = self.dead_c_slots(rows)
        live = [i for i in range(c.shape[1]) if i not in dead]
        partner = {}
        for i in live:
            same = [j for j in dead if (c[:, j, 1] == c[:, i, 1]).all()
                    and not set(c[:, j, 0].tolist()) & set(reserved)]
            if not same:
                return None
            partner[i] = same[0]
        ones = sorted(set(c[:, list(set(partner.values())), 0].ravel().tolist()))
        if set(ones) & set(c[:, live, 0].ravel().tolist()):
            return None
        return partner, ones

    # PV: B = V tokens x head dim, V loaded per the model's scheme.
    def v_loads(self) -> int:
        return self.model.mmacs_per_wave * self.instruction.b.slots // \
            self.model.v_load.bytes_per_lane

    def v_load_alignment(self, row_tokens: int) -> int:
        """Bytes every V load of a lane is aligned to, in a token-innermost cache of
        `row_tokens`-byte rows read from multiples of the wave's tokens (a partition, a
        tile, or a block of `row_tokens`): its width, where each starts at a multiple."""
        return min(self.model.v_load.bytes_per_lane, power_of_two_divisor(row_tokens),
                   power_of_two_divisor(self.model.wave_tokens),
                   *(self.v_load_start(u).alignment() for u in range(self.v_loads())))

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
