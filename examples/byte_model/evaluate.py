"""How much a KV cache's quantization costs a trained model: bits per byte, agreement, KL.

    python examples/byte_model/evaluate.py --out out/byte-model-cpu          # the full table
    python examples/byte_model/evaluate.py --windows 2 --context 256 \\
        --variants f32,default,one-term,contiguous-one-term                  # the CI slice
    # cuda: compile the kernels where IREE's compiler is, run where the GPU is
    python examples/byte_model/evaluate.py --target cuda --prepare .gpu/byte-model
    python3 examples/byte_model/evaluate.py --target cuda --packages .gpu/byte-model --out OUT

The byte-level Llama of `weights/` (train.py) reads held-out standard-library files
(corpus.py) teacher-forced, one forward per window of `--context` bytes, through each cache
variant. Every int8attn variant runs the real kernels of its target (cpu, or cuda's lane
kernels with their own default numerics): the new keys and values quantized and written
into a PagedInt8Cache by cache_write, every query attending through the chunked paged
prefill. The float caches (bf16, FP8 e4m3 per token, INT8 per
token read back in f32) are applied to the states transformers' DynamicCache holds, with
f32 SDPA on them. Against the f32 cache: bits per byte, next-byte argmax agreement and
KL(f32 || variant). `--generate N` also generates greedily from N held-out file tails and
reports where each generation ends (the END byte), its repetition and the first step where
it parts from the f32 cache's path.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch        # noqa: E402

import corpus as corpus_module  # noqa: E402
import model as model_module    # noqa: E402

LN2 = math.log(2)
FP8_MAX = 448.0          # e4m3's largest finite value


@dataclass(frozen=True)
class Variant:
    """One cache: `kind` is "float" (a transform of the states DynamicCache holds) or
    "int8attn" (PagedInt8Cache with these PagedAttention `options`)."""

    name: str
    kind: str
    what: str
    options: dict = field(default_factory=dict)
    k_bias: bool = False


ONE_TERM = dict(q_terms=1, w_quant="s8", w_terms=1)
VARIANTS = {v.name: v for v in (
    Variant("f32", "float", "f32 cache (the reference)"),
    Variant("bf16", "float", "bf16 cache, f32 attention"),
    Variant("fp8-e4m3", "float", "FP8 e4m3 cache, one scale per token and head, f32 attention"),
    Variant("int8-exact", "float", "INT8 cache (the contract's quantize), f32 attention on it"),
    Variant("default", "int8attn", "int8attn, the target's default numerics"),
    Variant("one-term", "int8attn", "int8attn, one-term numerics", ONE_TERM),
    Variant("bf16-pv", "int8attn", "int8attn, BF16 PV twin (INT8 QK)", dict(pv="bf16")),
    Variant("k-bias", "int8attn", "int8attn, default numerics, K channel bias subtracted",
            k_bias=True),
    Variant("contiguous", "int8attn", "int8attn, default numerics, contiguous (wrong) W groups",
            dict(scale_groups="contiguous", verify=False)),
    Variant("contiguous-one-term", "int8attn",
            "int8attn, one-term numerics, contiguous (wrong) W groups",
            dict(ONE_TERM, scale_groups="contiguous", verify=False)),
)}


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default=str(model_module.WEIGHTS), metavar="DIR")
    parser.add_argument("--corpus", metavar="ARCHIVE",
                        help="a packed corpus (corpus.py); default: this Python's stdlib")
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, from: {', '.join(VARIANTS)}")
    parser.add_argument("--windows", type=int, default=16, help="held-out windows (default 16)")
    parser.add_argument("--context", type=int, default=model_module.CONTEXT,
                        help=f"bytes per window, at most {model_module.CONTEXT}")
    parser.add_argument("--batch", type=int, default=4, help="windows per forward")
    parser.add_argument("--chunk", type=int, default=64, help="chunked-prefill query tokens")
    parser.add_argument("--generate", type=int, default=0, metavar="N",
                        help="greedy generations from N held-out file tails (default none)")
    parser.add_argument("--prompt", type=int, default=384, help="prompt bytes of a generation")
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--prepare", metavar="DIR",
                        help="cuda: compile each variant's packages into DIR/<variant>, exit")
    parser.add_argument("--packages", metavar="DIR", help="cuda: the packages --prepare wrote")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    default_variants = args.variants == ",".join(VARIANTS)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if args.target == "cuda":
        wrong = [v for v in args.variants if "contiguous" in v]
        if wrong and not default_variants:
            parser.error(f"{', '.join(wrong)}: the lane kernels compute each W scale in the "
                         f"lanes that feed its MMA, so contiguous groups exist on --target cpu only")
        args.variants = [v for v in args.variants if "contiguous" not in v]
        if not (args.prepare or args.packages):
            parser.error("--target cuda needs --prepare DIR (here) or --packages DIR (on the GPU)")
    elif args.prepare or args.packages:
        parser.error("--prepare and --packages hold cuda kernels: add --target cuda")
    if "f32" not in args.variants:
        args.variants.insert(0, "f32")          # every comparison is against it
    for name in ("windows", "batch", "new_tokens", "prompt"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 2 <= args.context <= model_module.CONTEXT:
        parser.error(f"--context must be 2 to {model_module.CONTEXT}, got {args.context}")
    if args.generate and args.prompt + args.new_tokens > model_module.CONTEXT:
        parser.error(f"--prompt + --new-tokens must fit the model's {model_module.CONTEXT} "
                     f"positions, got {args.prompt + args.new_tokens}")
    return args


# float caches -------------------------------------------------------------
def per_token_absmax(x):
    return x.abs().amax(-1, keepdim=True)


def fake_quantize(kind: str, x):
    """x [B, H, S, D] f32 as the cache would store and give it back, per token and head."""
    if kind == "f32":
        return x
    if kind == "bf16":
        return x.to(torch.bfloat16).float()
    if kind == "fp8-e4m3":
        scale = per_token_absmax(x) / FP8_MAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        return (x / safe).to(torch.float8_e4m3fn).float() * scale
    if kind == "int8-exact":
        # the contract's quantize: s = a/127, q = clamp(rne(x * (127/a)), -127, 127)
        a = per_token_absmax(x)
        inverse = torch.where(a > 0, 127.0 / a, torch.zeros_like(a))
        return torch.clamp(torch.round(x * inverse), -127, 127) * (a / 127.0)
    raise ValueError(kind)


def float_cache(kind: str, config):
    from transformers import DynamicCache

    class QuantizedDynamicCache(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            return super().update(fake_quantize(kind, key_states.float()),
                                  fake_quantize(kind, value_states.float()),
                                  layer_idx, *args, **kwargs)

    return QuantizedDynamicCache(config=config)


# int8attn caches ----------------------------------------------------------
def int8attn_cache(variant: Variant, model, attention, blocks, chunk, k_bias):
    from int8attn.serving.transformers_attention import PagedInt8Cache

    class BiasedCache(PagedInt8Cache):
        """Keys minus their layer's per-KV-head mean before they are quantized: the
        scores of a query all move by q·mu, which softmax ignores."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            bias = k_bias[layer_idx].to(key_states.dtype)[None, :, None, :]
            return super().update(key_states - bias, value_states, layer_idx, *args, **kwargs)

    cls = BiasedCache if variant.k_bias else PagedInt8Cache
    return cls(model.config, attention, blocks, chunk=chunk, validate=False,
               device=model.device)


