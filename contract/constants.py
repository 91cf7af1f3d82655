"""The numerics contract's constants and option types.

See docs/design.md §2 (the contract) and docs/design.md §2c (the variants).

Plain Python: the numpy references, the option declarations, the dialects and the
IR rules (`scalar_ir`) all read them from here.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np

# The PV product: INT8 (the contract), or the baselines (docs/design.md §2).
PVKind = Literal["int8", "bf16", "f32"]
PV_MODES = get_args(PVKind)
# How many INT8 terms q is quantized into (docs/design.md §2c, two-term Q).
QTerms = Literal[1, 2]
Q_TERMS = get_args(QTerms)
# How W is quantized per MMAC group (docs/design.md §2c): symmetric s8 (127 levels
# for W >= 0), or unsigned u8 stored as s8 `u - W_OFFSET` with the offset
# compensated exactly in the int32 accumulator by W_OFFSET * sum Vq.
WQuant = Literal["s8", "u8"]
W_QUANTS = get_args(WQuant)
W_OFFSET = 128
# How many INT8 terms W is quantized into per MMAC group (docs/design.md §2c,
# two-term W): the first as w_quant says, the second (signed) on its f32 residual.
WTerms = Literal[1, 2]
W_TERMS = get_args(WTerms)
# How a two-term value (q, W) gets its second term (docs/design.md §2c): "scaled",
# the f32 residual quantized on its own absmax (a/127); or "digit", the value
# quantized once on DIGIT_BASE times finer levels and split into a high and a low
# INT8 digit, the low one's scale s1 / DIGIT_BASE, so that one integer multiply-add
# joins the two MMAC sums before the one conversion to f32.
SecondTerm = Literal["scaled", "digit"]
SECOND_TERMS = get_args(SecondTerm)
DIGIT_BASE = 256
# Scores are in log2 units (docs/design.md §2): the softmax is exp2 of a score less its
# row's max, and the score's constant is softmax_scale * log2 e, rounded once to f32,
# which each query row's scale takes up (`score_scale`). So a kernel's exp2 takes the
# score as it is, with no multiply by log2 e and none by softmax_scale per score.
LOG2_E = math.log2(math.e)
LN_2 = math.log(2.0)


def score_scale(softmax_scale: float) -> float:
    """c = f32(f32(softmax_scale) * log2 e): the one constant of every score (an f32
    value as a Python float). Each query row's scale is multiplied by it once, sQ * c."""
    with np.errstate(over="ignore"):
        return float(np.float32(float(np.float32(softmax_scale)) * LOG2_E))


def softmax_scale_problem(value) -> str | None:
    """Why `value` cannot be a softmax_scale, as a predicate for the caller to name it
    ("must be positive and finite, got -0.5"), or None: it must be a number, positive
    and finite as the f32 the graph holds, and so must the scores' constant
    `score_scale` (about 1.44x it). The one rule the verifiers, the graph builders and
    the serving API state."""
    try:
        scale = float(value)
    except (TypeError, ValueError):
        return f"must be a number, got {value!r}"
    with np.errstate(over="ignore"):
        as_f32 = float(np.float32(scale))
    if not (np.isfinite(as_f32) and as_f32 > 0):
        shown = f" ({as_f32} as an f32)" if np.isfinite(scale) and scale > 0 else ""
        return f"must be positive and finite, got {value!r}{shown}"
    if not np.isfinite(score_scale(scale)):
        return (f"must be at most about 2.3e38: {value!r} overflows f32 once the scores' "
                f"constant softmax_scale * log2 e is taken")
    return None


# A row whose absmax is below this quantizes to zero (127/a would overflow f32).
# Every implementation (IR rules, kernels, numpy references) reads it from here.
QUANTIZE_MIN_ABSMAX = 2.0 ** -118

# The largest |product| of a W level and an int8 V value, per W kind: s8 levels
# and V in [-128, 127]; unsigned u = Wq + W_OFFSET in [0, 255]. What bounds the
# exact sums of a group in f32 (< 2^24) or i32 (< 2^31).
MAX_W_V_PRODUCT = {"s8": 128 * 128, "u8": 255 * 128}
# The same for a Q level (or digit, in [-128, 127]) and an int8 K value.
MAX_Q_K_PRODUCT = 128 * 128

QMAX = 127.0
UMAX = 255.0
# x + 1.5*2^23 - 1.5*2^23 is roundeven(x) for |x| <= 2^22 in f32's round-to-nearest-even
# arithmetic: the sum has no bits below 1, so the add rounds x to an integer, ties to
# even. Two adds where math.roundeven expands to about eight instructions on the GPU
# targets. The contract clamps x * inv to the (integer) level range first, which
# rounds the same (rounding is monotonic) and keeps the product a separate rounding:
# an add fed straight by the multiply may be contracted into an fma by the backend
# (LLVM does on x86 and NVPTX), which rounds the exact product instead.
ROUND_BIAS = 1.5 * 2.0 ** 23
# Its f32 bits. For an integer n with |n| <= EXACT_BIAS_RANGE, ROUND_BIAS + n is an f32
# whose bits are ROUND_BIAS_BITS + n (the binades [2^23, 2^24] step by 1): the GPU
# kernels read a rounded level off those bits, and turn an exact int32 sum into f32
# the other way round, instead of the conversion instructions (quarter rate).
ROUND_BIAS_BITS = 0x4B400000
EXACT_BIAS_RANGE = 2 ** 22
# ROUND_BIAS / DIGIT_BASE = 1.5*2^15: its sums with |y| <= 2^14 step by 1/DIGIT_BASE, so
# adding it rounds y to DIGIT_BASE-times finer levels (ties to even) and the bits less
# DIGIT_ROUND_BIAS_BITS are the level t = roundeven(y * DIGIT_BASE): the digits' rounding
# with no multiply (whose y * inv * DIGIT_BASE form, inv * DIGIT_BASE, overflows f32 for
# absmaxes below 2^-112).
DIGIT_ROUND_BIAS = ROUND_BIAS / DIGIT_BASE
DIGIT_ROUND_BIAS_BITS = ROUND_BIAS_BITS - ((DIGIT_BASE.bit_length() - 1) << 23)
# Both biases' bits end in a zero byte (the digits' in two: their high digit is the
# biased sum shifted down a byte), so a level's low byte can be read off the biased
# sum's bits with no subtract. LEVEL_BYTE is the width of a level handed over as such
# an i32, its low byte the level and the bias's bits above it, to a sink that only
# packs bytes (a byte permute takes no mask, and the backend cannot see through it)
# for an MMA that scales each group's sum by the group's scale: a non-finite group's
# level is then left as NaN's bits (its scale is NaN; `scalar_ir.to_int`).
assert ROUND_BIAS_BITS % (1 << 8) == 0 and DIGIT_ROUND_BIAS_BITS % (1 << 16) == 0
LEVEL_BYTE = 32
