"""What every `int8attn bench` kind shares (in the spirit of `triton.testing`'s
`Benchmark` / `do_bench`).

A bench kind (dense decode `bench_cuda`, `bench_paged`, `bench_prefill`) is a list of
cases (frozen dataclasses: a name, the shapes, the variants to compare) and a few
small functions: prepare the modules, make a case's inputs, run one case, check an
output. This module holds the rest, passed explicitly (no module-global state):

- `Timer`: one timer. An IREE call's device time is the CUPTI kernel time of the
  call (through torch.profiler, every kernel of the process, IREE's included) and
  its per-kernel split; without torch, the median wall time of a synchronized call.
  torch's own baselines (SDPA, the copy ceiling) are timed with CUDA events.
- `IreeDevice`: loads a prepared module's function and puts arrays on the GPU
  (IREE's CUDA runtime); tests pass a fake one.
- `measure`: one variant of a case: run once, check the output with the kind's
  checker hook, then time; the row's `{variant}_...` fields.
- `run_cases`: the loop (a row per case, printed as JSON as it comes).
- `Column` / `markdown_table`, `write_results` (PREFIX.md, .json, optional .png)
  and `report` (the `python -m int8attn.bench_* --run` output): one results writer.
- `BenchKind`: what `int8attn bench --mode MODE` needs of a kind; the table of kinds
  is `int8attn.bench_kinds.BENCH_KINDS`.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, NoReturn, Sequence


# ---- the timer ----------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """One variant's time: the median wall seconds of a synchronized call, and the
    device seconds per call of all its kernels (CUPTI; None without torch) with the
    split per kernel name."""
    wall_s: float
    kernel_s: float | None
    kernels: dict[str, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """The kernels' time where CUPTI saw them, the wall time otherwise."""
        return self.kernel_s or self.wall_s

    @property
    def source(self) -> str:
        return "cupti kernels" if self.kernel_s else "wall per call"


@dataclass(frozen=True)
class Timer:
    warmup: int = 5
    iterations: int = 50

    def call(self, fn, device_args) -> Timing:
        """Time the IREE function `fn` on `device_args` (each call synchronized by
        copying its result to the host)."""
        for _ in range(self.warmup):
            fn(*device_args).to_host()
        seconds = []
        for _ in range(self.iterations):
            start = time.perf_counter()
            fn(*device_args).to_host()
            seconds.append(time.perf_counter() - start)
        kernel_s, kernels = self.kernel_seconds(fn, device_args)
        return Timing(statistics.median(seconds), kernel_s, kernels)

    def kernel_seconds(self, fn, device_args) -> tuple[float | None, dict[str, float]]:
        """(device seconds per call of all kernels, per kernel name) from a CUPTI
        trace; (None, {}) without torch. CUPTI sees every CUDA kernel of the
        process, IREE's included."""
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile
        except ImportError:
            return None, {}
        with profile(activities=[ProfilerActivity.CUDA]) as trace:
            for _ in range(self.iterations):
                fn(*device_args).to_host()
            torch.cuda.synchronize()
        total, kernels = 0.0, {}
        for event in trace.events():
            # Kernels (IREE's dispatches), not the copy of the result to the host.
            if str(event.device_type).endswith("CUDA") and not event.name.startswith("Memcpy"):
                total += event.device_time_total * 1e-6
                kernels[event.name] = kernels.get(event.name, 0.0) + \
                    event.device_time_total * 1e-6 / self.iterations
        return (total / self.iterations if total else None), kernels

    def events(self, fn) -> float:
        """Median seconds of `fn` on the current CUDA stream, from CUDA events."""
        import torch

        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.iterations):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
        return statistics.median(times)

    def copy_ceiling(self) -> float | None:
        """Bytes/s of a 1 GiB device-to-device copy (read + write), or None without
        torch."""
        try:
            import torch
        except ImportError:
            return None
        src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
        dst = torch.empty_like(src)
        return 2 * src.numel() / self.events(lambda: dst.copy_(src))


# ---- the device -----------------------------------------------------------------------

