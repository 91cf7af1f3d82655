"""Pass pipelines on MLIR's PassManager: parse `a,b{opt=v},canonicalize` and run it.

Project passes (looked up in `int8attn.passes.PASSES`) are added to one real
`PassManager` as Python passes, upstream ones (canonicalize, cse, any pass IREE
registers) by their textual element, so IR printing, timing and the verifier
after every pass come from MLIR. After each project pass the int8attn op
verifiers run too; an error raised inside a pass reaches the caller as the
pass raised it (a `DiagnosticError` at the op's location).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from iree.compiler import ir, passmanager

from ..dialects.int8attn import verify
from ..passes import PASSES
from ..support.docs import first_sentence
from ..support.ir import mlir_error
from ..support.options import OptionError, option_string, parse_option_items


class PipelineError(ValueError):
    """A pipeline string that names an unknown pass or a bad option."""


@dataclass(frozen=True)
class UpstreamPass:
    """A pass registered with IREE's compiler, by its textual pipeline element."""

    text: str

    @property
    def argument(self) -> str:
        return self.text.split("{", 1)[0]


def pass_name(p) -> str:
    """The pass as a pipeline element, with every option: `argument{key=value ...}`."""
    if isinstance(p, UpstreamPass):
        return p.text
    return p.argument + option_string(p)


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
            try:                # (its messages name the pass)
                options = parse_option_items(cls, rest.rstrip("}"), f"pass '{name}'")
            except OptionError as error:
                raise PipelineError(str(error)) from None
            try:
                passes.append(cls(**options))
            except OptionError as error:
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


def _python_pass(p):
    def run(op, _pass):
        p.run(op)
        verify(op)
    return run


def pass_manager(passes: Sequence, *, print_ir_after_all: bool = False,
                 timing: bool = False) -> passmanager.PassManager:
    """One PassManager on builtin.module holding `passes` in order (current context)."""
    manager = passmanager.PassManager("builtin.module")
    for p in passes:
        if isinstance(p, UpstreamPass):
            manager.add(p.text)
        else:
            doc = first_sentence(type(p).__doc__)
            manager.add(_python_pass(p), name=pass_name(p), argument=p.argument,
                        description=doc)
    if print_ir_after_all:
        manager.enable_ir_printing()
    if timing:
        manager.enable_timing()
    return manager


def run_passes(module: ir.Operation, passes: Sequence, *, print_ir_after_all: bool = False,
               timing: bool = False) -> None:
    """Verify `module`, then run `passes` on it in place through one PassManager."""
    verify(module)
    if not passes:
        return
    manager = pass_manager(passes, print_ir_after_all=print_ir_after_all, timing=timing)
    try:
        manager.run(module)
    except ir.MLIRError as error:
        raise mlir_error(error, "pipeline failed: ") from None
