"""Numpy references for int8attn's numerics contract (docs/design.md §2).

`exact_attention` is the accuracy yardstick: float64 attention on the
dequantized cache with unquantized Q (causal for prefill), returned as f32.

`fragment_attention` is the contract itself, step by step in f32: INT8 QK,
decode partitions or prefill online-softmax tiles, W = P*sV, W quantized per
group of tokens that one MMAC consumes -- read from the fragment model, like
the compiler -- int32 sums per group, rescale, merge. It is the one reference
implementation of the contract; compiled modules must match it to f32 rounding.

`error_model` says how far the INT8 results may be from those, per output.

The numerics variant travels whole as a `Numerics` (contract/numerics.py): every
function here that depends on it takes `numerics=`, default the contract's
`Numerics()` (q-terms 2, w-quant u8, w-terms 2); `ONE_TERM_NUMERICS` is one INT8 term each
(`SEED_NUMERICS`, its old name, is a deprecated alias).
"""

from ..contract.numerics import ONE_TERM_NUMERICS, SEED_NUMERICS, Numerics
from .common import (PV_MODES, Q_TERMS, W_OFFSET, W_QUANTS, W_TERMS, PVKind,
                     QTerms, WQuant, WTerms, quantize, quantize_cache,
                     quantize_q, quantize_w, quantize_w_terms, round_to_bf16,
                     w_residual)
from .error_model import (TIE_WINDOW, bf16_rounding_error_scale,
                          qk_quantization_error_bound,
                          qk_quantization_error_scale, rounding_tie_slack,
                          w_quantization_error_scale)
from .error_split import TERMS, error_split
from .exact import exact_attention
from .key_bias import channel_bias, quantize_keys, subtract_bias
from .fragment import fixed_p_scale_attention, fragment_attention, fragment_softmax_pv
from .paged import (exact_paged_attention, fragment_paged_attention,
                    paged_cache_write, sequence_cache)

__all__ = ["Numerics", "ONE_TERM_NUMERICS", "SEED_NUMERICS", "TERMS", "error_split", "PV_MODES", "PVKind", "Q_TERMS", "QTerms", "quantize_q",
           "W_OFFSET", "W_QUANTS", "WQuant", "quantize_w", "W_TERMS", "WTerms",
           "quantize_w_terms", "w_residual", "TIE_WINDOW", "quantize",
           "quantize_cache", "round_to_bf16", "channel_bias", "quantize_keys", "subtract_bias",
           "exact_attention", "fragment_attention", "exact_paged_attention",
           "fragment_paged_attention", "paged_cache_write", "sequence_cache", "fragment_softmax_pv", "fixed_p_scale_attention", "w_quantization_error_scale",
           "qk_quantization_error_scale", "qk_quantization_error_bound", "bf16_rounding_error_scale",
           "rounding_tie_slack"]
