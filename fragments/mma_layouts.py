"""The fragment model as linear layouts: operands, V loads, W scale groups, shuffles.

Each matrix instruction's operands are `LinearLayout`s (register, lane) ->
(row, col), built in fragments/mma_atoms.py as products of identities read off
the ISA lane tables (docs/design.md §3): gfx936's A, `A[l % 16][8(l / 16) + j]`, is

    identity(register, 8 -> col) * identity(lane, 16 -> row) * identity(lane, 4 -> col)

(the product puts the second factor's bits above the first's, in and out).
From those and a model's V load scheme, everything that docs/design.md §4
derives by enumeration follows by composition and inversion:

- `v_load_layout`: (byte, load, lane) -> (token, head_dim) of a wave's V loads;
- `k_slot_tokens`: (k, mmac) -> token, the B layout's inverse composed with the
  register feed and the V loads: the token behind each K slot of each MMAC;
- `group_tokens` / `token_set`: a block's W scale groups and, for one group,
  its tokens as the preimage of the group index (a coset, not a search);
- `score_layout` / `xor_partners`: the lane bits a row (or row, MMAC)
  reduction shuffles over, the lane bases whose image in the kept dims is 0.

The operand layouts are the MMA atoms' (fragments/mma_atoms.py); fragments/instructions.py
and fragments/model.py keep tables enumerated from them, and tests/test_linear_layout.py
checks what is derived here against the model's enumerations element by element.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from .instructions import MatrixInstruction, OperandLayout
from .linear_layout import LinearLayout
from .mma_atoms import ATOMS
from .model import FragmentModel

I = LinearLayout.identity


@dataclass(frozen=True)
class MmaLayouts:
    """One instruction's A, B, C operand layouts: (register, lane) -> (row, col)."""

    name: str
    a: LinearLayout
    b: LinearLayout
    c: LinearLayout

    def operand(self, which: str) -> LinearLayout:
        return {"a": self.a, "b": self.b, "c": self.c}[which.lower()]


# The layouts are the atoms' (fragments/mma_atoms.py): one source for both views.
MMA_LAYOUTS: dict[str, MmaLayouts] = {
    name: MmaLayouts(name, atom.layout("a"), atom.layout("b"), atom.layout("c"))
    for name, atom in ATOMS.items()}


def mma_layouts(instruction: MatrixInstruction | str) -> MmaLayouts:
    """An instruction's operand layouts: its atom's, when they reproduce its lane
    tables; else fitted from its tables (a model built on altered
    tables, as the tests of wrong layouts do, gets the layouts of what it says)."""
    if isinstance(instruction, str):
        try:
            return MMA_LAYOUTS[instruction]
        except KeyError:
            raise KeyError(f"no linear layouts for '{instruction}' (known: "
                           f"{', '.join(MMA_LAYOUTS)})") from None
    return _layouts_of(instruction)


@lru_cache(maxsize=None)
def _layouts_of(instruction: MatrixInstruction) -> MmaLayouts:
    written = MMA_LAYOUTS.get(instruction.name)
    operands = {"a": instruction.a, "b": instruction.b, "c": instruction.c}
    if written is not None and all(
            np.array_equal(written.operand(k).table(["lane", "register"], ["row", "col"]),
                           table.coords) for k, table in operands.items()):
        return written
    return MmaLayouts(instruction.name, *(fit_operand(t) for t in operands.values()))


def fit_operand(table: OperandLayout) -> LinearLayout:
    """(register, lane) -> (row, col) of a lane table; NotLinear if it has none."""
    rows = int(table.coords[..., 0].max()) + 1
    cols = int(table.coords[..., 1].max()) + 1
    size = lambda n: 1 << (n - 1).bit_length()
    return LinearLayout.from_function(
        {"register": table.slots, "lane": table.lanes}, {"row": size(rows), "col": size(cols)},
        lambda register, lane: dict(zip(("row", "col"), map(int, table.coords[lane, register]))))


