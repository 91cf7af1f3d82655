"""The driver's options: the pipeline's, plus the target. Declared once.

`CompileOptions` is what determines a compiled artifact (and so the module
cache key). Its fields are the `int8attn compile/run` flags and the
`int8attn.compile(...)` keywords; `PipelineOptions` (its base) is what the
named pipelines read. Which options a target accepts is in its row of the
stage table (`driver.targets`); an option that does not apply is refused.
What an option needs to apply at all, whatever the target (`w_quant` needs
`pv=int8`, `q_second` needs `q_terms=2`, ...), is the pipeline's table
`APPLIES_WHEN` plus `COMPILE_APPLIES_WHEN` here; `CompileOptions.refusal()` applies it
to the options the caller gave, and `Target.check` raises it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, replace
from typing import Literal, get_args

from ..fragments import FragmentModelName, PVAtomName, fragment_model, pv_model
from ..pipelines import (NO_W_GROUPS, APPLIES_WHEN, PIPELINE_NUMERICS, AppliesWhen,
                         PipelineOptions, refusal)
from ..contract.constants import QTerms, WQuant, SecondTerm, WTerms
from ..contract.numerics import Numerics
from ..kernels.target_spec import TARGET_SPECS
from ..support.cpu_vectors import VectorISA
from ..support.options import OptionError, check_fields, kebab, option

TargetName = Literal["cpu", "gfx936", "gfx942", "cuda"]
TARGET_NAMES = get_args(TargetName)
# The numerics a kernel target resolves the q-terms / w-quant / w-terms options to
# when they are not given: its target spec's (kernels/target_spec.py; the same on
# every kernel target so far, which the option help states as one value); --target
# cpu resolves them to the pipeline's defaults (`Numerics()`).
_KERNEL_DEFAULTS = {name: spec.numerics for name, spec in TARGET_SPECS.items()}
assert len(set(_KERNEL_DEFAULTS.values())) == 1, "the option help states one kernel default"
KERNEL_TARGET_NUMERICS: Numerics = next(iter(_KERNEL_DEFAULTS.values()))
# Deprecated alias of KERNEL_TARGET_NUMERICS, kept so code using the old name still imports.
KERNEL_NUMERICS = KERNEL_TARGET_NUMERICS
# The CompileOptions fields a `Numerics` declares (`numerics=` gives all of them).
NUMERICS_FIELDS = tuple(f.name for f in dataclasses.fields(Numerics))

# The driver's own "applies when" rows, after the pipeline's (pipelines.APPLIES_WHEN).
COMPILE_APPLIES_WHEN: tuple[AppliesWhen, ...] = APPLIES_WHEN + (
    AppliesWhen("w_second", "pv", ("int8",), NO_W_GROUPS),
    AppliesWhen("w_second", "w_terms", (2,), "it chooses how the second W term is made, "
                "and one W term has none"),
    AppliesWhen("q_second", "q_terms", (2,), "it chooses how the second q term is made, "
                "and one q term has none"),
    AppliesWhen("pv_atom", "pv", ("int8",), "it names the INT8 matrix instruction PV runs "
                "on; a float PV runs on the target's bf16 MMA"),
)


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
    q_terms: QTerms | None = option(
        None, "INT8 terms of q: 1, or 2 (a second term quantizes the f32 residual q - Qq1*s1; "
        f"docs/design.md §2c). Default: {PipelineOptions.q_terms} on cpu (the pipeline's), "
        f"{KERNEL_TARGET_NUMERICS.q_terms} on the kernel targets")
    w_quant: WQuant | None = option(
        None, "W per MMAC group: s8, or u8 (255 levels as u - 128, offset compensated by 128 * "
        f"sum Vq; docs/design.md §2c). Default: {PipelineOptions.w_quant} on cpu (the pipeline's), "
        f"{KERNEL_TARGET_NUMERICS.w_quant} on the kernel targets")
    w_terms: WTerms | None = option(
        None, "INT8 terms of W per MMAC group: 1, or 2 (a second, signed term quantizes the f32 "
        f"residual W - level*sW1; docs/design.md §2c). Default: {PipelineOptions.w_terms} on cpu "
        f"(the pipeline's), {KERNEL_TARGET_NUMERICS.w_terms} on the kernel targets")
    q_second: SecondTerm | None = option(
        None, "q-terms 2: how the second q term is made: scaled (the residual on its own "
        "absmax) or digit (q quantized once on 256x finer levels, split into two INT8 digits "
        "whose QK sums one integer multiply-add joins; the lane kernels only; "
        f"docs/design.md §2c). Default: {PIPELINE_NUMERICS.q_second} on cpu, "
        f"{KERNEL_TARGET_NUMERICS.q_second} on the kernel targets")
    w_second: SecondTerm | None = option(
        None, "w-terms 2: how the second W term is scaled: scaled (its own absmax over the "
        "residual), or digit (W quantized once on 256x finer levels, split into a high and a "
        "low INT8 digit whose MMAC sums one integer multiply-add joins; the lane kernels "
        f"only; docs/design.md §2c). Default: {PIPELINE_NUMERICS.w_second} on cpu, "
        f"{KERNEL_TARGET_NUMERICS.w_second} on the kernel targets")
    target_cpu: str = option(
        "host", "cpu only: the CPU IREE compiles for (--iree-llvmcpu-target-cpu): host (this "
        "machine's), or an LLVM CPU name such as x86-64-v3 (AVX2), x86-64-v4 (AVX-512), "
        "znver4, sapphirerapids; a module for another CPU can be compiled here but runs "
        "only where that CPU's features are")
    vector_isa: VectorISA | None = option(
        None, "Python API only, contraction=mmt4d: derived from --target-cpu "
        "(support/cpu_vectors.py); a value given must be that CPU's")
    pv_atom: PVAtomName | None = option(
        None, "kernel targets, pv=int8: the INT8 matrix instruction PV runs on, the target's "
        "own by default (QK's); gfx942 also offers v_mfma_i32_32x32x16_i8, whose 16-token "
        "MMAC groups the W scales then follow (int8attn targets lists each target's)")
    kernel_object: str | None = option(
        None, "gfx936, gfx942: package this AMDGPU code object (.co, built from --emit llvm "
        "with the command its manifest gives) into the vmfb instead of IREE's own build; it "
        "is checked against this graph first (processor, kernels, the IR it was built from)",
        metavar="K.co")
    v_token_innermost: bool = option(
        False, "kernel targets, Python API only: the host function takes V as [B, Hkv, D, S] "
        "(the kernels' layout, as a paged cache holds it) instead of transposing per call")

    def pipeline_options(self) -> PipelineOptions:
        """The named pipeline's options, with the fragment model and numerics resolved."""
        numerics = asdict(self.numerics)
        for name in ("q_second", "w_second"):   # the lane kernels' alone (cpu refuses digit)
            del numerics[name]
        return PipelineOptions(
            pv=self.pv, fragment_model=self.resolved_fragment_model(),
            scale_groups=self.scale_groups, verify=self.verify,
            partition_tokens=self.partition_tokens, tile_tokens=self.tile_tokens,
            **numerics, w_chain=self.w_chain, contraction=self.contraction,
            vector_isa=self.vector_isa or PipelineOptions.vector_isa)

    @property
    def pv_model_name(self) -> str:
        """The fragment model whose accumulators' token sets the W groups follow: the
        resolved fragment model, or "target:atom" for another PV atom, chained `w_chain`
        times (fragments.pv_model_named reads it; "gfx936" at chain 1)."""
        model = self.resolved_fragment_model()
        atom = None if self.pv_atom == fragment_model(model).instruction.name else self.pv_atom
        return pv_model(model, atom, self.w_chain).name

    def resolved_fragment_model(self) -> str:
        if self.fragment_model is not None:
            return self.fragment_model
        return self.target if self.target in get_args(FragmentModelName) else "gfx936"

    @property
    def default_numerics(self) -> Numerics:
        """The target's numerics: the pipeline's (PIPELINE_NUMERICS, the contract's
        `Numerics()`) on cpu, else the kernel target's spec's."""
        return PIPELINE_NUMERICS if self.target == "cpu" else _KERNEL_DEFAULTS[self.target]

    @property
    def numerics(self) -> Numerics:
        """The resolved `Numerics`: q_terms / w_quant / w_terms / w_second as given, each
        one not given the target's (`default_numerics`)."""
        given = {name: getattr(self, name) for name in asdict(self.default_numerics)}
        try:
            return self.default_numerics.updated(
                **{name: value for name, value in given.items() if value is not None})
        except ValueError as error:      # a combination the contract has no variant for
            raise OptionError(str(error)) from None

    def given(self) -> set[str]:
        """The fields the caller set: those whose value is not the declared default (None
        for most; a recognisable default such as verify=True or contraction=f32 is
        indistinguishable from not giving it here; the CLI, which knows its flags, passes
        them to `refusal`). A `Numerics` given whole
        (all five numerics fields, as `numerics=` passes them) names a variant of the
        contract, which a float PV is compared against: the parts of it that do not apply
        are not counted as given."""
        given = {f.name for f in dataclasses.fields(self)
                 if getattr(self, f.name) != f.default}
        if given.issuperset(NUMERICS_FIELDS):
            given -= set(NUMERICS_FIELDS)
        return given

    def refusal(self, given=None) -> str | None:
        """Why an option the caller gave does nothing with the others (the rules of
        COMPILE_APPLIES_WHEN, tested on the resolved values), or None. `given`: the
        options the caller named (the CLI's flags, at their default values too); None:
        `given()`."""
        return refusal(self._defaults_resolved(), self.given() if given is None else given,
                       COMPILE_APPLIES_WHEN, flag_spelling)

    def _defaults_resolved(self) -> "CompileOptions":
        return replace(self, fragment_model=self.resolved_fragment_model(),
                       **asdict(self.numerics))

    def resolved(self) -> "CompileOptions":
        """Every default resolved for the target (the fragment model, the numerics), and
        every option that does nothing with the others (COMPILE_APPLIES_WHEN) back at its
        declared default: what the module is built from, and options that pass `refusal`
        again, also after `with_pv`."""
        full = self._defaults_resolved()
        idle = {rule.option: _FIELDS[rule.option].default for rule in COMPILE_APPLIES_WHEN
                if getattr(full, rule.depends) not in rule.values}
        return replace(full, **idle)

    def with_pv(self, pv: str) -> "CompileOptions":
        """The same module with PV `pv` (a baseline): resolved again, so the options that
        do nothing with it are dropped, not refused."""
        return replace(self, pv=pv).resolved()

    def __post_init__(self):
        check_fields(self)
        self.pipeline_options()  # the pipeline's own checks, on the resolved model


_FIELDS = {f.name: f for f in dataclasses.fields(CompileOptions)}


def flag_spelling(name: str, value) -> str:
    """An option as the CLI spells it: `--w-quant s8`, `--no-verify`."""
    flag = _FIELDS[name].metadata.get("flag") or f"--{kebab(name)}"
    return flag if isinstance(value, bool) else f"{flag} {value}"
