"""One value for the contract's numerics variants (docs/design.md §2c).

Which INT8 terms q and W are quantized into, and how W is quantized per MMAC
group, travel together as a `Numerics`: the options declare the fields, the
target spec holds each kernel target's default, and the kernels, the
references and the simulator take the value whole.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from .constants import (DIGIT_BASE, Q_TERMS, W_QUANTS, SECOND_TERMS, W_TERMS, QTerms, WQuant, SecondTerm,
                        WTerms)


@dataclass(frozen=True)
class Numerics:
    """The contract's variants; the defaults are the pipeline's (the cpu target's)."""

    q_terms: QTerms = 2      # INT8 terms of q (a second one quantizes the residual)
    w_quant: WQuant = "u8"   # W per MMAC group: symmetric s8, or u8 with its offset
    w_terms: WTerms = 2      # INT8 terms of W per group (a second, signed, on the residual)
    w_second: SecondTerm = "scaled"   # two-term W: the second term's own scale, or a digit
    q_second: SecondTerm = "scaled"   # two-term Q: likewise

    def __post_init__(self):
        for name, allowed in (("q_terms", Q_TERMS), ("w_quant", W_QUANTS),
                              ("w_terms", W_TERMS), ("w_second", SECOND_TERMS),
                              ("q_second", SECOND_TERMS)):
            value = getattr(self, name)
            # exactly one of the choices: not True for 1, 2.0 for 2 or "2" for 2
            if not any(type(value) is type(choice) and value == choice for choice in allowed):
                raise ValueError(f"numerics {name}={value!r}: expected one of "
                                 f"{', '.join(map(str, allowed))}")
        for value, terms in (("w", self.w_terms), ("q", self.q_terms)):
            if getattr(self, f"{value}_second") == "digit" and terms != 2:
                raise ValueError(f"{value}-second digit splits {value.upper()} into two INT8 "
                                 f"terms: it needs {value}-terms 2 (got {terms})")

    @property
    def unsigned_w(self) -> bool:
        return self.w_quant == "u8"

    def updated(self, **given) -> "Numerics":
        """This value with the `given` fields replaced; a second-term choice not given
        becomes "scaled" where its value is left with one term (a digit needs two)."""
        for value in ("q", "w"):
            terms = given.get(f"{value}_terms", getattr(self, f"{value}_terms"))
            if terms == 1 and f"{value}_second" not in given:
                given[f"{value}_second"] = "scaled"
        return replace(self, **given)

    def check_head_dim(self, head_dim: int) -> None:
        """q digits join Σ high·Kq · BASE + Σ low·Kq in int32 (|high| <= 127, |low| and
        |Kq| <= 128): refuse a head dim whose joined sums could overflow it."""
        if self.q_digits and head_dim * 128 * (127 * DIGIT_BASE + 128) >= 2 ** 31:
            raise ValueError(f"q-second digit joins the two QK sums in int32, which a head "
                             f"dim of {head_dim} could overflow (head dim x 128 x 32640 must "
                             f"stay below 2^31: at most 512); use q-second scaled")

    @property
    def w_digits(self) -> bool:
        return self.w_second == "digit"

    @property
    def q_digits(self) -> bool:
        return self.q_second == "digit"

    def describe(self) -> str:
        shown = [f for f in fields(self)
                 if not f.name.endswith("_second") or getattr(self, f.name) == "digit"]
        return ", ".join(f"{f.name.replace('_', '-')} {getattr(self, f.name)}" for f in shown)


# One INT8 term each of q and of W, symmetric W: the write-up's numerics that the
# project grew from (docs/design.md §2c).
ONE_TERM_NUMERICS = Numerics(q_terms=1, w_quant="s8", w_terms=1)

# The lane kernels' default: two terms of q and of W, symmetric W, each second term a
# digit. As accurate as the pipeline's (two scaled terms each, u8 W) on the accuracy
# families (benchmarks/results/2026-12-04-h200-paged-decode-default-numerics/), and
# cheap: the low digits take padding rows of the same MMA tiles where the C layout
# allows (for W, the rows u8's column sums would need), and one integer multiply-add
# joins each pair of sums before the one conversion to f32 (kernels/qk_stages.py,
# kernels/pv_stages.py).
DIGIT_NUMERICS = Numerics(q_terms=2, w_quant="s8", w_terms=2, w_second="digit",
                          q_second="digit")

# Deprecated aliases, kept so code written against the old names still imports:
# SEED_NUMERICS is ONE_TERM_NUMERICS, KERNEL_NUMERICS is DIGIT_NUMERICS.
SEED_NUMERICS = ONE_TERM_NUMERICS
KERNEL_NUMERICS = DIGIT_NUMERICS
