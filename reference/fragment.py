"""The numerics contract step by step in f32, with fragment-model W groups.

Both modes reduce to blocks of tokens (decode partitions of 256, prefill
tiles of 64) with a weight W per (row, block, token) and a factor `omega`
per (row, block): the final output is sum_n omega_n * PV_n(W). Decode:
W = P * sV with P normalized in its partition, omega = the log-sum-exp merge
weight. Prefill: W = 2^(score - m_n) * sV with m_n the running max after
tile n, omega_n = 2^(m_n - m_N) / l_N. Scores are in log2 units (`int8_scores`),
so every exp of the contract is exp2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..contract.numerics import Numerics
from ..fragments import NUMPY_OPS, FragmentModel, ceil_div, pv_model_named
from .common import (F32, PV_MODES, float_pv, group_rows, int8_pv_terms,
                     int8_scores, pad_tokens, pv_chain, row_chunks)

# Bytes per (row, token) held at once: the QK sums, scores, P, W and their
# temporaries (f32); the PV sums per (row, block) add 16 * D / block_tokens.
_BYTES_PER_SCORE = 24


@dataclass(frozen=True)
class Blocks:
    p: np.ndarray          # [B,Hkv,R,N,T] f32 probabilities (decode) / exp weights (prefill)
    w: np.ndarray          # [B,Hkv,R,N,T] f32: p * sV
    v_blocks: np.ndarray   # [B,Hkv,N,T,D] int8
    omega: np.ndarray      # [B,Hkv,R,N] f64: d(output) / d(PV_n)
    alpha: np.ndarray      # [B,Hkv,R,N] prefill rescale per tile (decode: merge weights)
    l: np.ndarray          # [B,Hkv,R,N] decode: partition sums; prefill: sum_t p per tile


def _split(scores, v, v_scale, block_tokens):
    batch, kv_heads, rows, tokens = scores.shape
    blocks = ceil_div(NUMPY_OPS, tokens, block_tokens)
    padded = blocks * block_tokens
    head_dim = v.shape[-1]
    scores = pad_tokens(scores, 3, padded, -np.inf).reshape(
        batch, kv_heads, rows, blocks, block_tokens)
    v_blocks = pad_tokens(v, 2, padded, 0).reshape(batch, kv_heads, blocks, block_tokens, head_dim)
    vs_blocks = pad_tokens(v_scale, 2, padded, 0).reshape(
        batch, kv_heads, blocks, block_tokens).astype(F32)
    return scores, v_blocks, vs_blocks


def decode_blocks(scores, v, v_scale, partition_tokens) -> Blocks:
    """Steps 2-4 of decode: partitions, softmax per partition, W = P*sV."""
    scores, v_blocks, vs_blocks = _split(scores, v, v_scale, partition_tokens)
    m = scores.max(axis=-1)
    e = np.exp2(scores - m[..., None]).astype(F32)
    l = e.sum(axis=-1, dtype=F32)
    p = e / l[..., None]
    w = (p * vs_blocks[:, :, None, :, :]).astype(F32)
    merge = (np.exp2(m - m.max(axis=-1, keepdims=True)) * l).astype(F32)
    omega = merge.astype(np.float64) / merge.sum(axis=-1, keepdims=True)
    return Blocks(p, w, v_blocks, omega, merge, l)


def prefill_blocks(scores, v, v_scale, tile_tokens) -> Blocks:
    """Online softmax over tiles: running max, unnormalized W = p * sV."""
    scores, v_blocks, vs_blocks = _split(scores, v, v_scale, tile_tokens)
    running = np.maximum.accumulate(scores.max(axis=-1), axis=-1)          # m_n
    previous = np.concatenate([np.full_like(running[..., :1], -np.inf), running[..., :-1]], -1)
    with np.errstate(invalid="ignore"):
        dead = running == -np.inf
        alpha = np.where(dead, F32(1), np.exp2(previous - running)).astype(F32)
        p = np.where(dead[..., None], F32(0), np.exp2(scores - running[..., None])).astype(F32)
    tile_sums = p.sum(axis=-1, dtype=F32)
    l = np.zeros(running.shape[:-1], dtype=F32)
    for n in range(running.shape[-1]):                  # the loop's order of operations
        l = alpha[..., n] * l + tile_sums[..., n]
    w = (p * vs_blocks[:, :, None, :, :]).astype(F32)
    with np.errstate(invalid="ignore"):
        omega = np.where(dead, 0.0, np.exp2(running.astype(np.float64) - running[..., -1:]))
    omega = omega / l[..., None]
    return Blocks(p, w, v_blocks, omega, alpha, tile_sums)


def blocks_for(q, k, k_scale, v, v_scale, softmax_scale, *, partition_tokens=256,
               tile_tokens=64, numerics: Numerics = Numerics()) -> Blocks:
    """The blocks of decode (q [B,Hq,D]) or prefill; W's values follow `numerics.q_terms`."""
    scores = int8_scores(q, k, k_scale, softmax_scale, numerics=numerics)
    if q.ndim == 3:
        return decode_blocks(scores, v, v_scale, partition_tokens)
    return prefill_blocks(scores, v, v_scale, tile_tokens)


