"""The numerics a bench's modules are compiled with and checked against: `--numerics`
(`int8attn bench --mode paged` and `prefill`) by name, and their record in a prepared
folder's manifest, which the runners read back (`manifest_numerics`)."""

from __future__ import annotations

import dataclasses
import sys

from .contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS, Numerics

# --numerics NAME: one INT8 term each (q-terms 1, s8 W, one W term); two-term digits
# (two terms of q and W, each second a digit: the lane kernels' default); the cpu
# pipeline's defaults (two scaled terms, u8 W).
CHOICES = ("one-term", "digits", "defaults")
# The old spellings, still accepted with a note on stderr.
DEPRECATED = {"seed": "one-term", "kernel": "digits"}


def numerics_name(text: str) -> str:
    """`--numerics`'s argparse type: an old spelling becomes its new name, with a
    one-line note on stderr; anything else is left to argparse's choices."""
    if text in DEPRECATED:
        print(f"note: --numerics {text} is deprecated; it is --numerics "
              f"{DEPRECATED[text]}", file=sys.stderr)
        return DEPRECATED[text]
    return text


def bench_numerics(name: str | None, default: str) -> Numerics:
    """The numerics `--numerics NAME` names (None: the mode's `default`; one of
    `CHOICES`, or an old spelling of one)."""
    name = default if name is None else DEPRECATED.get(name, name)
    if name not in CHOICES:
        raise ValueError(f"--numerics {name!r}: one of {', '.join(CHOICES)}")
    if name == "one-term":
        return ONE_TERM_NUMERICS
    if name == "digits":
        return DIGIT_NUMERICS
    from .pipelines import PIPELINE_NUMERICS

    return PIPELINE_NUMERICS


def manifest_numerics(meta: dict) -> Numerics:
    """The numerics of the modules a manifest describes (one-term numerics' fields where
    a manifest predates them)."""
    return dataclasses.replace(ONE_TERM_NUMERICS, **{f.name: meta[f.name] for f in
                                                     dataclasses.fields(Numerics)
                                                     if f.name in meta})
