"""`int8attn bench --target cuda --mode paged`: the paged decode kernels on a GPU.

One compiled module per PV precision serves every case (B, pool size, table
width and lengths are run-time values). Cases (`bench_paged_cases`): uniform
batches at each context, a ragged batch whose lengths are drawn uniformly from
[1, 2·mean − 1] (the stated distribution; mean 8K by default), and one sequence
at the longest context (latency), all on Gaussian data; then a batch shaped like
a real K cache. For each: device time of all kernels of a call
(CUPTI), the bytes the call must read (each sequence's own K, V and scales,
its table slots, q) and their fraction of the copy ceiling, torch SDPA on the
same data as a padded bf16 batch (masked past each length), and every
sequence checked against the fragment-level reference (the contract, tight)
and its max abs error against exact attention on the dequantized cache.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from .bench_harness import (BenchKind, BenchSettings, Check, Column, IreeDevice, Timer,
                            map_forked, markdown_table, measure, nan_or, report, run_cases,
                            run_main)
from .bench_numerics import bench_numerics, manifest_numerics
from .bench_paged_cases import PV, PagedCase, batch_arrays, bytes_read, cases
from .contract.numerics import ONE_TERM_NUMERICS, Numerics

BLOCK_SIZE = 16
RAGGED_MEAN = 8192        # the ragged batch's mean length, unless --ragged-mean
MANIFEST = "paged.json"   # what `prepare` wrote: the shapes and numerics, for `run`


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote (one per PV precision, whatever the manifest)."""
    return [f"paged_{pv}.vmfb" for pv in PV]


def prepare(directory: Path, q_heads: int, kv_heads: int, head_dim: int,
            block_size: int = BLOCK_SIZE, *, numerics: Numerics | None = None,
            partition_tokens: int | None = None) -> None:
    """Compile the paged modules for cuda with `numerics` (default: the kernel target's)
    and `partition_tokens` (a model of other partitions: benchmarks/paged_schedules.py)."""
    from .driver.compile import compile
    from .driver.options import CompileOptions
    from .driver.paged_decode import paged_attention_graph

    directory.mkdir(parents=True, exist_ok=True)
    source = paged_attention_graph(q_heads, kv_heads, head_dim, block_size,
                                   softmax_scale=float(np.float32(head_dim ** -0.5)))
    given = {} if numerics is None else dataclasses.asdict(numerics)
    given.update({} if partition_tokens is None else {"partition_tokens": partition_tokens})
    for pv in PV:
        options = CompileOptions(target="cuda", pv=pv, **given)
        resolved = dataclasses.asdict(options.numerics)
        compiled = compile(source, options, filename="paged.mlir", until="ptx")
        (directory / f"paged_{pv}.vmfb").write_bytes(compiled.artifacts["vmfb"])
        (directory / f"paged_{pv}.ptx").write_text(compiled.artifacts["ptx"])
        print(f"prepared paged {pv}: one module for every batch", flush=True)
    (directory / MANIFEST).write_text(json.dumps(dict(
        q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
        **resolved)))


def check(out, arrays, scale, pv, numerics: Numerics = ONE_TERM_NUMERICS) -> Check:
    """The checker hook: (max abs error, all within 5e-5 + tie slack) of every sequence
    against the fragment-level reference of `numerics`, the modules' (one sequence per
    worker process), and `{pv}_max_abs_vs_exact`: against exact attention."""
    from .reference import (exact_attention, fragment_attention, rounding_tie_slack,
                            sequence_cache)

    q, k, ks, v, vs, tables, lengths = arrays
    contract = dict(model="cuda", pv=pv, numerics=numerics)

    def one(b):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lengths, b))
        expected = fragment_attention(*dense, scale, **contract)
        slack = rounding_tie_slack(*dense, scale, **contract)    # (bf16 too: its ties)
        err = np.abs(out[b:b + 1] - expected)
        exact = float(np.abs(out[b:b + 1] - exact_attention(*dense, scale)).max())
        return float(err.max()), bool((err <= 5e-5 + slack).all()), exact

    results = map_forked(one, range(q.shape[0]))
    return Check(max(r[0] for r in results), all(r[1] for r in results),
                 {f"{pv}_max_abs_vs_exact": max(r[2] for r in results)})