def fragment_attention(q, k, k_scale, v, v_scale, softmax_scale: float, *, pv: str = "int8",
                       model: str = "gfx936", partition_tokens: int = 256,
                       tile_tokens: int = 64, fragments: FragmentModel | None = None,
                       scale_groups: str = "fragment", numerics: Numerics = Numerics(),
                       progress: Callable[[str], None] | None = None) -> np.ndarray:
    """The contract in f32: decode for q [B,Hq,D], causal prefill for [B,Hq,Sq,D].

    `fragments` overrides the named model (e.g. another V-load scheme);
    `scale_groups="contiguous"` reproduces contiguous (wrong) W groups like the compiler does;
    `numerics` is the variant (docs/design.md §2c), default the contract's `Numerics()`
    (q-terms 2, w-quant u8, w-terms 2; `ONE_TERM_NUMERICS` is one term each): q in `q_terms`
    INT8 terms, W unsigned (u8, the offset compensated exactly) or symmetric (s8), in
    `w_terms` INT8 terms (the second signed, on the first's residual).
    Works through the query rows in chunks (common.row_chunks), calling
    `progress` with a short line after each.
    """
    mode = "decode" if q.ndim == 3 else "prefill"
    block_tokens = partition_tokens if mode == "decode" else tile_tokens
    batch, kv_heads, tokens, head_dim = k.shape
    out = np.empty(group_rows(np.asarray(q), kv_heads).shape, dtype=F32)   # [B,Hkv,R,D]
    per_token = _BYTES_PER_SCORE + 16 * head_dim // max(block_tokens, 1)
    for chunk in row_chunks(out.shape[2], batch * kv_heads * tokens * per_token,
                            progress, "fragment reference", batch * kv_heads):
        scores = int8_scores(q, k, k_scale, softmax_scale, chunk, numerics=numerics)
        out[:, :, chunk] = fragment_softmax_pv(scores, v, v_scale, mode, pv=pv, model=model,
                                               block_tokens=block_tokens, fragments=fragments,
                                               scale_groups=scale_groups, numerics=numerics)
    return out.reshape(q.shape)


def fragment_softmax_pv(scores, v, v_scale, mode: str, *, pv: str = "int8",
                        model: str = "gfx936", block_tokens: int | None = None,
                        fragments: FragmentModel | None = None,
                        scale_groups: str = "fragment",
                        numerics: Numerics = Numerics()) -> np.ndarray:
    """Softmax and PV of the contract on given scores [B,Hkv,R,S] (-inf = masked).

    Returns [B,Hkv,R,D]; `block_tokens` is the partition (decode, 256) or
    tile (prefill, 64) size; `numerics` as for `fragment_attention` (its w-quant and
    w-terms apply here: the scores already hold q's terms).
    """
    if pv not in PV_MODES:
        raise ValueError(f"pv must be one of {PV_MODES}, got {pv!r}")
    if mode == "decode":
        st = decode_blocks(scores, v, v_scale, block_tokens or 256)
    else:
        st = prefill_blocks(scores, v, v_scale, block_tokens or 64)
    if pv == "int8":
        model = fragments or pv_model_named(model)
        groups = model.token_groups(st.w.shape[-1])
        scales = model.scale_groups(st.w.shape[-1], scale_groups)
        sums, sw = int8_pv_terms(st.w, st.v_blocks, groups,
                                 None if scale_groups == "fragment" else scales, numerics)
        # the tile's chain goes on from `start` (decode: +0; prefill: α·o)
        tile = lambda n, start: pv_chain([a[:, :, :, n] for a in sums],
                                         [s[:, :, :, n] for s in sw], start)
    else:
        partial = float_pv(st.w, st.v_blocks, pv)                          # [B,Hkv,R,N,D]
        tile = lambda n, start: start + partial[:, :, :, n]
    if mode == "decode":
        zero = np.zeros(st.w.shape[:3] + st.v_blocks.shape[-1:], F32)
        partial = np.stack([tile(n, zero) for n in range(st.w.shape[3])], axis=3)
        numerator = np.einsum("bhrn,bhrnd->bhrd", st.alpha, partial).astype(F32)
        return (numerator / st.alpha.sum(axis=-1, dtype=F32)[..., None]).astype(F32)
    return _online_output(st, tile)


def _online_output(st: Blocks, tile: Callable) -> np.ndarray:
    """Prefill: o' = tile n's PV into alpha o (`tile(n, alpha o)`) and
    l' = alpha l + sum p over the tiles, O = o / l."""
    o = np.zeros(st.w.shape[:3] + st.v_blocks.shape[-1:], dtype=F32)
    l = np.zeros(st.w.shape[:3], dtype=F32)
    for n in range(st.w.shape[3]):                  # the loop's order of operations
        o = tile(n, (st.alpha[..., n, None] * o).astype(F32))
        l = st.alpha[..., n] * l + st.l[..., n]
    return (o / l[..., None]).astype(F32)


def fixed_p_scale_attention(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                            tile_tokens: int = 64,
                            numerics: Numerics = Numerics()) -> np.ndarray:
    """Causal prefill as the contract computes it but for PV: the tile's p = 2^(s - m)
    (in [0, 1]) quantized with the fixed scale 1/127 (INT-FlashAttention's INT8 P),
    Pq = roundeven(127 p), and O accumulated from (Pq / 127) * sV * Vq in f32. The
    comparison point for the contract's per-MMAC dynamic W scales: the same scores,
    online softmax and l; only how the weights are quantized differs."""
    scores = int8_scores(q, k, k_scale, softmax_scale, numerics=numerics)
    st = prefill_blocks(scores, v, v_scale, tile_tokens)
    _, _, v_scales = _split(scores, v, v_scale, tile_tokens)               # [B,Hkv,N,T]
    levels = np.rint(st.p * F32(127)).astype(F32)
    fixed = (levels / F32(127)) * v_scales[:, :, None]
    partial = float_pv(fixed.astype(F32), st.v_blocks, "f32")
    return _online_output(st, lambda n, start: start + partial[:, :, :, n]).reshape(q.shape)
