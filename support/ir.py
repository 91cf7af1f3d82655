"""Generic IR helpers: a context for int8attn IR, parsing with located errors, walking.

int8attn's ops are unregistered (the bindings cannot define dialects), so a
context allows unregistered dialects; `parse_module` then refuses any foreign
op that neither int8attn nor a dialect IREE registers defines.
"""

from __future__ import annotations

from iree.compiler import ir

from int8attn.support.diagnostics import DiagnosticError

NAMESPACE = "int8attn."


def new_context() -> ir.Context:
    context = ir.Context()
    context.allow_unregistered_dialects = True
    return context


def walk(op: ir.Operation):
    """Pre-order walk of `op` and everything nested in it."""
    yield op
    for region in op.regions:
        for block in region.blocks:
            for child in block.operations:
                yield from walk(child.operation)


def parse_module(source: str, filename: str) -> ir.Operation:
    """MLIR text -> a builtin.module (top-level ops without one are wrapped)."""
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
    for op in walk(module):
        if not op.name.startswith(NAMESPACE) and \
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


def mlir_error(error: ir.MLIRError, prefix: str = "") -> DiagnosticError:
    """An MLIRError from the bindings as a DiagnosticError at its first location."""
    diagnostics = getattr(error, "error_diagnostics", None) or []
    location = diagnostics[0].location if diagnostics else None
    text = "; ".join(d.message for d in diagnostics) or str(error)
    return DiagnosticError(location, prefix + text)