def sdpa_seconds(arrays, timer: Timer):
    """torch SDPA on the same data, padded to the longest sequence, bf16, masked."""
    try:
        import torch
    except ImportError:
        return None
    from .reference import sequence_cache

    q, k, ks, v, vs, tables, lengths = arrays
    longest = int(lengths.max())
    batch, kv_heads, head_dim = q.shape[0], k.shape[1], k.shape[3]
    dev = torch.device("cuda")
    kf = torch.zeros(batch, kv_heads, longest, head_dim, dtype=torch.bfloat16, device=dev)
    vf = torch.zeros_like(kf)
    for b in range(batch):
        kd, ksd, vd, vsd = sequence_cache(k, ks, v, vs, tables, lengths, b)
        n = int(lengths[b])
        kf[b, :, :n] = (torch.from_numpy(kd[0]).to(dev).float() *
                        torch.from_numpy(ksd[0]).to(dev)[..., None]).to(torch.bfloat16)
        vf[b, :, :n] = (torch.from_numpy(vd[0]).to(dev).float() *
                        torch.from_numpy(vsd[0]).to(dev)[..., None]).to(torch.bfloat16)
    mask = (torch.arange(longest, device=dev)[None, :] <
            torch.from_numpy(lengths).to(dev)[:, None].long())[:, None, None, :]
    qt = torch.from_numpy(q).to(dev).to(torch.bfloat16)[:, :, None, :]
    scale = head_dim ** -0.5
    return timer.events(lambda: torch.nn.functional.scaled_dot_product_attention(
        qt, kf, vf, attn_mask=mask, scale=scale, enable_gqa=True))


def run_case(case: PagedCase, rng, metas: dict, functions: dict, device, timer: Timer,
             ceiling, seed: int) -> list[dict]:
    """A row per prepared folder (`metas`: folder -> its manifest; `functions`: folder ->
    PV -> module function), on the same arrays, drawn from `rng` (shared by the cases, in
    order); each folder's output checked against the reference of its own numerics."""
    directories = list(metas)
    shape = metas[directories[0]]
    # a folder's name, or its path as given where two folders share a name
    names = [d.name for d in directories]
    labels = {d: d.name if names.count(d.name) == 1 else str(d) for d in directories}
    arrays = batch_arrays(rng, list(case.lengths), shape["q_heads"], shape["kv_heads"],
                          shape["head_dim"], shape["block_size"], case.data)
    device_args = device.put(arrays)
    scale = float(np.float32(shape["head_dim"] ** -0.5))
    sdpa = sdpa_seconds(arrays, timer)
    rows = []
    for d in directories:
        numerics = manifest_numerics(metas[d])
        row = dict(case=case.name, batch=len(case.lengths),
                   mean_length=float(np.mean(case.lengths)), max_length=int(max(case.lengths)),
                   bytes_read=bytes_read(arrays), copy_ceiling_bytes_per_s=ceiling, seed=seed,
                   **metas[d])
        if len(directories) > 1:
            row["modules"] = labels[d]
        for pv in case.variants:
            measure(row, pv, functions[d][pv], device_args,
                    lambda out: check(out, arrays, scale, pv, numerics), timer,
                    record="kernels")
        row["torch_sdpa_bf16_padded_s"] = sdpa
        rows.append(row)
    return rows


SHAPE_FIELDS = ("q_heads", "kv_heads", "head_dim", "block_size")


