"""transformers' generate() of a Llama-architecture model with every attention through int8attn.

    # CPU: compiles here (IREE's CPU runtime on torch CPU tensors), runs here
    .venv/bin/python examples/transformers_generate.py --target cpu --out out/transformers-cpu
    # GPU: compile the cuda packages where the IREE compiler is, then run where the GPU is
    .venv/bin/python examples/transformers_generate.py --target cuda --prepare .pkg/llama
    python3 examples/transformers_generate.py --target cuda --packages .pkg/llama \\
        --out out/transformers-h200

The model is transformers' own LlamaForCausalLM with random weights (seeded, printed):
GPU default 4 layers, hidden 4096, 32 query heads over 8 KV heads, head dim 128; the CPU
default is much smaller. A ragged batch of random prompts (left-padded) is generated
greedily twice: with attention "int8attn_paged" on a PagedInt8Cache (the pool INT8, the
new tokens quantized and written by cache_write, prefill through the chunked paged
prefill, decode through the paged decode kernel), and with attention "sdpa" on
transformers' DynamicCache (bf16 on the GPU, f32 on the CPU), the baseline.

Compared per step: logits max abs difference and KL(baseline || int8attn), both against
the baseline *teacher-forced on int8attn's tokens* (a manual loop making the forwards
generate makes, with a DynamicCache), so every step compares the same prefixes even
where the greedy paths part; the greedy-token agreement of the two free-running
generations; and tokens/s of each (after a warm-up generation that compiles or loads
every kernel). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

GPU = dict(layers=4, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=14336,
           vocab=32000, prompts="37,250,1000,3000", chunk=64)
CPU = dict(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, intermediate=512,
           vocab=2000, prompts="5,20,70,150", chunk=16)


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--prepare", metavar="DIR", help="cuda: compile the packages here, exit")
    parser.add_argument("--packages", metavar="DIR", help="cuda: the packages --prepare wrote")
    for name in GPU:
        parser.add_argument("--" + name.replace("_", "-"), type=type(GPU[name]), default=None,
                            help=f"default {GPU[name]} (cuda), {CPU[name]} (cpu)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--validate", action="store_true",
                        help="PagedAttention's value checks on every kernel call of the timed "
                             "run too (a host sync each; the warm-up run always checks)")
    parser.add_argument("--out", help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    for name, value in (GPU if args.target == "cuda" else CPU).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.prompts = [int(n) for n in str(args.prompts).split(",")]
    if args.target == "cuda" and not (args.prepare or args.packages):
        parser.error("--target cuda needs --prepare DIR (here) or --packages DIR (on the GPU)")
    if args.target == "cpu" and args.packages:
        parser.error("--packages holds cuda kernels: add --target cuda (the cpu target "
                     "compiles here)")
    return args


def cuda_missing() -> str | None:
    """Why torch cannot put tensors on a CUDA GPU here (None: it can)."""
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "torch finds no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def load_packages(folder: str, chunk: int):
    """PagedAttention.load(folder) with a prefill_{chunk} package, or exit with one line."""
    from int8attn.runtime.module import InputError
    from int8attn.serving import PagedAttention
    from int8attn.serving.kernel_package import PackageError

    try:
        attn = PagedAttention.load(folder)
    except (InputError, PackageError, KeyError, TypeError) as error:
        # KeyError / TypeError: a paged_attention.json missing a field or of another shape
        sys.exit(f"error: {error}; write the packages with --target cuda --prepare DIR")
    if ("prefill", chunk) not in attn._executors:
        sys.exit(f"error: {folder} holds no prefill_{chunk} package: --prepare it with "
                 f"--chunk {chunk}")
    return attn


def build_model(args, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    print(f"random weights: torch.manual_seed({args.seed})")
    torch.manual_seed(args.seed)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                         intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.head_dim, max_position_embeddings=8192,
                         bos_token_id=1, eos_token_id=None, pad_token_id=0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompts(args, device):
    generator = torch.Generator().manual_seed(args.seed + 1)
    width = max(args.prompts)
    ids = torch.zeros(len(args.prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(args.prompts):
        ids[row, width - length:] = torch.randint(3, args.vocab, (length,), generator=generator)
        mask[row, width - length:] = 1
    return ids.to(device), mask.to(device)


class StepTimes:
    """A stopping criterion that never stops: the time each step's token is chosen."""

    def __init__(self, device):
        self.device, self.times = device, []

    def __call__(self, input_ids, scores, **kwargs):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.times.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def generate(model, ids, mask, new_tokens, cache=None):
    from transformers import StoppingCriteriaList

    timer = StepTimes(ids.device)
    from int8attn.serving.transformers_attention import cache_keyword

    extra = {} if cache is None else {cache_keyword(model): cache}
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True,
                             stopping_criteria=StoppingCriteriaList([timer]), **extra)
    tokens = out.sequences[:, ids.shape[1]:]
    logits = torch.stack(out.logits, 1).float()              # [B, steps, V]
    t = timer.times
    batch = ids.shape[0]
    timing = {"seconds": t[-1] - start, "prefill_seconds": t[0] - start,
              "tokens_per_s": batch * new_tokens / (t[-1] - start),
              "decode_tokens_per_s": batch * (new_tokens - 1) / (t[-1] - t[0])
              if new_tokens > 1 else None}
    return tokens, logits, timing


