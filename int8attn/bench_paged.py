"""`int8attn bench --target cuda --mode paged`: the paged decode kernels on a GPU.

One compiled module per PV precision serves every case (B, pool size, table
width and lengths are run-time values). Cases: uniform batches at each
context, a ragged batch whose lengths are drawn uniformly from [1, 2·mean − 1]
(the stated distribution; mean 8K by default), and one sequence at the
longest context (latency). For each: device time of all kernels of a call
(CUPTI), the bytes the call must read (each sequence's own K, V and scales,
its table slots, q) and their fraction of the copy ceiling, torch SDPA on the
same data as a padded bf16 batch (masked past each length), and every
sequence checked against the fragment-level reference.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from int8attn import bench_cuda
from int8attn.bench_cuda import _events, _time_iree, copy_ceiling

PV = ("int8", "bf16")
BLOCK_SIZE = 16


def prepare(directory: Path, q_heads: int, kv_heads: int, head_dim: int,
            block_size: int = BLOCK_SIZE, q_terms: int | None = None,
            w_quant: str | None = None) -> None:
    from int8attn.driver.compile import compile
    from int8attn.driver.options import CompileOptions
    from int8attn.driver.paged_decode import paged_attention_graph

    directory.mkdir(parents=True, exist_ok=True)
    source = paged_attention_graph(q_heads, kv_heads, head_dim, block_size,
                                   softmax_scale=float(np.float32(head_dim ** -0.5)))
    for pv in PV:
        options = CompileOptions(target="cuda", pv=pv, q_terms=q_terms, w_quant=w_quant)
        numerics = {name: options.resolved_numerics(name) for name in ("q_terms", "w_quant")}
        compiled = compile(source, options, filename="paged.mlir", until="ptx")
        (directory / f"paged_{pv}.vmfb").write_bytes(compiled.artifacts["vmfb"])
        (directory / f"paged_{pv}.ptx").write_text(compiled.artifacts["ptx"])
        print(f"prepared paged {pv}: one module for every batch", flush=True)
    (directory / "paged.json").write_text(json.dumps(dict(
        q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
        **numerics)))


def cases(batch: int, contexts, mean: int, seed: int):
    """(name, lengths): uniform batches, the ragged batch, one long sequence."""
    rng = np.random.default_rng(seed)
    out = [(f"uniform {c}", [c] * batch) for c in contexts]
    out.append((f"ragged mean {mean} (uniform [1, {2 * mean - 1}])",
                rng.integers(1, 2 * mean, batch).tolist()))
    out.append((f"B=1 {max(contexts)}", [max(contexts)]))
    return out


def batch_arrays(rng, lengths, q_heads, kv_heads, head_dim, block_size):
    """q and a pool holding exactly the sequences' blocks, in shuffled order."""
    needed = [-(-n // block_size) for n in lengths]
    pool = sum(needed)
    order = rng.permutation(pool).astype(np.int32)
    tables = np.zeros((len(lengths), max(needed)), np.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    shape = (pool, kv_heads, block_size)
    k = rng.integers(-127, 128, shape + (head_dim,), dtype=np.int8)
    v = rng.integers(-127, 128, (pool, kv_heads, head_dim, block_size), dtype=np.int8)
    k_scale = rng.uniform(0.5, 1.5, shape).astype(np.float32) / 127
    v_scale = rng.uniform(0.5, 1.5, shape).astype(np.float32) / 127
    q = rng.standard_normal((len(lengths), q_heads, head_dim), dtype=np.float32)
    return [q, k, k_scale, v, v_scale, tables, np.array(lengths, np.int32)]


def bytes_read(arrays) -> int:
    q, k, k_scale, v, v_scale, tables, lengths = arrays
    _, kv_heads, block_size, head_dim = k.shape
    tokens = int(lengths.astype(np.int64).sum())
    per_token = kv_heads * (2 * head_dim + 2 * 4)
    slots = sum(-(-int(n) // block_size) for n in lengths) * 4
    return tokens * per_token + slots + q.nbytes + q.nbytes  # + the output


def check(out, arrays, scale, pv, q_terms=1, w_quant="s8") -> tuple[float, bool]:
    from int8attn.reference import fragment_attention, rounding_tie_slack, sequence_cache

    q, k, ks, v, vs, tables, lengths = arrays
    worst, ok = 0.0, True
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lengths, b))
        numerics = dict(model="cuda", pv=pv, q_terms=q_terms, w_quant=w_quant)
        expected = fragment_attention(*dense, scale, **numerics)
        slack = rounding_tie_slack(*dense, scale, **numerics) if pv == "int8" else 0
        err = np.abs(out[b:b + 1] - expected)
        worst = max(worst, float(err.max()))
        ok = ok and bool((err <= 5e-5 + slack).all())
    return worst, ok


def sdpa_seconds(arrays, warmup, iterations):
    """torch SDPA on the same data, padded to the longest sequence, bf16, masked."""
    try:
        import torch
    except ImportError:
        return None
    from int8attn.reference import sequence_cache

    q, k, ks, v, vs, tables, lengths = arrays
    longest = int(lengths.max())
    batch, kv_heads, head_dim = q.shape[0], k.shape[1], k.shape[3]
    dev = torch.device("cuda")
    kf = torch.zeros(batch, kv_heads, longest, head_dim, dtype=torch.bfloat16, device=dev)
    vf = torch.zeros_like(kf)
    for b in range(batch):
        kd, ksd, vd, vsd = sequence_cache(k, ks, v, vs, tables, lengths, b)
        n = int(lengths[b])
        kf[b, :, :n] = (torch.from_numpy(kd[0]).to(dev).float() *
                        torch.from_numpy(ksd[0]).to(dev)[..., None]).to(torch.bfloat16)
        vf[b, :, :n] = (torch.from_numpy(vd[0]).to(dev).float() *
                        torch.from_numpy(vsd[0]).to(dev)[..., None]).to(torch.bfloat16)
    mask = (torch.arange(longest, device=dev)[None, :] <
            torch.from_numpy(lengths).to(dev)[:, None].long())[:, None, None, :]
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)[:, :, None, :]
    scale = head_dim ** -0.5
    return _events(lambda: torch.nn.functional.scaled_dot_product_attention(
        qt, kf, vf, attn_mask=mask, scale=scale, enable_gqa=True), warmup, iterations)


def run(directory: Path, batch: int, contexts, mean: int, seed: int = 0, warmup: int = 5,
        iterations: int = 50) -> list[dict]:
    import iree.runtime as rt

    meta = json.loads((directory / "paged.json").read_text())
    config = rt.Config("cuda")
    functions = {}
    for pv in PV:
        ctx = rt.SystemContext(config=config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(
            ctx.instance, (directory / f"paged_{pv}.vmfb").read_bytes()))
        functions[pv] = ctx.modules.module["paged"]
    scale = float(np.float32(meta["head_dim"] ** -0.5))
    ceiling = copy_ceiling(warmup, iterations)
    rows = []
    rng = np.random.default_rng(seed)
    for name, lengths in cases(batch, contexts, mean, seed):
        arrays = batch_arrays(rng, lengths, meta["q_heads"], meta["kv_heads"], meta["head_dim"],
                              meta["block_size"])
        device_args = [rt.asdevicearray(config.device, a) for a in arrays]
        row = dict(case=name, batch=len(lengths), mean_length=float(np.mean(lengths)),
                   max_length=int(max(lengths)), bytes_read=bytes_read(arrays),
                   copy_ceiling_bytes_per_s=ceiling, seed=seed, **meta)
        for pv, fn in functions.items():
            out = fn(*device_args).to_host()
            row[f"{pv}_max_abs_vs_fragment"], row[f"{pv}_within_tolerance"] = \
                check(out, arrays, scale, pv, meta.get("q_terms", 1), meta.get("w_quant", "s8"))
            row[f"{pv}_wall_s"], kernel_s = _time_iree(fn, device_args, warmup, iterations)
            row[f"{pv}_s"] = kernel_s or row[f"{pv}_wall_s"]
            row[f"{pv}_kernels_s"] = dict(bench_cuda.KERNEL_SECONDS)
        row["torch_sdpa_bf16_padded_s"] = sdpa_seconds(arrays, warmup, iterations)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| case | B | INT8 PV (us) | BF16 PV (us) | INT8/BF16 | torch SDPA bf16 padded (us) "
             "| vs SDPA | GB/s read | of ceiling | max abs vs fragment (INT8 / BF16) | checked |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"]
    for r in rows:
        gbps = r["bytes_read"] / r["int8_s"] / 1e9
        sdpa = r["torch_sdpa_bf16_padded_s"]
        ok = r["int8_within_tolerance"] and r["bf16_within_tolerance"]
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['int8_s'] * 1e6:.1f} | {r['bf16_s'] * 1e6:.1f} | "
            f"{r['bf16_s'] / r['int8_s']:.2f}x | "
            f"{sdpa * 1e6 if sdpa else float('nan'):.1f} | "
            f"{(sdpa / r['int8_s']) if sdpa else float('nan'):.2f}x | {gbps:.0f} | "
            f"{gbps * 1e9 / r['copy_ceiling_bytes_per_s']:.0%} | "
            f"{r['int8_max_abs_vs_fragment']:.1e} / {r['bf16_max_abs_vs_fragment']:.1e} | "
            f"{'yes' if ok else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run modules prepared by `int8attn bench --mode paged --prepare-only DIR` (on a GPU
    machine without IREE's compiler)."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m int8attn.bench_paged")
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ragged-mean", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run(args.run, args.batch, [int(c) for c in args.contexts.split(",")],
               args.ragged_mean, seed=args.seed, iterations=args.iterations)
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