class IreeDevice:
    """IREE's CUDA runtime: a prepared module's function, arrays on the device.
    Making one raises RuntimeError where there is no CUDA device."""

    def __init__(self):
        import iree.runtime as rt

        self._rt = rt
        self.config = rt.Config("cuda")

    def load(self, path: Path, function: str):
        """`function` of the module in `path`, in a context of its own."""
        rt = self._rt
        ctx = rt.SystemContext(config=self.config)
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, Path(path).read_bytes()))
        return ctx.modules.module[function]

    def put(self, arrays) -> list:
        return [self._rt.asdevicearray(self.config.device, a) for a in arrays]


# ---- one variant, the cases -------------------------------------------------------------

@dataclass(frozen=True)
class Check:
    """A checker hook's verdict on one output: the max abs error against the
    reference, whether every element is within the tolerance, and further row
    fields (e.g. INT8 vs BF16 PV)."""
    max_abs: float
    ok: bool
    fields: dict = field(default_factory=dict)


def measure(row: dict, variant: str, fn, device_args, check: Callable[..., Check],
            timer: Timer, *, record: str):
    """Run `fn` once, check its output, then time it; writes `{variant}_max_abs_vs_fragment`,
    `_within_tolerance` (and the check's fields), `_wall_s`, `_s` and, by `record`,
    `_timing` (where the time came from) or `_kernels_s` (time per kernel name).
    Returns the output."""
    out = fn(*device_args).to_host()
    checked = check(out)
    row[f"{variant}_max_abs_vs_fragment"] = checked.max_abs
    row[f"{variant}_within_tolerance"] = checked.ok
    row.update(checked.fields)
    timing = timer.call(fn, device_args)
    row[f"{variant}_wall_s"], row[f"{variant}_s"] = timing.wall_s, timing.seconds
    if record == "timing":
        row[f"{variant}_timing"] = timing.source
    elif record == "kernels":
        row[f"{variant}_kernels_s"] = dict(timing.kernels)
    else:
        raise ValueError(f"record is 'timing' or 'kernels', not {record!r}")
    return out


def run_main(main: Callable[[], int]) -> NoReturn:
    """`raise SystemExit(main())` for a bench's command line on the GPU machine, without
    the interpreter's teardown: after the CUDA runtimes (IREE's, torch's and its CUPTI
    trace) the teardown is where things went wrong, after the work was done. A run
    the device failed (IREE's and torch's RuntimeError) can outlive its traceback by
    minutes there, time the device lease pays for; a finished one can abort there with
    "double free or corruption" (exit 134) after every row and file was written. So
    the process says what failed, if anything, flushes its output and ends at once.
    The rows measured before a failure are already printed (`run_cases`)."""
    try:
        code = main()
    except RuntimeError as error:
        lines = str(error).strip().splitlines()[:4]
        print("error: the run failed on the device (rows measured before it are printed "
              "above):\n  " + "\n  ".join(lines), file=sys.stderr, flush=True)
        code = 1
    except SystemExit as done:       # argparse's usage errors, --help; as Python ends on it
        code = 0 if done.code is None else done.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_cases(cases: Iterable, run_case: Callable[..., list[dict]]) -> list[dict]:
    """The rows of every case (`run_case(case)` gives one or more), each printed as
    a JSON line as soon as it is measured."""
    rows = []
    for case in cases:
        for row in run_case(case):
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def map_forked(fn, items) -> list:
    """[fn(x) for x in items] in forked worker processes, which inherit the caller's
    arrays: the numpy references run one sequence per core of the GPU machine."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    global _TASK
    items = list(items)
    workers = min(len(items), os.cpu_count() or 1)
    if workers <= 1:
        return [fn(x) for x in items]
    _TASK = fn
    try:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            return list(pool.map(_run_task, items))
    finally:
        _TASK = None


_TASK = None   # map_forked's function while it runs, inherited by its forked workers


def _run_task(x):
    return _TASK(x)


# ---- the results writer ---------------------------------------------------------------

@dataclass(frozen=True)
class Column:
    """A Markdown column: its header, its alignment row cell ('---', '--:', ':-:')
    and the text of a row's cell."""
    header: str
    cell: Callable[[dict], str]
    align: str = "--:"


