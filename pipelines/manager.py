"""Textual pass pipelines: parse `a,b{opt=v},canonicalize` and run it.

Project passes are looked up in `int8attn.passes.PASSES`; any other name is
handed to IREE's pass registry (canonicalize, cse, ...), one pass at a time,
so the IR can be printed and verified after each.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from iree.compiler import ir, passmanager

from int8attn.diagnostics import DiagnosticError
from int8attn.dialects.int8attn import verify
from int8attn.passes import PASSES


class PipelineError(ValueError):
    """A pipeline string that names an unknown pass or a bad option."""


@dataclass(frozen=True)
class UpstreamPass:
    """A pass registered with IREE's compiler, by its textual pipeline element."""

    text: str

    @property
    def argument(self) -> str:
        return self.text.split("{", 1)[0]

    def run(self, module: ir.Operation) -> None:
        manager = passmanager.PassManager.parse(f"builtin.module({self.text})")
        try:
            manager.run(module)
        except ir.MLIRError as error:
            raise DiagnosticError(_first_location(error), f"pass '{self.argument}' failed: "
                                  f"{_diagnostic_text(error)}") from None


def _first_location(error) -> ir.Location | None:
    diagnostics = getattr(error, "error_diagnostics", None) or []
    return diagnostics[0].location if diagnostics else None


def _diagnostic_text(error) -> str:
    diagnostics = getattr(error, "error_diagnostics", None) or []
    return "; ".join(d.message for d in diagnostics) or str(error)


def pass_name(p) -> str:
    if isinstance(p, UpstreamPass):
        return p.text
    options = " ".join(f"{f.name}={getattr(p, f.name)}" for f in dataclasses.fields(p))
    return p.argument + (f"{{{options}}}" if options else "")


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "{"
        depth -= ch == "}"
        if depth < 0:
            raise PipelineError(f"unbalanced '}}' in pipeline '{text}'")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise PipelineError(f"unbalanced '{{' in pipeline '{text}'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_options(cls, name: str, body: str) -> dict:
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
    options = {}
    for item in body.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep:
            raise PipelineError(f"option '{item}' of pass '{name}' needs a value (key=value)")
        field = fields.get(key) or fields.get(key.replace("_", "-"))
        if field is None:
            known = ", ".join(fields) or "none"
            raise PipelineError(f"pass '{name}' has no option '{key}' (options: {known})")
        try:
            options[field.name] = int(value) if field.type == "int" else value
        except ValueError:
            raise PipelineError(f"option '{key}' of pass '{name}' expects an integer, "
                                f"got '{value}'") from None
    return options


def known_passes() -> str:
    return ", ".join(sorted(PASSES))


def parse_pipeline(text: str) -> list:
    """Pass instances for a comma-separated pipeline string."""
    passes = []
    for element in _split_top_level(text):
        name, _, rest = element.partition("{")
        name = name.strip()
        if name in PASSES:
            cls = PASSES[name]
            options = _parse_options(cls, name, rest.rstrip("}")) if rest else {}
            try:
                passes.append(cls(**options))
            except ValueError as error:
                raise PipelineError(f"pass '{name}': {error}") from None
            continue
        try:
            with ir.Context():
                passmanager.PassManager.parse(f"builtin.module({element})")
        except ValueError as error:
            if "no such option" in str(error) or "failed to add" in str(error):
                detail = str(error).strip().splitlines()[0].split(">: ")[-1]
                raise PipelineError(f"IREE pass '{name}': {detail}") from None
            raise PipelineError(
                f"unknown pass '{name}' in pipeline. int8attn passes: {known_passes()}; "
                f"any pass registered with IREE (canonicalize, cse, ...) is also accepted"
            ) from None
        passes.append(UpstreamPass(element))
    return passes


def run_passes(module: ir.Operation, passes: Sequence,
               after_pass: Callable[[object, ir.Operation], None] | None = None) -> None:
    """Run `passes` in order, verifying the module after each one."""
    verify(module)
    for p in passes:
        p.run(module)
        if not module.verify():
            raise DiagnosticError(None, f"the IR is invalid after pass '{pass_name(p)}'")
        verify(module)
        if after_pass is not None:
            after_pass(p, module)