def teacher_forced(model, ids, mask, tokens):
    """The baseline's logits on `tokens`' prefixes: the forwards generate would make."""
    from transformers import DynamicCache

    from int8attn.serving.transformers_attention import cache_keyword

    key, cache = cache_keyword(model), DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = []
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    **{key: cache}, use_cache=True, logits_to_keep=1)
        logits.append(out.logits[:, -1])
        for step in range(tokens.shape[1] - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            out = model(input_ids=tokens[:, step:step + 1], attention_mask=mask,
                        position_ids=mask.sum(-1, keepdim=True) - 1, **{key: cache},
                        use_cache=True)
            logits.append(out.logits[:, -1])
    return torch.stack(logits, 1).float()


def compare(int8, base, forced, int8_tokens, base_tokens):
    log_p, log_q = forced.log_softmax(-1), int8.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)                 # [B, steps]
    diff = (int8 - forced).abs().amax(-1)                          # [B, steps]
    same = int8_tokens == base_tokens
    parted = [int(row.logical_not().nonzero()[0]) if not row.all() else None for row in same]
    prefix = min(p if p is not None else same.shape[1] for p in parted)
    return {
        "per_step": [{"step": s, "logits_max_abs": diff[:, s].max().item(),
                      "kl_mean": kl[:, s].mean().item(), "kl_max": kl[:, s].max().item()}
                     for s in range(int8.shape[1])],
        "logits_max_abs": diff.max().item(), "kl_max": kl.max().item(),
        "kl_mean": kl.mean().item(), "baseline_logits_max_abs": forced.abs().max().item(),
        "greedy_agreement": same.float().mean().item(),
        "greedy_agreement_per_sequence": same.float().mean(1).tolist(),
        "first_divergence_step": parted,
        "teacher_forced_argmax_agreement":
            (forced.argmax(-1) == int8_tokens).float().mean().item(),
        # the manual loop against the baseline's own generate, on the shared prefix
        "baseline_loop_vs_generate_max_abs":
            (forced[:, :prefix] - base[:, :prefix]).abs().max().item() if prefix else None,
    }


def prepare(args) -> int:
    from int8attn.serving import PagedAttention

    attn = PagedAttention(args.heads, args.kv_heads, args.head_dim, 16, target="cuda")
    try:
        folder = attn.save(args.prepare, query_tokens=(args.chunk,))
        kinds = "decode, cache_write"
    except Exception as error:          # no cuda cache_write lowering in this checkout
        print(f"no cuda cache_write package ({str(error).splitlines()[0]}); the cache "
              f"writes through torch_cache_write (the same quantize in torch ops)")
        folder = attn.save(args.prepare, query_tokens=(args.chunk,), write=False)
        kinds = "decode"
    print(f"saved the {kinds} and prefill_{args.chunk} cuda packages in {folder}")
    return 0


