"""The driver's options: the pipeline's, plus the target. Declared once.

`CompileOptions` is what determines a compiled artifact (and so the module
cache key). Its fields are the `int8attn compile/run` flags and the
`int8attn.compile(...)` keywords; `PipelineOptions` (its base) is what the
named pipelines read. Which options a target accepts is in its row of the
stage table (`driver.targets`); an option that does not apply is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

from int8attn.fragments import FragmentModelName
from int8attn.pipelines import PipelineOptions
from int8attn.support.options import check_fields, option

TargetName = Literal["cpu", "gfx936", "gfx942", "cuda"]
TARGET_NAMES = get_args(TargetName)


@dataclass(frozen=True)
class CompileOptions(PipelineOptions):
    """Everything that determines a compiled artifact."""

    fragment_model: FragmentModelName | None = option(
        None, "matrix instruction and V-load scheme whose MMAC token sets the W scale groups "
        "follow (cpu only, default gfx936; a kernel target uses its own)")
    target: TargetName = option(
        "cpu", "what to compile for: cpu (tensor-level pipeline on IREE llvm-cpu), gfx936 / "
        "gfx942 / cuda (lane-level decode kernels on that GPU's matrix instruction)")
    iree_flags: tuple[str, ...] = option(
        (), "Python API only: extra iree-compile flags appended to the target's own")
    v_token_innermost: bool = option(
        False, "kernel targets, Python API only: the host function takes V as [B, Hkv, D, S] "
        "(the kernels' layout, as a paged cache holds it) instead of transposing per call")

    def pipeline_options(self) -> PipelineOptions:
        """The named pipeline's options, with the fragment model resolved."""
        return PipelineOptions(self.pv, self.resolved_fragment_model(), self.scale_groups,
                               self.verify, self.partition_tokens, self.tile_tokens,
                               self.q_terms, self.w_quant)

    def resolved_fragment_model(self) -> str:
        if self.fragment_model is not None:
            return self.fragment_model
        return self.target if self.target in get_args(FragmentModelName) else "gfx936"

    def resolved(self) -> "CompileOptions":
        return replace(self, fragment_model=self.resolved_fragment_model())

    def __post_init__(self):
        check_fields(self)
        self.pipeline_options()  # the pipeline's own checks, on the resolved model
