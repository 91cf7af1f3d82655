"""QK's scores as PV's A operand, in registers: the FlashAttention-2 feed, derived.

QK leaves a wave's scores in C tiles; PV takes W (one value per score) in its A
operand. Where both put a query row in the same lanes, W need not go through
LDS: choosing which token each QK C column holds (the order in which the
wave's K rows enter QK's B tiles) makes each lane's C elements exactly the
(row, token) pairs its A registers take. `score_feed` derives that order and
the register map from the two layouts, or says there is none.

Both sides are linear layouts (fragments/mma_layouts.py):

    scores  S: (register, block, lane) -> (row, token)   token = block*N + C column
    PV's A  A: (register, mmac, lane)  -> (row, token)   A's (row, k), k through
                                                          `k_slot_tokens`

A feed is a bijection `order` (S's token -> wave token) and a lane-independent
`source` ((A register, mmac) -> (C register, block)) with

    A(x, lane) = (row, order(token)) where (row, token) = S(source(x), lane).

Each lane bit must move the row alike in S and A; it pins `order` on S's token
image. Each register / MMAC bit of A is paired with the first unpaired register /
block bit of S that moves the row alike; their token images pin `order` there.
The W scale groups do not move: MMAC t still consumes the tokens of
`k_slot_tokens` (the instruction and the V loads); only QK's K rows are read in
another order.
"""

from __future__ import annotations

from dataclasses import dataclass

from .linear_layout import LinearLayout, NotInvertible
from .mma_layouts import k_slot_tokens, mma_layouts, score_layout
from .model import FragmentModel

I = LinearLayout.identity


@dataclass(frozen=True)
class ScoreFeed:
    """`order`: token -> token, the wave token QK's C column position holds;
    `source`: (register, mmac) -> (register, block), the score element that
    register `register` of PV MMAC `mmac`'s A operand takes."""

    order: LinearLayout
    source: LinearLayout

    def element(self, register: int, mmac: int) -> tuple[int, int]:
        """(C register, block) of A register `register` of PV MMAC `mmac`."""
        image = self.source.apply(register=register, mmac=mmac)
        return image["register"], image["block"]


def a_token_layout(pv: FragmentModel) -> LinearLayout:
    """(register, mmac, lane) -> (row, token): the (row, wave token) of each A
    register of each PV MMAC."""
    inst = pv.instruction
    a = mma_layouts(inst).a.rename(outs={"col": "k"}) * I("mmac", pv.mmacs_per_wave)
    rows = I("row", a.out_size("row"))
    return a.compose(rows * k_slot_tokens(pv)).transpose_ins(("register", "mmac", "lane"))


def _bits(layout: LinearLayout, dims) -> list[tuple[str, int, dict]]:
    return [(dim, bit, basis) for dim in dims for bit, basis in enumerate(layout.bases(dim))]


def score_feed(qk: FragmentModel, pv: FragmentModel) -> ScoreFeed | None:
    """The feed from QK's scores (model `qk`) to PV's A operand (model `pv`), or
    None where the layouts put a row in other lanes (e.g. AMD's C, a row per
    register, against A's row per lane)."""
    scores, a = score_layout(qk), a_token_layout(pv)
    if (qk.wave_tokens != pv.wave_tokens or scores.out_shape != a.out_shape
            or scores.in_bits("lane") != a.in_bits("lane")):
        return None
    pins = []                                    # (S token image, A token image)
    for (_, _, s), (_, _, x) in zip(_bits(scores, ["lane"]), _bits(a, ["lane"])):
        if s["row"] != x["row"]:
            return None
        pins.append((s["token"], x["token"]))
    unpaired = _bits(scores, ["register", "block"])
    source = {"register": [], "mmac": []}
    for dim, _, x in _bits(a, ["register", "mmac"]):
        match = next((bit for bit in unpaired if bit[2]["row"] == x["row"]), None)
        if match is None:
            return None
        unpaired.remove(match)
        s_dim, s_bit, s = match
        source[dim].append({s_dim: 1 << s_bit})
        pins.append((s["token"], x["token"]))
    if unpaired:
        return None
    tokens = [("token", qk.wave_tokens)]
    pinned = LinearLayout({"pin": [{"token": s} for s, _ in pins]}, tokens)
    wanted = LinearLayout({"pin": [{"token": x} for _, x in pins]}, tokens)
    try:
        order = pinned.invert().compose(wanted)
    except NotInvertible:
        return None
    if not order.is_bijective():
        return None
    source_layout = LinearLayout(source, [("register", scores.in_size("register")),
                                          ("block", scores.in_size("block"))])
    feed = ScoreFeed(order, source_layout)
    return feed if _feeds(feed, scores, a) else None


def _feeds(feed: ScoreFeed, scores: LinearLayout, a: LinearLayout) -> bool:
    """Does the feed give every A register of every lane its (row, token)?"""
    ordered = scores.compose(I("row", scores.out_size("row")) * feed.order)
    fed = (feed.source * I("lane", a.in_size("lane"))).compose(ordered)
    return fed.transpose_ins(("register", "mmac", "lane")) == a
