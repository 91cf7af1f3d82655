"""The table of `int8attn bench` kinds: `--mode` -> the kind's `BenchKind`
(`bench_harness`), which the CLI dispatches through (its `--mode` choices, the
flags only one mode reads, the manifests `--from` looks for)."""

from __future__ import annotations

from . import bench_cuda, bench_paged, bench_prefill
from .bench_harness import BenchKind
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


def mode_flags(kinds: dict[str, BenchKind] | None = None) -> dict[str, tuple[str, str]]:
    """Flags that only one mode reads: flag -> (settings field, mode)."""
    kinds = BENCH_KINDS if kinds is None else kinds
    return {flag: (name, kind.mode) for kind in kinds.values() for flag, name in kind.flags}
