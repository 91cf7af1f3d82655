"""Train the byte-level Llama on the standard library's training split (minutes on one GPU).

    python examples/byte_model/corpus.py out/stdlib-corpus.tar.gz     # pack here (optional)
    python examples/byte_model/train.py --corpus out/stdlib-corpus.tar.gz --out DIR

Deterministic for a given seed, corpus, GPU and torch build (seeded sampling, deterministic
algorithms where torch has them; the seed is printed). Writes DIR/model.safetensors (bf16),
DIR/config.json and DIR/training.json (the loss curve in bits per byte, the corpus digest).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import corpus as corpus_module  # noqa: E402
import model as model_module    # noqa: E402

LN2 = math.log(2)


def arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", metavar="ARCHIVE",
                        help="a packed corpus (corpus.py); default: this Python's stdlib")
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=500)
    parser.add_argument("--held-out-windows", type=int, default=None,
                        help="evaluate on the first N held-out windows (default: all)")
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "warmup", "eval_every"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> int:
    args = arguments(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    from transformers import LlamaForCausalLM

    if not torch.cuda.is_available():
        print("warning: no CUDA GPU; training on the CPU takes hours", file=sys.stderr)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"training seed {args.seed} (torch.manual_seed, sampling generator)")
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    text = corpus_module.load(args.corpus)
    train = torch.from_numpy(text.tokens(held_out=False))
    held = torch.from_numpy(text.tokens(held_out=True))
    print(f"corpus: {text.origin}, {len(train):,} training and {len(held):,} held-out tokens")

    model = LlamaForCausalLM(model_module.config()).to(device)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=device.type == "cuda")

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    n = model_module.CONTEXT
    sampler = torch.Generator().manual_seed(args.seed + 1)
    windows = (len(held) - 1) // n
    if args.held_out_windows is not None:
        windows = min(windows, args.held_out_windows)
    held_windows = held[: windows * n + 1]

    def held_out_bits():
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16):
            for first in range(0, windows, 16):
                rows = [held_windows[w * n:w * n + n + 1] for w in range(first, min(first + 16,
                        windows))]
                batch = torch.stack(rows).to(device)
                logits = model(input_ids=batch[:, :-1]).logits.float()
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1),
                                                         batch[:, 1:].flatten(), reduction="sum")
                total, count = total + loss.item(), count + batch[:, 1:].numel()
        model.train()
        return total / count / LN2

    curve, start_time = [], time.perf_counter()
    model.train()
    for step in range(args.steps):
        starts = torch.randint(0, len(train) - n - 1, (args.batch,), generator=sampler)
        batch = torch.stack([train[s:s + n + 1] for s in starts.tolist()]).to(device)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast(device.type, torch.bfloat16):
            logits = model(input_ids=batch[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            point = {"step": step + 1, "train_bits_per_byte": loss.item() / LN2,
                     "held_out_bits_per_byte": held_out_bits(),
                     "seconds": time.perf_counter() - start_time}
            curve.append(point)
            print(f"step {point['step']:6d}  train {point['train_bits_per_byte']:.4f}  "
                  f"held-out {point['held_out_bits_per_byte']:.4f} bits/byte  "
                  f"({point['seconds']:.0f} s)", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    (out / "training.json").write_text(json.dumps({
        "command": " ".join(["python"] + sys.argv), "seed": args.seed, "steps": args.steps,
        "batch": args.batch, "context": n, "lr": args.lr, "warmup": args.warmup,
        "parameters": params, "corpus": text.origin, "corpus_sha256": text.digest(),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__, "curve": curve}, indent=1))
    print(f"wrote {out}/model.safetensors ({(out / 'model.safetensors').stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
