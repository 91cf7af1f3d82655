"""The `int8attn bench` command: its checks, then the bench kind's prepare and run.

Every check comes before any compilation and needs no GPU: flags of another
`--mode` (`MODE_FLAGS`), the kernels' shape limits, a `--from` folder that
`--prepare-only` wrote, a writable `--prepare-only` folder, the `--out` paths.
The kinds themselves (decode, paged, prefill) are the table in `bench_kinds`.
"""

from __future__ import annotations

import os
from pathlib import Path

from .bench_harness import BENCH_OUT, BenchSettings, output_paths, write_results
from .bench_kinds import bench_kind, check_prepared, mode_flags
from .cli_errors import UserError
from .support.files import OutputError, check_output_path


# Flags that only one --mode reads (the others would ignore them): flag -> (name, mode),
# from the table of kinds, checked in the order `int8attn bench --help` lists them (of
# two misused, the first is named).
_HELP_ORDER = ("--history", "--new-tokens", "--ragged-mean", "--numerics", "--w-chain")
MODE_FLAGS = dict(sorted(mode_flags().items(), key=lambda item: (
    _HELP_ORDER.index(item[0]) if item[0] in _HELP_ORDER else len(_HELP_ORDER))))


# BenchSettings field -> the argparse name of its flag.
_SETTINGS_ARGS = {"contexts": "context", "batch": "batch", "q_heads": "q_heads",
                  "kv_heads": "kv_heads", "head_dim": "head_dim", "iterations": "iterations",
                  "seed": "seed", "history": "history", "new_tokens": "new_tokens",
                  "ragged_mean": "ragged_mean", "numerics": "numerics", "w_chains": "w_chains"}


I32_MAX = 2 ** 31 - 1       # the kernels' lengths and block tables are int32


def _check_bench_shape(args, misuse) -> None:
    """The kernels' limits on the shape flags, before anything is compiled."""
    from .kernels.target_spec import target_spec

    cuda = target_spec("cuda")

    if args.q_heads % args.kv_heads:
        misuse(f"--q-heads {args.q_heads} is not a multiple of --kv-heads {args.kv_heads} "
               f"(each KV head serves the same number of query heads)")
    rows = args.q_heads // args.kv_heads
    if bench_kind(args.mode).query_heads_in_one_tile and rows > cuda.tile_rows:
        misuse(f"--q-heads {args.q_heads} over --kv-heads {args.kv_heads} is {rows} query heads "
               f"per KV head; the decode kernels' MMAC tile holds {cuda.tile_rows} "
               f"(raise --kv-heads)")
    longest = {"--context": max(args.context or (0,)),
               "--history plus --new-tokens": (args.history or 0) + (args.new_tokens or 0),
               # the ragged batch's lengths are uniform on [1, 2 * mean - 1]
               f"--ragged-mean {args.ragged_mean}'s longest sequence":
                   2 * (args.ragged_mean or 0) - 1}
    for what, count in longest.items():
        if count > I32_MAX:
            misuse(f"{what} ({count} tokens) is past the kernels' token counts, which are "
                   f"int32 (at most {I32_MAX})")
    k = cuda.model.instruction.k
    if args.head_dim % k:
        misuse(f"--head-dim {args.head_dim} is not a multiple of {k}, the K of the cuda "
               f"kernels' int8 mma.sync (e.g. 64 or 128)")


def _check_prepare_folder(directory: Path) -> None:
    """`--prepare-only DIR`: a folder (made if missing) that can be written."""
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--prepare-only '{directory}' is a file, not a folder; give a folder "
                        f"to write the modules to (it is made if missing)")
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--prepare-only '{directory}': '{existing}' is a file, so the folder "
                        f"cannot be made; give another folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"--prepare-only '{directory}': '{existing}' is not writable; give a "
                        f"folder you can write to")


def cmd_bench(args) -> int:
    import tempfile

    misuse = args.misuse
    kind = bench_kind(args.mode)
    # Every check first: none needs a GPU, and a mistake must not cost a compilation.
    for flag, (name, wanted) in MODE_FLAGS.items():
        if getattr(args, name) is not None and kind.mode not in wanted:
            misuse(f"{flag} applies to --mode {' or '.join(wanted)}, not --mode {kind.mode}")
    if args.from_dir and args.prepare_only:
        misuse("--prepare-only compiles the modules and --from runs compiled ones; give one")
    if args.prepare_only:
        for flag, value in (("--out", args.out), ("--iterations", args.iterations)):
            if value is not None:
                misuse(f"{flag} applies to the run, and --prepare-only only compiles; give it "
                       f"where the modules run (int8attn bench --from DIR {flag} ...)")
    out = BENCH_OUT if args.out is None else args.out
    if args.from_dir:
        for flag, name in kind.prepared_flags:
            if getattr(args, _SETTINGS_ARGS[name]) is not None:
                misuse(f"{flag} is fixed by the modules in --from {args.from_dir} (they were "
                       f"compiled for the values in its manifest); leave it out, or prepare "
                       f"another folder with --prepare-only")
    given = {name: getattr(args, arg) for name, arg in _SETTINGS_ARGS.items()
             if getattr(args, arg) is not None}
    settings = BenchSettings(**given)       # a flag not given: BenchSettings' default
    for name in ("q_heads", "kv_heads", "head_dim"):      # for the shape checks
        setattr(args, name, getattr(settings, name))
    if args.from_dir:
        directory = Path(args.from_dir)
        check_prepared(directory, kind.mode)
    else:
        _check_bench_shape(args, misuse)
        if args.prepare_only:
            _check_prepare_folder(Path(args.prepare_only))
    outputs = [] if args.prepare_only else output_paths(out, kind.plot is not None)
    for output in outputs:
        try:
            check_output_path(output)
        except OutputError as error:
            raise OutputError(f"--out {out}: {error}") from None
    if not args.from_dir:
        directory = Path(args.prepare_only or tempfile.mkdtemp(prefix="int8attn-bench-"))
        kind.prepare(directory, settings)
        if args.prepare_only:
            return 0
    try:
        rows = kind.run(directory, settings)
    except RuntimeError as error:
        raise UserError(f"cannot run on CUDA here ({error}); compile with --prepare-only "
                        f"and run with --from on a machine with an NVIDIA GPU") from None
    write_results(rows, kind.markdown, out, kind.plot)
    return 0