# -- the V load scheme and the tokens of each K slot ------------------------------------

def _lane_bits(b: LinearLayout) -> tuple[list[int], list[int]]:
    """B's lane bits that move the K row (the lane group, by K row) and the column."""
    group, column = [], []
    for bit, basis in enumerate(b.bases("lane")):
        if basis["row"] and basis["col"]:
            raise ValueError(f"lane bit {bit} of B moves both K row and column: {basis}")
        (group if basis["row"] else column).append(bit)
    return sorted(group, key=lambda bit: b.basis("lane", bit)["row"]), column


def _loads(model: FragmentModel) -> int:
    """V loads per lane: its bytes for all PV MMACs in `bytes_per_lane` loads."""
    width = model.v_load.bytes_per_lane
    lane_bytes = model.mmacs_per_wave * model.instruction.b.slots
    if lane_bytes % width:
        raise ValueError(f"{model.name}: the V load scheme with {width}-byte loads does not "
                         f"cover the wave's {model.wave_tokens} tokens exactly once (a lane "
                         f"holds {lane_bytes} V bytes)")
    return lane_bytes // width


def v_load_layout(model: FragmentModel) -> LinearLayout:
    """(byte, load, lane) -> (token, head_dim): a wave's V loads from the
    token-innermost cache. Lanes holding the same K rows of B form a lane group;
    one load gives a lane `bytes_per_lane` consecutive tokens of its B column,
    successive loads continue after all lane groups' bytes (docs/design.md §4)."""
    inst, width = model.instruction, model.v_load.bytes_per_lane
    b = mma_layouts(inst).b
    group, column = _lane_bits(b)
    loads = _loads(model)
    lane = LinearLayout({"lane": [
        {"token": 1 << group.index(bit)} if bit in group else
        {"head_dim": b.basis("lane", bit)["col"]} for bit in range(b.in_bits("lane"))]},
        [("token", 1 << len(group)), ("head_dim", b.out_size("col"))])
    return (I("byte", width, "token") * lane
            * I("load", loads, "token")).transpose_ins(("byte", "load", "lane"))


def register_feed(model: FragmentModel) -> LinearLayout:
    """(register, mmac) -> (byte, load): MMAC t takes a lane's V bytes
    `slots*t .. slots*t + slots - 1`, in load order."""
    slots, width = model.instruction.b.slots, model.v_load.bytes_per_lane
    flat = I("register", slots, "flat") * I("mmac", model.mmacs_per_wave, "flat")
    return flat.reshape_outs([("byte", width), ("load", _loads(model))])


def pv_token_layout(model: FragmentModel) -> LinearLayout:
    """(register, mmac, lane) -> (token, head_dim) of each PV B register."""
    feed = register_feed(model) * I("lane", model.instruction.wave_size)
    return feed.compose(v_load_layout(model))


def k_slot_tokens(model: FragmentModel) -> LinearLayout:
    """(k, mmac) -> token (within the wave) that K slot k of PV MMAC `mmac` consumes:
    B's inverse, (k, n) -> (register, lane), composed with `pv_token_layout`."""
    b = mma_layouts(model.instruction).b.rename(outs={"row": "k", "col": "n"})
    slots_of = b.invert() * I("mmac", model.mmacs_per_wave)
    full = slots_of.compose(pv_token_layout(model))      # (k, n, mmac) -> (token, head_dim)
    if any(basis["token"] for basis in full.bases("n")):
        raise ValueError(f"{model.name}: lanes disagree on the token of a K slot "
                         "(the V load scheme's token depends on B's column)")
    if full.sublayout(["n"], ["head_dim"]) != I("n", full.in_size("n"), "head_dim") or any(
            basis["head_dim"] for d in ("k", "mmac") for basis in full.bases(d)):
        raise ValueError(f"{model.name}: the V loads do not give B column n head-dim n")
    tokens = full.sublayout(["k", "mmac"], ["token"])
    if tokens.out_size("token") != model.wave_tokens or not tokens.is_bijective():
        raise ValueError(f"{model.name}: the V load scheme with {model.v_load.bytes_per_lane}"
                         f"-byte loads does not cover the wave's {model.wave_tokens} tokens "
                         "exactly once")
    return tokens


