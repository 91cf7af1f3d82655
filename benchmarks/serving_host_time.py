"""Host time per serving call in each value-check mode, eager and replayed from a CUDA graph.

    python benchmarks/serving_host_time.py prepare DIR             # here: compile the packages
    python benchmarks/serving_host_time.py run DIR --out OUT       # on the GPU machine
    python benchmarks/serving_host_time.py cpu                     # the same harness, cpu target

For attend and write + attend (one new token per sequence), at B = 1 16K and
B = 16 4K, in each mode of `validate` ("sync": today's check, one host sync per
call; True: the checks on the device, no sync; False: none):
- eager: the host time to enqueue `--calls` back-to-back calls (no synchronize in
  the loop), per call, and the wall time per call once the GPU has finished;
- graph: the same calls captured in a CUDA graph (10 per graph; "sync" cannot be
  captured), the host time of back-to-back replays per call (the GPU's time where
  its queue fills), and graph-idle: one replay on an idle GPU, per call;
- syncs: the host syncs one eager call makes, counted by torch's sync debug mode.
The `cpu` mode runs the eager part on torch CPU tensors (the cpu target, small
sizes): it checks the harness, not the GPU's numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_cuda import BS, D, HKV, HQ, SEED, random_pool  # noqa: E402

MODES = (("sync", "sync"), ("deferred", True), ("none", False))
GRAPH_CALLS = 10


def prepare(folder: Path) -> None:
    from int8attn.serving import PagedAttention

    PagedAttention(HQ, HKV, D, BS, target="cuda").save(folder, write=True)
    print(f"prepared {folder}")


def new_tokens(torch, rng, pool, batch, device):
    """One new token per sequence, at distinct random slots of the pool."""
    slots = rng.permutation(pool[0].shape[0] * BS)[:batch].astype(np.int32)
    return (torch.randn(batch, HKV, D, device=device), torch.randn(batch, HKV, D, device=device),
            torch.from_numpy(slots).to(device))


def step(attn, q, pool, out, new, validate):
    if new is not None:
        attn.write(*new, *pool[:4], validate=validate)
    attn(q, *pool, out=out, validate=validate)


def eager(torch, attn, q, pool, out, new, validate, calls: int) -> dict:
    cuda = q.device.type == "cuda"
    for _ in range(3):
        step(attn, q, pool, out, new, validate)
    finish = torch.cuda.synchronize if cuda else (lambda: None)
    finish()
    start = time.perf_counter()
    for _ in range(calls):
        step(attn, q, pool, out, new, validate)
    enqueued = time.perf_counter() - start
    finish()
    wall = time.perf_counter() - start
    attn.check()
    return {"host_us": enqueued / calls * 1e6, "wall_us": wall / calls * 1e6,
            "syncs": syncs(torch, attn, q, pool, out, new, validate) if cuda else None}


def syncs(torch, attn, q, pool, out, new, validate) -> int:
    """Host syncs one call makes (torch's sync debug mode, as warnings)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step(attn, q, pool, out, new, validate)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    return sum("synchroniz" in str(w.message) for w in caught)


def replayed(torch, attn, q, pool, out, new, validate, replays: int = 50) -> tuple:
    """(back to back: host and wall time per call; idle: the host time of one replay
    started on an idle GPU, per call). Back-to-back replays wait on the host once the
    GPU's queue is full, so where the captured work outlasts the host's loop their host
    time is the GPU's; the idle replay is the launch alone."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            step(attn, q, pool, out, new, validate)
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(replays):
        graph.replay()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    idle = []
    for _ in range(20):
        torch.cuda.synchronize()
        begin = time.perf_counter()
        graph.replay()
        idle.append(time.perf_counter() - begin)
    torch.cuda.synchronize()
    attn.check()
    calls = replays * GRAPH_CALLS
    return ({"host_us": host / calls * 1e6, "wall_us": wall / calls * 1e6},
            {"host_us": float(np.median(idle)) / GRAPH_CALLS * 1e6, "wall_us": None})


def measure(torch, attn, device, shapes, calls: int, write: bool, graphs: bool) -> dict:
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    results = {}
    for batch, length in shapes:
        pool = random_pool(torch, rng, batch * -(-length // BS) + 2 * batch, [length] * batch,
                           device, garbage=False)
        q = torch.randn(batch, HQ, D, device=device)
        out = torch.empty_like(q)
        for with_write in (False, True) if write else (False,):
            new = new_tokens(torch, rng, pool, batch, device) if with_write else None
            row = {}
            for name, validate in MODES:
                row[f"{name} eager"] = eager(torch, attn, q, pool, out, new, validate, calls)
                if graphs and validate != "sync":
                    row[f"{name} graph"], row[f"{name} graph-idle"] = replayed(
                        torch, attn, q, pool, out, new, validate)
            label = f"B={batch} {length // 1024}K" if length >= 1024 else f"B={batch} {length}"
            results[label + (" write+attend" if with_write else " attend")] = row
            print(label, "write+attend" if with_write else "attend", row, flush=True)
    return results


def table(results: dict) -> str:
    """Host us per call (syncs per eager call) by shape and mode."""
    columns = sorted({c for row in results.values() for c in row},
                     key=lambda c: ([m for m, _ in MODES].index(c.split()[0]), c))
    lines = ["| call | " + " | ".join(columns) + " |",
             "|---|" + "--:|" * len(columns)]
    for label, row in results.items():
        cells = []
        for c in columns:
            cell = row.get(c)
            if cell is None:
                cells.append("n/a")
                continue
            text = f"{cell['host_us']:.1f}"
            if cell.get("syncs") is not None:
                text += f" ({cell['syncs']} sync{'' if cell['syncs'] == 1 else 's'})"
            cells.append(text)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(folder: Path, out_dir: Path | None, calls: int) -> dict:
    import torch

    from int8attn.serving import PagedAttention

    print(f"random inputs: seed {SEED}", flush=True)
    attn = PagedAttention.load(folder)
    results = {"device": torch.cuda.get_device_name(), "calls": calls,
               "host_us_per_call": measure(torch, attn, torch.device("cuda"),
                                           ((1, 16384), (16, 4096)), calls,
                                           write="write" in attn._executors, graphs=True)}
    print(table(results["host_us_per_call"]))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "serving_host_time.json").write_text(json.dumps(results, indent=1))
        (out_dir / "serving_host_time.md").write_text(table(results["host_us_per_call"]) + "\n")
    return results


def run_cpu(calls: int, length: int) -> dict:
    import torch

    from int8attn.serving import PagedAttention

    print(f"random inputs: seed {SEED}", flush=True)
    attn = PagedAttention(HQ, HKV, D, BS, target="cpu")
    results = measure(torch, attn, torch.device("cpu"), ((1, length),), calls, write=True,
                      graphs=False)
    print(table(results))
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("prepare", "run", "cpu"))
    parser.add_argument("folder", type=Path, nargs="?")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--calls", type=int, default=1000, help="eager calls per measurement")
    parser.add_argument("--length", type=int, default=256, help="cpu: the sequence's tokens")
    args = parser.parse_args(argv)
    if args.mode != "cpu" and args.folder is None:
        parser.error(f"{args.mode} needs the packages' folder")
    if args.mode == "prepare":
        prepare(args.folder)
    elif args.mode == "run":
        run(args.folder, args.out, args.calls)
    else:
        run_cpu(args.calls, args.length)
    return 0


if __name__ == "__main__":
    sys.exit(main())
