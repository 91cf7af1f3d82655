"""The dense API's cost over the kernel on the CPU, before and after arguments were read in
place, interleaved in one process.

    python benchmarks/api_copies.py [--contexts 4096,16384] [--rounds 31] [--cpu-time]
                                    [--before 7b1321c~1]

"before" is `int8attn/api.py` and `runtime/module.py` as they were at the commit
`--before` (loaded from git beside the current package: every argument packed into a
fresh IREE buffer); "after" is the working tree. Each is called on numpy's own arrays
(usually 16-byte aligned: copied after too) and on 64-byte aligned copies of them
(`runtime.aligned_copy`: read in place after). "kernel only" calls the module on
arguments already on the device (IREE's buffers, or the imported arrays). B 1, Hq 32,
Hkv 8, D 128; each call follows a 96 MiB write that evicts the cache from L3; min and
median per method over `--rounds` rounds of all methods in turn. `--cpu-time` runs the
modules on the inline `local-sync` driver and times by process CPU time (what a shared
machine's load does not inflate); otherwise wall time on `local-task`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import int8attn
from int8attn.driver.graph import decode_graph, random_inputs
from int8attn.runtime import LoadedModule, aligned_copy

REPO = Path(__file__).resolve().parent.parent


def load_before(commit: str, folder: Path):
    """(api module, runtime.module module) of `commit`, imported under other names."""
    def source(path):
        return subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"],
                              capture_output=True, text=True, check=True).stdout
    module = source("runtime/module.py").replace("from ..support", "from int8attn.support")
    api = source("int8attn/api.py")
    api = api.replace("from .runtime.module import", "from before_module import")
    api = api.replace("from .runtime import LoadedModule, ModuleCache",
                      "from before_module import LoadedModule\n"
                      "from int8attn.runtime import ModuleCache")
    api = api.replace("from .", "from int8attn.")
    # (AttentionCall.by_reference was () for a dense call; it is gone since)
    api = api.replace('"by_reference": call.by_reference', '"by_reference": ()')
    loaded = []
    for name, text in (("before_module", module), ("before_api", api)):
        path = folder / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(name, path)
        loaded.append(importlib.util.module_from_spec(spec))
        sys.modules[name] = loaded[-1]
        spec.loader.exec_module(loaded[-1])
    return loaded[1], loaded[0]


def measure(tokens: int, args, before_api, before_module) -> dict[str, list[float]]:
    import iree.runtime as rt

    after = int8attn.compile(decode_graph(1, 32, 8, tokens, 128), target="cpu")
    before = before_api.CompiledGraph(after.functions, after.options, vmfb=after.vmfb)
    if args.cpu_time:     # one thread, the calling one: CPU time is the call's own work
        signatures = {"decode": list(after.entry().arguments)}
        after._executor = LoadedModule(after.vmfb, signatures, driver="local-sync")
        before._executor = before_module.LoadedModule(after.vmfb, signatures,
                                                      driver="local-sync")
    arrays = random_inputs(after.entry(), args.seed)
    aligned = [aligned_copy(a) for a in arrays]
    expected = before(*arrays)
    for out in (after(*arrays), after(*aligned), before(*aligned)):
        assert np.array_equal(out, expected), "before and after differ"
    entry = after.executor._entry("decode", arrays)
    device = after.executor._context.config.device
    on_device = [rt.asdevicearray(device, a) for a in arrays]
    held = []
    imported = after.executor._pass("decode", aligned, (), held)
    methods = {
        "before: API, numpy arrays": lambda: before(*arrays),
        "before: API, aligned arrays": lambda: before(*aligned),
        "after: API, numpy arrays": lambda: after(*arrays),
        "after: API, aligned arrays": lambda: after(*aligned),
        "kernel only, IREE's buffers": lambda: entry(*on_device).to_host(),
        "kernel only, imported arrays": lambda: entry(*imported).to_host(),
    }
    scratch = np.zeros(96 << 20, np.uint8)
    clock = time.process_time if args.cpu_time else time.perf_counter
    times = {name: [] for name in methods}
    for _ in range(args.rounds):
        for name, call in methods.items():
            scratch[::64] += 1
            start = clock()
            call()
            times[name].append(clock() - start)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-time", action="store_true")
    parser.add_argument("--before", default="7b1321c~1")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        before_api, before_module = load_before(args.before, Path(folder))
        clock = "local-sync, process CPU time" if args.cpu_time else "local-task, wall time"
        print(f"seed {args.seed}; B 1, Hq 32, Hkv 8, D 128; {clock}; {args.rounds} "
              f"interleaved rounds; before = {args.before}")
        print("| S | method | min (ms) | median (ms) |\n|--:|:--|--:|--:|")
        for tokens in (int(c) for c in args.contexts.split(",")):
            for name, seconds in measure(tokens, args, before_api, before_module).items():
                print(f"| {tokens} | {name} | {min(seconds) * 1e3:.2f} | "
                      f"{np.median(seconds) * 1e3:.2f} |", flush=True)
        load = os.getloadavg()
        print(f"load average at the end: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on "
              f"{os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
