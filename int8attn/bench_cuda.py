"""`int8attn bench --target cuda`: decode kernels on an NVIDIA GPU through IREE.

Two phases, which may run on different machines (IREE's compiler is not on
the GPU machine here): `prepare` compiles the kernel modules (sm_80 PTX, which
the driver JITs on Hopper); `run` loads them with IREE's CUDA runtime, checks
each output against the fragment-level reference, and times, for each context:
the INT8-PV module (V token-innermost, the kernel's layout), the same with the
per-call V transpose (the graph's token-major V), torch SDPA on a bf16 KV cache,
and a device-to-device copy as the bandwidth ceiling.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# (name, PV precision, V token-innermost)
VARIANTS = {"int8": ("int8", True), "bf16": ("bf16", True), "int8_transpose_v": ("int8", False)}


MANIFEST = "manifest.json"   # what `prepare` wrote: the shapes, for `run`


def _name(variant: str, tokens: int) -> str:
    return f"{variant}_{tokens}.vmfb"


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote for the manifest `meta`."""
    return [_name(variant, int(tokens)) for tokens in meta["contexts"] for variant in VARIANTS]


def prepare(directory: Path, contexts, batch: int, q_heads: int, kv_heads: int,
            head_dim: int) -> None:
    from int8attn.driver.compile import compile
    from int8attn.driver.graph import decode_graph
    from int8attn.driver.options import CompileOptions

    directory.mkdir(parents=True, exist_ok=True)
    for tokens in contexts:
        source = decode_graph(batch, q_heads, kv_heads, tokens, head_dim)
        for variant, (pv, innermost) in VARIANTS.items():
            options = CompileOptions(target="cuda", pv=pv, v_token_innermost=innermost)
            compiled = compile(source, options, filename=f"decode_{tokens}.mlir", until="ptx")
            vmfb, ptx = compiled.artifacts["vmfb"], compiled.artifacts["ptx"]
            (directory / _name(variant, tokens)).write_bytes(vmfb)
            print(f"prepared {variant} S={tokens}: {len(vmfb)} bytes, "
                  f"{ptx.count('mma.sync.aligned.m16n8k32')} int8 and "
                  f"{ptx.count('mma.sync.aligned.m16n8k16')} bf16 mma.sync in the PTX", flush=True)
    (directory / MANIFEST).write_text(json.dumps(dict(
        contexts=list(contexts), batch=batch, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim)))


def map_forked(fn, items) -> list:
    """[fn(x) for x in items] in forked worker processes, which inherit the caller's
    arrays: the numpy references run one sequence per core of the GPU machine."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    global _TASK
    items = list(items)
    workers = min(len(items), os.cpu_count() or 1)
    if workers <= 1:
        return [fn(x) for x in items]
    _TASK = fn
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_run_task, items))
    finally:
        _TASK = None


_TASK = None   # map_forked's function, inherited by its workers


def _run_task(x):
    return _TASK(x)


def _per_sequence(reference, q, k, k_scale, v, v_scale, *args, **kwargs) -> np.ndarray:
    """`reference` of a batch, one sequence per worker process."""
    def one(b):
        return reference(q[b:b + 1], k[b:b + 1], k_scale[b:b + 1], v[b:b + 1],
                         v_scale[b:b + 1], *args, **kwargs)
    return np.concatenate(map_forked(one, range(q.shape[0])))


def _inputs(seed, batch, q_heads, kv_heads, tokens, head_dim):
    from int8attn.reference import quantize_cache

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_heads, head_dim), dtype=np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim), dtype=np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim), dtype=np.float32))
    return q, k, k_scale, v, v_scale


def _time_iree(module_fn, device_args, warmup, iterations):
    """(median wall seconds per synchronized call, device seconds per call of the two
    kernels from a CUPTI trace through torch.profiler, or None without torch)."""
    for _ in range(warmup):
        module_fn(*device_args).to_host()
    seconds = []
    for _ in range(iterations):
        start = time.perf_counter()
        module_fn(*device_args).to_host()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), _kernel_seconds(module_fn, device_args, iterations)


def _kernel_seconds(module_fn, device_args, iterations):
    """CUPTI sees every CUDA kernel of the process, IREE's included."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    KERNEL_SECONDS.clear()
    with profile(activities=[ProfilerActivity.CUDA]) as trace:
        for _ in range(iterations):
            module_fn(*device_args).to_host()
        torch.cuda.synchronize()
    total = 0.0
    for event in trace.events():
        # Kernels (IREE's dispatches), not the copy of the result to the host.
        if str(event.device_type).endswith("CUDA") and not event.name.startswith("Memcpy"):
            total += event.device_time_total * 1e-6
            KERNEL_SECONDS[event.name] = KERNEL_SECONDS.get(event.name, 0.0) + \
                event.device_time_total * 1e-6 / iterations
    return total / iterations if total else None


