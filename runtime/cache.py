"""Content-addressed cache of compiled modules.

The key covers the source text, every compile option, the IREE compiler and
runtime versions and every source file of every int8attn package (recursively), so a hit is always the module the same
compile would produce. Entries are written atomically (temp file + rename) and
carry the vmfb's sha256: a damaged entry is a miss, never a broken module.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from functools import lru_cache
from importlib import metadata
from pathlib import Path


def default_cache_dir() -> Path:
    root = os.environ.get("INT8ATTN_CACHE_DIR")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "int8attn"


PACKAGES = ("int8attn", "contract", "dialects", "driver", "fragments", "kernels", "passes", "pipelines",
            "reference", "runtime", "simulator", "support")


def project_source_roots() -> list[Path]:
    """The folders of every int8attn package (each shapes what a compile produces)."""
    import importlib

    roots = []
    for name in PACKAGES:
        module = importlib.import_module("int8attn" if name == "int8attn" else f"int8attn.{name}")
        roots.append(Path(module.__file__).parent)
    return roots


def source_fingerprint(roots) -> str:
    """sha256 over every .py file under `roots`, recursively, with its relative path."""
    digest = hashlib.sha256()
    for root in roots:
        root = Path(root)
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            digest.update(f"{root.name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def _toolchain_fingerprint() -> str:
    digest = hashlib.sha256()
    for dist in ("iree-base-compiler", "iree-base-runtime"):
        try:
            digest.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=?;".encode())
    digest.update(source_fingerprint(project_source_roots()).encode())
    return digest.hexdigest()


class ModuleCache:
    def __init__(self, directory: Path | str | None = None):
        self.directory = Path(directory) if directory else default_cache_dir()

    def key(self, source: str | bytes, options) -> str:
        """`source`: MLIR text or an ONNX model's bytes."""
        digest = hashlib.sha256()
        digest.update(_toolchain_fingerprint().encode())
        digest.update(repr(options).encode())
        # The kind keeps MLIR text and a model file of the same bytes apart.
        digest.update(b"onnx\0" + source if isinstance(source, bytes) else
                      b"mlir\0" + source.encode())
        return digest.hexdigest()

    def load(self, key: str) -> tuple[bytes, dict] | None:
        vmfb, meta = self.directory / f"{key}.vmfb", self.directory / f"{key}.json"
        try:
            data, info = vmfb.read_bytes(), json.loads(meta.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or info.get("vmfb_sha256") != hashlib.sha256(data).hexdigest():
            return None
        return data, info

    def store(self, key: str, vmfb: bytes, meta: dict) -> None:
        meta = {**meta, "vmfb_sha256": hashlib.sha256(vmfb).hexdigest()}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.directory / f"{key}.json", json.dumps(meta).encode())
            _atomic_write(self.directory / f"{key}.vmfb", vmfb)
        except OSError as error:
            # only costs a recompile, but every time: said once per folder
            if self.directory not in _UNWRITABLE:
                _UNWRITABLE.add(self.directory)
                warnings.warn(f"the module cache '{self.directory}' cannot be written "
                              f"({error.strerror or error}): every call compiles again; set "
                              f"INT8ATTN_CACHE_DIR to a writable folder", RuntimeWarning,
                              stacklevel=2)


_UNWRITABLE: set[Path] = set()


def _atomic_write(path: Path, data: bytes) -> None:
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
