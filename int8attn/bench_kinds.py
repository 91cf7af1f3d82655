"""The table of `int8attn bench` kinds: `--mode` -> the kind's `BenchKind`
(`bench_harness`), which the CLI dispatches through (its `--mode` choices, the
flags only one mode reads, the manifests `--from` looks for), and the check that a
prepared folder (`--from`, a runner's `--run`) holds a mode's modules."""

from __future__ import annotations

import json
from pathlib import Path

from . import bench_cuda, bench_paged, bench_prefill
from .bench_harness import BenchKind
from .bench_numerics import manifest_numerics
from .cli_errors import UserError
from .support.diagnostics import UsageError

BENCH_KINDS: dict[str, BenchKind] = {kind.mode: kind for kind in (
    bench_cuda.KIND, bench_paged.KIND, bench_prefill.KIND)}


def bench_kind(mode: str, kinds: dict[str, BenchKind] | None = None) -> BenchKind:
    """The kind of `--mode mode`; an unknown mode is refused as argparse refuses it."""
    kinds = BENCH_KINDS if kinds is None else kinds
    try:
        return kinds[mode]
    except KeyError:
        choices = ", ".join(repr(m) for m in kinds)
        raise UsageError(f"argument --mode: invalid choice: {mode!r} (choose from "
                         f"{choices})") from None


def mode_flags(kinds: dict[str, BenchKind] | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Flags that only some modes read: flag -> (settings field, those modes)."""
    kinds = BENCH_KINDS if kinds is None else kinds
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for kind in kinds.values():
        for flag, name in kind.flags:
            modes = found.get(flag, (name, ()))[1]
            found[flag] = (name, modes + (kind.mode,))
    return found


def check_manifest(meta, kind: BenchKind) -> None:
    """ValueError unless `meta` is a manifest of `kind`: a JSON object holding its counts
    as positive integers and numerics the contract takes."""
    if not isinstance(meta, dict):
        raise ValueError(f"not a JSON object but {type(meta).__name__}")
    for name in kind.manifest_counts:
        value = meta.get(name)
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} is {value!r}, not a positive integer")
    manifest_numerics(meta)


def check_prepared(directory: Path, mode: str, flag: str = "--from") -> None:
    """`flag DIR` (`int8attn bench --from`, a runner's `--run`) must hold what
    `int8attn bench --mode MODE --prepare-only DIR` writes."""
    kind = bench_kind(mode)
    if not directory.exists():
        raise UserError(f"{flag} folder '{directory}' does not exist; prepare it with "
                        f"int8attn bench --mode {mode} --prepare-only {directory}")
    if not directory.is_dir():
        raise UserError(f"{flag} '{directory}' is not a folder; give the folder that "
                        f"--prepare-only wrote")
    manifest = directory / kind.manifest
    if not manifest.is_file():
        other = [m for m, k in BENCH_KINDS.items()
                 if m != mode and (directory / k.manifest).is_file()]
        if other:
            hint = f"it holds --mode {other[0]} modules"
            hint += f" (add --mode {other[0]})" if flag == "--from" else ""
        else:
            hint = f"prepare it with int8attn bench --mode {mode} --prepare-only {directory}"
        raise UserError(f"{flag} folder '{directory}' has no {kind.manifest}, so no "
                        f"--mode {mode} modules; {hint}")
    try:
        meta = json.loads(manifest.read_text())
        check_manifest(meta, kind)
        files = kind.module_files(meta)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError(f"{flag} folder '{directory}': {manifest.name} is damaged ({error}); "
                        f"prepare the folder again with --prepare-only") from None
    missing = [name for name in files if not (directory / name).is_file()]
    if missing:
        raise UserError(f"{flag} folder '{directory}' lacks {', '.join(missing)} that its "
                        f"{manifest.name} lists; prepare the folder again with --prepare-only")
