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
MANIFEST = "paged.json"   # what `prepare` wrote: the shapes and numerics, for `run`


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote (one per PV precision, whatever the manifest)."""
    return [f"paged_{pv}.vmfb" for pv in PV]


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
    (directory / MANIFEST).write_text(json.dumps(dict(
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
    """(max abs error, all within 5e-5 + tie slack) of every sequence against the
    fragment-level reference (one sequence per worker process)."""
    from int8attn.reference import fragment_attention, rounding_tie_slack, sequence_cache

    q, k, ks, v, vs, tables, lengths = arrays
    numerics = dict(model="cuda", pv=pv, q_terms=q_terms, w_quant=w_quant)

    def one(b):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lengths, b))
        expected = fragment_attention(*dense, scale, **numerics)
        slack = rounding_tie_slack(*dense, scale, **numerics) if pv == "int8" else 0
        err = np.abs(out[b:b + 1] - expected)
        return float(err.max()), bool((err <= 5e-5 + slack).all())

    results = bench_cuda.map_forked(one, range(q.shape[0]))
    return max(r[0] for r in results), all(r[1] for r in results)


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


def run(directory, batch: int, contexts, mean: int, seed: int = 0, warmup: int = 5,
        iterations: int = 50, pvs=PV) -> list[dict]:
    """One row per case; `directory` may be a list of prepared folders (schedule
    variants of the same shapes), run on the same data one after the other, a
    row per (folder, case) naming its folder. `pvs` selects the modules to run
    (both by default; one for a quicker look at a variant)."""
    import iree.runtime as rt

    directories = [Path(d) for d in directory] if isinstance(directory, (list, tuple)) \
        else [Path(directory)]
    metas = [json.loads((d / MANIFEST).read_text()) for d in directories]
    if any(m != metas[0] for m in metas):
        raise ValueError("the folders hold modules of different shapes or numerics")
    meta = metas[0]
    config = rt.Config("cuda")
    functions = {}
    for d in directories:
        for pv in pvs:
            ctx = rt.SystemContext(config=config)
            ctx.add_vm_module(rt.VmModule.copy_buffer(
                ctx.instance, (d / f"paged_{pv}.vmfb").read_bytes()))
            functions.setdefault(d, {})[pv] = ctx.modules.module["paged"]
    scale = float(np.float32(meta["head_dim"] ** -0.5))
    ceiling = copy_ceiling(warmup, iterations)
    rows = []
    rng = np.random.default_rng(seed)
    for name, lengths in cases(batch, contexts, mean, seed):
        arrays = batch_arrays(rng, lengths, meta["q_heads"], meta["kv_heads"], meta["head_dim"],
                              meta["block_size"])
        device_args = [rt.asdevicearray(config.device, a) for a in arrays]
        sdpa = sdpa_seconds(arrays, warmup, iterations)
        for d in directories:
            row = dict(case=name, batch=len(lengths), mean_length=float(np.mean(lengths)),
                       max_length=int(max(lengths)), bytes_read=bytes_read(arrays),
                       copy_ceiling_bytes_per_s=ceiling, seed=seed, **meta)
            if len(directories) > 1:
                row["modules"] = d.name
            for pv, fn in functions[d].items():
                out = fn(*device_args).to_host()
                row[f"{pv}_max_abs_vs_fragment"], row[f"{pv}_within_tolerance"] = check(
                    out, arrays, scale, pv, meta.get("q_terms", 1), meta.get("w_quant", "s8"))
                row[f"{pv}_wall_s"], kernel_s = _time_iree(fn, device_args, warmup, iterations)
                row[f"{pv}_s"] = kernel_s or row[f"{pv}_wall_s"]
                row[f"{pv}_kernels_s"] = dict(bench_cuda.KERNEL_SECONDS)
            row["torch_sdpa_bf16_padded_s"] = sdpa
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    """The results table, then the INT8 module's time per kernel (a module that
    was not run shows as -)."""
    def us(r, pv):
        return f"{r[f'{pv}_s'] * 1e6:.1f}" if f"{pv}_s" in r else "-"

    def err(r, pv):
        return f"{r[f'{pv}_max_abs_vs_fragment']:.1e}" if f"{pv}_s" in r else "-"

    lines = ["| case | B | INT8 PV (us) | BF16 PV (us) | INT8/BF16 | torch SDPA bf16 padded (us) "
             "| vs SDPA | GB/s read | of ceiling | max abs vs fragment (INT8 / BF16) | checked |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"]
    for r in rows:
        gbps = r["bytes_read"] / r["int8_s"] / 1e9
        sdpa = r["torch_sdpa_bf16_padded_s"]
        ok = all(r[f"{pv}_within_tolerance"] for pv in PV if f"{pv}_s" in r)
        ratio = f"{r['bf16_s'] / r['int8_s']:.2f}x" if "bf16_s" in r else "-"
        case = f"{r['modules']}: {r['case']}" if "modules" in r else r["case"]
        lines.append(
            f"| {case} | {r['batch']} | {us(r, 'int8')} | {us(r, 'bf16')} | {ratio} | "
            f"{sdpa * 1e6 if sdpa else float('nan'):.1f} | "
            f"{(sdpa / r['int8_s']) if sdpa else float('nan'):.2f}x | {gbps:.0f} | "
            f"{gbps * 1e9 / r['copy_ceiling_bytes_per_s']:.0%} | "
            f"{err(r, 'int8')} / {err(r, 'bf16')} | {'yes' if ok else 'NO'} |")
    kernels = sorted({k for r in rows for k in r.get("int8_kernels_s", {})})
    if kernels:
        lines += ["", "| case | " + " | ".join(f"{k} (us)" for k in kernels) + " |",
                  "|---|" + "--:|" * len(kernels)]
        for r in rows:
            times = r.get("int8_kernels_s", {})
            case = f"{r['modules']}: {r['case']}" if "modules" in r else r["case"]
            lines.append(f"| {case} | " + " | ".join(
                f"{times[k] * 1e6:.1f}" if k in times else "-" for k in kernels) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run modules prepared by `int8attn bench --mode paged --prepare-only DIR` (on a GPU
    machine without IREE's compiler)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m int8attn.bench_paged")
    parser.add_argument("--run", required=True,
                        help="a prepared folder, or several (comma-separated) on the same data")
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ragged-mean", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--pv", default=",".join(PV), help="modules to run (default: both)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run([Path(d) for d in args.run.split(",")], args.batch,
               [int(c) for c in args.contexts.split(",")], args.ragged_mean, seed=args.seed,
               iterations=args.iterations, pvs=args.pv.split(","))
    bench_cuda.report(rows, markdown, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