def key_states(model, tokens):
    """Every layer's post-RoPE keys [Hkv, S, D] for one row of tokens (an f32 cache)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        model(input_ids=tokens[None], past_key_values=cache, use_cache=True)
    return [layer.keys[0].float() for layer in cache.layers]


def channel_outliers(keys):
    """Per layer, the largest channel RMS over the median channel RMS (each KV head)."""
    ratios = []
    for k in keys:
        rms = k.pow(2).mean(1).sqrt()                      # [Hkv, D]
        ratios.append((rms.amax(-1) / rms.median(-1).values).amax().item())
    return ratios


# evaluation ---------------------------------------------------------------
def windows(tokens: np.ndarray, count: int, length: int) -> torch.Tensor:
    available = (len(tokens) - 1) // length
    if available < count:
        raise SystemExit(f"error: the held-out text holds {available} windows of {length} "
                         f"bytes, fewer than --windows {count}")
    # spread over the whole held-out text, not only its first files
    starts = np.linspace(0, (available - 1) * length, count).astype(np.int64) // length * length
    return torch.from_numpy(np.stack([tokens[s:s + length + 1] for s in starts]))


def forward_logits(model, variant, rows, args, attention, k_bias):
    """log-softmax of the next-byte logits [N, S, V] for every window row."""
    from int8attn.serving.transformers_attention import install

    out = []
    for first in range(0, len(rows), args.batch):
        ids = rows[first:first + args.batch, :-1]
        if variant.kind == "float":
            model.set_attn_implementation("sdpa")
            cache = float_cache(variant.name, model.config)
        else:
            install(model)
            blocks = len(ids) * -(-ids.shape[1] // attention.block_size) + 1
            cache = int8attn_cache(variant, model, attention, blocks, args.chunk, k_bias)
        with torch.no_grad():
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        out.append(torch.log_softmax(logits.double(), -1))
    return torch.cat(out)


def score(log_p, log_q, targets):
    """bits per byte of q, argmax agreement with p, KL(p || q) (mean and max per byte)."""
    nll = -log_q.gather(-1, targets[..., None]).squeeze(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    half = targets.shape[1] // 2
    return {"bits_per_byte": nll.mean().item() / LN2,
            "bits_per_byte_second_half": nll[:, half:].mean().item() / LN2,
            "agreement": (log_p.argmax(-1) == log_q.argmax(-1)).double().mean().item(),
            "kl_mean": kl.mean().item(), "kl_max": kl.max().item()}


def generation_prompts(text, count, prompt, room):
    """The last `prompt + room` bytes of held-out files (each long enough), cut before its
    last `room` bytes: a generation that follows the file should end within ~room bytes."""
    files = [data for _, data in text.split(held_out=True) if len(data) >= prompt + room]
    if len(files) < count:
        raise SystemExit(f"error: only {len(files)} held-out files hold {prompt + room} bytes")
    picked = [files[i] for i in np.linspace(0, len(files) - 1, count).astype(int)]
    return (torch.tensor([list(d[len(d) - room - prompt:len(d) - room]) for d in picked]),
            torch.tensor([list(d[len(d) - room:]) for d in picked]))


def generate(model, variant, prompts, args, attention, k_bias):
    from int8attn.serving.transformers_attention import cache_keyword, install

    if variant.kind == "float":
        model.set_attn_implementation("sdpa")
        cache = float_cache(variant.name, model.config)
    else:
        install(model)
        blocks = len(prompts) * -(-(prompts.shape[1] + args.new_tokens) // attention.block_size)
        cache = int8attn_cache(variant, model, attention, blocks + 1, args.chunk, k_bias)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=args.new_tokens, eos_token_id=None,
                             **{cache_keyword(model): cache})
    return out[:, prompts.shape[1]:]


def end_of_file_scores(model, variant, prompts, rest, args, attention, k_bias):
    """Teacher-forced through each file tail to its real end: log2 p(END) where the file
    ends, and END's rank among the 257 tokens there (0: the model would stop)."""
    rows = torch.cat([prompts, rest, torch.full_like(rest[:, :1], corpus_module.END)], 1)
    log_q = forward_logits(model, variant, rows, args, attention, k_bias)[:, -1]
    end = log_q[:, corpus_module.END]
    rank = (log_q > end[:, None]).sum(-1)
    return {"end_log2_prob": (end / LN2).tolist(), "end_rank": rank.tolist()}


