"""Located diagnostics: what went wrong, where, and how to fix it."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

__all__ = ["DiagnosticError", "StageError", "format_location", "save_for_repro"]

_FILE_LINE_COL = re.compile(r'loc\("(?P<file>[^"]*)":(?P<line>\d+):(?P<col>\d+)')
_NAME = re.compile(r'loc\("(?P<name>[^"]+)"')


def format_location(location) -> str:
    """`file:line:col` for a file location (also inside fused/callsite locs);
    `node 'name'` for a name location (an imported ONNX node)."""
    if location is None:
        return "<unknown>"
    match = _FILE_LINE_COL.search(str(location))
    if match:
        return f"{match['file']}:{match['line']}:{match['col']}"
    match = _NAME.search(str(location))
    return f"node '{match['name']}'" if match else "<unknown>"


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


class StageError(Exception):
    """IREE failed in a stage; `reproducer` is a shell command that shows it again (None
    where nothing of the module's is at fault: no device to run it on)."""

    def __init__(self, stage: str, message: str, reproducer: str | None):
        again = f"\nreproduce with:\n  {reproducer}" if reproducer else ""
        super().__init__(f"{stage} failed: {message}{again}")
        self.stage = stage
        self.reproducer = reproducer


def save_for_repro(files: dict) -> Path:
    """A fresh directory holding `files` (name -> text, bytes or a numpy array)."""
    import numpy as np

    directory = Path(tempfile.mkdtemp(prefix="int8attn-repro-"))
    for name, content in files.items():
        if isinstance(content, np.ndarray):
            np.save(directory / name, content)
        elif isinstance(content, bytes):
            (directory / name).write_bytes(content)
        else:
            (directory / name).write_text(content)
    return directory


class UsageError(Exception):
    """An option the chosen target does not offer: printed as `error: ...`, exit 2."""
