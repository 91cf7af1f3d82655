"""Accuracy per accumulation chain length (`--w-chain 1|2|4`) on the IREE CPU runtime.

    python benchmarks/cpu_w_chain_accuracy.py [--seeds 0,1] [--out PREFIX]

For each mode (decode B=1 Hq=32 Hkv=8 S=4096 D=128; causal prefill Hq=8 Hkv=2
Sq=S=1024 D=128, KV tiles of 128 tokens so that a chain of 4 fits), data family
(gaussian; key-outliers: 4 key channels per KV head x30-60 before the cache is
quantized), numerics (one-term: q1 s8 one W term; default: q2 u8 two W terms) and
chain c, the compiled INT8-PV module against

- the compiled f32-PV module of the same numerics: W's quantization alone,
- the exact reference (dequantized cache, unquantized q),
- the fragment-level reference of the same chain (the contract, to f32 rounding),

max abs and RMS over all outputs, the largest over the seeds. Writes PREFIX.json (rows)
and PREFIX.md (the table).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import int8attn
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.graph import attention_graph
from int8attn.fragments import W_CHAINS, fragment_model

MODES = {"decode": dict(q_heads=32, kv_heads=8, tokens=4096, query_tokens=1),
         "prefill": dict(q_heads=8, kv_heads=2, tokens=1024, query_tokens=1024)}
HEAD_DIM = 128
TILE_TOKENS = 128
NUMERICS = {"one-term": ONE_TERM_NUMERICS, "default": Numerics()}
FAMILIES = ("gaussian", "key-outliers")


def inputs(mode: str, family: str, seed: int):
    shape = MODES[mode]
    rng = np.random.default_rng(seed)
    q_shape = (1, shape["q_heads"], HEAD_DIM) if mode == "decode" else \
        (1, shape["q_heads"], shape["query_tokens"], HEAD_DIM)
    q = rng.standard_normal(q_shape).astype(np.float32)
    kv = (1, shape["kv_heads"], shape["tokens"], HEAD_DIM)
    keys = rng.standard_normal(kv).astype(np.float32)
    if family == "key-outliers":
        for h in range(shape["kv_heads"]):
            channels = rng.choice(HEAD_DIM, 4, replace=False)
            keys[:, h, :, channels] *= rng.uniform(30, 60, 4).astype(np.float32)[:, None, None]
    k, k_scale = ref.quantize_cache(keys)
    v, v_scale = ref.quantize_cache(rng.standard_normal(kv).astype(np.float32))
    return q, k, k_scale, v, v_scale


def stats(a, b) -> dict:
    d = a.astype(np.float64) - b.astype(np.float64)
    return {"max_abs": float(np.abs(d).max()), "rms": float(np.sqrt(np.mean(d * d)))}


def worst(rows: list[dict]) -> dict:
    return {k: max(r[k] for r in rows) for k in rows[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", default=None, help="write PREFIX.json and PREFIX.md")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for mode, shape in MODES.items():
        source = attention_graph(1, shape["q_heads"], shape["kv_heads"], shape["tokens"],
                                 HEAD_DIM, mode=mode, query_tokens=shape["query_tokens"])
        scale = HEAD_DIM ** -0.5
        for numerics_name, numerics in NUMERICS.items():
            f32 = int8attn.compile(source, pv="f32", q_terms=numerics.q_terms,
                                   tile_tokens=TILE_TOKENS)
            modules = {c: int8attn.compile(source, numerics=numerics, w_chain=c,
                                           tile_tokens=TILE_TOKENS) for c in W_CHAINS}
            for family in FAMILIES:
                per_chain: dict[int, dict[str, list]] = {c: {} for c in W_CHAINS}
                for seed in seeds:
                    start = time.perf_counter()
                    data = inputs(mode, family, seed)
                    baseline = f32(*data)
                    exact = ref.exact_attention(*data, scale)
                    for c in W_CHAINS:
                        out = modules[c](*data)
                        model = fragment_model("gfx936").chained(c).name
                        fragment = ref.fragment_attention(*data, scale, numerics=numerics,
                                                          model=model, tile_tokens=TILE_TOKENS)
                        for name, other in (("w_alone", baseline), ("exact", exact),
                                            ("fragment", fragment)):
                            per_chain[c].setdefault(name, []).append(stats(out, other))
                    print(f"{mode} {numerics_name} {family} seed {seed}: "
                          f"{time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
                for c in W_CHAINS:
                    rows.append({"mode": mode, "numerics": numerics_name, "family": family,
                                 "chain": c, "seeds": seeds,
                                 **{name: worst(v) for name, v in per_chain[c].items()}})
    table = ["| mode | numerics | family | chain | W alone max abs | W alone RMS | "
             "vs exact max abs | vs exact RMS | vs fragment max abs |",
             "|:--|:--|:--|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        table.append(f"| {r['mode']} | {r['numerics']} | {r['family']} | {r['chain']} | "
                     f"{r['w_alone']['max_abs']:.2e} | {r['w_alone']['rms']:.2e} | "
                     f"{r['exact']['max_abs']:.2e} | {r['exact']['rms']:.2e} | "
                     f"{r['fragment']['max_abs']:.2e} |")
    text = "\n".join(table) + "\n"
    print(text)
    if args.out:
        with open(f"{args.out}.json", "w") as f:
            json.dump({"rows": rows, "tile_tokens": TILE_TOKENS, "modes": MODES}, f, indent=1)
        with open(f"{args.out}.md", "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