def generation_stats(tokens, reference):
    rows = []
    for row, ref in zip(tokens.tolist(), reference.tolist()):
        end = row.index(corpus_module.END) if corpus_module.END in row else None
        body = row[:end] if end is not None else row
        grams = [tuple(body[i:i + 16]) for i in range(max(0, len(body) - 15))]
        parted = next((i for i, (a, b) in enumerate(zip(row, ref)) if a != b), None)
        rows.append({"end_step": end, "repeated_16grams": 1 - len(set(grams)) / len(grams)
                     if grams else 0.0, "first_divergence_step": parted})
    return rows


def attention_of(variant: Variant, model, args):
    """The variant's PagedAttention: compiled here (cpu), or loaded from --packages (cuda)."""
    if variant.kind != "int8attn":
        return None
    if args.target == "cuda":
        from int8attn.serving import PagedAttention

        return PagedAttention.load(Path(args.packages) / variant.name)
    from int8attn.serving.transformers_attention import paged_attention_for

    return paged_attention_for(model.config, target="cpu", **variant.options)


def prepare(args) -> int:
    from int8attn.serving.transformers_attention import paged_attention_for

    config = model_module.config()
    for name in args.variants:
        variant = VARIANTS[name]
        if variant.kind == "int8attn":
            attn = paged_attention_for(config, target="cuda", **variant.options)
            folder = attn.save(Path(args.prepare) / name, query_tokens=(args.chunk,))
            print(f"{name}: saved the cuda packages ({attn.numerics.describe()}) in {folder}")
    return 0


