"""A decode loop on the paged INT8 cache, end to end on the IREE CPU runtime.

    .venv/bin/python examples/paged_decode.py [--steps 8] [--seed 0]
    python examples/paged_decode.py --target cuda [--packages DIR]   # torch CUDA tensors

Compiles examples/paged_decode.mlir (@write = int8attn.cache_write, @attend =
int8attn.paged_attention) once, prefills four sequences of different lengths
into a pool of blocks handed out from a shuffled free list, then runs decode
steps: every sequence writes its new token (one @write call for the batch,
in place in the cache arrays), grows by one, and attends (one @attend call).
Each step is checked against the exact reference of every sequence (float
attention on the dequantized cache) and the fragment-level reference (the
numerics contract, 5e-5 plus the rounding-tie slack); the script prints the
max abs error per step and exits 1 if a check fails.

`--target cuda` runs the same loop on torch CUDA tensors through
`int8attn.serving.PagedAttention` (the kernels launched on torch's stream, the
pool written and read in place on the GPU; each step's check copies the pool to
the host, which the serving path itself never does). `--packages DIR` loads
kernels `PagedAttention.save` wrote (a GPU machine without the IREE compiler).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import int8attn
from int8attn.driver.paged_decode import PagedCache, PagedDecoder
from int8attn.reference import (exact_paged_attention, fragment_paged_attention,
                                paged_cache_write, rounding_tie_slack, sequence_cache)

GRAPH = Path(__file__).with_name("paged_decode.mlir")
PROMPTS = [37, 250, 1, 600]          # across block (16) and partition (256) edges
HQ, HKV, D, BS, SCALE = 32, 8, 128, 16, 0.0883883
FRAGMENT_TOL = 5e-5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=512, help="blocks in the pool")
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--packages", type=Path, help="cuda: kernels PagedAttention.save wrote")
    parser.add_argument("--prepare", type=Path,
                        help="cuda: compile the decode and write packages into DIR, exit")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.target == "cuda":
        return run_cuda(args, rng)
    if args.packages is not None or args.prepare is not None:
        parser.error("--packages and --prepare are for cuda kernels: add --target cuda")

    start = time.perf_counter()
    graph = int8attn.compile(GRAPH.read_text(), filename=str(GRAPH))
    how = "loaded the cached module" if graph.cache_hit else "compiled"
    print(f"{how} (@write and @attend) once, in {time.perf_counter() - start:.1f} s")
    cache = PagedCache(args.blocks, HKV, BS, D, seed=args.seed)
    decoder = PagedDecoder(graph, cache)
    numerics = graph.options.numerics               # the module's, for the references

    sequences = []
    for length in PROMPTS:
        k, v = (rng.standard_normal((length, HKV, D)).astype(np.float32) for _ in range(2))
        before = [a.copy() for a in cache.arrays]
        sequence = decoder.prefill(k, v)
        expected = paged_cache_write(k, v, cache.slots(sequence, np.arange(length)), *before)
        exact_write = all(np.array_equal(a, e, equal_nan=True)
                          for a, e in zip(cache.arrays, expected))
        sequences.append(sequence)
        print(f"prefill sequence {sequence}: {length} tokens in blocks "
              f"{cache.tables[sequence][:4]}{'...' if len(cache.tables[sequence]) > 4 else ''}"
              f", cache == numpy quantization: {exact_write}")
        if not exact_write:
            return 1

    failed = False
    for step in range(args.steps):
        q, k_new, v_new = step_inputs(rng, len(sequences))
        start = time.perf_counter()
        out = decoder.step(q, k_new, v_new, sequences)
        seconds = time.perf_counter() - start
        tables, lens = decoder.last_batch
        failed |= not check_step(step, out, q, cache.arrays, tables, lens, numerics, seconds)
    return 1 if failed else 0


def step_inputs(rng, batch: int):
    """A decode step's Gaussian q [B, Hq, D] and new k, v rows [B, Hkv, D]."""
    return (rng.standard_normal((batch, HQ, D)).astype(np.float32),
            *(rng.standard_normal((batch, HKV, D)).astype(np.float32) for _ in range(2)))


