"""What limits the W quantization, and what other rules would give: a numpy model.

    python benchmarks/numpy_w_rounding.py [--seeds 0,1] [--families key-mult,gaussian,prefill-S] [--out FILE.md]

On the data families of cpu_accuracy_variants.py, with the contract's own W (the
fragment reference's blocks: INT8 Q with --q-terms 2, partitions / tiles, W = P*sV)
and its MMAC groups, the W-quantization term alone, sum_n omega_n sum_i (W~_i - W_i) Vq_i,
for each rule of W~ per (row, MMAC group), max abs over all outputs:

    s8        W~ = sW rne(W/sW), sW = a/127 (one-term numerics)
    u8        sW = a/255, u = rne(W/sW) in [0, 255] (--w-quant u8, one term)
    u8-pow2   u8 with sW rounded up to a power of two (exact rescale)
    u8-min    u8 over [lo, a], lo = the group's min, W~ = lo + sW u: lo * sum Vq is
              exact (the column sum), so it is an MMAC rule too
    u8-mse    u8 with sW = a/c, the c in 230..255 (26 candidates, max still exact)
              whose sum (W~ - W)^2 is least: a search, not a kernel's rule
    max-exact the group's largest W exact, the rest u8 against the second largest
              (not an MMAC rule: a bound on what the largest weight costs)
    2-term    u8, then a signed INT8 term on the residual (--w-terms 2, the contract)

and, per family, the worst output's leading group: its weights over the largest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from cpu_accuracy_variants import DECODE, FAMILIES, PREFILL, float_inputs  # noqa: E402

from int8attn import reference as ref  # noqa: E402
from int8attn.contract.numerics import Numerics  # noqa: E402
from int8attn.fragments import fragment_model  # noqa: E402
from int8attn.reference.fragment import blocks_for  # noqa: E402


def _grid(w, lo, step, top):
    with np.errstate(invalid="ignore", divide="ignore"):
        u = np.where(step > 0, np.clip(np.rint((w - lo) / np.where(step > 0, step, 1)), 0, top), 0)
    return lo + u * step


def s8(w):
    return _grid(w, 0.0, w.max(-1, keepdims=True) / 127, 127)


def u8(w):
    return _grid(w, 0.0, w.max(-1, keepdims=True) / 255, 255)


def u8_pow2(w):
    a = w.max(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        step = np.where(a > 0, 2.0 ** np.ceil(np.log2(np.where(a > 0, a, 1) / 255)), 0)
    return _grid(w, 0.0, step, 255)


def u8_min(w):
    lo = w.min(-1, keepdims=True)
    return _grid(w, lo, (w.max(-1, keepdims=True) - lo) / 255, 255)


def u8_mse(w):
    a = w.max(-1, keepdims=True)
    best, best_err = None, None
    for c in np.arange(255, 229, -1):
        out = _grid(w, 0.0, a / c, 255)
        err = ((out - w) ** 2).sum(-1, keepdims=True)
        if best is None:
            best, best_err = out, err
        else:
            better = err < best_err
            best, best_err = np.where(better, out, best), np.minimum(err, best_err)
    return best


def max_exact(w):
    top = w.argmax(-1)[..., None]
    rest = w.copy()
    np.put_along_axis(rest, top, 0, -1)
    out = u8(rest)
    np.put_along_axis(out, top, np.take_along_axis(w, top, -1), -1)
    return out


def two_term(w):
    first = u8(w)
    return first + _signed(w - first)


def _signed(r):
    step = np.abs(r).max(-1, keepdims=True) / 127
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(step > 0, np.clip(np.rint(r / np.where(step > 0, step, 1)), -127, 127),
                        0) * step


RULES = {"s8": s8, "u8": u8, "u8-pow2": u8_pow2, "u8-min": u8_min, "u8-mse": u8_mse,
         "max-exact": max_exact, "2-term": two_term}


def w_errors(family, seed):
    """{rule: W-term error [B,Hkv,R,D]}, and (weights [..,G,K], omega, v groups)."""
    q, keys, values = float_inputs(family, seed)
    head_dim = (PREFILL if family.mode == "prefill" else DECODE)[2]
    scale = family.scale if family.scale is not None else head_dim ** -0.5
    k, k_scale = ref.quantize_keys(keys, ref.channel_bias(keys) if family.bias else None)
    v, v_scale = ref.quantize_cache(values)
    st = blocks_for(q, k, k_scale, v, v_scale, scale, numerics=Numerics(q_terms=2))
    groups = fragment_model("gfx936").token_groups(st.w.shape[-1])
    w = st.w[..., groups].astype(np.float64)                        # [B,Hkv,R,N,G,K]
    vg = st.v_blocks[:, :, :, groups, :].astype(np.float64)         # [B,Hkv,N,G,K,D]
    out = {}
    for name, rule in RULES.items():
        per_block = np.einsum("bhrngk,bhngkd->bhrnd", rule(w) - w, vg)
        out[name] = np.einsum("bhrn,bhrnd->bhrd", st.omega, per_block)
    return out, (w, st.omega, vg)


def leading_group(error, w, omega, vg):
    """The worst output's largest contributing group: its share and W / max W."""
    b, h, r, d = np.unravel_index(np.abs(error).argmax(), error.shape)
    e = u8(w[b, h, r]) - w[b, h, r]                                  # [N,G,K]
    per_group = omega[b, h, r][:, None] * (e * vg[b, h][..., d]).sum(-1)
    n, g = np.unravel_index(np.abs(per_group).argmax(), per_group.shape)
    weights = np.sort(w[b, h, r, n, g])[::-1]
    share = per_group[n, g] / error[b, h, r, d]
    return share, weights[:4] / weights[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--families", default="key-mult,gaussian,prefill-S")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    chosen = [f for f in FAMILIES if f.name in args.families.split(",")]
    lines = ["| family | seed | " + " | ".join(RULES) + " | worst output: leading group's "
             "share, its W / max W |", "|:--|--:|" + "--:|" * len(RULES) + ":--|"]
    print("\n".join(lines), flush=True)
    for family in chosen:
        for seed in seeds:
            errors, (w, omega, vg) = w_errors(family, seed)
            share, top = leading_group(errors["u8"], w, omega, vg)
            line = (f"| {family.name} | {seed} | "
                    + " | ".join(f"{np.abs(e).max():.2e}" for e in errors.values())
                    + f" | {share:.0%}, {', '.join(f'{x:.4f}' for x in top)} |")
            lines.append(line)
            print(line, flush=True)
    if args.out:
        command = "python benchmarks/numpy_w_rounding.py " + " ".join(
            argv if argv is not None else sys.argv[1:])
        Path(args.out).write_text(
            f"`{command}` (W-quantization term alone, max abs over all outputs; W from the "
            f"contract with q-terms 2; decode B=1 Hq=32 Hkv=8 D=128, prefill B=1 Hq=8 Hkv=2 "
            f"D=128)\n\n" + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
