"""The cpu decode module's kernel time with and without IREE's data tiling of the
QK int8 contractions, per --target-cpu, interleaved in one process.

    python benchmarks/cpu_int8_dot.py [--contexts 4096,16384] [--rounds 11]
        [--target-cpus host,x86-64-v3] [--json rows.json]

One linalg module per context (the default numerics, B 1, Hq 32 / Hkv 8, D 128),
compiled by iree-compile with the cpu target's flags without and with
`--iree-opt-data-tiling` (which puts QK's i8 x i8 -> i32 contractions on packed
mmt4d tiles: VNNI `vpdpwssd` or AVX2 `vpmaddwd`). Every output is checked bitwise
against the form without data tiling before any timing. Kernel only: the IREE
function on arguments already on the device, 3 calls per variant per round, all
variants in turn each round; min and median over every call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np
from iree.compiler import compile_str

from int8attn.driver.compile import compile
from int8attn.driver.graph import attention_graph, random_inputs
from int8attn.driver.options import CompileOptions
from int8attn.driver.targets import TARGETS
from int8attn.driver.cpu_target import DATA_TILING, resolve
from int8attn.runtime import LoadedModule

SEED = 0


def modules(tokens: int, cpus: list[str]):
    source = attention_graph(1, 32, 8, tokens, 128, mode="decode", name="decode")
    compiled = compile(source, CompileOptions(), until="linalg")
    linalg, info = compiled.artifacts["linalg"], compiled.functions["decode"]
    base = [f for f in TARGETS["cpu"].iree_flags if f not in DATA_TILING]
    out = {}
    for cpu in cpus:
        flags = base + [f"--iree-llvmcpu-target-cpu={cpu}"]
        for name, extra in (("generic QK", []), ("data-tiled QK", list(DATA_TILING))):
            print(f"  S={tokens} {cpu} {name}...", file=sys.stderr, flush=True)
            vmfb = compile_str(linalg, extra_args=flags + extra)
            out[(cpu, name)] = LoadedModule(vmfb, {"decode": list(info.arguments)})
    return info, out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--target-cpus", default="host,x86-64-v3")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cpus = args.target_cpus.split(",")
    rows = []
    for tokens in (int(t) for t in args.contexts.split(",")):
        info, loaded = modules(tokens, cpus)
        inputs = random_inputs(info, SEED)
        print(f"  inputs: Gaussian, seed {SEED}", file=sys.stderr)
        for cpu in cpus:
            before = loaded[(cpu, "generic QK")].call("decode", *inputs)[0]
            after = loaded[(cpu, "data-tiled QK")].call("decode", *inputs)[0]
            if not np.array_equal(before.view(np.uint32), after.view(np.uint32)):
                raise SystemExit(f"S={tokens} {cpu}: data-tiled QK output differs")
        seconds = {key: [] for key in loaded}
        for _ in range(args.rounds):
            for key, module in loaded.items():
                seconds[key] += module.time_calls("decode", inputs, iterations=3, warmup=1)
        for (cpu, name), times in seconds.items():
            resolved = resolve(cpu).cpu
            rows.append({"context": tokens, "target_cpu": cpu, "resolved_cpu": resolved,
                         "qk": name, "min_ms": 1e3 * min(times),
                         "median_ms": 1e3 * statistics.median(times), "calls": len(times),
                         "bitwise_equal_to_generic": True})
            print(f"S={tokens:6d} {cpu:10s} ({resolved}) {name:14s} "
                  f"min {1e3 * min(times):7.2f} ms  median {1e3 * statistics.median(times):7.2f}"
                  f" ms  ({len(times)} calls)", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "load_average": list(__import__("os").getloadavg()),
                       "time": time.strftime("%Y-%m-%d %H:%M")}, f, indent=1)


if __name__ == "__main__":
    main()