def check_step(step, out, q, arrays, tables, lens, numerics, seconds) -> bool:
    """One step's outputs against both references; prints the line, returns ok."""
    operands = (q, *arrays, tables, lens)
    exact_err = np.abs(out - exact_paged_attention(*operands, SCALE)).max(axis=(1, 2))
    fragment = fragment_paged_attention(*operands, SCALE, numerics=numerics)
    frag_err = np.abs(out.astype(np.float64) - fragment).max(axis=(1, 2))
    ties = [rounding_tie_slack(q[b:b + 1], *sequence_cache(*arrays, tables, lens, b),
                               SCALE, numerics=numerics).max() for b in range(len(lens))]
    ok = all(e <= FRAGMENT_TOL + t for e, t in zip(frag_err, ties))
    print(f"step {step}: lengths {lens.tolist()}, write+attend {seconds * 1e3:.1f} ms, "
          f"max abs vs exact {exact_err.max():.3e}, vs fragment {frag_err.max():.3e} "
          f"{'ok' if ok else 'FAILED'}")
    return ok


def cuda_missing() -> str | None:
    """Why torch cannot put tensors on a CUDA GPU here (None: it can)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install 'int8attn[torch]')"
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is built without CUDA"
    if not torch.cuda.is_available():
        return "torch finds no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def load_packages(folder: Path):
    """PagedAttention.load(folder), or exit with one line saying why not."""
    from int8attn.runtime.module import InputError
    from int8attn.serving import PagedAttention
    from int8attn.serving.kernel_package import PackageError

    try:
        return PagedAttention.load(folder)
    except (InputError, PackageError, KeyError, TypeError) as error:
        # KeyError / TypeError: a paged_attention.json missing a field or of another shape
        sys.exit(f"error: {error}; write the packages with --target cuda --prepare DIR")


def run_cuda(args, rng) -> int:
    """The loop on torch CUDA tensors (module docstring)."""
    if args.prepare is not None:   # compiles only: no GPU needed
        from int8attn.serving import PagedAttention

        PagedAttention(HQ, HKV, D, BS, softmax_scale=SCALE, target="cuda").save(args.prepare)
        print(f"saved the decode and write packages in {args.prepare}")
        return 0
    # Both checks before compiling (minutes) or touching the GPU, which would end in a
    # traceback.
    attn = load_packages(args.packages) if args.packages else None
    missing = cuda_missing()
    if missing is not None:
        sys.exit(f"error: --target cuda runs on torch CUDA tensors, but {missing}; run it on "
                 f"a CUDA GPU (the packages can be compiled elsewhere with --prepare DIR)")
    import torch

    from int8attn.serving import PagedAttention

    if attn is None:
        attn = PagedAttention(HQ, HKV, D, BS, softmax_scale=SCALE, target="cuda")
    numerics = attn.numerics                        # its kernels' (as saved, if loaded)
    cache = PagedCache(args.blocks, HKV, BS, D, seed=args.seed)   # the bookkeeping
    pool = [torch.from_numpy(a).cuda() for a in cache.arrays]      # garbage, on the GPU
    host = lambda: [t.cpu().numpy() for t in pool]
    sequences = []
    for length in PROMPTS:
        k, v = (rng.standard_normal((length, HKV, D)).astype(np.float32) for _ in range(2))
        sequence = cache.add_sequence()
        slots = cache.append(sequence, length)
        attn.write(*(torch.from_numpy(a).cuda() for a in (k, v, slots)), *pool)
        sequences.append(sequence)
    failed = False
    for step in range(args.steps):
        q, k_new, v_new = step_inputs(rng, len(sequences))
        start = time.perf_counter()
        slots = np.concatenate([cache.append(s, 1) for s in sequences])
        attn.write(*(torch.from_numpy(a).cuda() for a in (k_new, v_new, slots)), *pool)
        tables, lens = cache.batch(sequences)
        out = attn(torch.from_numpy(q).cuda(), *pool, torch.from_numpy(tables).cuda(),
                   torch.from_numpy(lens).cuda()).cpu().numpy()
        seconds = time.perf_counter() - start
        failed |= not check_step(step, out, q, host(), tables, lens, numerics, seconds)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
