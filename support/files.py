"""Safe file output: never a partial file, never over one of the inputs.

A regular file (new, or replacing one) is written to a temp file beside it and
renamed into place, keeping the mode an existing file had (a new one gets what
a plain open() gives). A symlink keeps pointing where it did: the file it
names is written. A device or FIFO (/dev/null, a pipe) is written through in
place: a rename would replace the node itself.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


class OutputError(ValueError):
    pass


def _existing(output: Path) -> os.stat_result | None:
    """What `output` names now, links followed; None for nothing (or a dangling link)."""
    try:
        return os.stat(output)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return None   # a missing folder on the way is named by check_output_path
        raise OutputError(f"cannot write '{output}': {error.strerror}") from None


def _in_place(status: os.stat_result | None) -> bool:
    """A device, FIFO or socket: written through, never replaced."""
    return status is not None and not stat.S_ISREG(status.st_mode) and \
        not stat.S_ISDIR(status.st_mode)


def _refuse_a_file_on_the_way(output: Path, shown: Path, link: str) -> None:
    """The nearest existing folder on the way to `shown` is a file (`good.npz/out.npz`):
    said as such, not as a folder that does not exist."""
    for parent in (shown, *shown.parents):
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(f"cannot write '{output}': '{parent}'{link} is a file, not "
                                  f"a directory, so it cannot hold the output; give a path "
                                  f"in a folder")
            return


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
    status = _existing(output)
    if _in_place(status):
        # Written through with a plain write: only the node itself must be writable,
        # not its folder (a user may write /dev/null but not add files to /dev).
        if not os.access(output, os.W_OK):
            raise OutputError(f"cannot write '{output}': it exists and is not writable")
        return output
    # The file written is a link's target, in the target's folder.
    folder = Path(os.path.realpath(output)).parent
    shown = folder if output.is_symlink() else output.parent
    link = " (the folder of the link's target)" if output.is_symlink() else ""
    if not folder.is_dir():
        _refuse_a_file_on_the_way(output, shown, link)
        raise OutputError(f"output directory '{shown}'{link} does not exist; create it or "
                          f"give another path")
    # Refused now, before the work: a run that fails only at the end loses it.
    if not os.access(folder, os.W_OK | os.X_OK) or not can_create_in(folder):
        raise OutputError(f"cannot write '{output}': its directory '{shown}'{link} is not "
                          f"writable; give a path in a folder you can write to")
    if status is not None and not os.access(output, os.W_OK):
        raise OutputError(f"cannot write '{output}': the file exists and is read-only")
    return output


def can_create_in(folder: Path) -> bool:
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
    """Write `data` to `output`: a regular file through a temp file renamed into place,
    a device or FIFO in place (see the module's docstring)."""
    output = check_output_path(output, inputs)
    payload = data.encode() if isinstance(data, str) else data
    status = _existing(output)
    if _in_place(status):
        try:
            with open(output, "wb") as out:
                out.write(payload)
        except OSError as error:
            raise OutputError(f"cannot write '{output}': {error.strerror}") from None
        return
    target = Path(os.path.realpath(output))   # a link stays a link to the file it names
    try:
        handle, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                        suffix=".partial")
    except OSError as error:
        raise OutputError(f"cannot write '{output}': {error.strerror}") from None
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(payload)
        # What a plain open() would leave: the existing file's owner (where allowed) and
        # mode, or 0666 & ~umask for a new one, not mkstemp's 0600 (chown first: it
        # clears the set-id bits).
        if status is not None and (status.st_uid, status.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(temp, status.st_uid, status.st_gid)
            except PermissionError:
                pass
        os.chmod(temp, stat.S_IMODE(status.st_mode) if status else 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException as error:
        if os.path.exists(temp):
            os.unlink(temp)
        if isinstance(error, OSError):
            raise OutputError(f"cannot write '{output}': {error.strerror}") from None
        raise
