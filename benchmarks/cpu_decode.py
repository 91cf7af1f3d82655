"""Decode on the IREE CPU runtime: pass time, IREE compile time and run time
of the int8 / bf16 / f32 PV modules, measured in one run.

    python benchmarks/cpu_decode.py [--contexts 4096,8192,16384] [--iterations 20]
    python benchmarks/cpu_decode.py --numerics     # the int8 module per q-terms x w-quant
                                                   # (one W term), and two-term W
    python benchmarks/cpu_decode.py --numerics --query-tokens 256 --contexts 2048   # prefill
    python benchmarks/cpu_decode.py --cpu-time     # one thread, CPU time of the calls
    python benchmarks/cpu_decode.py --cpu-time --w-terms 2,1   # int8 with two and one W terms
    python benchmarks/cpu_decode.py --cpu-time --w-terms 2,1 --contractions mmt4d,f32
                                   # ... each with these lower-mmac-tiles contractions
    python benchmarks/cpu_decode.py --cpu-time --contractions mmt4d,f32 \
        --target-cpus x86-64-v3,x86-64-v4  # ... compiled for each of these CPUs

Shapes follow the issue: batch 1, 32 query heads, 8 KV heads, head dim 128.
Run time is the median over `--iterations` calls with inputs already on the
device, after warm-up; the three modules of a context take turns, in
`--rounds` rounds, so that a change in the machine's load falls on all of them
alike. Ratios are against the first module of the same context (int8 with the
pipeline's defaults; with --numerics, one-term numerics: one-term Q and s8 W) compiled
for the same --target-cpu.

`--cpu-time` runs the modules on IREE's inline `local-sync` driver (one thread,
the calling one) and times each call by this process's CPU time: on a machine
shared with other jobs that counts the calls' own work, not the time the
scheduler gave to others (cache and memory contention still show).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

from int8attn.contract.numerics import Numerics
from int8attn.driver.compile import compile
from int8attn.driver.graph import attention_graph, random_inputs
from int8attn.driver.options import CompileOptions
from int8attn.pipelines import PIPELINE_NUMERICS
from int8attn.runtime import LoadedModule

# (pv, numerics[, contraction]); numerics None: the pipeline's default.
MODULES = (("int8", None), ("bf16", None), ("f32", None))
NUMERICS = tuple(("int8", Numerics(q_terms=t, w_quant=w, w_terms=1))
                 for t in (1, 2) for w in ("s8", "u8")) + \
    tuple(("int8", Numerics(q_terms=2, w_quant=w, w_terms=2)) for w in ("s8", "u8"))


def measure(tokens: int, args) -> list[dict]:
    """Compile the modules of one context, then time them in turns."""
    mode = "prefill" if args.query_tokens else "decode"
    source = attention_graph(args.batch, args.q_heads, args.kv_heads, tokens, args.head_dim,
                             mode=mode, query_tokens=args.query_tokens or 1, name="decode")
    rows, runs = [], []
    modules = NUMERICS if args.numerics else MODULES
    if args.w_terms and not args.numerics:
        modules = tuple(("int8", dataclasses.replace(PIPELINE_NUMERICS, w_terms=int(t)))
                        for t in args.w_terms.split(",")) + MODULES[1:]
    if args.contractions and not args.numerics:
        modules = tuple((*m, c) for m in modules if m[0] == "int8"
                        for c in args.contractions.split(",")) + \
            tuple(m for m in modules if m[0] != "int8")
    cpus = args.target_cpus.split(",") if args.target_cpus else ["host"]
    modules = tuple((*m, cpu) for cpu in cpus for m in modules)
    for pv, numerics, *contraction, target_cpu in modules:
        print(f"  S={tokens} pv={pv} {' '.join(contraction)} {target_cpu}...", file=sys.stderr,
              flush=True)
        options = CompileOptions(pv=pv, **(dataclasses.asdict(numerics) if numerics else {}),
                                 target_cpu=target_cpu,
                                 **({"contraction": contraction[0]} if contraction else {}))
        compiled = compile(source, options, filename=f"decode_{tokens}.mlir")
        info, vmfb = compiled.functions["decode"], compiled.artifacts["vmfb"]
        passes = sum(compiled.timings[s] for s in ("graph", "algorithm", "linalg"))
        resolved = options.numerics
        label = pv if pv != "int8" else \
            f"int8 q{resolved.q_terms} {resolved.w_quant} w{resolved.w_terms}" + \
            "".join(f" {c}" for c in contraction)
        label += f" ({target_cpu})" if args.target_cpus else ""
        rows.append({"context": tokens, "target_cpu": target_cpu, "pv": label, "passes_s": passes,
                     "iree_compile_s": compiled.timings["vmfb"], "times_s": []})
        driver = "local-sync" if args.cpu_time else "local-task"
        runs.append((LoadedModule(vmfb, {"decode": list(info.arguments)}, driver),
                     random_inputs(info, args.seed)))
    per_round = max(1, -(-args.iterations // args.rounds))
    clock = time.process_time if args.cpu_time else time.perf_counter
    for _ in range(args.rounds):
        for row, (loaded, inputs) in zip(rows, runs):
            row["times_s"] += loaded.time_calls("decode", inputs, per_round, clock=clock)
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
    parser.add_argument("--query-tokens", type=int, default=0,
                        help="prefill with this many query tokens instead of decode")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one thread (IREE local-sync) and CPU time per call instead of "
                             "wall time on local-task")
    parser.add_argument("--numerics", action="store_true",
                        help="time the int8 module for every q-terms x w-quant instead")
    parser.add_argument("--w-terms", default="",
                        help="int8 modules with these W terms instead of the default one, "
                             "e.g. 2,1 (the first is the ratios' base)")
    parser.add_argument("--contractions", default="",
                        help="int8 modules with each of these lower-mmac-tiles contractions, "
                             "e.g. mmt4d,f32 (the pass's default otherwise)")
    parser.add_argument("--target-cpus", default="",
                        help="compile every module for each of these --target-cpu values, "
                             "e.g. x86-64-v3,x86-64-v4 (default: host)")
    args = parser.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"seed {args.seed}; B={args.batch} Hq={args.q_heads} Hkv={args.kv_heads} "
          f"D={args.head_dim}; run time = median of {args.iterations} calls in "
          f"{args.rounds} interleaved rounds"
          + ("; one thread (local-sync), process CPU time" if args.cpu_time else ""),
          file=sys.stderr)
    rows = [row for tokens in contexts for row in measure(tokens, args)]
    print("| context | PV | passes (s) | iree-compile (s) | run (ms) | min run (ms) "
          "| run / first run |")
    print("|--:|:--|--:|--:|--:|--:|--:|")
    for row in rows:
        base = next(r for r in rows if (r["context"], r["target_cpu"]) ==
                    (row["context"], row["target_cpu"]))
        print(f"| {row['context']} | {row['pv']} | {row['passes_s']:.3f} | "
              f"{row['iree_compile_s']:.2f} | {row['run_s'] * 1e3:.2f} | "
              f"{row['run_min_s'] * 1e3:.2f} | {row['run_s'] / base['run_s']:.2f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
