"""`int8attn bench --target cuda` (--mode decode): dense decode kernels on an NVIDIA GPU
through IREE.

Two phases, which may run on different machines (IREE's compiler is not on
the GPU machine here): `prepare` compiles the kernel modules (sm_80 PTX, which
the driver JITs on Hopper); `run` loads them with IREE's CUDA runtime, checks
each output against the fragment-level reference, and times, for each context:
the INT8-PV module (V token-innermost, the kernel's layout), the same with the
per-call V transpose (the graph's token-major V), torch SDPA on a bf16 KV cache,
and a device-to-device copy as the bandwidth ceiling.

The cases, timer and results writer are the bench harness's (`bench_harness`); this
module holds the decode kind's part: its cases, inputs, one case's run and its check.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bench_harness import (
                            BenchKind, BenchSettings, Check, Column, IreeDevice, Timer, map_forked, markdown_table,
                            measure, nan_or, report, run_cases, run_main)
from .contract.numerics import DIGIT_NUMERICS

# (name, PV precision, V token-innermost)
VARIANTS = {"int8": ("int8", True), "bf16": ("bf16", True), "int8_transpose_v": ("int8", False)}
# The numerics `prepare` compiles the modules with and `run` checks them against: the
# kernel targets' default, whose timings benchmarks/results/CURRENT.md reports.
NUMERICS = DIGIT_NUMERICS

MANIFEST = "manifest.json"   # what `prepare` wrote: the shapes, for `run`


@dataclass(frozen=True)
class DecodeCase:
    """One context: a module per variant, each checked against the fragment reference
    of its PV precision and timed; torch SDPA and the copy ceiling beside them."""
    context: int
    batch: int
    q_heads: int
    kv_heads: int
    head_dim: int
    variants: tuple[str, ...] = tuple(VARIANTS)

    @property
    def name(self) -> str:
        return f"S={self.context}"

    def shape(self) -> tuple[int, int, int, int, int]:
        return self.batch, self.q_heads, self.kv_heads, self.context, self.head_dim


def cases(meta: dict) -> list[DecodeCase]:
    """One case per context of the manifest `meta`."""
    return [DecodeCase(int(tokens), meta["batch"], meta["q_heads"], meta["kv_heads"],
                       meta["head_dim"]) for tokens in meta["contexts"]]


def _name(variant: str, tokens: int) -> str:
    return f"{variant}_{tokens}.vmfb"


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote for the manifest `meta`."""
    return [_name(variant, int(tokens)) for tokens in meta["contexts"] for variant in VARIANTS]


def prepare(directory: Path, contexts, batch: int, q_heads: int, kv_heads: int,
            head_dim: int) -> None:
    from .driver.compile import compile
    from .driver.graph import decode_graph
    from .driver.options import CompileOptions

    directory.mkdir(parents=True, exist_ok=True)
    for tokens in contexts:
        source = decode_graph(batch, q_heads, kv_heads, tokens, head_dim)
        for variant, (pv, innermost) in VARIANTS.items():
            options = CompileOptions(target="cuda", pv=pv, v_token_innermost=innermost,
                                     **dataclasses.asdict(NUMERICS))
            compiled = compile(source, options, filename=f"decode_{tokens}.mlir", until="ptx")
            vmfb, ptx = compiled.artifacts["vmfb"], compiled.artifacts["ptx"]
            (directory / _name(variant, tokens)).write_bytes(vmfb)
            print(f"prepared {variant} S={tokens}: {len(vmfb)} bytes, "
                  f"{ptx.count('mma.sync.aligned.m16n8k32')} int8 and "
                  f"{ptx.count('mma.sync.aligned.m16n8k16')} bf16 mma.sync in the PTX", flush=True)
    (directory / MANIFEST).write_text(json.dumps(dict(
        contexts=list(contexts), batch=batch, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim)))


def _per_sequence(reference, q, k, k_scale, v, v_scale, *args, **kwargs) -> np.ndarray:
    """`reference` of a batch, one sequence per worker process."""
    def one(b):
        return reference(q[b:b + 1], k[b:b + 1], k_scale[b:b + 1], v[b:b + 1],
                         v_scale[b:b + 1], *args, **kwargs)
    return np.concatenate(map_forked(one, range(q.shape[0])))


