"""bf16 rounding, the one definition: f32 to the nearest bf16, ties to even.

numpy has no bf16 dtype: values are held as f32 whose low 16 bits are zero. The
references (BF16 PV's W) and the runtime (a bf16 argument given as f32) both round
with `round_to_bf16`.
"""

from __future__ import annotations

import numpy as np


def round_to_bf16(x) -> np.ndarray:
    """Round f32 to the nearest bf16 (ties to even), returned as f32. A NaN stays a NaN
    (rounding a NaN's bits could carry its payload into Inf's); past bf16's largest
    finite value the result is Inf, as a bf16 conversion gives."""
    values = np.asarray(x, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = (bits + (((bits >> 16) & 1) + np.uint32(0x7FFF))) & np.uint32(0xFFFF0000)
    out = rounded.astype(np.uint32).view(np.float32)
    return np.where(np.isnan(values), np.float32(np.nan), out).astype(np.float32)


def bf16_bits(x) -> np.ndarray:
    """The bf16 bits (uint16) of `x` rounded to bf16 (`round_to_bf16`): what a bf16
    buffer holds."""
    rounded = np.ascontiguousarray(round_to_bf16(x))
    return (rounded.view(np.uint32) >> 16).astype(np.uint16)