def run(args) -> dict:
    print(f"held-out windows: {args.windows} x {args.context} bytes spread over the held-out "
          f"files (deterministic; no random draw)")
    text = corpus_module.load(args.corpus)
    device = torch.device("cuda" if args.target == "cuda" else "cpu")
    model = model_module.load(Path(args.weights)).to(device)
    rows = windows(text.tokens(held_out=True), args.windows, args.context).to(device)
    targets = rows[:, 1:]
    calibration = windows(text.tokens(held_out=False), 1, model_module.CONTEXT)[0, :-1].to(device)
    keys = key_states(model, calibration)
    k_bias = [k.mean(1) for k in keys]                      # per layer [Hkv, D]
    report = {"command": " ".join(["python"] + sys.argv), "corpus": text.origin,
              "corpus_sha256": text.digest(), "weights": str(args.weights),
              "windows": args.windows, "context": args.context, "chunk": args.chunk,
              "target": args.target, "machine": torch.cuda.get_device_name()
              if args.target == "cuda" else platform.processor() or platform.machine(),
              "torch": torch.__version__, "k_channel_outlier_ratio": channel_outliers(keys),
              "variants": {}}
    reference = None
    for name in args.variants:
        variant = VARIANTS[name]
        attention = attention_of(variant, model, args)
        start = time.perf_counter()
        log_q = forward_logits(model, variant, rows, args, attention, k_bias)
        if reference is None:
            reference = log_q
        entry = {"what": variant.what, **score(reference, log_q, targets),
                 "numerics": attention.numerics.describe() if attention else None,
                 "seconds": time.perf_counter() - start}
        base = report["variants"].get("f32", entry)["bits_per_byte"]    # f32 runs first
        entry["bits_per_byte_vs_f32_percent"] = 100 * (entry["bits_per_byte"] / base - 1)
        report["variants"][name] = entry
        print(f"{name:22s} {entry['bits_per_byte']:.5f} bits/byte  agreement "
              f"{entry['agreement']:.4f}  KL mean {entry['kl_mean']:.3g}  "
              f"({entry['seconds']:.1f} s)", flush=True)
    if args.generate:
        room = args.new_tokens // 4
        prompts, rest = generation_prompts(text, args.generate, args.prompt, room)
        prompts, rest = prompts.to(device), rest.to(device)
        report["generation"] = {"prompts": args.generate, "prompt_bytes": args.prompt,
                                "bytes_left_in_file": room, "new_tokens": args.new_tokens,
                                "variants": {}}
        base = None
        for name in args.variants:
            variant = VARIANTS[name]
            attention = attention_of(variant, model, args)
            tokens = generate(model, variant, prompts, args, attention, k_bias)
            base = tokens if base is None else base
            stats = generation_stats(tokens, base)
            ended = [s["end_step"] for s in stats if s["end_step"] is not None]
            report["generation"]["variants"][name] = {
                "rows": stats, "ended": len(ended),
                "median_end_step": float(np.median(ended)) if ended else None,
                **end_of_file_scores(model, variant, prompts, rest, args, attention, k_bias)}
            print(f"generate {name:22s} ended {len(ended)}/{len(stats)}  end steps "
                  f"{[s['end_step'] for s in stats]}", flush=True)
    return report


def markdown(r) -> str:
    lines = [f"Byte-level Llama ({r['weights']}) on {r['windows']} held-out windows of "
             f"{r['context']} bytes ({r['corpus']}), target {r.get('target', 'cpu')} on "
             f"{r['machine']}, torch {r['torch']}.",
             f"`{r['command']}`", "",
             "| cache | numerics | bits/byte | vs f32 | second half | argmax agreement | KL mean "
             "| KL max |", "| --- | --- | --: | --: | --: | --: | --: | --: |"]
    for name, v in r["variants"].items():
        lines.append(f"| {v['what']} | {v.get('numerics') or '-'} | {v['bits_per_byte']:.5f} | "
                     f"{v['bits_per_byte_vs_f32_percent']:+.3f}% | "
                     f"{v['bits_per_byte_second_half']:.5f} | {v['agreement']:.4f} | "
                     f"{v['kl_mean']:.3g} | {v['kl_max']:.3g} |")
    ratios = ", ".join(f"{x:.1f}" for x in r["k_channel_outlier_ratio"])
    lines += ["", f"Largest K channel RMS over the median channel's, per layer: {ratios}."]
    if "generation" in r:
        g = r["generation"]
        lines += ["", f"Greedy generation from {g['prompts']} held-out file tails "
                  f"({g['prompt_bytes']} prompt bytes, the file ends {g['bytes_left_in_file']} "
                  f"bytes later; up to {g['new_tokens']} new bytes):", "",
                  "| cache | ended | median end step | repeated 16-grams | first divergence "
                  "from f32 | log2 p(END) at the file's end, mean | END ranked first |",
                  "| --- | --: | --: | --: | --- | --: | --: |"]
        for name, v in g["variants"].items():
            rep = np.mean([s["repeated_16grams"] for s in v["rows"]])
            first = sum(r == 0 for r in v["end_rank"])
            lines.append(f"| {name} | {v['ended']}/{g['prompts']} | {v['median_end_step']} | "
                         f"{rep:.3f} | {[s['first_divergence_step'] for s in v['rows']]} | "
                         f"{np.mean(v['end_log2_prob']):.2f} | {first}/{g['prompts']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = arguments(argv)
    if args.prepare:
        return prepare(args)
    report = run(args)
    print(markdown(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))
        out.with_suffix(".md").write_text(markdown(report))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
