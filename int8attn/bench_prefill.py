"""`int8attn bench --target cuda --mode prefill`: the prefill kernel on a GPU.

Cases: causal prefill without history (Sq = S) at each context, and a
history case (`--history` cached tokens + `--new-tokens` new ones). Per case
the INT8-PV kernel module and its BF16-PV twin (one module each: the dense
prefill graph has static shapes) and torch SDPA on the same data in bf16
(causal, aligned to the end of the sequence). For each: device time of all
kernels of a call (CUPTI; the host function's V transpose included, the
prefill kernel alone in the JSON), TFLOP/s on the causal work (4·D flops per
visible (query, key) pair and head), the output checked against the
fragment-level reference on three 64-token slices of the query tokens (first,
middle, last: each slice is the prefill of a shorter sequence, so the
reference stays cheap at 16K), and INT8 vs BF16 PV over the whole output.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from int8attn import bench_cuda
from int8attn.bench_cuda import _events, _time_iree

PV = ("int8", "bf16")
CHECK_TOKENS = 64
MANIFEST = "prefill.json"   # what `prepare` wrote: the cases and shapes, for `run`


def cases(contexts, history: int, new_tokens: int) -> list[tuple[str, int, int]]:
    """(name, S, Sq) of each case."""
    found = [(f"Sq=S={s}", s, s) for s in contexts]
    if new_tokens:
        found.append((f"{history}+{new_tokens}", history + new_tokens, new_tokens))
    return found


def _module_name(pv: str, tokens: int, query_tokens: int) -> str:
    return f"prefill_{pv}_{tokens}_{query_tokens}.vmfb"


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote for the manifest `meta`."""
    return [_module_name(pv, int(tokens), int(query_tokens))
            for _, tokens, query_tokens in meta["cases"] for pv in PV]


def prepare(directory: Path, contexts, history: int, new_tokens: int, batch: int,
            q_heads: int, kv_heads: int, head_dim: int) -> None:
    from int8attn.driver.compile import compile
    from int8attn.driver.graph import prefill_graph
    from int8attn.driver.options import CompileOptions

    directory.mkdir(parents=True, exist_ok=True)
    all_cases = cases(contexts, history, new_tokens)
    for name, tokens, query_tokens in all_cases:
        source = prefill_graph(batch, q_heads, kv_heads, tokens, query_tokens, head_dim)
        for pv in PV:
            compiled = compile(source, CompileOptions(target="cuda", pv=pv),
                               filename=f"prefill_{tokens}.mlir", until="ptx")
            (directory / _module_name(pv, tokens, query_tokens)).write_bytes(
                compiled.artifacts["vmfb"])
            print(f"prepared prefill {pv} {name}", flush=True)
    (directory / MANIFEST).write_text(json.dumps(dict(
        cases=all_cases, batch=batch, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim)))


def inputs(seed: int, batch, q_heads, kv_heads, tokens, query_tokens, head_dim):
    from int8attn.reference import quantize_cache

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_heads, query_tokens, head_dim), dtype=np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim),
                                                    dtype=np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim),
                                                    dtype=np.float32))
    return q, k, k_scale, v, v_scale


def causal_pairs(tokens: int, query_tokens: int) -> int:
    """Visible (query, key) pairs: query t sees S - Sq + t + 1 keys."""
    history = tokens - query_tokens
    return query_tokens * (history + 1) + query_tokens * (query_tokens - 1) // 2


def check_slices(out, arrays, scale, pv) -> tuple[float, bool]:
    """(max abs vs the fragment reference, within 5e-5 + tie slack) on the first,
    a middle and the last CHECK_TOKENS query tokens."""
    from int8attn.reference import fragment_attention, rounding_tie_slack

    q, k, ks, v, vs = arrays
    tokens, query_tokens = k.shape[2], q.shape[2]
    width = min(CHECK_TOKENS, query_tokens)
    starts = sorted({0, (query_tokens - width) // 2, query_tokens - width})
    worst, ok = 0.0, True
    for start in starts:
        end = start + width
        # Query tokens [start, end) are the last ones of a sequence that ends at
        # their last token's position.
        seen = tokens - query_tokens + end
        part = (q[:, :, start:end], k[:, :, :seen], ks[:, :, :seen], v[:, :, :seen],
                vs[:, :, :seen])
        expected = fragment_attention(*part, scale, model="cuda", pv=pv)
        slack = rounding_tie_slack(*part, scale, model="cuda", pv=pv)
        err = np.abs(out[:, :, start:end] - expected)
        worst = max(worst, float(err.max()))
        ok = ok and bool((err <= 5e-5 + slack).all())
    return worst, ok


def sdpa_seconds(arrays, warmup, iterations):
    """torch SDPA, bf16, causal aligned to the sequence's end (the new tokens last)."""
    try:
        import torch
    except ImportError:
        return None
    q, k, ks, v, vs = arrays
    dev = torch.device("cuda")
    dequant = lambda c, s: (torch.from_numpy(c).to(dev).float() *
                            torch.from_numpy(s).to(dev)[..., None]).to(torch.bfloat16)
    kf, vf = dequant(k, ks), dequant(v, vs)
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)
    scale = q.shape[-1] ** -0.5
    if q.shape[2] == k.shape[2]:
        call = lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kf, vf, is_causal=True, scale=scale, enable_gqa=True)
    else:
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q.shape[2], k.shape[2])
        groups = q.shape[1] // k.shape[1]
        kf, vf = kf.repeat_interleave(groups, 1), vf.repeat_interleave(groups, 1)
        call = lambda: torch.nn.functional.scaled_dot_product_attention(
            qt, kf, vf, attn_mask=mask, scale=scale)
    return _events(call, warmup, iterations)


