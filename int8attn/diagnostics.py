"""Located diagnostics: what went wrong, where, and how to fix it."""

from __future__ import annotations

import re

__all__ = ["DiagnosticError", "format_location"]

_FILE_LINE_COL = re.compile(r'loc\("(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)')


def format_location(location) -> str:
    """`file:line:col` for a file location (also inside fused/callsite locs)."""
    if location is None:
        return "<unknown>"
    match = _FILE_LINE_COL.search(str(location))
    if not match:
        return "<unknown>"
    return f"{match['file']}:{match['line']}:{match['col']}"


class DiagnosticError(Exception):
    """An error reported at an IR location, formatted like MLIR's diagnostics."""

    def __init__(self, location, message: str, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.location = location
        self.message = message
        self.notes = tuple(notes)

    def format(self) -> str:
        where = format_location(self.location)
        lines = [f"{where}: error: {self.message}"]
        lines += [f"{where}: note: {note}" for note in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
