"""The numerics a bench's modules are compiled with and checked against: `--numerics`
(`int8attn bench --mode paged` and `prefill`) by name, and their record in a prepared
folder's manifest, which the runners read back (`manifest_numerics`)."""

from __future__ import annotations

import dataclasses

from .contract.numerics import ONE_TERM_NUMERICS, Numerics

# --numerics NAME: the seed's (q-terms 1, s8 W, one W term), the kernel targets' default
# (two terms of Q and W, as digits), the cpu pipeline's defaults (two terms, u8 W).
CHOICES = ("seed", "kernel", "defaults")


def bench_numerics(name: str | None, default: str) -> Numerics | None:
    """The numerics `--numerics NAME` names (None: the mode's `default`, one of
    `CHOICES`); None for "kernel": the kernel target's own, which compile resolves."""
    name = default if name is None else name
    if name not in CHOICES:
        raise ValueError(f"--numerics {name!r}: one of {', '.join(CHOICES)}")
    if name == "seed":
        return ONE_TERM_NUMERICS
    if name == "kernel":
        return None
    from .pipelines import PIPELINE_NUMERICS

    return PIPELINE_NUMERICS


def manifest_numerics(meta: dict) -> Numerics:
    """The numerics of the modules a manifest describes (the seed's fields where a
    manifest predates them)."""
    return dataclasses.replace(ONE_TERM_NUMERICS, **{f.name: meta[f.name] for f in
                                                 dataclasses.fields(Numerics) if f.name in meta})