# Device seconds per call of each kernel name, of the latest `_kernel_seconds`.
KERNEL_SECONDS: dict[str, float] = {}


def _events(fn, warmup, iterations):
    """Median seconds of `fn` on the current CUDA stream, from CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iterations):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


def copy_ceiling(warmup, iterations):
    """Bytes/s of a 1 GiB device-to-device copy (read + write), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / _events(lambda: dst.copy_(src), warmup, iterations)


def _torch_times(q, k, k_scale, v, v_scale, warmup, iterations):
    """(SDPA on a bf16 KV cache, device copy ceiling in bytes/s) with CUDA events."""
    try:
        import torch
    except ImportError:
        return None, None
    dev = torch.device("cuda")
    kf = torch.from_numpy(k).to(dev).to(torch.bfloat16) * torch.from_numpy(k_scale).to(dev)[..., None].to(torch.bfloat16)
    vf = torch.from_numpy(v).to(dev).to(torch.bfloat16) * torch.from_numpy(v_scale).to(dev)[..., None].to(torch.bfloat16)
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)[:, :, None, :]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kf, vf, enable_gqa=True)
    return _events(sdpa, warmup, iterations), copy_ceiling(warmup, iterations)


def run(directory: Path, warmup: int = 5, iterations: int = 50, seed: int = 0) -> list[dict]:
    import iree.runtime as rt

    from int8attn.reference import fragment_attention, rounding_tie_slack

    meta = json.loads((directory / MANIFEST).read_text())
    config = rt.Config("cuda")
    rows = []
    for tokens in meta["contexts"]:
        shape = (meta["batch"], meta["q_heads"], meta["kv_heads"], tokens, meta["head_dim"])
        q, k, k_scale, v, v_scale = _inputs(seed + tokens, *shape)
        scale = float(np.float32(meta["head_dim"] ** -0.5))
        expected = {pv: _per_sequence(fragment_attention, q, k, k_scale, v, v_scale, scale,
                                      model="cuda", pv=pv)
                    for pv in ("int8", "bf16")}
        slack = {"int8": _per_sequence(rounding_tie_slack, q, k, k_scale, v, v_scale, scale,
                                       model="cuda"),
                 "bf16": 0}
        row = dict(context=tokens, batch=meta["batch"], q_heads=meta["q_heads"],
                   kv_heads=meta["kv_heads"], head_dim=meta["head_dim"])
        for variant, (pv, innermost) in VARIANTS.items():
            ctx = rt.SystemContext(config=config)
            ctx.add_vm_module(rt.VmModule.copy_buffer(
                ctx.instance, (directory / _name(variant, tokens)).read_bytes()))
            v_arg = np.ascontiguousarray(v.transpose(0, 1, 3, 2)) if innermost else v
            args = [rt.asdevicearray(config.device, a) for a in (q, k, k_scale, v_arg, v_scale)]
            fn = ctx.modules.module["decode"]
            out = fn(*args).to_host()
            err = np.abs(out - expected[pv])
            row[f"{variant}_max_abs_vs_fragment"] = float(err.max())
            row[f"{variant}_within_tolerance"] = bool((err <= 5e-5 + slack[pv]).all())
            if variant == "bf16":
                diff = out - expected["int8"]
                row["int8_vs_bf16_max_abs"] = float(np.abs(diff).max())
                row["int8_vs_bf16_rms"] = float(np.sqrt(np.mean(diff.astype(np.float64) ** 2)))
            row[f"{variant}_wall_s"], kernel_s = _time_iree(fn, args, warmup, iterations)
            row[f"{variant}_s"] = kernel_s if kernel_s else row[f"{variant}_wall_s"]
            row[f"{variant}_timing"] = "cupti kernels" if kernel_s else "wall per call"
        cache_bytes = 2 * k.nbytes + 2 * k_scale.nbytes + q.nbytes + expected["int8"].nbytes
        row["int8_bytes"] = cache_bytes
        sdpa_s, copy_bps = _torch_times(q, k, k_scale, v, v_scale, warmup, iterations)
        row["torch_sdpa_bf16_s"], row["copy_ceiling_bytes_per_s"] = sdpa_s, copy_bps
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["Times are the device time of all kernels of one module call (CUPTI through "
             "torch.profiler): the partition and merge kernels (the query rows are quantized "
             "inside the partition kernel), plus the V transpose in that column; not the copy "
             "of the result to the host. The wall time per synchronized IREE call is in the "
             "JSON.", "",
             "| context | batch | INT8 PV (us) | BF16 PV (us) | INT8/BF16 speedup | "
             "+ V transpose (us) | torch SDPA bf16 KV (us) | vs SDPA | achieved GB/s | "
             "copy ceiling GB/s | of ceiling | max abs vs fragment | INT8 vs BF16 max abs / RMS |",
             "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        gbps = r["int8_bytes"] / r["int8_s"] / 1e9
        ceiling = (r["copy_ceiling_bytes_per_s"] or float("nan")) / 1e9
        sdpa = r["torch_sdpa_bf16_s"]
        lines.append(
            f"| {r['context']} | {r['batch']} | {r['int8_s'] * 1e6:.1f} | {r['bf16_s'] * 1e6:.1f} | "
            f"{r['bf16_s'] / r['int8_s']:.2f}x | {r['int8_transpose_v_s'] * 1e6:.1f} | "
            f"{sdpa * 1e6 if sdpa else float('nan'):.1f} | "
            f"{(sdpa / r['int8_s']) if sdpa else float('nan'):.2f}x | {gbps:.0f} | {ceiling:.0f} | "
            f"{gbps / ceiling:.0%} | {r['int8_max_abs_vs_fragment']:.1e} | "
            f"{r['int8_vs_bf16_max_abs']:.6f} / {r['int8_vs_bf16_rms']:.6f} |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(contexts, [r["int8_s"] * 1e6 for r in rows], "o-", label="INT8 PV kernel (IREE)")
    ax.plot(contexts, [r["bf16_s"] * 1e6 for r in rows], "d-", label="BF16 PV kernel (IREE)")
    ax.plot(contexts, [r["int8_transpose_v_s"] * 1e6 for r in rows], "s--",
            label="INT8 PV + per-call V transpose")
    if all(r["torch_sdpa_bf16_s"] for r in rows):
        ax.plot(contexts, [r["torch_sdpa_bf16_s"] * 1e6 for r in rows], "^-",
                label="torch SDPA, bf16 KV")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("time per decode step (us)")
    ax.set_title(f"decode, B={rows[0]['batch']}, Hq={rows[0]['q_heads']}, "
                 f"Hkv={rows[0]['kv_heads']}, D={rows[0]['head_dim']} (H200)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m int8attn.bench_cuda")
    parser.add_argument("--prepare", type=Path, help="compile the modules into this folder")
    parser.add_argument("--run", type=Path, help="run the modules of this folder on the GPU")
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.prepare, [int(c) for c in args.contexts.split(",")], args.batch,
                args.q_heads, args.kv_heads, args.head_dim)
    if args.run:
        report(run(args.run, iterations=args.iterations), markdown, args.json)
    return 0


def report(rows: list[dict], table, json_path: Path | None) -> None:
    """A GPU runner's output: the Markdown table on stdout, the rows as JSON."""
    print(table(rows))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