def markdown_table(columns: Sequence[Column], rows: Iterable[dict]) -> list[str]:
    lines = ["| " + " | ".join(c.header for c in columns) + " |",
             "|" + "|".join(c.align for c in columns) + "|"]
    lines += ["| " + " | ".join(c.cell(r) for c in columns) + " |" for r in rows]
    return lines


def nan_or(value) -> float:
    """value, or NaN where there is none (a baseline that did not run)."""
    return value if value else float("nan")


BENCH_OUT = "bench-cuda"      # int8attn bench's --out PREFIX when none is given


def output_paths(prefix: str, plot: bool) -> list[str]:
    """What `write_results` writes for `--out PREFIX`."""
    return [f"{prefix}.{ext}" for ext in ("md", "json") + (("png",) if plot else ())]


def write_results(rows: list[dict], markdown: Callable[[list[dict]], str], prefix: str,
                  plot: Callable | None = None) -> None:
    """`int8attn bench`'s output: the table on stdout and in PREFIX.md, the rows in
    PREFIX.json, and the plot in PREFIX.png where the kind has one (a note where
    matplotlib is missing)."""
    from .support.files import write_atomic

    table = markdown(rows)
    print(table)
    write_atomic(f"{prefix}.md", table + "\n")
    write_atomic(f"{prefix}.json", json.dumps(rows, indent=2))
    if plot is None:
        return
    try:
        plot(rows, Path(f"{prefix}.png"))
    except ImportError:
        print("note: no PNG written: install matplotlib (pip install 'int8attn[bench]')",
              file=sys.stderr)


def report(rows: list[dict], markdown: Callable[[list[dict]], str],
           json_path: Path | None) -> None:
    """A GPU runner's output (`python -m int8attn.bench_* --run`): the Markdown
    table on stdout, the rows as JSON."""
    print(markdown(rows))
    if json_path:
        json_path.write_text(json.dumps(rows, indent=2))
    sys.stdout.flush()


# ---- a bench kind -------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchSettings:
    """`int8attn bench`'s flags, as every kind reads them (None: the kind's default)."""
    contexts: tuple[int, ...] = (4096, 8192, 16384)
    batch: int | None = None
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    iterations: int = 50
    seed: int = 0
    history: int | None = None
    new_tokens: int | None = None
    ragged_mean: int | None = None
    numerics: str | None = None
    w_chains: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BenchKind:
    """One `int8attn bench --mode`: its manifest and module files (what
    `--prepare-only` writes and `--from` needs), `prepare(directory, settings)`,
    `run(directory, settings) -> rows`, the Markdown table and optional plot, the
    default batch, the flags only this mode reads (flag -> settings field), whether
    each KV head's query heads must fit one decode MMA tile, and the flags a prepared
    folder fixes."""
    mode: str
    manifest: str
    module_files: Callable[[dict], list[str]]
    prepare: Callable[[Path, BenchSettings], None]
    run: Callable[[Path, BenchSettings], list[dict]]
    markdown: Callable[[list[dict]], str]
    plot: Callable | None = None
    default_batch: int = 16
    flags: tuple[tuple[str, str], ...] = ()
    query_heads_in_one_tile: bool = True
    # The flags (-> settings field) whose values the prepared modules fix: `--from` runs
    # modules compiled for them, so there they are refused, not ignored.
    prepared_flags: tuple[tuple[str, str], ...] = (
        ("--q-heads", "q_heads"), ("--kv-heads", "kv_heads"), ("--head-dim", "head_dim"))
    # The positive integers its manifest holds (a manifest without one is damaged).
    manifest_counts: tuple[str, ...] = ("batch", "q_heads", "kv_heads", "head_dim")

    def batch(self, settings: BenchSettings) -> int:
        return self.default_batch if settings.batch is None else settings.batch
