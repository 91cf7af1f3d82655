"""Compilation stages, in order: graph -> linalg -> vmfb.

Like Triton's backends, each stage is a `make_<stage>` function over one
frozen `CompileOptions`, and compilation can start at any stage. A failure
inside IREE is reported with the stage and an `iree-compile` command line that
reproduces it on the IR saved next to the error.
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass, field

from iree.compiler import ir
from iree.compiler.tools import CompilerToolError, compile_str

from int8attn.support.diagnostics import DiagnosticError, StageError, save_for_repro
from int8attn.dialects.int8attn import verify, walk
from int8attn.driver.graph import FunctionInfo, describe_functions
from int8attn.pipelines import PipelineOptions, to_linalg
from int8attn.pipelines.manager import run_passes

BACKENDS = {
    "cpu": ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=host"],
}


@dataclass(frozen=True)
class CompileOptions:
    """Everything that determines a compiled module (also the cache key)."""

    backend: str = "cpu"
    pv: str = "int8"
    target: str = "gfx936"
    partition_tokens: int = 256
    tile_tokens: int = 64
    scale_groups: str = "fragment"
    verify: bool = True
    iree_flags: tuple[str, ...] = ()

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend '{self.backend}' (known: {', '.join(BACKENDS)})")
        self.pipeline_options()  # validates pv and target

    def pipeline_options(self) -> PipelineOptions:
        return PipelineOptions(self.pv, self.target, self.partition_tokens, self.tile_tokens,
                               self.scale_groups, self.verify)


@dataclass
class Compiled:
    vmfb: bytes
    linalg_ir: str
    functions: dict[str, FunctionInfo]
    timings: dict[str, float] = field(default_factory=dict)


def new_context() -> ir.Context:
    context = ir.Context()
    context.allow_unregistered_dialects = True
    return context


def parse_graph(source: str, filename: str) -> ir.Operation:
    """Parse MLIR text into a module; top-level ops without one are wrapped."""
    try:
        op = ir.Operation.parse(source, source_name=filename)
    except ir.MLIRError as error:
        if "single top-level operation" not in str(error):
            raise _parse_error(error, filename) from None
        return _reject_unknown_ops(_parse_wrapped(source, filename, error))
    if op.name == "builtin.module":
        return _reject_unknown_ops(op)
    module = ir.Operation.create("builtin.module", regions=1, loc=op.location)
    module.regions[0].blocks.append()
    ir.InsertionPoint(module.regions[0].blocks[0]).insert(op.operation)
    return _reject_unknown_ops(module)


def _reject_unknown_ops(module: ir.Operation) -> ir.Operation:
    # Unregistered dialects are allowed only for int8attn's own ops.
    for op in walk(module):
        if not op.name.startswith("int8attn.") and \
                not op.context.is_registered_operation(op.name):
            raise DiagnosticError(op.location, f"unknown op '{op.name}': neither an int8attn op "
                                  f"nor an op of a dialect IREE's compiler registers")
    return module


def _parse_wrapped(source: str, filename: str, first_error) -> ir.Operation:
    # Same line numbers; columns on the first line shift by len("module {").
    try:
        return ir.Operation.parse("module {" + source + "\n}", source_name=filename)
    except ir.MLIRError:
        error = _parse_error(first_error, filename)
        error.notes += ("several top-level operations: put them in one `module { ... }` "
                        "(attribute aliases such as `#x = ...` go before it)",)
        raise error from None


def _parse_error(error, filename) -> DiagnosticError:
    diagnostics = getattr(error, "error_diagnostics", None) or []
    if not diagnostics:
        return DiagnosticError(None, f"{filename}: cannot parse MLIR: {error}")
    first = diagnostics[0]
    return DiagnosticError(first.location, first.message)


def make_linalg(module: ir.Operation, options: CompileOptions, after_pass=None) -> ir.Operation:
    """Run the algorithm pipeline in place; no int8attn op may be left."""
    run_passes(module, to_linalg(options.pipeline_options()), after_pass)
    for op in walk(module):
        if op.name.startswith("int8attn."):
            raise DiagnosticError(op.location, f"'{op.name}' was not lowered by the pipeline")
    return module


def iree_flags(options: CompileOptions) -> list[str]:
    return BACKENDS[options.backend] + list(options.iree_flags)


def make_vmfb(linalg_ir: str, options: CompileOptions) -> bytes:
    try:
        return compile_str(linalg_ir, extra_args=iree_flags(options))
    except CompilerToolError as error:
        saved = save_for_repro({"linalg.mlir": linalg_ir})
        command = shlex.join(["iree-compile", str(saved / "linalg.mlir"), *iree_flags(options),
                              "-o", str(saved / "out.vmfb")])
        raise StageError("IREE compilation (iree-compile)", _diagnostics(str(error)),
                         command) from None


def _diagnostics(text: str, lines: int = 12) -> str:
    """The compiler's own messages: no invocation, temp-file hints or stack frames."""
    body = text.split("Diagnostics:", 1)[-1].split("Invoked with:", 1)[0]
    kept = [line for line in body.strip().splitlines()
            if line.strip() and not re.match(r"\s*#\d+ 0x", line)]
    return "\n".join(kept[:lines]) or text.strip()


def compile_graph(source: str, filename: str, options: CompileOptions) -> Compiled:
    """Source text -> vmfb through every stage, with per-stage timings."""
    with new_context():
        start = time.perf_counter()
        module = parse_graph(source, filename)
        verify(module)
        functions = describe_functions(module)
        if not functions:
            raise DiagnosticError(module.location, "the graph has no public func.func to "
                                  "compile (e.g. func.func @decode(...) returning an "
                                  "int8attn.attention)")
        make_linalg(module, options)
        linalg_ir = str(module)
        passes_done = time.perf_counter()
    vmfb = make_vmfb(linalg_ir, options)
    done = time.perf_counter()
    return Compiled(vmfb, linalg_ir, functions,
                    {"passes": passes_done - start, "iree_compile": done - passes_done})
