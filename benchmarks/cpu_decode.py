"""Decode on the IREE CPU runtime: pass time, IREE compile time and run time
of the int8 / bf16 / f32 PV modules, measured in one run.

    python benchmarks/cpu_decode.py [--contexts 4096,8192,16384] [--iterations 20]

Shapes follow the issue: batch 1, 32 query heads, 8 KV heads, head dim 128.
Run time is the median over `--iterations` calls with inputs already on the
device, after warm-up; the three modules of a context take turns, in
`--rounds` rounds, so that a change in the machine's load falls on all of them
alike. Ratios are against the int8 module of the same context.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


from int8attn.driver.compile import compile
from int8attn.driver.graph import decode_graph, random_inputs
from int8attn.driver.options import CompileOptions
from int8attn.runtime import LoadedModule

PVS = ("int8", "bf16", "f32")


def measure(tokens: int, args) -> list[dict]:
    """Compile the int8 / bf16 / f32 modules of one context, then time them in turns."""
    source = decode_graph(args.batch, args.q_heads, args.kv_heads, tokens, args.head_dim)
    rows, runs = [], []
    for pv in PVS:
        print(f"  S={tokens} pv={pv} ...", file=sys.stderr, flush=True)
        compiled = compile(source, CompileOptions(pv=pv), filename=f"decode_{tokens}.mlir")
        info, vmfb = compiled.functions["decode"], compiled.artifacts["vmfb"]
        passes = sum(compiled.timings[s] for s in ("graph", "algorithm", "linalg"))
        rows.append({"context": tokens, "pv": pv, "passes_s": passes,
                     "iree_compile_s": compiled.timings["vmfb"], "times_s": []})
        runs.append((LoadedModule(vmfb, {"decode": list(info.arguments)}),
                     random_inputs(info, args.seed)))
    per_round = max(1, -(-args.iterations // args.rounds))
    for _ in range(args.rounds):
        for row, (loaded, inputs) in zip(rows, runs):
            row["times_s"] += loaded.time_calls("decode", inputs, per_round)
    for row in rows:
        times = row.pop("times_s")
        row.update(run_s=statistics.median(times), run_min_s=min(times), calls=len(times))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5,
                        help="turns the three modules of a context take (default 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"seed {args.seed}; B={args.batch} Hq={args.q_heads} Hkv={args.kv_heads} "
          f"D={args.head_dim}; run time = median of {args.iterations} calls in "
          f"{args.rounds} interleaved rounds", file=sys.stderr)
    rows = [row for tokens in contexts for row in measure(tokens, args)]
    print("| context | PV | passes (s) | iree-compile (s) | run (ms) | min run (ms) "
          "| run / int8 run |")
    print("|--:|:--|--:|--:|--:|--:|--:|")
    for row in rows:
        base = next(r for r in rows if r["context"] == row["context"] and r["pv"] == "int8")
        print(f"| {row['context']} | {row['pv']} | {row['passes_s']:.3f} | "
              f"{row['iree_compile_s']:.2f} | {row['run_s'] * 1e3:.2f} | "
              f"{row['run_min_s'] * 1e3:.2f} | {row['run_s'] / base['run_s']:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
