"""Named pipelines: the whole lowering, built from pipeline options.

`int8attn-to-linalg{pv=int8 target=gfx936}` takes an `int8attn.attention`
graph to standard dialects (linalg/tensor/arith/math) that every IREE backend
compiles. Only the PV part differs between `pv` values:

    pv=int8:       quantize-w-groups, verify-scale-groups, pv-to-mmac,
                   verify-scale-groups, lower-mmac-tiles
    pv=bf16|f32:   float-pv

`verify=false` drops the verifier (only to measure a deliberately wrong
`scale-groups=contiguous`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from int8attn.fragments import SCALE_GROUP_KINDS, TARGETS
from int8attn.passes import (DecodeSplitKV, FloatPV, FoldVScale, Int8QK, LowerMMACTiles,
                             LowerQuantize, PrefillOnlineSoftmax, PVToMMAC, QuantizeWGroups,
                             VerifyScaleGroups)
from int8attn.pipelines.manager import PipelineError, UpstreamPass

PV_CHOICES = ("int8", "bf16", "f32")


@dataclass(frozen=True)
class PipelineOptions:
    """Options of the named pipelines (and of `int8attn compile/run`)."""

    pv: str = "int8"
    target: str = "gfx936"
    partition_tokens: int = 256
    tile_tokens: int = 64
    scale_groups: str = "fragment"
    verify: bool = True

    def __post_init__(self):
        if self.pv not in PV_CHOICES:
            raise PipelineError(f"pv must be one of {', '.join(PV_CHOICES)}, got '{self.pv}'")
        if self.target not in TARGETS:
            raise PipelineError(f"target must be one of {', '.join(TARGETS)}, got '{self.target}'")
        if self.scale_groups not in SCALE_GROUP_KINDS:
            raise PipelineError(f"scale-groups must be one of {', '.join(SCALE_GROUP_KINDS)}, "
                                f"got '{self.scale_groups}'")
        for name, tokens in (("partition-tokens", self.partition_tokens),
                             ("tile-tokens", self.tile_tokens)):
            if tokens <= 0:
                raise PipelineError(f"{name} must be positive, got {tokens}")
            if self.pv == "int8":
                try:
                    TARGETS[self.target].token_groups(tokens)
                except ValueError as error:
                    raise PipelineError(f"{name}={tokens} with pv=int8: {error} "
                                        f"({self.target})") from None


def to_linalg(options: PipelineOptions) -> list:
    """The algorithm passes, then cleanup."""
    if options.pv == "int8":
        verify = [VerifyScaleGroups()] if options.verify else []
        pv = [QuantizeWGroups(options.target, options.scale_groups), *verify,
              PVToMMAC(options.target), *verify, LowerMMACTiles()]
    else:
        pv = [FloatPV(options.pv)]
    return [Int8QK(), DecodeSplitKV(options.partition_tokens),
            PrefillOnlineSoftmax(options.tile_tokens), FoldVScale(), *pv,
            LowerQuantize(), UpstreamPass("canonicalize"), UpstreamPass("cse")]


NAMED_PIPELINES = {"int8attn-to-linalg": to_linalg}


def named_pipeline(text: str) -> list:
    """`name{k=v ...}` -> pass list."""
    name, _, rest = text.partition("{")
    name = name.strip()
    if name not in NAMED_PIPELINES:
        raise PipelineError(f"unknown pipeline '{name}'; known pipelines: "
                            f"{', '.join(NAMED_PIPELINES)}")
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(PipelineOptions)}
    options = {}
    for item in rest.rstrip("}").replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            raise PipelineError(f"pipeline '{name}' has no option '{item}' "
                                f"(options: {', '.join(fields)})")
        try:
            options[fields[key].name] = _option_value(fields[key].type, value)
        except ValueError:
            raise PipelineError(f"option '{key}' expects {fields[key].type}, got '{value}'") from None
    return NAMED_PIPELINES[name](PipelineOptions(**options))


def _option_value(kind: str, text: str):
    if kind == "int":
        return int(text)
    if kind == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    return text
