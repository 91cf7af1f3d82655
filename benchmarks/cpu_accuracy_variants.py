"""Accuracy of the numerics variants over data families, on the IREE CPU runtime.

    python benchmarks/cpu_accuracy_variants.py [--seeds 0,1] [--families all] [--out FILE.md]

For each data family and each combination of --w-quant (s8, u8) and --q-terms
(1, 2) with one W term, and two-term W (--w-terms 2) with two-term Q and either
w-quant, the compiled INT8-PV module against

- the compiled f32-PV module with the same q-terms (the W quantization alone),
- exact attention on the dequantized cache with unquantized q (the project's
  `exact` reference: INT8 Q + W quantization),
- exact attention on the float q, K, V before the cache was quantized (what a
  user sees: every term, K and V cache included),

max abs over all outputs, the largest over the seeds. Families (q, K, V
standard normal unless said; decode B=1 Hq=32 Hkv=8 D=128, prefill Hq=8 Hkv=2):

    gaussian        decode S=4096
    key-mult        4 key channels per KV head x30-60 (multiplicative outliers)
    key-add         4 key channels per KV head +30-60 on every token (additive)
    key-add-bias    the same keys, the channel bias subtracted before quantizing
                    (reference.quantize_keys; exact for attention)
    peaked-1        softmax_scale = 1 (instead of 1/sqrt(D))
    peaked-10       softmax_scale = 10
    huge-v          one V token x100
    short-7, short-255, short-257    decode S = 7, 255, 257
    prefill-S       prefill Sq = S = 2048
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

import int8attn
from int8attn import reference as ref
from int8attn.contract.numerics import Numerics
from int8attn.driver.graph import attention_graph

VARIANTS = [Numerics(q_terms=t, w_quant=w, w_terms=1) for w in ("s8", "u8") for t in (1, 2)] + \
    [Numerics(q_terms=2, w_quant=w, w_terms=2) for w in ("s8", "u8")]
DECODE = (32, 8, 128)
PREFILL = (8, 2, 128)


@dataclass(frozen=True)
class Family:
    name: str
    mode: str = "decode"
    tokens: int = 4096
    scale: float | None = None          # softmax_scale; None: 1/sqrt(D)
    keys: str = "gaussian"              # gaussian, mult, add
    bias: bool = False
    huge_v: bool = False


FAMILIES = [
    Family("gaussian"), Family("key-mult", keys="mult"), Family("key-add", keys="add"),
    Family("key-add-bias", keys="add", bias=True), Family("peaked-1", scale=1.0),
    Family("peaked-10", scale=10.0), Family("huge-v", huge_v=True),
    Family("short-7", tokens=7), Family("short-255", tokens=255), Family("short-257", tokens=257),
    Family("prefill-S", mode="prefill", tokens=2048),
]


def float_inputs(family: Family, seed: int):
    """Float q, K, V of the family: [B,Hq,(Sq,)D], [B,Hkv,S,D] twice."""
    q_heads, kv_heads, head_dim = PREFILL if family.mode == "prefill" else DECODE
    rng = np.random.default_rng(seed)
    tokens = family.tokens
    q_shape = (1, q_heads, tokens, head_dim) if family.mode == "prefill" else (1, q_heads, head_dim)
    q = rng.standard_normal(q_shape).astype(np.float32)
    keys = rng.standard_normal((1, kv_heads, tokens, head_dim)).astype(np.float32)
    for h in range(kv_heads):
        channels = rng.choice(head_dim, 4, replace=False)
        size = rng.uniform(30, 60, 4).astype(np.float32)
        if family.keys == "mult":
            keys[:, h, :, channels] *= size[:, None, None]
        elif family.keys == "add":
            offset = np.zeros(head_dim, np.float32)
            offset[channels] = size
            keys[:, h] += offset
    values = rng.standard_normal((1, kv_heads, tokens, head_dim)).astype(np.float32)
    if family.huge_v:
        values[:, :, rng.integers(tokens)] *= 100
    return q, keys, values


def run_family(family: Family, seeds, compiled) -> list[dict]:
    q_heads, kv_heads, head_dim = PREFILL if family.mode == "prefill" else DECODE
    scale = family.scale if family.scale is not None else head_dim ** -0.5
    source = attention_graph(1, q_heads, kv_heads, family.tokens, head_dim, mode=family.mode,
                             query_tokens=family.tokens if family.mode == "prefill" else 1,
                             softmax_scale=scale)

    def module(pv, numerics: Numerics):
        key = (source, pv, numerics)
        if key not in compiled:
            compiled[key] = int8attn.compile(source, pv=pv, numerics=numerics)
        return compiled[key]

    worst = {v: {"f32pv": 0.0, "exact": 0.0, "float": 0.0} for v in VARIANTS}
    for seed in seeds:
        q, keys, values = float_inputs(family, seed)
        k, k_scale = ref.quantize_keys(keys, ref.channel_bias(keys) if family.bias else None)
        v, v_scale = ref.quantize_cache(values)
        args = (q, k, k_scale, v, v_scale)
        exact = ref.exact_attention(*args, scale).astype(np.float64)
        ones = np.ones(keys.shape[:3], np.float32)
        floating = ref.exact_attention(q, keys, ones, values, ones, scale).astype(np.float64)
        f32 = {t: module("f32", Numerics(q_terms=t, w_quant="s8", w_terms=1))(*args)
               for t in (1, 2)}
        for variant in VARIANTS:
            out = module("int8", variant)(*args).astype(np.float64)
            errs = worst[variant]
            for name, other in (("f32pv", f32[variant.q_terms]), ("exact", exact),
                                ("float", floating)):
                errs[name] = max(errs[name], float(np.abs(out - other).max()))
    return [{"family": family.name, "w_quant": v.w_quant, "q_terms": v.q_terms,
             "w_terms": v.w_terms, **worst[v]} for v in VARIANTS]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--families", default="all",
                        help=f"comma list of {', '.join(f.name for f in FAMILIES)}")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = FAMILIES if args.families == "all" else \
        [f for f in FAMILIES if f.name in args.families.split(",")]
    lines = ["| family | w-quant | q-terms | w-terms | INT8 vs f32 PV | vs exact (deq. cache) | "
             "vs float attention |", "|:--|:--|--:|--:|--:|--:|--:|"]
    print("\n".join(lines), flush=True)
    compiled: dict = {}
    start = time.time()
    for family in chosen:
        for row in run_family(family, seeds, compiled):
            line = (f"| {row['family']} | {row['w_quant']} | {row['q_terms']} | {row['w_terms']} | "
                    f"{row['f32pv']:.2e} | {row['exact']:.2e} | {row['float']:.2e} |")
            lines.append(line)
            print(line, flush=True)
    print(f"{time.time() - start:.0f} s", file=sys.stderr)
    if args.out:
        command = "python benchmarks/cpu_accuracy_variants.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        with open(args.out, "w") as f:
            f.write(f"`{command}` (max abs over seeds {args.seeds}; decode B=1 Hq=32 Hkv=8 "
                    f"D=128, prefill B=1 Hq=8 Hkv=2 D=128)\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
