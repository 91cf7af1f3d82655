"""Optimization remarks: MLIR's remark engine, collected as located lines.

A pass reports what it did or did not do with `passed(loc, ...)` /
`missed(loc, ...)` (MLIR `Location.emit_remark`, category `int8attn`); the
remark reaches whoever enabled the engine on the context (`collect(context)`:
the driver and `int8attn-opt`) as `file:line:col: remark: [Passed] ...`. On a
context without the engine the remark goes nowhere, as in MLIR.
"""

from __future__ import annotations

from iree.compiler import ir

from .diagnostics import format_location

CATEGORY = "int8attn"


def passed(location: ir.Location, name: str, message: str) -> None:
    location.emit_remark(ir.RemarkKind.PASSED, name, category=CATEGORY, message=message)


def missed(location: ir.Location, name: str, message: str) -> None:
    location.emit_remark(ir.RemarkKind.MISSED, name, category=CATEGORY, message=message)


_KINDS = {ir.RemarkKind.PASSED: "Passed", ir.RemarkKind.MISSED: "Missed",
          ir.RemarkKind.ANALYSIS: "Analysis", ir.RemarkKind.FAILURE: "Failure"}


def collect(context: ir.Context) -> list[str]:
    """Enable the remark engine on `context`; the returned list fills with one
    line per remark, in the order they are emitted."""
    lines: list[str] = []

    def keep(remark) -> None:
        # A Remark is valid only during the call: keep its text.
        kind = _KINDS.get(remark.kind, str(remark.kind))
        text = dict(remark.args).get("Remark", remark.message)
        lines.append(f"{format_location(remark.location)}: remark: [{kind}] "
                     f"{remark.remark_name}: {text}")

    context.enable_remarks(all_filter=CATEGORY + ".*", callback=keep,
                           print_as_emit_remarks=False)
    return lines
