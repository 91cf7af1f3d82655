"""lower-paged-attention: decode over the paged cache as loops over sequences and partitions.

Rewrites `int8attn.paged_attention` (B, NB, MB possibly dynamic) into

    for b in [0, B):                                     (scf.for, B = dim(q, 0))
      qq, sq = int8attn.quantize(q[b] grouped by KV head)   (q-terms=2: and the residual's)
      len = context_lens[b]
      for p in [0, ceil(len / T)):                       (scf.for carrying M, L, O)
        k, k_scale, v, v_scale = the partition's T tokens, gathered through
            block_tables[b, t // BS], slot t % BS (the paged CacheLayout's rules,
            fragments/cache_layout.py); a token past len reads the sequence's
            last used table slot (never an unused one) and its scales are 0
        scores = (f32(qq . k) * (sq * c)) * k_scale;  -inf past len   (log2 units,
            c = softmax_scale * log2 e; q-terms=2: (f32(qq1 . k) * (s1 * c) +
            f32(qq2 . k) * (s2 * c)) * k_scale: `int8_qk.int8_scores`)
        m_p, l_p, P = partition softmax;  O_p = int8attn.pv(P, v, v_scale)
        M' = max(M, m_p);  w = exp2(m_p - M') l_p
        L' = exp2(M - M') L + w;  O' = exp2(M - M') O + w O_p
      out[b] = O / L

Chunked prefill (q [B, Hq, Sq, D]: each sequence's last Sq tokens) loops over
the sequence's `tile-tokens`-token KV tiles instead, gathered the same way:
scores with the causal mask of a sequence of len_b tokens (history len_b - Sq,
`contract.causal_visible`), and the dense prefill's online-softmax step
(`prefill_online_softmax.online_softmax_tile`) carrying (m, l, o); out = o / l.

Each partition is the dense decode contract's (T = `partition-tokens` over the
sequence's own length, the same `int8attn.pv` and so the same W groups), with
static shapes inside the loops; one compiled module serves every B, NB, MB and
mix of lengths. The running merge equals the contract's all-partition merge in
exact arithmetic (f32 rounding may differ in the last bits).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith, scf, tensor

from ..dialects import int8attn as d
from ..dialects import builders as build
from ..contract import scalar_ir as contract
from .decode_split_kv import DecodeSplitKV, partition_softmax
from .int8_qk import Int8QK, group_query_rows, int8_scores, quantize_q, ungroup_query_rows
from .prefill_online_softmax import PrefillOnlineSoftmax, causal_mask, online_softmax_tile
from .rewrite import apply_patterns
from ..contract.constants import QTerms
from ..fragments.cache_layout import CacheLayout, arith_ops, ceil_div
from ..fragments.model import MAX_BLOCK_TOKENS
from ..support.options import TypedOptions, option


def _index_of(tensor_value: ir.Value, indices) -> ir.Value:
    """An i32 tensor element as an index."""
    return arith.index_cast(ir.IndexType.get(), tensor.ExtractOp(tensor_value, indices).result)


class _Sequence:
    """Addresses of sequence `b`'s tokens in the block pool: the paged `CacheLayout`'s
    rules, emitted (docs/design.md §2b)."""

    def __init__(self, op: d.PagedAttentionOp, b: ir.Value, length: ir.Value):
        self.op, self.b, self.length = op, b, length
        self.layout = CacheLayout.paged(op.block_size)
        self.rules = self.layout.rules(arith_ops(build.index))
        # The block size constant, made here once: every rule of the sequence reuses it.
        self.block_size = self.rules.bs
        # The last table slot the sequence uses: tokens past its length read this one.
        self.last_slot = self.rules.last_table_slot(length)

    def address(self, token: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """(block, offset, token < length) of a token of the sequence."""
        block = self.rules.block(token, lambda slot: _index_of(self.op.block_tables,
                                                               [self.b, slot]), self.last_slot)
        live = self.rules.live(token, self.length)
        return block, self.rules.offset(token), live

    def gather(self, start: ir.Value, tokens: int, what: str) -> ir.Value:
        """The partition's `tokens` tokens of k ([1,Hkv,T,D]), v ([1,Hkv,1,T,D]) or of a
        scale ([1,Hkv,1,T], 0 past the length)."""
        op, layout = self.op, self.layout
        kv_heads, head_dim = d.shape_of(op.k_cache)[1], d.shape_of(op.k_cache)[3]
        shapes = {"k": [1, kv_heads, tokens, head_dim], "v": [1, kv_heads, 1, tokens, head_dim],
                  "k_scale": [1, kv_heads, 1, tokens], "v_scale": [1, kv_heads, 1, tokens]}
        shape = shapes[what]
        token_dim = 2 if what == "k" else 3
        element = "i8" if what in ("k", "v") else "f32"

        def body(_):
            loops = [build.loop_index(i) for i in range(len(shape))]
            head, t = loops[1], loops[token_dim]
            block, offset, live = self.address(arith.addi(start, t))
            if what == "k":
                at = layout.k_index(block, head, offset, loops[3])
                return tensor.ExtractOp(op.k_cache, list(at)).result
            if what == "v":
                at = layout.v_index(block, head, offset, loops[4])
                return tensor.ExtractOp(op.v_cache, list(at)).result
            scales = op.k_scale if what == "k_scale" else op.v_scale
            value = tensor.ExtractOp(scales, list(layout.scale_index(block, head, offset))).result
            return arith.select(live, value, build.f32(0.0))

        dims = "abcde"[:len(shape)]
        return build.generic([], [], dims, build.empty(shape, element), body)


def _masked_scores(scores: ir.Value, start: ir.Value, seq: _Sequence) -> ir.Value:
    """scores [1,Hkv,R,T] with -inf at tokens start + t past the sequence's length."""
    def body(s, _):
        live = seq.rules.live(arith.addi(start, build.loop_index(3)), seq.length)
        return arith.select(live, s, build.f32(float("-inf")))

    return build.generic([scores], ["bhrt"], "bhrt", build.empty(d.shape_of(scores), "f32"), body)