def inputs(seed, batch, q_heads, kv_heads, tokens, head_dim):
    from .reference import quantize_cache

    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, q_heads, head_dim), dtype=np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim), dtype=np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((batch, kv_heads, tokens, head_dim), dtype=np.float32))
    return q, k, k_scale, v, v_scale


def references(arrays, scale) -> tuple[dict, dict]:
    """(the fragment reference and its rounding-tie slack, per PV precision: a W next
    to a level's or a bf16 midpoint may round either way, as tests/accuracy.py allows)."""
    from .reference import fragment_attention, rounding_tie_slack

    contract = dict(model="cuda", numerics=NUMERICS)
    pvs = ("int8", "bf16")
    expected = {pv: _per_sequence(fragment_attention, *arrays, scale, pv=pv, **contract)
                for pv in pvs}
    slack = {pv: _per_sequence(rounding_tie_slack, *arrays, scale, pv=pv, **contract)
             for pv in pvs}
    return expected, slack


def check(out, expected: dict, slack: dict, variant: str) -> Check:
    """The checker hook: the variant's output against the fragment reference of its PV
    precision (within 5e-5 + tie slack); BF16 PV also against INT8 PV's reference."""
    pv = VARIANTS[variant][0]
    err = np.abs(out - expected[pv])
    fields = {}
    if variant == "bf16":
        diff = out - expected["int8"]
        fields = dict(int8_vs_bf16_max_abs=float(np.abs(diff).max()),
                      int8_vs_bf16_rms=float(np.sqrt(np.mean(diff.astype(np.float64) ** 2))))
    return Check(float(err.max()), bool((err <= 5e-5 + slack[pv]).all()), fields)


def torch_times(arrays, timer: Timer):
    """(SDPA on a bf16 KV cache, device copy ceiling in bytes/s) with CUDA events."""
    try:
        import torch
    except ImportError:
        return None, None
    q, k, k_scale, v, v_scale = arrays
    dev = torch.device("cuda")
    kf = torch.from_numpy(k).to(dev).to(torch.bfloat16) * torch.from_numpy(k_scale).to(dev)[..., None].to(torch.bfloat16)
    vf = torch.from_numpy(v).to(dev).to(torch.bfloat16) * torch.from_numpy(v_scale).to(dev)[..., None].to(torch.bfloat16)
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)[:, :, None, :]
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kf, vf, enable_gqa=True)
    return timer.events(sdpa), timer.copy_ceiling()


def run_case(case: DecodeCase, directory: Path, device, timer: Timer, seed: int) -> list[dict]:
    arrays = q, k, k_scale, v, v_scale = inputs(seed + case.context, *case.shape())
    expected, slack = references(arrays, float(np.float32(case.head_dim ** -0.5)))
    row = dict(context=case.context, batch=case.batch, q_heads=case.q_heads,
               kv_heads=case.kv_heads, head_dim=case.head_dim)
    for variant in case.variants:
        innermost = VARIANTS[variant][1]
        fn = device.load(directory / _name(variant, case.context), "decode")
        v_arg = np.ascontiguousarray(v.transpose(0, 1, 3, 2)) if innermost else v
        measure(row, variant, fn, device.put((q, k, k_scale, v_arg, v_scale)),
                lambda out: check(out, expected, slack, variant), timer, record="timing")
    row["int8_bytes"] = 2 * k.nbytes + 2 * k_scale.nbytes + q.nbytes + expected["int8"].nbytes
    row["torch_sdpa_bf16_s"], row["copy_ceiling_bytes_per_s"] = torch_times(arrays, timer)
    return [row]


def run(directory: Path, warmup: int = 5, iterations: int = 50, seed: int = 0, *,
        device=None, timer: Timer | None = None) -> list[dict]:
    """A row per context of the folder `prepare` wrote (`device`: IREE's CUDA
    runtime unless given; `timer`: Timer(warmup, iterations) unless given)."""
    meta = json.loads((directory / MANIFEST).read_text())
    device = device or IreeDevice()
    timer = timer or Timer(warmup, iterations)
    return run_cases(cases(meta), lambda case: run_case(case, directory, device, timer, seed))


def _us(value) -> str:
    return f"{value * 1e6:.1f}"


