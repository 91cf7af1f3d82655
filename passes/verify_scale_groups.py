"""verify-scale-groups: prove that every W scale covers its accumulator's tokens.

A W group is the set of tokens whose W·V products one int32 accumulator sums before
its single conversion to f32 (one MMAC's, or a chain's of c MMACs): the scale is
applied once, to that one sum, so it must be computed over exactly those tokens.

Checks, from the IR alone, every consumer of quantized W (`grouped_pv`,
`mmac_tiles`):

- its Wq (and sW) come from one `int8attn.group_quantize`;
- that op computes the scale of group g over exactly the tokens whose values
  it quantizes into group g (`scale_groups` row g == `groups` row g, as sets);
- the consumer reads V through the same `groups` table (K slot k of group g
  pairs W and V of the same token);
- for `mmac_tiles`, those are the tokens the fragment model's accumulator really
  sums (the fragment model's groups for the block, chained `chain` times; the model is
  a target's, or a PV atom's named "target:atom", `fragments.pv_model`); a scale over
  one step of a chain is refused like any other wrong set;
- unsigned W (`w_quant = "u8"`) and only it has column sums, produced by one
  `int8attn.column_sums` of the consumer's own V whose group g sums exactly
  the tokens the consumer's group g reads (as sets): the 128 * sum Vq offset
  compensation covers the MMAC's token set, no more, no less.

On a mismatch it reports an error at the offending op naming both token sets,
e.g. `{0-31}` vs `{0-7,16-23,32-39,48-55}`. It rewrites nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from iree.compiler import ir

from ..support.diagnostics import DiagnosticError, format_location
from ..dialects import int8attn as d
from ..support.ir import walk
from ..fragments import format_token_set


def _producer(value: ir.Value, consumer, what: str) -> d.GroupQuantizeOp:
    owner = value.owner
    if not isinstance(owner, d.GroupQuantizeOp):
        raise DiagnosticError(consumer.location, f"cannot prove the W scale groups of "
                              f"'{consumer.name}': its {what} is not produced by "
                              f"'{d.GROUP_QUANTIZE}'")
    return owner


def _first_mismatch(left: np.ndarray, right: np.ndarray, as_sets: bool) -> int | None:
    for g, (a, b) in enumerate(zip(left, right)):
        same = set(a.tolist()) == set(b.tolist()) if as_sets else np.array_equal(a, b)
        if not same:
            return g
    return None


def _check_consumer(consumer: d.GroupedPVOp | d.MMACTilesOp) -> None:
    quantize = _producer(consumer.wq, consumer, "Wq operand")
    if isinstance(consumer, d.GroupedPVOp):
        scales = _producer(consumer.sw, consumer, "sW operand")
        if scales.operation != quantize.operation or consumer.sw.result_number != 1:
            raise DiagnosticError(consumer.location, f"'{consumer.name}' op takes Wq and sW "
                                  f"from different '{d.GROUP_QUANTIZE}' ops")
    groups = quantize.groups
    consumed = consumer.groups
    scale_groups = quantize.scale_groups
    distinct = format_location(consumer.location) != format_location(quantize.location)
    here = (f"consumer at {format_location(consumer.location)}; " if distinct else "")

    g = _first_mismatch(scale_groups, groups, as_sets=True)
    if g is not None and set(scale_groups[g].tolist()) < set(groups[g].tolist()):
        raise DiagnosticError(
            quantize.location,
            f"W scale of group {g} is computed over tokens "
            f"{format_token_set(scale_groups[g])}, {len(scale_groups[g])} of the "
            f"{len(groups[g])} tokens {format_token_set(groups[g])} whose products one "
            f"accumulator sums",
            (f"{here}a scale must cover its accumulator's whole token set (every MMAC "
             f"step of a chain), as it is applied once to the one integer sum",))
    if g is not None:
        raise DiagnosticError(
            quantize.location,
            f"W scale of group {g} is computed over tokens "
            f"{format_token_set(scale_groups[g])} but the MMAC consuming its "
            f"quantized values reads tokens {format_token_set(groups[g])}",
            (f"{here}scales must come from the token set the MMAC really consumes",))
    g = _first_mismatch(groups, consumed, as_sets=False)
    if g is not None:
        raise DiagnosticError(
            consumer.location,
            f"'{consumer.name}' op pairs quantized W group {g} (tokens "
            f"{format_token_set(groups[g])}) with V tokens {format_token_set(consumed[g])}",
            (f"Wq produced at {format_location(quantize.location)}",) if distinct else ())
    _check_column_sums(consumer, quantize)
    if isinstance(consumer, d.MMACTilesOp):
        model = consumer.model
        try:
            real = model.token_groups(d.shape_of(consumer.v)[3])
        except ValueError as error:
            raise DiagnosticError(consumer.location, f"'{consumer.name}' op: {error} "
                                  f"({model.name})") from None
        g = _first_mismatch(consumed, real, as_sets=False)
        if g is not None:
            what = f"MMAC {g} consumes" if model.chain == 1 else \
                f"the chain of {model.chain} MMACs into accumulator {g} consumes"
            raise DiagnosticError(
                consumer.location,
                f"'{consumer.name}' op claims {what} tokens "
                f"{format_token_set(consumed[g])} but {model.name}'s fragment model says "
                f"{format_token_set(real[g])}")


def _check_column_sums(consumer, quantize: d.GroupQuantizeOp) -> None:
    sums = consumer.column_sums
    if quantize.w_quant != "u8":
        if sums is not None:
            raise DiagnosticError(consumer.location, f"'{consumer.name}' op adds 128 * column "
                                  f"sums to signed (s8) W; only w_quant = \"u8\" has an offset")
        return
    if sums is None:
        raise DiagnosticError(consumer.location, f"'{consumer.name}' op consumes unsigned W "
                              f"(Wq = u - 128) without the column sums that compensate the "
                              f"offset")
    producer = sums.owner
    if not isinstance(producer, d.ColumnSumsOp):
        raise DiagnosticError(consumer.location, f"cannot prove the column sums of "
                              f"'{consumer.name}': they are not produced by '{d.COLUMN_SUMS}'")
    distinct = format_location(consumer.location) != format_location(producer.location)
    here = f"consumer at {format_location(consumer.location)}; " if distinct else ""
    if not producer.v == consumer.v:
        raise DiagnosticError(producer.location, f"column sums of another V than the one "
                              f"'{consumer.name}' reads", (here.rstrip("; "),) if distinct else ())
    g = _first_mismatch(producer.groups, consumer.groups, as_sets=True)
    if g is not None:
        raise DiagnosticError(
            producer.location,
            f"column sum of group {g} is computed over tokens "
            f"{format_token_set(producer.groups[g])} but the MMAC it compensates reads tokens "
            f"{format_token_set(consumer.groups[g])}",
            (f"{here}the 128 * sum Vq offset must cover the MMAC's own tokens",))


@dataclass(frozen=True)
class VerifyScaleGroups:
    """Prove every W scale is computed over the token set its MMAC consumes."""

    argument: ClassVar[str] = "verify-scale-groups"

    def run(self, module: ir.Operation) -> None:
        for op in list(walk(module)):
            view = op.opview
            if isinstance(view, (d.GroupedPVOp, d.MMACTilesOp)):
                _check_consumer(view)
