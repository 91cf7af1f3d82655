"""Safe file output: never a partial file, never over one of the inputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputError(ValueError):
    pass


def check_output_path(output: str | Path, inputs=()) -> Path:
    output = Path(output)
    for source in inputs:
        if source and output.exists() and Path(source).exists() and \
                os.path.samefile(output, source):
            raise OutputError(f"output '{output}' is the input file '{source}'; "
                              f"choose another output path")
    if output.is_dir():
        raise OutputError(f"output '{output}' is a directory; give a file path")
    if not output.parent.resolve().is_dir():
        raise OutputError(f"output directory '{output.parent}' does not exist")
    return output


def write_atomic(output: str | Path, data: bytes | str, inputs=()) -> None:
    """Write `data` to a temp file beside `output`, then rename it into place."""
    output = check_output_path(output, inputs)
    payload = data.encode() if isinstance(data, str) else data
    handle, temp = tempfile.mkstemp(dir=output.parent.resolve(), prefix=f".{output.name}.",
                                    suffix=".partial")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.replace(temp, output)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
