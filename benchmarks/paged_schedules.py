"""Prepare paged bench modules with another cuda decode schedule (`DecodeTuning`).

    python benchmarks/paged_schedules.py DIR merge_chunks=16 merge_splits=32 merge_unroll=2
    python -m int8attn.bench_paged --run DEFAULT_DIR,DIR,... --pv int8   # on the GPU

Each folder holds the modules `int8attn bench --mode paged --prepare-only`
writes, built with the cuda target's default schedule (kernels/decode.py
default_tuning) changed in the named fields; `bench_paged --run` with several
folders times them on the same data, every output checked as in the bench.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

from int8attn import bench_paged
from int8attn.kernels import decode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/paged_schedules.py")
    parser.add_argument("directory", type=Path)
    parser.add_argument("fields", nargs="*", metavar="FIELD=VALUE",
                        help=", ".join(f.name for f in fields(decode.DecodeTuning)))
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    types = {f.name: f.type for f in fields(decode.DecodeTuning)}
    changes = {}
    for pair in args.fields:
        name, _, value = pair.partition("=")
        if name not in types:
            parser.error(f"DecodeTuning has no field {name!r}")
        changes[name] = value == "True" if types[name] == "bool" else int(value)
    measured = decode.default_tuning
    decode.default_tuning = lambda target, head_dim: replace(measured(target, head_dim), **changes)
    print(f"{args.directory}: {decode.default_tuning('cuda', args.head_dim)}", flush=True)
    bench_paged.prepare(args.directory, args.q_heads, args.kv_heads, args.head_dim)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
