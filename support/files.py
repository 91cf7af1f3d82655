"""Safe file output: never a partial file, never over one of the inputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputError(ValueError):
    pass


def check_output_path(output: str | Path, inputs=()) -> Path:
    text = os.fspath(output)
    if text.endswith(tuple(filter(None, (os.sep, os.altsep)))) and not Path(text).is_dir():
        # Path() drops the trailing '/': the user asked for a folder, not a file of that name.
        raise OutputError(f"output '{text}' ends in '{text[-1]}', so it names a folder, and "
                          f"there is no such folder; give a file path (an existing folder "
                          f"followed by a file name)")
    output = Path(output)
    for source in inputs:
        if source and output.exists() and Path(source).exists() and \
                os.path.samefile(output, source):
            raise OutputError(f"output '{output}' is the input file '{source}'; "
                              f"choose another output path")
    if output.is_dir():
        raise OutputError(f"output '{text}' is a directory; give a file path (a file name "
                          f"inside it, or another path)")
    if not output.parent.resolve().is_dir():
        raise OutputError(f"output directory '{output.parent}' does not exist; create it or "
                          f"give another path")
    # Refused now, before the work: a run that fails only at the end loses it.
    if not os.access(output.parent.resolve(), os.W_OK | os.X_OK) or \
            not _can_create_in(output.parent.resolve()):
        raise OutputError(f"cannot write '{output}': its directory '{output.parent}' is not "
                          f"writable; give a path in a folder you can write to")
    if output.exists() and not os.access(output, os.W_OK):
        raise OutputError(f"cannot write '{output}': the file exists and is read-only")
    return output


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder` (what write_atomic does), tried: access()
    says yes to root for any folder, also those that refuse new files (/proc, /sys)."""
    try:
        handle, temp = tempfile.mkstemp(dir=folder, prefix=".int8attn-probe-")
    except OSError:
        return False
    os.close(handle)
    os.unlink(temp)
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(output: str | Path, data: bytes | str, inputs=()) -> None:
    """Write `data` to a temp file beside `output`, then rename it into place."""
    output = check_output_path(output, inputs)
    payload = data.encode() if isinstance(data, str) else data
    try:
        handle, temp = tempfile.mkstemp(dir=output.parent.resolve(), prefix=f".{output.name}.",
                                        suffix=".partial")
    except OSError as error:
        raise OutputError(f"cannot write '{output}': {error.strerror}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        os.chmod(temp, 0o666 & ~_umask())  # what a plain open() would give, not mkstemp's 0600
        os.replace(temp, output)
    except BaseException as error:
        if os.path.exists(temp):
            os.unlink(temp)
        if isinstance(error, OSError):
            raise OutputError(f"cannot write '{output}': {error.strerror}") from None
        raise