def group_tokens(model: FragmentModel, block_tokens: int) -> LinearLayout:
    """(k, group) -> token of a block of whole waves; MMAC group = wave * mmacs + mmac.
    A chained model's group is `chain` consecutive MMACs, its K slots step after step
    (k = step * K + MMAC slot), as `FragmentModel.token_groups` lists them."""
    waves, rest = divmod(block_tokens, model.wave_tokens)
    if rest or waves & (waves - 1):
        raise ValueError(f"a block of {block_tokens} tokens is not a power-of-two number "
                         f"of {model.wave_tokens}-token waves")
    mmacs = model.mmacs_per_wave * waves
    if mmacs % model.chain:
        raise ValueError(f"a block of {block_tokens} tokens holds {mmacs} MMACs of "
                         f"K={model.instruction.k}, not a whole number of {model.chain}-MMAC "
                         f"chains")
    block = k_slot_tokens(model) * I("wave", waves, "token")
    return block.reshape_ins([("k", model.group_size), ("group", mmacs // model.chain)])


def token_slots(model: FragmentModel, block_tokens: int | None = None) -> LinearLayout:
    """token -> (k, group): which K slot of which group consumes each token."""
    return group_tokens(model, block_tokens or model.wave_tokens).invert()


def token_set(model: FragmentModel, group: int, block_tokens: int | None = None) -> np.ndarray:
    """The sorted tokens of W scale group `group`: the preimage of `group` under
    token -> group (a coset of the tokens that do not change the group)."""
    owner = token_slots(model, block_tokens).sublayout(["token"], ["group"])
    return owner.preimage(group=group)["token"]


# -- scores in the C layout and the xor-shuffle partners ---------------------------------

def score_layout(model: FragmentModel, order: LinearLayout | None = None) -> LinearLayout:
    """(register, block, lane) -> (row, token): a wave's QK scores, `blocks` C tiles
    of N tokens (element (n, i) of lane l is row c_row[i](l), token n*N + c_col[i](l));
    with `order` (token -> token, fragments/score_feed.py), C column position p
    holds wave token order(p)."""
    inst = model.instruction
    c = mma_layouts(inst).c.rename(outs={"col": "token"})
    scores = (c * I("block", model.wave_tokens // inst.n, "token")).transpose_ins(
        ("register", "block", "lane"))
    if order is None:
        return scores
    return scores.compose(I("row", scores.out_size("row")) * order)


def score_group_layout(model: FragmentModel, pv: FragmentModel | None = None,
                       order: LinearLayout | None = None) -> LinearLayout:
    """(register, block, lane) -> (row, k, group): the W scale group of each score, the
    groups of PV's model `pv` (default `model`'s own: QK and PV on one instruction)."""
    scores = score_layout(model, order)
    return scores.compose(I("row", scores.out_size("row")) * token_slots(pv or model))


def xor_partners(layout: LinearLayout, keep: Sequence[str], dim: str = "lane") -> tuple[int, ...]:
    """The `dim` xor offsets that leave every output in `keep` unchanged: the bits
    whose basis is 0 there (a butterfly over them reduces within each class)."""
    return tuple(1 << bit for bit, basis in enumerate(layout.bases(dim))
                 if not any(basis[name] for name in keep))


def row_reduction_offsets(model: FragmentModel) -> tuple[int, ...]:
    """Softmax row max / sum: lanes that hold the same rows."""
    return xor_partners(score_layout(model), ["row"])


def group_reduction_offsets(model: FragmentModel,
                            pv: FragmentModel | None = None) -> tuple[int, ...]:
    """W absmax per (row, MMAC): lanes that hold the same rows and groups."""
    return xor_partners(score_group_layout(model, pv), ["row", "group"])