def main(argv=None) -> int:
    args = arguments(argv)
    if args.prepare:
        return prepare(args)
    # The packages and the GPU are checked before the model is built (or anything
    # compiled): either missing would end in a traceback later.
    packages = load_packages(args.packages, args.chunk) if args.packages else None
    if args.target == "cuda" and (missing := cuda_missing()) is not None:
        sys.exit(f"error: --target cuda runs on torch CUDA tensors, but {missing}; run it on "
                 f"a CUDA GPU (the packages can be compiled elsewhere with --prepare DIR)")
    from int8attn.serving.transformers_attention import (PagedInt8Cache, install,
                                                          paged_attention_for)

    device = torch.device("cuda" if args.target == "cuda" else "cpu")
    dtype = torch.bfloat16 if args.target == "cuda" else torch.float32
    model = build_model(args, device, dtype)
    ids, mask = prompts(args, device)
    attn = packages if packages is not None else paged_attention_for(model.config, target="cpu")
    blocks = sum(-(-(n + args.new_tokens) // 16) for n in args.prompts) + len(args.prompts)

    def paged_cache(validate):
        return PagedInt8Cache(model.config, attn, blocks, device=device, chunk=args.chunk,
                              validate=validate, seed=args.seed)

    install(model)
    start = time.perf_counter()
    # warm-up: every kernel once, with PagedAttention's value checks on every call
    generate(model, ids, mask, 2, paged_cache(validate=True))
    print(f"int8attn warm-up (compile/load every kernel): {time.perf_counter() - start:.1f} s")
    cache = paged_cache(args.validate)
    pool = [t.data_ptr() for layer in cache.layers for t in layer.pool]
    int8_tokens, int8_logits, int8_time = generate(model, ids, mask, args.new_tokens, cache)
    assert pool == [t.data_ptr() for layer in cache.layers for t in layer.pool]

    model.set_attn_implementation("sdpa")
    generate(model, ids, mask, 2)
    base_tokens, base_logits, base_time = generate(model, ids, mask, args.new_tokens)
    forced = teacher_forced(model, ids, mask, int8_tokens)
    report = {
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "model": {k: getattr(args, k) for k in GPU if k not in ("prompts", "chunk")},
        "dtype": str(dtype).removeprefix("torch."), "prompts": args.prompts,
        "chunk": args.chunk, "new_tokens": args.new_tokens, "seed": args.seed,
        "validate": args.validate or args.target == "cpu", "blocks": blocks,
        "cache_write": cache.writer,
        "device": device_name(device),
        "versions": versions(), "iree_compiler_imported": "iree.compiler" in sys.modules,
        "int8attn": int8_time, "baseline_sdpa": base_time,
        **compare(int8_logits, base_logits, forced, int8_tokens, base_tokens),
    }
    print(markdown(report))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1))
        out.with_suffix(".md").write_text(markdown(report))
        print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


def device_name(device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def versions() -> dict:
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__}


def markdown(r) -> str:
    m = r["model"]
    lines = [
        f"Llama ({m['layers']} layers, hidden {m['hidden']}, {m['heads']} query heads over "
        f"{m['kv_heads']} KV heads, head dim {m['head_dim']}, random weights, seed "
        f"{r['seed']}), {r['dtype']}, on {r['device']}; prompts {r['prompts']} (left-padded), "
        f"{r['new_tokens']} greedy steps; int8attn prefill chunk {r['chunk']}, cache write "
        f"{'kernel' if r['cache_write'] == 'kernel' else 'in torch ops (no write kernel)'}, "
        f"value checks {'on' if r['validate'] else 'off'}.",
        f"`{r['command']}` ({', '.join(f'{k} {v}' for k, v in r['versions'].items())})", "",
        "| | int8attn_paged | sdpa baseline |", "| --- | --- | --- |",
        *(f"| {label} | {r['int8attn'][key]:.{digits}f} | {r['baseline_sdpa'][key]:.{digits}f} |"
          for label, key, digits in (("generate, s", "seconds", 3),
                                     ("prefill (to first token), s", "prefill_seconds", 3),
                                     ("tokens/s (all)", "tokens_per_s", 1),
                                     ("decode tokens/s", "decode_tokens_per_s", 1))), "",
        f"Greedy-token agreement {r['greedy_agreement']:.3f} (first divergence step per "
        f"sequence: {r['first_divergence_step']}); the baseline teacher-forced on int8attn's "
        f"tokens picks the same token at {r['teacher_forced_argmax_agreement']:.3f} of steps.",
        f"Logits max abs difference {r['logits_max_abs']:.4g} (baseline logits max abs "
        f"{r['baseline_logits_max_abs']:.4g}); KL(baseline || int8attn) mean "
        f"{r['kl_mean']:.3g}, max {r['kl_max']:.3g}.", "",
        "| step | logits max abs | KL mean | KL max |", "| --- | --- | --- | --- |",
        *(f"| {s['step']} | {s['logits_max_abs']:.4g} | {s['kl_mean']:.3g} | {s['kl_max']:.3g} |"
          for s in r["per_step"]),
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
