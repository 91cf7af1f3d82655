"""Prefill accuracy: a fixed P scale of 1/127 against the per-MMAC dynamic W scales.

    python benchmarks/prefill_p_scale.py [--tokens 512] [--seeds 0,1] [--families all] [--out FILE.md]

INT-FlashAttention quantizes the online softmax's p (in [0, 1]) with the fixed scale
1/127; this project quantizes W = p * sV per MMAC group on its own absmax (the contract,
docs/design.md §2). For each prefill data family of benchmarks/cpu_accuracy_variants.py
(causal Sq = S, Hq 8 over Hkv 2, D 128) and each numerics (one-term, and two-term digits:
the kernels' default), max abs and RMS against exact attention on the dequantized cache
(float q) of:

- f32 PV: the contract's scores and online softmax, PV unquantized (what Q alone costs);
- fixed P: the same, p quantized to roundeven(127 p) / 127 (reference.fixed_p_scale_attention);
- dynamic W: the contract (reference.fragment_attention, the cuda fragment model);
- the cuda prefill kernel in the lane simulator, and its distance to the dynamic reference.

The seed of each run is printed; the worst over the seeds is reported.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import numpy as np

from cpu_accuracy_variants import FAMILIES, PREFILL, float_inputs

from int8attn import reference as ref
from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS
from int8attn.simulator import simulate_prefill

PREFILL_FAMILIES = ["gaussian", "key-mult", "key-add", "peaked-1", "peaked-10", "huge-v"]
NUMERICS = {"one-term": ONE_TERM_NUMERICS, "digits": DIGIT_NUMERICS}
COLUMNS = ("f32 PV", "fixed P", "dynamic W", "kernel", "kernel vs dynamic")


def run(family, seed: int, numerics) -> dict[str, np.ndarray]:
    print(f"{family.name}: numpy default_rng seed {seed}", file=sys.stderr, flush=True)
    q, keys, values = float_inputs(family, seed)
    k, k_scale = ref.quantize_keys(keys, None)
    v, v_scale = ref.quantize_cache(values)
    args = (q, k, k_scale, v, v_scale)
    scale = family.scale if family.scale is not None else q.shape[-1] ** -0.5
    exact = ref.exact_attention(*args, scale).astype(np.float64)
    dynamic = ref.fragment_attention(*args, scale, model="cuda", numerics=numerics)
    kernel = simulate_prefill(*args, scale, target="cuda", numerics=numerics)
    outs = {"f32 PV": ref.fragment_attention(*args, scale, pv="f32", numerics=numerics),
            "fixed P": ref.fixed_p_scale_attention(*args, scale, numerics=numerics),
            "dynamic W": dynamic, "kernel": kernel}
    errors = {name: out.astype(np.float64) - exact for name, out in outs.items()}
    errors["kernel vs dynamic"] = kernel.astype(np.float64) - dynamic
    return errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512, help="Sq = S of every family")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--families", default="all",
                        help=f"comma list of {', '.join(PREFILL_FAMILIES)}")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    names = PREFILL_FAMILIES if args.families == "all" else args.families.split(",")
    unknown = sorted(set(names) - set(PREFILL_FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown} (known: {', '.join(PREFILL_FAMILIES)})")
    seeds = [int(s) for s in args.seeds.split(",")]
    by_name = {f.name: f for f in FAMILIES}
    heads = f"Hq {PREFILL[0]} / Hkv {PREFILL[1]}, D {PREFILL[2]}"
    lines = [f"Causal prefill Sq = S = {args.tokens}, {heads}, seeds {args.seeds}: max abs "
             f"(RMS) vs exact attention on the dequantized cache, the worst seed.", "",
             "| family | numerics | " + " | ".join(COLUMNS) + " |",
             "|:--|:--|" + "--:|" * len(COLUMNS)]
    print("\n".join(lines), flush=True)
    for name in names:
        family = replace(by_name[name], mode="prefill", tokens=args.tokens)
        for label, numerics in NUMERICS.items():
            worst = {c: (0.0, 0.0) for c in COLUMNS}
            for seed in seeds:
                for column, error in run(family, seed, numerics).items():
                    stats = (float(np.abs(error).max()), float(np.sqrt(np.mean(error ** 2))))
                    worst[column] = tuple(map(max, worst[column], stats))
            cells = [f"{m:.1e} ({r:.0e})" for m, r in worst.values()]
            line = f"| {name} | {label} | " + " | ".join(cells) + " |"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