def _partition(op, seq: _Sequence, terms, p, tokens: int):
    """(m_p, l_p [1,Hkv,R], O_p [1,Hkv,R,D]) of partition p of the sequence."""
    start = arith.muli(p, build.index(tokens))
    k = seq.gather(start, tokens, "k")
    k_scale = build.collapse(seq.gather(start, tokens, "k_scale"), [[0], [1], [2, 3]])
    scores = _masked_scores(int8_scores(terms, k, k_scale, op.softmax_scale), start, seq)
    batch, kv_heads, rows, _ = d.shape_of(scores)
    m, l, probs = partition_softmax(build.expand(scores, [[0], [1], [2], [3, 4]],
                                                 [batch, kv_heads, rows, 1, tokens]))
    v = seq.gather(start, tokens, "v")
    partial = d.pv(probs, v, seq.gather(start, tokens, "v_scale"),
                   build.zeros([batch, kv_heads, rows, 1, d.shape_of(v)[-1]], "f32"))
    return (build.collapse(m, [[0], [1], [2, 3]]), build.collapse(l, [[0], [1], [2, 3]]),
            build.collapse(partial, [[0], [1], [2], [3, 4]]))


def _merge(state, part):
    """The running log-sum-exp merge of one more partition into (M, L, O)."""
    (m_run, l_run, o_run), (m_p, l_p, o_p) = state, part
    rows = d.shape_of(m_run)
    m_new = build.generic([m_run, m_p], ["bhr", "bhr"], "bhr", build.empty(rows, "f32"),
                          lambda a, b, _: arith.maximumf(a, b))
    keep = build.generic([m_run, m_new], ["bhr", "bhr"], "bhr", build.empty(rows, "f32"),
                         lambda old, new, _: contract.exp2(arith.subf(old, new)))
    weight = build.generic([m_p, l_p, m_new], ["bhr", "bhr", "bhr"], "bhr",
                           build.empty(rows, "f32"),
                           lambda m_i, l_i, new, _: arith.mulf(contract.exp2(arith.subf(m_i, new)), l_i))
    l_new = build.generic([keep, l_run, weight], ["bhr", "bhr", "bhr"], "bhr",
                          build.empty(rows, "f32"),
                          lambda a, l_i, w, _: arith.addf(arith.mulf(a, l_i), w))
    o_new = build.generic([keep, o_run, weight, o_p], ["bhr", "bhrd", "bhr", "bhrd"], "bhrd",
                          build.empty(d.shape_of(o_run), "f32"),
                          lambda a, o_i, w, x, _: arith.addf(arith.mulf(a, o_i), arith.mulf(w, x)))
    return m_new, l_new, o_new


def _count(length: ir.Value, unit: int) -> ir.Value:
    """ceil(length / unit)."""
    return ceil_div(arith_ops(build.index), length, unit)


def _decode_sequence(op, seq: _Sequence, terms, state, partition_tokens: int):
    """(L, O) of one sequence's decode: its partitions merged by a running LSE."""
    partitions = scf.ForOp(build.index(0), _count(seq.length, partition_tokens),
                           build.index(1), state)
    with ir.InsertionPoint(partitions.body):
        part = _partition(op, seq, terms, partitions.induction_variable, partition_tokens)
        scf.YieldOp(list(_merge(list(partitions.inner_iter_args), part)))
    return partitions.results[1], partitions.results[2]