COLUMNS = (
    Column("context", lambda r: f"{r['context']}"),
    Column("batch", lambda r: f"{r['batch']}"),
    Column("INT8 PV (us)", lambda r: _us(r["int8_s"])),
    Column("BF16 PV (us)", lambda r: _us(r["bf16_s"])),
    Column("INT8/BF16 speedup", lambda r: f"{r['bf16_s'] / r['int8_s']:.2f}x"),
    Column("+ V transpose (us)", lambda r: _us(r["int8_transpose_v_s"])),
    Column("torch SDPA bf16 KV (us)", lambda r: _us(nan_or(r["torch_sdpa_bf16_s"]))),
    Column("vs SDPA", lambda r: f"{nan_or(r['torch_sdpa_bf16_s']) / r['int8_s']:.2f}x"),
    Column("achieved GB/s", lambda r: f"{_gbps(r):.0f}"),
    Column("copy ceiling GB/s", lambda r: f"{_ceiling(r):.0f}"),
    Column("of ceiling", lambda r: f"{_gbps(r) / _ceiling(r):.0%}"),
    Column("max abs vs fragment", lambda r: f"{r['int8_max_abs_vs_fragment']:.1e}"),
    Column("INT8 vs BF16 max abs / RMS",
           lambda r: f"{r['int8_vs_bf16_max_abs']:.6f} / {r['int8_vs_bf16_rms']:.6f}"),
)


def _gbps(r) -> float:
    return r["int8_bytes"] / r["int8_s"] / 1e9


def _ceiling(r) -> float:
    return nan_or(r["copy_ceiling_bytes_per_s"]) / 1e9


def markdown(rows: list[dict]) -> str:
    lines = ["Times are the device time of all kernels of one module call (CUPTI through "
             "torch.profiler): the partition and merge kernels (the query rows are quantized "
             "inside the partition kernel), plus the V transpose in that column; not the copy "
             "of the result to the host. The wall time per synchronized IREE call is in the "
             "JSON.", ""]
    return "\n".join(lines + markdown_table(COLUMNS, rows))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = [r["context"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(contexts, [r["int8_s"] * 1e6 for r in rows], "o-", label="INT8 PV kernel (IREE)")
    ax.plot(contexts, [r["bf16_s"] * 1e6 for r in rows], "d-", label="BF16 PV kernel (IREE)")
    ax.plot(contexts, [r["int8_transpose_v_s"] * 1e6 for r in rows], "s--",
            label="INT8 PV + per-call V transpose")
    if all(r["torch_sdpa_bf16_s"] for r in rows):
        ax.plot(contexts, [r["torch_sdpa_bf16_s"] * 1e6 for r in rows], "^-",
                label="torch SDPA, bf16 KV")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("time per decode step (us)")
    ax.set_title(f"decode, B={rows[0]['batch']}, Hq={rows[0]['q_heads']}, "
                 f"Hkv={rows[0]['kv_heads']}, D={rows[0]['head_dim']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _prepare(directory: Path, settings: BenchSettings) -> None:
    prepare(directory, list(settings.contexts), KIND.batch(settings), settings.q_heads,
            settings.kv_heads, settings.head_dim)


def _run(directory: Path, settings: BenchSettings) -> list[dict]:
    return run(directory, iterations=settings.iterations, seed=settings.seed)


KIND = BenchKind("decode", MANIFEST, module_files, _prepare, _run, markdown, plot=plot,
                 prepared_flags=(("--context", "contexts"), ("--batch", "batch"), ("--q-heads", "q_heads"),
                 ("--kv-heads", "kv_heads"), ("--head-dim", "head_dim")))


def main(argv=None) -> int:
    from . import arg_types

    parser = arg_types.FlagParser(prog="python -m int8attn.bench_cuda")
    parser.add_argument("--prepare", type=Path, help="compile the modules into this folder")
    parser.add_argument("--run", type=Path, help="run the modules of this folder on the GPU")
    parser.add_argument("--contexts", default="4096,8192,16384")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.prepare, [int(c) for c in args.contexts.split(",")], args.batch,
                args.q_heads, args.kv_heads, args.head_dim)
    if args.run:
        report(run(args.run, iterations=args.iterations), markdown, args.json)
    return 0


if __name__ == "__main__":
    run_main(main)
