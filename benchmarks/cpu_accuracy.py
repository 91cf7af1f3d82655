"""Accuracy of the compiled decode modules on the IREE CPU runtime.

    python benchmarks/cpu_accuracy.py [--contexts 4096,8192,16384] [--seeds 0,1,2]

For each context and seed (Gaussian q/k/v, B=1, Hq=32, Hkv=8, D=128): max abs
and RMS of INT8 PV vs f32 PV (both compiled), of INT8 PV vs BF16 PV, and of the
INT8 module vs the fragment-level and the exact reference.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import int8attn
from int8attn import reference as ref
from int8attn.graph import decode_graph, error_stats, random_inputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    print("| context | seed | int8 vs f32 PV max / rms | int8 vs bf16 PV max / rms | "
          "vs fragment ref max | vs exact max / rms |")
    print("|--:|--:|--:|--:|--:|--:|")
    for tokens in (int(c) for c in args.contexts.split(",")):
        source = decode_graph(1, args.q_heads, args.kv_heads, tokens, args.head_dim)
        graphs = {pv: int8attn.compile(source, pv=pv) for pv in ("int8", "bf16", "f32")}
        info = graphs["int8"].entry()
        for seed in (int(s) for s in args.seeds.split(",")):
            inputs = random_inputs(info, seed)
            out = {pv: g(*inputs) for pv, g in graphs.items()}
            scale = info.attention.softmax_scale
            fragment = ref.fragment_attention(*inputs, scale)
            exact = ref.exact_attention(*inputs, scale)
            vs_f32 = error_stats(out["int8"], out["f32"])
            vs_bf16 = error_stats(out["int8"], out["bf16"])
            vs_exact = error_stats(out["int8"], exact)
            print(f"| {tokens} | {seed} | {vs_f32['max_abs']:.2e} / {vs_f32['rms']:.2e} | "
                  f"{vs_bf16['max_abs']:.2e} / {vs_bf16['rms']:.2e} | "
                  f"{error_stats(out['int8'], fragment)['max_abs']:.2e} | "
                  f"{vs_exact['max_abs']:.2e} / {vs_exact['rms']:.2e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
