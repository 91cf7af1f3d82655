"""Generic IR helpers: a context for int8attn IR, parsing with located errors, walking.

int8attn's ops are unregistered (the bindings cannot define dialects), so a
context allows unregistered dialects; `parse_module` then refuses any foreign
op that neither int8attn nor a dialect IREE registers defines.
"""

from __future__ import annotations

import sys
import types

from iree.compiler import ir
from iree.compiler.dialects._ods_common import _cext

from .diagnostics import DiagnosticError

NAMESPACE = "int8attn."
# Dialects without a Python module in IREE's bindings: an imported ONNX model's,
# and int8attn (whose op classes dialects/ops.py registers).
FOREIGN_DIALECTS = ("torch", "torch_c", "int8attn")
_FOREIGN_PREFIX = "int8attn.support.ir_foreign_dialects"


def _remember_foreign_dialects() -> None:
    # The bindings import a dialect's Python module (iree.compiler.dialects.<name>)
    # before wrapping one of its ops, and do not remember a failed import: every
    # torch or int8attn op walked cost a file-system search (seconds over a large
    # model's passes). An empty module under a search prefix of ours is
    # found once and kept; registered op classes are still looked up as before.
    if _FOREIGN_PREFIX in _cext.globals.dialect_search_modules:
        return
    for name in FOREIGN_DIALECTS:
        sys.modules.setdefault(f"{_FOREIGN_PREFIX}.{name}", types.ModuleType(name))
    _cext.globals.append_dialect_search_prefix(_FOREIGN_PREFIX)


def new_context() -> ir.Context:
    _remember_foreign_dialects()
    context = ir.Context()
    context.allow_unregistered_dialects = True
    # MLIR verifies ops isolated from above on worker threads, and a diagnostic raised
    # there waits for the GIL, which the bindings hold through verify() and the pass
    # manager's run: an invalid op (a kernel generator's bug) would hang the compile
    # instead of being reported. Our passes run on the whole module, so only that
    # verification was ever parallel.
    context.enable_multithreading(False)
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
