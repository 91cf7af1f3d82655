"""prefill-online-softmax: causal prefill as a loop over KV tiles.

Rewrites `int8attn.softmax_pv` (prefill, Sq query tokens that are the last Sq
of S) into

    scores = causal mask(scores): token t of row r allowed iff t <= S - Sq + r % Sq
    scf.for n over KV tiles of T tokens, carrying (m, l, o) = (-inf, 0, 0):
        m' = max(m, max_t score_n)
        a  = m' == -inf ? 1 : exp2(m - m')        (a fully masked tile so far)
        p  = m' == -inf ? 0 : exp2(score_n - m')    (unnormalized weights)
        o' = int8attn.pv(p, v_n, v_scale_n, a * o)     (the tile's sums into a * o)
        l' = a * l + sum_t p
    O = o / l

T is `tile_tokens` (64: one wave of the gfx936 kernel). `int8attn.pv` is the
same op decode produces, so the V-scale fold, W group quantization and MMAC
tiles apply unchanged; here W is the unnormalized p * sV.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith, scf

from ..dialects import int8attn as d
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from ..fragments import NUMPY_OPS, HeadMajorRows, arith_ops, ceil_div
from ..fragments.model import MAX_BLOCK_TOKENS
from .rewrite import apply_patterns
from ..support.options import TypedOptions, option


def causal_mask(scores: ir.Value, query_tokens: int, history: int | ir.Value,
                first: ir.Value | None = None) -> ir.Value:
    """scores [B,Hkv,R,T] (rows head-major: query token r % Sq) with -inf where a
    token lies after the row's own query position; token t of the scores is key
    `first + t` (first: 0 unless given) of a sequence of `history` + Sq tokens."""
    neg_inf = build.f32(float("-inf"))

    def body(score, _):
        row, token = build.loop_index(2), build.loop_index(3)
        if first is not None:
            token = arith.addi(first, token)
        query_token = HeadMajorRows(query_tokens).query_token(arith_ops(build.index), row)
        visible = contract.causal_visible(token, query_token, history, build.index)
        return arith.select(visible, score, neg_inf)

    return build.generic([scores], ["bhrt"], "bhrt",
                         build.empty(d.shape_of(scores), "f32"), body)


def _is_neg_inf(x: ir.Value) -> ir.Value:
    return arith.cmpf(arith.CmpFPredicate.OEQ, x, build.f32(float("-inf")))


def online_softmax_tile(s_tile, v_tile, vs_tile, m, l, o):
    """One KV tile of the contract's online softmax: scores s_tile [B,Hkv,R,1,T]
    (-inf where masked), v_tile [B,Hkv,1,T,D], vs_tile [B,Hkv,1,T]; the carried
    (m, l [B,Hkv,R], o [B,Hkv,R,D]) -> (m', l', o') with the guarded alpha."""
    state = d.shape_of(m)
    head_dim = d.shape_of(o)[-1]
    neg_inf = build.f32(float("-inf"))
    m_tile = build.generic([s_tile], ["bhrnt"], "bhr", build.full(state, "f32", neg_inf),
                           lambda s, acc: arith.maximumf(acc, s))
    m_new = build.generic([m, m_tile], ["bhr", "bhr"], "bhr", build.empty(state, "f32"),
                          lambda a, b, _: arith.maximumf(a, b))
    alpha = build.generic(
        [m, m_new], ["bhr", "bhr"], "bhr", build.empty(state, "f32"),
        lambda old, new, _: arith.select(_is_neg_inf(new), build.f32(1.0),
                                         contract.exp2(arith.subf(old, new))))
    p = build.generic(
        [s_tile, m_new], ["bhrnt", "bhr"], "bhrnt", build.empty(d.shape_of(s_tile), "f32"),
        lambda s, new, _: arith.select(_is_neg_inf(new), build.f32(0.0),
                                       contract.exp2(arith.subf(s, new))))
    scaled_l = build.generic([l, alpha], ["bhr", "bhr"], "bhr", build.empty(state, "f32"),
                             lambda l_i, a, _: arith.mulf(a, l_i))
    l_new = build.generic([p], ["bhrnt"], "bhr", scaled_l,
                          lambda p_i, acc: arith.addf(acc, p_i))
    scaled_o = build.generic([o, alpha], ["bhrd", "bhr"], "bhrd",
                             build.empty(state + [head_dim], "f32"),
                             lambda o_i, a, _: arith.mulf(a, o_i))
    tile_acc = build.expand(scaled_o, [[0], [1], [2], [3, 4]], state + [1, head_dim])
    o_new = build.collapse(d.pv(p, v_tile, vs_tile, tile_acc), [[0], [1], [2], [3, 4]])
    return m_new, l_new, o_new


def online_softmax(op: d.SoftmaxPVOp, rewriter, tile_tokens: int):
    if op.mode != "prefill":
        return True  # decode: left for decode-split-kv
    scores, v, v_scale = op.scores, op.v, op.v_scale
    query_tokens = op.query_tokens
    batch, kv_heads, rows, tokens = d.shape_of(scores)
    head_dim = d.shape_of(v)[-1]
    tiles = ceil_div(NUMPY_OPS, tokens, tile_tokens)
    padded = tiles * tile_tokens
    state = [batch, kv_heads, rows]
    with rewriter.ip, op.location:
        neg_inf, zero = build.f32(float("-inf")), build.f32(0.0)
        scores = build.pad_dim(scores, 3, padded, neg_inf)
        scores = build.expand(causal_mask(scores, query_tokens, tokens - query_tokens),
                              [[0], [1], [2], [3, 4]],
                              state + [tiles, tile_tokens])
        v = build.expand(build.pad_dim(v, 2, padded, build.zero("i8")), [[0], [1], [2, 3], [4]],
                         [batch, kv_heads, tiles, tile_tokens, head_dim])
        v_scale = build.expand(build.pad_dim(v_scale, 2, padded, zero), [[0], [1], [2, 3]],
                               [batch, kv_heads, tiles, tile_tokens])
        m0 = build.full(state, "f32", neg_inf)
        l0 = build.zeros(state, "f32")
        o0 = build.zeros(state + [head_dim], "f32")
        loop = scf.ForOp(build.index(0), build.index(tiles), build.index(1), [m0, l0, o0])
        with ir.InsertionPoint(loop.body):
            tile, m, l, o = loop.induction_variable, *loop.inner_iter_args
            s_tile = build.unit_slice(scores, 3, tile)
            v_tile = build.unit_slice(v, 2, tile)
            vs_tile = build.unit_slice(v_scale, 2, tile)
            m_new, l_new, o_new = online_softmax_tile(s_tile, v_tile, vs_tile, m, l, o)
            scf.YieldOp([m_new, l_new, o_new])
        _, l_final, o_final = loop.results
        out = build.generic([o_final, l_final], ["bhrd", "bhr"], "bhrd",
                            build.empty(state + [head_dim], "f32"),
                            lambda o_i, l_i, _: arith.divf(o_i, l_i))
    rewriter.replace_op(op, [out])


@dataclass(frozen=True)
class PrefillOnlineSoftmax(TypedOptions):
    """Causal prefill: an online-softmax loop over `tile_tokens`-token KV tiles."""

    argument: ClassVar[str] = "prefill-online-softmax"
    tile_tokens: int = option(64, "tokens per prefill KV tile", minimum=1,
                              maximum=MAX_BLOCK_TOKENS)

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.SOFTMAX_PV: lambda op, rw: online_softmax(op, rw, self.tile_tokens)})