def _prefill_sequence(op, seq: _Sequence, terms, state, query_tokens: int, tile_tokens: int):
    """(l, o) of one sequence's chunked prefill: its last `query_tokens` tokens
    attend causally, tile by tile (the dense prefill contract's tiles)."""
    history = arith.subi(seq.length, build.index(query_tokens))
    tiles = scf.ForOp(build.index(0), _count(seq.length, tile_tokens), build.index(1), state)
    with ir.InsertionPoint(tiles.body):
        start = arith.muli(tiles.induction_variable, build.index(tile_tokens))
        k = seq.gather(start, tile_tokens, "k")
        k_scale = build.collapse(seq.gather(start, tile_tokens, "k_scale"), [[0], [1], [2, 3]])
        scores = causal_mask(int8_scores(terms, k, k_scale, op.softmax_scale), query_tokens,
                             history, start)
        batch, kv_heads, rows, _ = d.shape_of(scores)
        s_tile = build.expand(scores, [[0], [1], [2], [3, 4]],
                              [batch, kv_heads, rows, 1, tile_tokens])
        scf.YieldOp(list(online_softmax_tile(
            s_tile, seq.gather(start, tile_tokens, "v"), seq.gather(start, tile_tokens, "v_scale"),
            *tiles.inner_iter_args)))
    return tiles.results[1], tiles.results[2]


def lower_paged(op: d.PagedAttentionOp, rewriter, partition_tokens: int, q_terms: int = 1,
                tile_tokens: int = 64):
    q = op.q
    q_shape = d.shape_of(q)
    q_heads, head_dim = q_shape[1], q_shape[-1]
    query_tokens = q_shape[2] if len(q_shape) == 4 else None
    kv_heads = d.shape_of(op.k_cache)[1]
    rows = q_heads // kv_heads * (query_tokens or 1)
    one = [1] + q_shape[1:]
    with rewriter.ip, op.location:
        batch = tensor.DimOp(q, build.index(0)).result
        # A static batch stays static: the result has the op's own type.
        size = batch if q_shape[0] == d.DYNAMIC else q_shape[0]
        result = tensor.EmptyOp([size] + q_shape[1:], ir.F32Type.get()).result
        sequences = scf.ForOp(build.index(0), batch, build.index(1), [result])
        with ir.InsertionPoint(sequences.body):
            b, out = sequences.induction_variable, sequences.inner_iter_args[0]
            q_b = build.unit_slice(q, 0, b)
            if d.element_of(q) != "f32":
                q_b = arith.extf(d.tensor(one, "f32"), q_b)
            terms = quantize_q(group_query_rows(q_b, kv_heads), q_terms)
            seq = _Sequence(op, b, _index_of(op.context_lens, [b]))
            state = [build.full([1, kv_heads, rows], "f32", build.f32(float("-inf"))),
                     build.zeros([1, kv_heads, rows], "f32"),
                     build.zeros([1, kv_heads, rows, head_dim], "f32")]
            if query_tokens is None:
                l_final, o_final = _decode_sequence(op, seq, terms, state, partition_tokens)
            else:
                l_final, o_final = _prefill_sequence(op, seq, terms, state, query_tokens,
                                                     tile_tokens)
            o_b = build.generic([o_final, l_final], ["bhrd", "bhr"], "bhrd",
                                build.empty([1, kv_heads, rows, head_dim], "f32"),
                                lambda o_i, l_i, _: arith.divf(o_i, l_i))
            scf.YieldOp([build.insert_unit_slice(ungroup_query_rows(o_b, one), out, 0, b)])
    rewriter.replace_op(op, [sequences.results[0]])


@dataclass(frozen=True)
class LowerPagedAttention(TypedOptions):
    """Lower paged decode (and chunked prefill) to loops over sequences and their
    partitions (tiles) gathered through the block table."""

    argument: ClassVar[str] = "lower-paged-attention"
    # The defaults of the passes it does the work of (class attributes: their defaults).
    partition_tokens: int = option(DecodeSplitKV.partition_tokens, "tokens per decode "
                                   "partition", minimum=1, maximum=MAX_BLOCK_TOKENS)
    q_terms: QTerms = option(Int8QK.q_terms, "INT8 terms of q, as int8-qk's")
    tile_tokens: int = option(PrefillOnlineSoftmax.tile_tokens, "tokens per KV tile of a "
                              "chunked prefill", minimum=1,
                              maximum=MAX_BLOCK_TOKENS)

    def run(self, module: ir.Operation) -> None:
        apply_patterns(module, {d.PAGED_ATTENTION: lambda op, rw: lower_paged(
            op, rw, self.partition_tokens, self.q_terms, self.tile_tokens)})