def run(directory: Path, seed: int = 0, warmup: int = 3, iterations: int = 20) -> list[dict]:
    import iree.runtime as rt

    meta = json.loads((directory / MANIFEST).read_text())
    config = rt.Config("cuda")
    scale = float(np.float32(meta["head_dim"] ** -0.5))
    rows = []
    for name, tokens, query_tokens in meta["cases"]:
        arrays = inputs(seed + tokens, meta["batch"], meta["q_heads"], meta["kv_heads"],
                        tokens, query_tokens, meta["head_dim"])
        device_args = [rt.asdevicearray(config.device, a) for a in arrays]
        flops = 4 * meta["head_dim"] * meta["batch"] * meta["q_heads"] * \
            causal_pairs(tokens, query_tokens)
        row = dict(case=name, tokens=tokens, query_tokens=query_tokens, causal_flops=flops,
                   seed=seed + tokens, **{k: meta[k] for k in
                                          ("batch", "q_heads", "kv_heads", "head_dim")})
        outputs = {}
        for pv in PV:
            ctx = rt.SystemContext(config=config)
            ctx.add_vm_module(rt.VmModule.copy_buffer(
                ctx.instance, (directory / _module_name(pv, tokens, query_tokens)).read_bytes()))
            fn = ctx.modules.module["prefill"]
            outputs[pv] = out = fn(*device_args).to_host()
            row[f"{pv}_max_abs_vs_fragment"], row[f"{pv}_within_tolerance"] = \
                check_slices(out, arrays, scale, pv)
            row[f"{pv}_wall_s"], kernel_s = _time_iree(fn, device_args, warmup, iterations)
            row[f"{pv}_s"] = kernel_s or row[f"{pv}_wall_s"]
            row[f"{pv}_kernels_s"] = dict(bench_cuda.KERNEL_SECONDS)
        diff = (outputs["int8"] - outputs["bf16"]).astype(np.float64)
        row["int8_vs_bf16_max_abs"] = float(np.abs(diff).max())
        row["int8_vs_bf16_rms"] = float(np.sqrt(np.mean(diff ** 2)))
        row["torch_sdpa_bf16_s"] = sdpa_seconds(arrays, warmup, iterations)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown(rows: list[dict]) -> str:
    lines = ["| case | B | INT8 PV (ms) | TFLOP/s | BF16 PV (ms) | INT8/BF16 | torch SDPA bf16 "
             "(ms) | vs SDPA | max abs vs fragment (INT8 / BF16) | INT8 vs BF16 max abs / RMS "
             "| checked |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|"]
    for r in rows:
        sdpa = r["torch_sdpa_bf16_s"]
        ok = r["int8_within_tolerance"] and r["bf16_within_tolerance"]
        lines.append(
            f"| {r['case']} | {r['batch']} | {r['int8_s'] * 1e3:.2f} | "
            f"{r['causal_flops'] / r['int8_s'] / 1e12:.1f} | {r['bf16_s'] * 1e3:.2f} | "
            f"{r['bf16_s'] / r['int8_s']:.2f}x | {sdpa * 1e3 if sdpa else float('nan'):.2f} | "
            f"{(sdpa / r['int8_s']) if sdpa else float('nan'):.2f}x | "
            f"{r['int8_max_abs_vs_fragment']:.1e} / {r['bf16_max_abs_vs_fragment']:.1e} | "
            f"{r['int8_vs_bf16_max_abs']:.2e} / {r['int8_vs_bf16_rms']:.2e} | "
            f"{'yes' if ok else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    """Run modules prepared by `int8attn bench --mode prefill --prepare-only DIR`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m int8attn.bench_prefill")
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = run(args.run, seed=args.seed, iterations=args.iterations)
    bench_cuda.report(rows, markdown, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