def folder_manifests(directories: list[Path]) -> dict:
    """Each folder's manifest; ValueError where two differ in a shape (folders timed on
    the same data must be prepared for the same shapes; their numerics may differ, each
    folder's outputs checked against its own)."""
    seen = {}
    for d in directories:
        if (same := seen.setdefault(d.resolve(), d)) is not d:
            raise ValueError(f"folders '{same}' and '{d}' are one folder; give each once")
    metas = {d: json.loads((d / MANIFEST).read_text()) for d in directories}
    first = directories[0]
    for d, meta in metas.items():
        if unlike := [f for f in SHAPE_FIELDS if meta.get(f) != metas[first].get(f)]:
            raise ValueError(
                f"folders '{first}' and '{d}' hold modules of different shapes ({MANIFEST}: "
                + ", ".join(f"{f} {metas[first].get(f)!r} against {meta.get(f)!r}"
                            for f in unlike)
                + "); folders timed on the same data must be prepared for the same shapes")
    return metas


def run(directory, batch: int, contexts, mean: int, seed: int = 0, warmup: int = 5,
        iterations: int = 50, pvs=PV, *, device=None, timer: Timer | None = None) -> list[dict]:
    """One row per case; `directory` may be a list of prepared folders (schedule or
    numerics variants of the same shapes), run on the same data one after the other, a
    row per (folder, case) naming its folder. `pvs` selects the modules to run
    (both by default; one for a quicker look at a variant). `device`: IREE's CUDA
    runtime unless given; `timer`: Timer(warmup, iterations) unless given."""
    directories = [Path(d) for d in directory] if isinstance(directory, (list, tuple)) \
        else [Path(directory)]
    metas = folder_manifests(directories)
    device = device or IreeDevice()
    timer = timer or Timer(warmup, iterations)
    functions = {d: {pv: device.load(d / f"paged_{pv}.vmfb", "paged") for pv in pvs}
                 for d in directories}
    ceiling = timer.copy_ceiling()
    rng = np.random.default_rng(seed)
    return run_cases(cases(batch, contexts, mean, seed, pvs), lambda case: run_case(
        case, rng, metas, functions, device, timer, ceiling, seed))


def _case(r) -> str:
    return f"{r['modules']}: {r['case']}" if "modules" in r else r["case"]


def _us(r, pv) -> str:
    return f"{r[f'{pv}_s'] * 1e6:.1f}" if f"{pv}_s" in r else "-"


def _err(r, pv) -> str:
    return f"{r[f'{pv}_max_abs_vs_fragment']:.1e}" if f"{pv}_s" in r else "-"


def _exact(r, pv) -> str:
    key = f"{pv}_max_abs_vs_exact"
    return f"{r[key]:.1e}" if key in r else "-"


def _gbps(r) -> float:
    return r["bytes_read"] / r["int8_s"] / 1e9


def _checked(r) -> str:
    ok = all(r[f"{pv}_within_tolerance"] for pv in PV if f"{pv}_s" in r)
    return "yes" if ok else "NO"


COLUMNS = (
    Column("case", _case, "---"),
    Column("B", lambda r: f"{r['batch']}"),
    Column("INT8 PV (us)", lambda r: _us(r, "int8")),
    Column("BF16 PV (us)", lambda r: _us(r, "bf16")),
    Column("INT8/BF16", lambda r: f"{r['bf16_s'] / r['int8_s']:.2f}x" if "bf16_s" in r else "-"),
    Column("torch SDPA bf16 padded (us)",
           lambda r: f"{nan_or(r['torch_sdpa_bf16_padded_s']) * 1e6:.1f}"),
    Column("vs SDPA", lambda r: f"{nan_or(r['torch_sdpa_bf16_padded_s']) / r['int8_s']:.2f}x"),
    Column("GB/s read", lambda r: f"{_gbps(r):.0f}"),
    Column("of ceiling", lambda r: f"{_gbps(r) * 1e9 / r['copy_ceiling_bytes_per_s']:.0%}"),
    Column("max abs vs fragment (INT8 / BF16)", lambda r: f"{_err(r, 'int8')} / {_err(r, 'bf16')}"),
    Column("max abs vs exact (INT8 / BF16)",
           lambda r: f"{_exact(r, 'int8')} / {_exact(r, 'bf16')}"),
    Column("checked", _checked, ":-:"),
)


