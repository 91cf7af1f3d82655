"""The prefill bench's plot (`int8attn.bench_prefill.plot`) from rows it saved.

    python benchmarks/plot_prefill.py benchmarks/results/2026-12-05-h200-prefill-and-paged-decode/rows.json \\
        --key head_tables --out benchmarks/results/2026-12-05-h200-prefill-and-paged-decode/plot.png

The JSON is what `bench_prefill --json` writes (a list of rows), or a results folder's
`rows.json` holding such lists under keys (`--key` chooses one).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from int8attn import bench_prefill


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/plot_prefill.py")
    parser.add_argument("json", type=Path, help="rows of bench_prefill --json, or a results file")
    parser.add_argument("--key", help="the results file's key holding the rows")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        found = json.loads(args.json.read_text())
    except (OSError, ValueError) as e:
        parser.error(f"cannot read rows from {args.json}: {e}")
    if isinstance(found, dict):
        if args.key not in found:
            parser.error(f"{args.json} holds rows under {', '.join(sorted(found))}: "
                         f"choose one with --key")
        found = found[args.key]
    if not (isinstance(found, list) and found and all("causal_flops" in r for r in found)):
        parser.error(f"{args.json}{f' [{args.key}]' if args.key else ''} holds no prefill "
                     f"bench rows (a list of rows with causal_flops)")
    try:
        bench_prefill.plot(found, args.out)
    except ImportError:
        print("error: the plot needs matplotlib (pip install 'int8attn[bench]')", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
