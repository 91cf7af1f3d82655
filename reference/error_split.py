"""Where the INT8 error comes from: the split of docs/design.md §1.

Against exact attention on the float cache (unquantized q, K, V), the
pipeline's output O_int8 = sum_n omega_n sum_t Wq_t sW_t Vq_t differs by

    total = O_int8 - O_exact
          = [sum omega p V - O_kdeq]             INT8 Q (through P)
          + [O_kdeq - O_exact]                   K cache (through P)
          + [sum omega p (sV Vq - V)]            V cache: sum P * (-eV)
          + [sum omega (W~ - W) Vq]              W quantization: sum eW * Vq
          + [O_int8 - its fragment-level value]  f32 rounding of the module

with p the pipeline's own weights (decode: P per partition; prefill: the
unnormalized tile weights), omega its block factors, O_kdeq exact attention
(unquantized q) on the dequantized K cache and the float V, and W~ the value
the MMAC's sum really weights V by: Wq sW (w-quant s8) or (Wq + 128) sW
(u8, the offset compensated), plus Wq2 sW2 with two-term W. The terms follow the module's variant (q-terms,
w-quant, scale groups). Each term is computed here from its definition, so
their sum matching `total` checks the module.
"""

from __future__ import annotations

import numpy as np

from ..contract.numerics import Numerics
from ..fragments import NUMPY_OPS, ceil_div, pv_model_named
from .common import F32, pad_tokens, quantize_w_terms, w_levels
from .exact import exact_attention
from .fragment import blocks_for

TERMS = ("q_quantization", "k_cache", "v_cache", "w_quantization")


def _blocks_of(x: np.ndarray, block_tokens: int) -> np.ndarray:
    """[B,Hkv,S,...] -> [B,Hkv,N,T,...], zero-padded."""
    blocks = ceil_div(NUMPY_OPS, x.shape[2], block_tokens)
    padded = pad_tokens(x, 2, blocks * block_tokens, 0)
    return padded.reshape(x.shape[:2] + (blocks, block_tokens) + x.shape[3:])


def error_split(q, k, k_scale, v, v_scale, k_float, v_float, softmax_scale: float,
                output: np.ndarray, *, model: str = "gfx936", partition_tokens: int = 256,
                tile_tokens: int = 64, scale_groups: str = "fragment",
                numerics: Numerics = Numerics()) -> dict[str, np.ndarray]:
    """The terms above (each shaped like q), plus `total` and `exact`.

    `scale_groups` and `numerics` must be the module's ("contiguous" to split
    contiguous (wrong) W groups).
    """
    st = blocks_for(q, k, k_scale, v, v_scale, softmax_scale, partition_tokens=partition_tokens,
                    tile_tokens=tile_tokens, numerics=numerics)
    block_tokens = st.w.shape[-1]
    ones = np.ones_like(k_scale, dtype=np.float32)
    exact = exact_attention(q, k_float, ones, v_float, ones, softmax_scale).astype(np.float64)
    k_deq = exact_attention(q, k, k_scale, v_float, ones, softmax_scale).astype(np.float64)
    v_float_blocks = _blocks_of(v_float.astype(np.float64), block_tokens)
    v_deq_blocks = _blocks_of(v.astype(np.float64) * v_scale[..., None], block_tokens)
    p = st.p.astype(np.float64)

    def merged(per_token):  # sum_n omega_n sum_t p_t x_t for x = [B,Hkv,N,T,D]
        per_block = np.einsum("bhrnt,bhntd->bhrnd", p, per_token)
        return np.einsum("bhrn,bhrnd->bhrd", st.omega, per_block).reshape(q.shape)

    model = pv_model_named(model)
    groups = model.token_groups(block_tokens)
    amax = np.abs(st.w[..., model.scale_groups(block_tokens, scale_groups)]).max(axis=-1)
    terms = quantize_w_terms(st.w[..., groups], numerics, amax)
    e_w = -st.w[..., groups].astype(np.float64)
    for term, (wq, sw) in enumerate(terms):
        levels = w_levels(wq, numerics.w_quant if term == 0 else "s8").astype(np.float64)
        e_w = e_w + levels * sw[..., None].astype(np.float64)
    v_groups = st.v_blocks[:, :, :, groups, :].astype(np.float64)
    w_term = np.einsum("bhrn,bhrnd->bhrd", st.omega,
                       np.einsum("bhrngk,bhngkd->bhrnd", e_w, v_groups)).reshape(q.shape)
    return {
        "exact": exact.astype(F32),
        "total": output.astype(np.float64) - exact,
        "q_quantization": merged(v_float_blocks) - k_deq,
        "k_cache": k_deq - exact,
        "v_cache": merged(v_deq_blocks - v_float_blocks),
        "w_quantization": w_term,
    }
