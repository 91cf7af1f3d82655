"""Named pipelines: the tensor-level lowering, built from one options type.

    int8attn-to-algorithm   attention / paged_attention -> INT8 QK, split-KV /
                            loops over sequences and partitions / online softmax,
                            W = P*sV, W groups from the fragment model, verified
                            MMAC tiles (or the float PV baselines); cache_write ->
                            quantize + in-place scatters into the paged cache
    int8attn-to-linalg      the same, then the tiles and quantizations lowered
                            to linalg/arith/math that every IREE backend compiles

Only the PV part differs between `pv` values:

    pv=int8:       quantize-w-groups, verify-scale-groups, pv-to-mmac,
                   verify-scale-groups             (+ lower-mmac-tiles)
                   (`w-chain` reaches quantize-w-groups and pv-to-mmac: one
                   accumulator, one W group, per chain of MMACs)
    pv=bf16|f32:   float-pv

The defaults (q-terms=2, w-quant=u8, w-terms=2: `PIPELINE_NUMERICS`, the contract's
`Numerics()`; `options.numerics` is the three as one value) are what the accuracy
benchmark over data families favours
(benchmarks/results/2026-12-03-cpu-numerics-accuracy/): two-term Q removes the Q
term, two-term W the W term (what one INT8 W term leaves is half a step a/510 on
the weights next to a big one, which a peaked softmax makes large;
benchmarks/results/2026-12-03-cpu-w-rounding-error/), so what stays is the K/V cache's
quantization. With two W terms u8 and s8 first terms measure alike (u8's W term
is ~2x smaller, both far below the rest); u8 stays. q-terms=1 w-quant=s8
w-terms=1 is one-term numerics (`ONE_TERM_NUMERICS`, the write-up's); the lane
kernels default to two-term digits (`DIGIT_NUMERICS`).

`verify=false` drops the verifier (only to measure a deliberately wrong
`scale-groups=contiguous`). `PipelineOptions` declares these options for the
pipeline string, the CLI flags and the API keywords; each default is the one its
pass declares (the numerics: the contract's `Numerics()`), so a pass run alone
(`int8attn-opt -p int8-qk`) computes what the pipeline does.

An option that does nothing unless another has a value (`w-quant` without
`pv=int8`, ...) says so in `APPLIES_WHEN`: given otherwise, it is refused with the
rule's reason, never ignored (`refusal`; the driver adds its own rows in
`driver.options.COMPILE_APPLIES_WHEN`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, get_args

from ..fragments import (W_CHAINS, FragmentModelName, ScaleGroupKind, WChain,
                         fragment_model)
from ..fragments.model import MAX_BLOCK_TOKENS
from ..passes import (DecodeSplitKV, FloatPV, FoldVScale, Int8QK, LowerCacheWrite,
                      LowerMMACTiles,
                      LowerPagedAttention, LowerQuantize, PrefillOnlineSoftmax, PVToMMAC, QuantizeWGroups,
                      VerifyScaleGroups)
from ..passes.lower_mmac_tiles import Contraction
from .manager import PipelineError, UpstreamPass
from ..contract.constants import PV_MODES, PVKind, QTerms, WQuant, WTerms
from ..contract.numerics import Numerics
from ..support.cpu_vectors import VectorISA
from ..support.options import (OptionError, TypedOptions, kebab, option,
                               parse_option_items)

PV_CHOICES = PV_MODES
# A chain's int32 accumulator holds sum u*Vq over its c*K tokens (u8 W: u <= 255,
# |Vq| <= 128 with the compensation folded in): every chain offered fits.
assert all(max(W_CHAINS) * fragment_model(name).instruction.k * 255 * 128 < 2 ** 31
           for name in get_args(FragmentModelName))
# The pipeline's (the cpu target's) numerics when not given: the contract's `Numerics()`.
PIPELINE_NUMERICS = Numerics()


@dataclass(frozen=True)
class PipelineOptions(TypedOptions):
    """Options of the named pipelines (and, through `CompileOptions`, of the driver)."""

    pv: PVKind = option("int8", "PV precision: int8 (MMAC tiles, W quantized per MMAC "
                        "group), or the bf16 / f32 baselines")
    fragment_model: FragmentModelName = option(
        QuantizeWGroups.fragment_model, "matrix instruction and V-load scheme whose MMAC "
        "token sets the W scale groups follow")
    scale_groups: ScaleGroupKind = option(
        QuantizeWGroups.scale_groups, "token sets of the W scales: fragment (the accumulator's "
        "real sets), or contiguous (wrong W groups) or step (a chain's first MMAC only, "
        "w-chain 2 or 4), both rejected by the verifier unless verification is off")
    verify: bool = option(True, "pv=int8: skip verify-scale-groups (--no-verify, "
                          "verify=false), which otherwise proves every W scale is computed "
                          "over its MMAC's tokens; only to measure the deliberately wrong "
                          "scale-groups contiguous", flag="--no-verify")
    partition_tokens: int = option(DecodeSplitKV.partition_tokens,
                                   "tokens per decode partition", minimum=1,
                                   maximum=MAX_BLOCK_TOKENS)
    tile_tokens: int = option(PrefillOnlineSoftmax.tile_tokens,
                              "tokens per prefill KV tile", minimum=1,
                              maximum=MAX_BLOCK_TOKENS)
    q_terms: QTerms = option(PIPELINE_NUMERICS.q_terms,
                             "INT8 terms of q: 1 (per-row quantize), or 2 (a second term "
                             "quantizes the f32 residual q - Qq1*s1: one more int8 QK dot, "
                             "~250x less Q quantization error; docs/design.md §2c)")
    w_quant: WQuant = option(PIPELINE_NUMERICS.w_quant,
                             "W per MMAC group (pv=int8): s8 (symmetric, 127 levels) or "
                             "u8 (255 levels as u - 128, offset compensated exactly by 128 * "
                             "the group's sum of Vq; half the W rounding error; docs/design.md §2c)")
    w_terms: WTerms = option(PIPELINE_NUMERICS.w_terms,
                             "INT8 terms of W per MMAC group (pv=int8): 1, or 2 (a second, "
                             "signed term quantizes the f32 residual W - level*sW1 over the "
                             "same tokens: one more MMAC per group, ~250x less W rounding "
                             "error; docs/design.md §2c)")

    w_chain: WChain = option(
        QuantizeWGroups.w_chain, "pv=int8: MMAC K-steps chained into one int32 accumulator "
        "before its one conversion to f32 and rescale: 1, 2 or 4; the W groups are the "
        "chain's tokens (chain x 32 on gfx936), one scale each; the MMACs of a partition "
        "and a prefill tile must be a whole number of chains (docs/design.md §4)")

    contraction: Contraction = option(
        LowerMMACTiles.contraction, "pv=int8: how lower-mmac-tiles contracts the in-place MMAC tiles: f32 (FMAs "
        "over a zero-spread Wq, exact) or mmt4d (a linalg.batch_mmt4d of i16 operands on "
        "IREE's mmt4d ukernel, exact; its tiles sized by vector-isa)")
    vector_isa: VectorISA = option(
        LowerMMACTiles.vector_isa, "contraction=mmt4d: the SIMD register file of the CPU IREE compiles for (sse, "
        "avx, avx512, neon; support/cpu_vectors.py); the driver derives it from --target-cpu")

    @property
    def numerics(self) -> Numerics:
        """q_terms, w_quant and w_terms as one `Numerics` (the references' argument)."""
        return Numerics(q_terms=self.q_terms, w_quant=self.w_quant, w_terms=self.w_terms)

    def __post_init__(self):
        super().__post_init__()
        if self.pv != "int8":
            return
        # Whole waves here; whole chains where a block is quantized (quantize-w-groups
        # names the op: a decode graph with w-chain=4 needs no 128-token prefill tile).
        model = fragment_model(self.fragment_model)
        for name, tokens in (("partition-tokens", self.partition_tokens),
                             ("tile-tokens", self.tile_tokens)):
            try:
                model.token_groups(tokens)
            except ValueError as error:
                raise OptionError(f"{name}={tokens} with pv=int8: {error} "
                                  f"({self.fragment_model})") from None
        if self.scale_groups == "step" and self.w_chain == 1:
            raise OptionError("scale-groups=step with w-chain=1: a step is one MMAC of a "
                              "chain, and with one MMAC per accumulator its scale groups are "
                              "the fragment's; give w-chain=2 or 4")


@dataclass(frozen=True)
class AppliesWhen:
    """`option` does something only while option `depends` has one of `values`; given
    while it has another, it is refused with `why` (never ignored)."""

    option: str
    depends: str
    values: tuple
    why: str


NO_W_GROUPS = ("only PV on the INT8 instruction (pv int8) quantizes W in scale groups; "
                "a float PV contracts W unquantized (f32) or rounded to bf16")

# What each pipeline option needs to do anything, in the order the rules are checked.
APPLIES_WHEN: tuple[AppliesWhen, ...] = (
    AppliesWhen("fragment_model", "pv", ("int8",),
                "the fragment model's MMAC token sets are the W scale groups, and " + NO_W_GROUPS),
    AppliesWhen("scale_groups", "pv", ("int8",), NO_W_GROUPS),
    AppliesWhen("verify", "pv", ("int8",), "verify-scale-groups checks the W scale groups, "
                "and " + NO_W_GROUPS),
    AppliesWhen("w_quant", "pv", ("int8",), NO_W_GROUPS),
    AppliesWhen("w_terms", "pv", ("int8",), NO_W_GROUPS),
    AppliesWhen("w_chain", "pv", ("int8",), "it chains INT8 MMACs into one integer "
                "accumulator per W group, and " + NO_W_GROUPS),
    AppliesWhen("contraction", "pv", ("int8",), "it chooses how lower-mmac-tiles contracts "
                "the MMAC tiles, which only pv int8 has"),
    AppliesWhen("vector_isa", "pv", ("int8",), "it sizes the mmt4d tiles of pv int8"),
    AppliesWhen("vector_isa", "contraction", ("mmt4d",), "it sizes the tiles of "
                "contraction mmt4d"),
)


def pipeline_spelling(name: str, value) -> str:
    """An option as a pipeline string spells it: `w-quant=s8`."""
    text = str(value).lower() if isinstance(value, bool) else value
    return f"{kebab(name)}={text}"


def refusal(options, given: Iterable[str], rules: Iterable[AppliesWhen] = APPLIES_WHEN,
            spelling: Callable[[str, object], str] = pipeline_spelling) -> str | None:
    """Why the first option of `given` (names of fields of `options` the caller set)
    that does not apply is refused, or None. `options` holds the resolved values the
    rules test."""
    given = set(given)
    for rule in rules:
        if rule.option in given and getattr(options, rule.depends) not in rule.values:
            return (f"{spelling(rule.option, getattr(options, rule.option))} does not apply "
                    f"with {spelling(rule.depends, getattr(options, rule.depends))}: "
                    f"{rule.why}")
    return None


def to_algorithm(options: PipelineOptions) -> list:
    """Graph -> the algorithm: verified MMAC tiles (or float PV), not yet lowered."""
    if options.pv == "int8":
        verify = [VerifyScaleGroups()] if options.verify else []
        pv = [QuantizeWGroups(options.fragment_model, options.scale_groups, options.w_quant,
                              options.w_terms, options.w_chain),
              *verify,
              PVToMMAC(options.fragment_model, options.w_chain), *verify]
    else:
        pv = [FloatPV(options.pv)]
    return [Int8QK(options.q_terms), LowerCacheWrite(),
            LowerPagedAttention(options.partition_tokens, options.q_terms, options.tile_tokens),
            DecodeSplitKV(options.partition_tokens),
            PrefillOnlineSoftmax(options.tile_tokens), FoldVScale(), *pv]


def algorithm_to_linalg(options: PipelineOptions) -> list:
    """The algorithm's int8attn ops -> linalg/arith/math, then cleanup."""
    tiles = [LowerMMACTiles(contraction=options.contraction, vector_isa=options.vector_isa)] \
        if options.pv == "int8" else []
    return [*tiles, LowerQuantize(), UpstreamPass("canonicalize"), UpstreamPass("cse")]


def to_linalg(options: PipelineOptions) -> list:
    """Graph -> standard dialects for IREE: the algorithm, then its lowering."""
    return to_algorithm(options) + algorithm_to_linalg(options)


NAMED_PIPELINES = {"int8attn-to-algorithm": to_algorithm, "int8attn-to-linalg": to_linalg}


def named_pipeline(text: str) -> list:
    """`name` or `name{key=value ...}` -> pass list."""
    name, brace, rest = text.partition("{")
    name = name.strip()
    if name not in NAMED_PIPELINES:
        raise PipelineError(f"unknown pipeline '{name}'; known pipelines: "
                            f"{', '.join(NAMED_PIPELINES)}")
    body = rest.rstrip()
    if (brace and not body.endswith("}")) or "{" in rest or body.count("}") > 1:
        raise PipelineError(f"pipeline '{text}': its options go in one pair of braces, "
                            f"'{name}{{key=value ...}}'")
    try:                    # (its messages name the pipeline)
        given = parse_option_items(PipelineOptions, body[:-1] if brace else "",
                                   f"pipeline '{name}'")
    except OptionError as error:
        raise PipelineError(str(error)) from None
    try:
        options = PipelineOptions(**given)
    except OptionError as error:
        raise PipelineError(f"pipeline '{name}': {error}") from None
    refused = refusal(options, given)
    if refused is not None:
        raise PipelineError(f"pipeline '{name}': {refused}")
    return NAMED_PIPELINES[name](options)
