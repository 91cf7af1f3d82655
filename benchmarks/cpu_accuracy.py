"""Accuracy of the compiled modules on the IREE CPU runtime.

    python benchmarks/cpu_accuracy.py [--mode decode] [--contexts 4096,8192,16384] [--seeds 0,1,2]
    python benchmarks/cpu_accuracy.py --mode prefill --contexts 4096 --query-tokens 1,37,128,S

For each case (Gaussian q/k/v): max abs (and RMS) of INT8 PV vs f32 PV (both
compiled), INT8 PV vs BF16 PV, the INT8 module vs the fragment-level reference
(raw, and beyond the exact rounding-tie slack), and vs the exact reference.
`--q-terms` / `--w-quant` / `--w-terms` choose the numerics (default: the pipeline's; the
baselines use the same q-terms). Other data families and every variant:
benchmarks/cpu_accuracy_variants.py.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import int8attn
from int8attn import reference as ref
from int8attn.contract.numerics import Numerics
from int8attn.driver.graph import attention_graph, error_stats, random_inputs
from int8attn.pipelines import PipelineOptions


def cases(args):
    for tokens in (int(c) for c in args.contexts.split(",")):
        if args.mode == "decode":
            yield tokens, 1
            continue
        for sq in args.query_tokens.split(","):
            yield tokens, tokens if sq == "S" else int(sq)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("decode", "prefill"), default="decode")
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--query-tokens", default="1,37,128,S",
                        help="prefill query counts (S = the whole context)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--q-terms", type=int, choices=(1, 2), default=PipelineOptions.q_terms)
    parser.add_argument("--w-quant", choices=("s8", "u8"), default=PipelineOptions.w_quant)
    parser.add_argument("--w-terms", type=int, choices=(1, 2), default=PipelineOptions.w_terms)
    args = parser.parse_args(argv)
    variant = Numerics(q_terms=args.q_terms, w_quant=args.w_quant, w_terms=args.w_terms)
    print(f"{args.mode}: B=1 Hq={args.q_heads} Hkv={args.kv_heads} D={args.head_dim}, "
          f"{variant.describe()}", file=sys.stderr)
    print("| S | Sq | seed | int8 vs f32 PV max / rms | int8 vs bf16 PV max / rms | "
          "vs fragment ref max (beyond tie slack) | vs exact max / rms |")
    print("|--:|--:|--:|--:|--:|--:|--:|")
    for tokens, query_tokens in cases(args):
        source = attention_graph(1, args.q_heads, args.kv_heads, tokens, args.head_dim,
                                 mode=args.mode, query_tokens=query_tokens)
        graphs = {pv: int8attn.compile(source, pv=pv, numerics=variant)
                  for pv in ("int8", "bf16", "f32")}
        info = graphs["int8"].entry()
        for seed in (int(s) for s in args.seeds.split(",")):
            inputs = random_inputs(info, seed)
            out = {pv: g(*inputs) for pv, g in graphs.items()}
            scale = info.attention.softmax_scale
            fragment_err = np.abs(out["int8"] - ref.fragment_attention(*inputs, scale,
                                                                       numerics=variant))
            slack = ref.rounding_tie_slack(*inputs, scale, numerics=variant)
            beyond = np.maximum(fragment_err - slack, 0).max()
            vs_f32 = error_stats(out["int8"], out["f32"])
            vs_bf16 = error_stats(out["int8"], out["bf16"])
            vs_exact = error_stats(out["int8"], ref.exact_attention(*inputs, scale))
            print(f"| {tokens} | {query_tokens} | {seed} | {vs_f32['max_abs']:.2e} / "
                  f"{vs_f32['rms']:.2e} | {vs_bf16['max_abs']:.2e} / {vs_bf16['rms']:.2e} | "
                  f"{fragment_err.max():.2e} ({beyond:.1e}) | "
                  f"{vs_exact['max_abs']:.2e} / {vs_exact['rms']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