def markdown(rows: list[dict]) -> str:
    """The results table, then the INT8 module's time per kernel (a module that
    was not run shows as -)."""
    lines = markdown_table(COLUMNS, rows)
    kernels = sorted({k for r in rows for k in r.get("int8_kernels_s", {})})
    if kernels:
        per_kernel = [Column("case", _case, "---")] + [
            Column(f"{k} (us)", lambda r, k=k: f"{r['int8_kernels_s'][k] * 1e6:.1f}"
                   if k in r.get("int8_kernels_s", {}) else "-") for k in kernels]
        lines += [""] + markdown_table(per_kernel, rows)
    return "\n".join(lines)


def _prepare(directory: Path, settings: BenchSettings) -> None:
    prepare(directory, settings.q_heads, settings.kv_heads, settings.head_dim,
            numerics=bench_numerics(settings.numerics, "digits"))


def _run(directory: Path, settings: BenchSettings) -> list[dict]:
    mean = RAGGED_MEAN if settings.ragged_mean is None else settings.ragged_mean
    return run(directory, KIND.batch(settings), list(settings.contexts), mean,
               seed=settings.seed, iterations=settings.iterations)


KIND = BenchKind("paged", MANIFEST, module_files, _prepare, _run, markdown,
                 flags=(("--ragged-mean", "ragged_mean"), ("--numerics", "numerics")),
                 # the batch, lengths and tables are drawn at run time
                 prepared_flags=(("--q-heads", "q_heads"), ("--kv-heads", "kv_heads"),
                                 ("--head-dim", "head_dim"), ("--numerics", "numerics")),
                 manifest_counts=SHAPE_FIELDS)


def main(argv=None) -> int:
    """Run modules prepared by `int8attn bench --mode paged --prepare-only DIR` (on a GPU
    machine without IREE's compiler)."""
    from . import arg_types
    from .bench_kinds import check_prepared
    from .cli_errors import UserError

    parser = arg_types.FlagParser(prog="python -m int8attn.bench_paged")
    parser.add_argument("--run", required=True, metavar="DIR[,DIR...]",
                        help="a prepared folder, or several (comma-separated) of the same "
                             "shapes on the same data (schedules or numerics to compare)")
    parser.add_argument("--contexts", type=arg_types.token_counts, default=(4096, 8192, 16384),
                        help="comma-separated lengths of the uniform batches and the B = 1 "
                             "case (default 4096,8192,16384)")
    parser.add_argument("--batch", type=arg_types.positive, default=16,
                        help="sequences of the uniform and ragged batches (default 16)")
    parser.add_argument("--ragged-mean", type=arg_types.positive, default=8192, metavar="TOKENS",
                        help="mean length of the ragged batch (default 8192)")
    parser.add_argument("--seed", type=arg_types.seed, default=0,
                        help="seed of the data, lengths and block tables (default 0)")
    parser.add_argument("--iterations", type=arg_types.positive, default=50,
                        help="timed calls per case (default 50)")
    parser.add_argument("--pv", default=",".join(PV), help="modules to run (default: both)")
    parser.add_argument("--json", type=arg_types.path_object,
                        help="also write the rows to this file")
    args = parser.parse_args(argv)
    if "" in args.run.split(","):
        parser.error(f"--run {args.run!r} has an empty folder name; give prepared folders "
                     f"separated by single commas")
    directories = [Path(d) for d in args.run.split(",")]
    pvs = args.pv.split(",")
    if unknown := [pv for pv in pvs if pv not in PV]:
        parser.error(f"--pv {unknown[0]!r} is not one of {', '.join(PV)}")
    try:
        for directory in directories:
            check_prepared(directory, "paged", "--run")
        folder_manifests(directories)
    except UserError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    except ValueError as error:                 # folder_manifests'
        parser.exit(1, f"{parser.prog}: error: --run {error}\n")
    rows = run(directories, args.batch, list(args.contexts), args.ragged_mean, seed=args.seed,
               iterations=args.iterations, pvs=pvs)
    report(rows, markdown, args.json)
    return 0


if __name__ == "__main__":
    run_main(main)
