"""The serving path on a GPU: correctness, stream order, no copies, host overhead.

    python benchmarks/serving_cuda.py prepare DIR          # here: compile the packages
    python benchmarks/serving_cuda.py run DIR --out OUT    # on the GPU machine

`run` (torch CUDA tensors, the kernels launched on torch's current stream):
1. every sequence of a ragged batch against the fragment-level reference
   (5e-5 + the tie slack) and the exact reference, the pool seeded with garbage;
2. stream order: on a side stream, a ~50 ms GPU sleep, then an op writing q,
   the call, an op reading the result, no synchronize in between: right. The
   control launches the same kernels on the default stream instead and must
   read the stale q (proves the test can fail);
3. no copy of the pool: data pointers unchanged, and the torch profiler sees no
   host<->device memcpy during 20 calls with validate=False;
4. host overhead: wall time per call over 1000 back-to-back calls (B = 1, 16K;
   B = 16, 4K), the host time to enqueue them, the kernels' device time; a
   32-layer B = 1, 16K step eager and replayed from a CUDA graph.
With the cache_write package present (`prepare --write`): the write checked on
the GPU against the reference bitwise, its time at 64 and 65,536 blocks, and
the step timings include it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

HQ, HKV, D, BS = 32, 8, 128, 16
SEED = 0


def prepare(folder: Path, write: bool) -> None:
    from int8attn.serving import PagedAttention

    PagedAttention(HQ, HKV, D, BS, target="cuda").save(folder, write=write)
    print(f"prepared {folder} (write={write})")


def random_pool(torch, rng, blocks, lengths, dev, garbage=True):
    """A pool with the sequences' blocks scattered, garbage elsewhere (NaN scales)."""
    needed = [-(-n // BS) for n in lengths]
    order = rng.permutation(blocks)[:sum(needed)]
    tables = np.full((len(lengths), max(needed)), -1, np.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    k = torch.randint(-127, 128, (blocks, HKV, BS, D), dtype=torch.int8, device=dev)
    v = torch.randint(-127, 128, (blocks, HKV, D, BS), dtype=torch.int8, device=dev)
    ks = torch.rand(blocks, HKV, BS, device=dev) / 127 + 0.5 / 127
    vs = torch.rand(blocks, HKV, BS, device=dev) / 127 + 0.5 / 127
    if garbage:
        unused = torch.ones(blocks, dtype=torch.bool, device=dev)
        unused[torch.from_numpy(order.astype(np.int64)).to(dev)] = False
        ks[unused] = float("nan")
        vs[unused] = float("nan")
    return [k, ks, v, vs, torch.from_numpy(tables).to(dev),
            torch.tensor(lengths, dtype=torch.int32, device=dev)]


def check_against_references(attn, torch, out, q, pool, numerics) -> dict:
    from int8attn.reference import (exact_attention, fragment_attention, rounding_tie_slack,
                                    sequence_cache)

    arrays = [t.cpu().numpy() for t in [q, *pool]]
    q_h, k, ks, v, vs, tables, lengths = arrays
    got = out.cpu().numpy()
    worst_fragment, worst_exact, ok = 0.0, 0.0, True
    for b in range(q_h.shape[0]):
        dense = (q_h[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lengths, b))
        expected = fragment_attention(*dense, attn.softmax_scale, model="cuda", pv="int8",
                                      numerics=numerics)
        slack = rounding_tie_slack(*dense, attn.softmax_scale, model="cuda", pv="int8",
                                   numerics=numerics)
        err = np.abs(got[b:b + 1] - expected)
        ok &= bool((err <= 5e-5 + slack).all())
        worst_fragment = max(worst_fragment, float(err.max()))
        worst_exact = max(worst_exact, float(np.abs(
            got[b:b + 1] - exact_attention(*dense, attn.softmax_scale)).max()))
    return {"fragment_max_abs": worst_fragment, "exact_max_abs": worst_exact,
            "within_fragment_tolerance": ok}


def stream_order(attn, torch, q, pool, dev) -> dict:
    """Side stream: sleep, write q, call, read the result; and the control."""
    from int8attn.serving.executors import CudaExecutor

    expected = attn(q, *pool, validate=False)
    torch.cuda.synchronize()
    side = torch.cuda.Stream(device=dev)
    q_late = torch.zeros_like(q)
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)          # ~50 ms of GPU time before q is written
        q_late.copy_(q)
        read = attn(q_late, *pool, validate=False) * 2.0
    side.synchronize()
    ordered = bool(torch.equal(read, expected * 2.0))
    # Control: the same kernels on the default stream while the side stream sleeps.
    q_late.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        q_late.copy_(q)
    stale = attn(q_late, *pool, validate=False)   # default stream: q not written yet
    torch.cuda.synchronize()
    control_differs = not bool(torch.equal(stale, expected))
    return {"ordered_on_side_stream": ordered, "control_reads_stale_q": control_differs}


def no_copies(attn, torch, q, pool) -> dict:
    before = [t.data_ptr() for t in pool]
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            attn(q, *pool, validate=False)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events()]
    memcpy = [n for n in names if "memcpy" in n.lower() and "dtod" not in n.lower()]
    kernels = [n for n in names if n.startswith("decode_")]
    with profile(activities=[ProfilerActivity.CUDA]) as prof_v:
        attn(q, *pool, validate="sync")
        torch.cuda.synchronize()
    validated = [e.name for e in prof_v.events() if "memcpy" in e.name.lower()]
    return {"pool_pointers_unchanged": before == [t.data_ptr() for t in pool],
            "host_device_memcpy_events_20_calls": len(memcpy),
            "kernel_events_20_calls": len(kernels),
            "memcpy_events_one_validated_call": len(validated)}


def decode_step(attn, torch, q, pool, out, new=None):
    """One layer's decode step: with `new` = (k_new, v_new, slots), the write first."""
    if new is not None:
        attn.write(*new, *pool[:4], validate=False)
    attn(q, *pool, out=out, validate=False)


def new_tokens(torch, rng, pool, batch):
    """One new token per sequence, written to a free slot at the end of the pool."""
    blocks = pool[0].shape[0]
    slots = torch.from_numpy(rng.permutation(blocks * BS)[:batch].astype(np.int32)).cuda()
    return (torch.randn(batch, HKV, D, device="cuda"), torch.randn(batch, HKV, D, device="cuda"),
            slots)


def host_overhead(attn, torch, q, pool, calls=1000, new=None) -> dict:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for _ in range(20):
        decode_step(attn, torch, q, pool, out, new)
    torch.cuda.synchronize()
    start_event, end_event = torch.cuda.Event(True), torch.cuda.Event(True)
    start = time.perf_counter()
    start_event.record()
    for _ in range(calls):
        decode_step(attn, torch, q, pool, out, new)
    enqueued = time.perf_counter() - start
    end_event.record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    # The kernels alone: the same calls replayed from a CUDA graph.
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            decode_step(attn, torch, q, pool, out, new)
    graph.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    start = time.perf_counter()
    for _ in range(20):
        graph.replay()
    replay_host = time.perf_counter() - start
    e1.record()
    torch.cuda.synchronize()
    device_us = e0.elapsed_time(e1) * 1e3 / 200
    return {"calls": calls, "with_write": new is not None,
            "wall_us_per_call": wall / calls * 1e6,
            "host_enqueue_us_per_call": enqueued / calls * 1e6,
            "event_us_per_call": start_event.elapsed_time(end_event) * 1e3 / calls,
            "graph_replayed_us_per_call": device_us,
            "graph_replay_host_us_per_call": replay_host / 200 * 1e6}


def layer_step(attn, torch, rng, dev, layers=32, length=16384, write=False) -> dict:
    pools = [random_pool(torch, rng, -(-length // BS) + 1, [length], dev, garbage=False)
             for _ in range(layers)]
    qs = [torch.randn(1, HQ, D, device=dev) for _ in range(layers)]
    outs = [torch.empty(1, HQ, D, device=dev) for _ in range(layers)]
    news = [new_tokens(torch, rng, pool, 1) if write else None for pool in pools]

    def step():
        for q, pool, out, new in zip(qs, pools, outs, news):
            decode_step(attn, torch, q, pool, out, new)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    steps = 50
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    eager = (time.perf_counter() - start) / steps
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        graph.replay()
    torch.cuda.synchronize()
    replayed = (time.perf_counter() - start) / steps
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(steps):
        graph.replay()
    e1.record()
    torch.cuda.synchronize()
    return {"layers": layers, "length": length, "with_write": write,
            "graph_event_us_per_step": e0.elapsed_time(e1) * 1e3 / steps,
            "eager_us_per_step": eager * 1e6,
            "graph_us_per_step": replayed * 1e6, "eager_over_graph": eager / replayed}


def write_checks(attn, torch, rng, dev) -> dict:
    """cache_write on the GPU against the reference bit for bit, and its time at 64
    and 65,536 blocks (16 new tokens: it must not grow with the pool)."""
    from int8attn.reference import paged_cache_write

    pool = random_pool(torch, rng, 64, [64 * BS], dev)[:4]
    slots = rng.permutation(64 * BS)[:300].astype(np.int32)
    slots[::7] = -1
    k_new = torch.randn(300, HKV, D, device=dev) * 3
    v_new = torch.randn(300, HKV, D, device=dev)
    expected = paged_cache_write(k_new.cpu().numpy(), v_new.cpu().numpy(), slots,
                                 *[t.cpu().numpy() for t in pool])
    attn.write(k_new, v_new, torch.from_numpy(slots).to(dev), *pool)
    exact = all(np.array_equal(a.cpu().numpy(), e, equal_nan=True)
                for a, e in zip(pool, expected))
    times = {}
    for blocks in (64, 65536):
        big = random_pool(torch, rng, blocks, [BS], dev, garbage=False)[:4]
        new = new_tokens(torch, rng, big, 16)
        for _ in range(10):
            attn.write(*new, *big, validate=False)
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        e0.record()
        for _ in range(200):
            attn.write(*new, *big, validate=False)
        e1.record()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):
                attn.write(*new, *big, validate=False)
        graph.replay()
        e2, e3 = torch.cuda.Event(True), torch.cuda.Event(True)
        e2.record()
        for _ in range(10):
            graph.replay()
        e3.record()
        torch.cuda.synchronize()
        times[blocks] = {"eager_us": e0.elapsed_time(e1) * 1e3 / 200,
                         "graph_us": e2.elapsed_time(e3) * 1e3 / 200}
    return {"bitwise_equal_to_reference": exact, "us_16_tokens_by_pool_blocks": times}


def run(folder: Path, out_dir: Path | None) -> dict:
    import torch

    from int8attn.serving import PagedAttention

    print(f"random inputs: seed {SEED}", flush=True)
    rng = np.random.default_rng(SEED)
    torch.manual_seed(SEED)
    dev = torch.device("cuda")
    attn = PagedAttention.load(folder)
    numerics = attn.numerics
    results = {"device": torch.cuda.get_device_name(), "numerics": dataclasses.asdict(numerics)}
    lengths = [1, 15, 16, 17, 255, 256, 257, 1000, 4096, 4097, 8191, 3, 640, 2048, 100, 9999]
    pool = random_pool(torch, rng, 4000, lengths, dev)
    q = torch.randn(len(lengths), HQ, D, device=dev)
    out = attn(q, *pool)                         # validate=True: checked on the device
    torch.cuda.synchronize()
    results["ragged"] = check_against_references(attn, torch, out, q, pool, numerics)
    print("ragged", results["ragged"], flush=True)
    bad_lens = pool[5].clone()
    bad_lens[3] = 10**6
    try:
        attn(q, *pool[:5], bad_lens, validate="sync")
        results["bad_length_refused"] = False
    except ValueError as error:
        results["bad_length_refused"] = str(error)[:200]
    results["stream"] = stream_order(attn, torch, q, pool, dev)
    print("stream", results["stream"], flush=True)
    write = "write" in attn._executors
    if write:
        results["write"] = write_checks(attn, torch, rng, dev)
        print("write", results["write"], flush=True)
    overhead = {}
    for name, batch, length in (("B=1 16K", 1, 16384), ("B=16 4K", 16, 4096)):
        p = random_pool(torch, rng, batch * length // BS + 1, [length] * batch, dev,
                        garbage=False)
        qq = torch.randn(batch, HQ, D, device=dev)
        overhead[name] = host_overhead(attn, torch, qq, p)
        print(name, overhead[name], flush=True)
        if write:
            overhead[name + " write+attend"] = host_overhead(
                attn, torch, qq, p, new=new_tokens(torch, rng, p, batch))
            print(name, "write+attend", overhead[name + " write+attend"], flush=True)
    results["overhead"] = overhead
    results["step_32_layers"] = layer_step(attn, torch, rng, dev)
    print("step", results["step_32_layers"], flush=True)
    if write:
        results["step_32_layers_write"] = layer_step(attn, torch, rng, dev, write=True)
        print("step+write", results["step_32_layers_write"], flush=True)
    # Last: the torch profiler leaves CUPTI hooked into every later launch.
    results["copies"] = no_copies(attn, torch, q, pool)
    print("copies", results["copies"], flush=True)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "serving.json").write_text(json.dumps(results, indent=1))
    return results


def profile(folder: Path, calls: int = 2000) -> None:
    """Where an eager call's host time goes: cProfile over back-to-back calls."""
    import cProfile
    import pstats

    import torch

    from int8attn.serving import PagedAttention

    attn = PagedAttention.load(folder)
    rng = np.random.default_rng(SEED)
    pool = random_pool(torch, rng, 1025, [16384], torch.device("cuda"), garbage=False)
    q = torch.randn(1, HQ, D, device="cuda")
    out = torch.empty_like(q)
    for _ in range(50):
        attn(q, *pool, out=out, validate=False)
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        attn(q, *pool, out=out, validate=False)
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("prepare", "run", "profile"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--write", action="store_true", help="prepare: the cache_write kernel too")
    args = parser.parse_args(argv)
    if args.mode == "prepare":
        prepare(args.folder, args.write)
    elif args.mode == "profile":
        profile(args.folder)
    else:
        run(args.folder, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
