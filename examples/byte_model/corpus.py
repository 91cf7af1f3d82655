"""The text the byte-level model learns and is evaluated on: Python's own standard library.

Every machine with Python has it, no one here wrote it, and it is real text with long-range
structure (indentation, names defined far above their use) that attention must carry. The
files are read as bytes; a token is a byte (0-255) and END (256) closes each file.

A file is held out when the CRC-32 of its path (relative to the library, '/'-separated) is
0 mod 20 and the path has no test folder: the split depends on the path only, so it is the
same on every machine and Python version that has the file.
"""

from __future__ import annotations

import hashlib
import io
import sysconfig
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

END = 256               # end of a file: the token generation should stop at
VOCAB = 257
HELD_OUT_MODULUS = 20
TEST_FOLDERS = frozenset({"test", "tests", "idle_test"})
SKIPPED_FOLDERS = frozenset({"site-packages", "__pycache__"})


@dataclass(frozen=True)
class Corpus:
    """Files (relative path, bytes) in path order, split into training and held-out."""

    files: tuple[tuple[str, bytes], ...]
    origin: str

    @staticmethod
    def is_held_out(path: str) -> bool:
        return (zlib.crc32(path.encode()) % HELD_OUT_MODULUS == 0
                and not TEST_FOLDERS & set(path.split("/")[:-1]))

    def split(self, held_out: bool) -> list[tuple[str, bytes]]:
        return [(p, b) for p, b in self.files if self.is_held_out(p) == held_out]

    def tokens(self, held_out: bool) -> np.ndarray:
        """The split's files joined, each followed by END, as int64 tokens."""
        parts = []
        for _, data in self.split(held_out):
            parts += [np.frombuffer(data, np.uint8).astype(np.int64), np.array([END])]
        return np.concatenate(parts)

    def digest(self) -> str:
        h = hashlib.sha256()
        for path, data in self.files:
            h.update(path.encode() + b"\0" + hashlib.sha256(data).digest())
        return h.hexdigest()


def stdlib_folder() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def from_stdlib(folder: Path | None = None) -> Corpus:
    folder = folder or stdlib_folder()
    files = []
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder).as_posix()
        if SKIPPED_FOLDERS & set(relative.split("/")):
            continue
        files.append((relative, path.read_bytes()))
    if not files:
        raise SystemExit(f"error: no .py files under {folder}: is this Python's standard "
                         f"library? (give --corpus ARCHIVE instead)")
    return Corpus(tuple(files), f"stdlib of Python at {folder}")


def save_archive(corpus: Corpus, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tar:
        for path, data in corpus.files:
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def from_archive(archive: Path) -> Corpus:
    try:
        with tarfile.open(archive, "r:gz") as tar:
            files = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers() if m.isfile()]
    except (OSError, tarfile.TarError) as error:
        raise SystemExit(f"error: {archive}: not a corpus archive ({error}); make one with "
                         f"python examples/byte_model/corpus.py ARCHIVE") from None
    return Corpus(tuple(sorted(files)), f"archive {archive.name}")


def load(archive: str | None) -> Corpus:
    return from_archive(Path(archive)) if archive else from_stdlib()


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        raise SystemExit("usage: python examples/byte_model/corpus.py ARCHIVE.tar.gz "
                         "(packs this Python's standard library for training elsewhere)")
    corpus = from_stdlib()
    save_archive(corpus, Path(sys.argv[1]))
    train, held = corpus.split(False), corpus.split(True)
    print(f"{len(corpus.files)} files from {corpus.origin}: {len(train)} training "
          f"({sum(len(b) for _, b in train):,} bytes), {len(held)} held out "
          f"({sum(len(b) for _, b in held):,} bytes); sha256 {corpus.digest()[:16]}")
