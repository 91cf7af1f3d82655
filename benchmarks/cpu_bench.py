"""The side-by-side CPU bench: int8attn's API, its kernel alone and PagedAttention against
torch SDPA on a dequantized cache and the memory floor, interleaved in one process.

    python benchmarks/cpu_bench.py --samples 9 --json rows.json --md table.md
    python benchmarks/cpu_bench.py --target-cpu x86-64-v3 --samples 9
    python benchmarks/cpu_bench.py --cases decode-b1-s4k,prefill-b1-q256-s4k --samples 5
    python benchmarks/cpu_bench.py --quick          # tiny shapes, 2 samples: a smoke run

For each case (Hq 32 / Hkv 8, D 128, Gaussian data from the printed --seed, K and V
quantized per token) the methods are:

- `api`: `int8attn.compile(graph, target="cpu")` called on numpy arrays (64-byte
  aligned: the cache read in place, q copied as a result of its type may be computed in its
  buffer; the row records what the call copied, `LoadedModule.copies`);
- `kernel`: the same module's function invoked through IREE on buffer views of those
  arrays made once before timing: no argument checks, no packing;
- `paged`: `PagedAttention(target="cpu")` on torch CPU tensors holding the same tokens
  in a shuffled pool of 16-token blocks, with its default value checks (`validate=True`,
  `check()` after each call); `paged_unchecked`: the same with `validate=False`;
- `torch_f32` / `torch_bf16`: `scaled_dot_product_attention` with q reshaped to
  `[B, Hkv, G*Sq, D]` over a dequantized f32 / bf16 copy of the cache (it reads 4x / 2x
  the INT8 bytes); prefill with the causal mask of queries at the last Sq positions;
- `floor`: the INT8 cache's bytes (K, V and their f32 scales) over the copy bandwidth
  measured in the same samples (a torch copy of one L3-sized buffer into another, on
  the same threads: bytes copied / seconds).

Every method's output is checked against the exact reference (float64 attention on the
dequantized cache) once before timing; an output beyond its tolerance (a multiple of
the exact output's largest magnitude, per method: `TOLERANCE`) stops the bench with an
error, so no wrong kernel is timed. Then `--samples` rounds: each round calls every
method once, in an order rotated per round (drift in the machine's load falls on all
alike), and before each call reads a buffer of twice the L3 size so that no method
finds the cache in L3. IREE's task topology (`--task_topology_group_count`) and torch
run on `--threads` threads. Min and median per method; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

METHODS = ("api", "kernel", "paged", "paged_unchecked", "torch_f32", "torch_bf16", "floor")
LABELS = {"api": "int8attn API", "kernel": "int8attn kernel only",
          "paged": "PagedAttention (torch)", "paged_unchecked": "PagedAttention, validate=False",
          "torch_f32": "torch f32 SDPA", "torch_bf16": "torch bf16 SDPA",
          "floor": "memory floor"}
# Largest |out - exact| allowed, as a fraction of max |exact|. int8attn's default numerics
# (two-term Q, u8 W with a second term) is within ~1e-4 of it on Gaussian data; bf16 SDPA
# rounds q, K and V to 8 bits of mantissa (~4e-3 each). A wrong kernel (zeros, a wrong
# head or token) is off by the output's own size.
TOLERANCE = {"api": 2e-3, "kernel": 2e-3, "paged": 2e-3, "paged_unchecked": 2e-3,
             "torch_f32": 1e-4, "torch_bf16": 5e-2}
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Case:
    mode: str                 # decode | prefill
    batch: int
    tokens: int
    query_tokens: int = 1
    q_heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128

    def title(self) -> str:
        tokens = f"{self.tokens // 1024}K" if self.tokens % 1024 == 0 else str(self.tokens)
        if self.mode == "prefill":
            return f"prefill B {self.batch}, Sq {self.query_tokens} over S {tokens}"
        return f"decode B {self.batch}, S {tokens}"


CASES = {
    "decode-b1-s1k": Case("decode", 1, 1024),
    "decode-b1-s4k": Case("decode", 1, 4096),
    "decode-b1-s16k": Case("decode", 1, 16384),
    "decode-b8-s4k": Case("decode", 8, 4096),
    "decode-b8-s16k": Case("decode", 8, 16384),
    "prefill-b1-q256-s4k": Case("prefill", 1, 4096, 256),
}
QUICK_CASES = {
    "quick-decode": Case("decode", 2, 256, q_heads=8, kv_heads=2, head_dim=64),
    "quick-prefill": Case("prefill", 1, 128, 16, q_heads=8, kv_heads=2, head_dim=64),
}
QUICK_SAMPLES = 2


class BenchError(Exception):
    """A run that cannot give a fair table: a wrong output, a copy where none may be."""


def progress(line: str) -> None:
    print(f"[cpu_bench {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


# ---- the machine ----------------------------------------------------------------------------

def l3_bytes() -> int:
    """The L3 (last level) cache size, from sysfs, else lscpu."""
    path = "/sys/devices/system/cpu/cpu0/cache/index3/size"
    try:
        return _size_bytes(open(path).read())
    except (OSError, ValueError):
        pass
    import subprocess

    try:
        for line in subprocess.run(["lscpu", "-B"], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            if line.startswith("L3 cache:"):
                return _size_bytes(line.split(":", 1)[1].split("(")[0])
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    raise BenchError(f"no L3 cache size in {path} or `lscpu -B`: the bench evicts the cache "
                     f"with a buffer of twice its size and cannot size it")


def _size_bytes(text: str) -> int:
    text = text.strip().upper().replace("IB", "").replace("B", "")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1] in units:
        return int(float(text[:-1].strip()) * units[text[-1]])
    return int(text)


def machine(threads: int, l3: int) -> dict:
    model = platform.processor()
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "threads": threads, "l3_bytes": l3,
            "avx512f": "avx512f" in flags, "avx512_vnni": "avx512_vnni" in flags,
            "avx_vnni": "avx_vnni" in flags, "avx2": "avx2" in flags,
            "load_average": list(os.getloadavg())}


def iree_cpu(target_cpu: str) -> dict:
    """What IREE compiles the int8attn modules for: the CPU name and its integer
    dot-product and bf16 features."""
    from int8attn.driver.cpu_target import resolve

    target = resolve(target_cpu)
    return {"cpu": target.cpu, "features": [f for f in target.features if any(
        word in f for word in ("vnni", "bf16", "avx512f", "avx2"))]}


def set_threads(threads: int) -> None:
    """IREE's task system and torch on `threads` threads. IREE reads the flag when it
    creates its local-task device: before the first module is loaded."""
    import iree.runtime as rt
    import torch

    rt.flags.parse_flags(f"--task_topology_group_count={threads}")
    torch.set_num_threads(threads)


class Evictor:
    """Reads a buffer of twice the L3 size (evicting whatever a call left there), and
    measures the copy bandwidth by copying its first half into its second."""

    def __init__(self, l3: int):
        import torch

        self.torch = torch
        half = -(-l3 // 8) * 8
        self.buffer = torch.ones(2 * half // 8, dtype=torch.int64)
        self.copied_bytes = half
        self.source, self.target = self.buffer[:half // 8], self.buffer[half // 8:]

    def evict(self) -> None:
        self.buffer.sum()

    def copy_seconds(self) -> float:
        start = time.perf_counter()
        self.target.copy_(self.source)
        return time.perf_counter() - start


# ---- one case's inputs and methods -----------------------------------------------------------

def inputs(case: Case, seed: int) -> dict:
    """Gaussian q, K and V (K and V quantized per token), 64-byte aligned."""
    from int8attn.reference import quantize_cache
    from int8attn.runtime import aligned_copy

    rng = np.random.default_rng(seed)
    q_shape = (case.batch, case.q_heads) + ((case.query_tokens,) if case.mode == "prefill"
                                            else ()) + (case.head_dim,)
    cache_shape = (case.batch, case.kv_heads, case.tokens, case.head_dim)
    q = rng.standard_normal(q_shape, dtype=np.float32)
    k, k_scale = quantize_cache(rng.standard_normal(cache_shape, dtype=np.float32))
    v, v_scale = quantize_cache(rng.standard_normal(cache_shape, dtype=np.float32))
    return {name: aligned_copy(a) for name, a in
            dict(q=q, k=k, k_scale=k_scale, v=v, v_scale=v_scale).items()}


def paged_pool(case: Case, arrays: dict, seed: int) -> list:
    """The same tokens as torch tensors in a pool of 16-token blocks handed out in a
    shuffled order (K [NB, Hkv, BS, D], V token-innermost [NB, Hkv, D, BS]), with the
    block tables and lengths."""
    import torch

    per_sequence = -(-case.tokens // BLOCK_SIZE)
    padded = per_sequence * BLOCK_SIZE
    blocks = case.batch * per_sequence
    order = np.random.default_rng(seed + 1).permutation(blocks)
    tables = order.reshape(case.batch, per_sequence).astype(np.int32)

    def blocked(x, fill):               # [B, Hkv, S, ...] -> [B*MB, Hkv, BS, ...] in order
        pad = [(0, 0)] * x.ndim
        pad[2] = (0, padded - case.tokens)
        x = np.pad(x, pad, constant_values=fill)
        x = x.reshape(case.batch, case.kv_heads, per_sequence, BLOCK_SIZE, *x.shape[3:])
        x = np.moveaxis(x, 2, 1).reshape(blocks, case.kv_heads, BLOCK_SIZE, *x.shape[4:])
        pool = np.empty(x.shape, x.dtype)
        pool[tables.reshape(-1)] = x
        return pool

    k_cache = blocked(arrays["k"], 0)
    v_cache = np.ascontiguousarray(blocked(arrays["v"], 0).transpose(0, 1, 3, 2))
    k_scale, v_scale = blocked(arrays["k_scale"], 1.0), blocked(arrays["v_scale"], 1.0)
    lengths = np.full(case.batch, case.tokens, np.int32)
    return [torch.from_numpy(a).clone() for a in
            (k_cache, k_scale, v_cache, v_scale, tables, lengths)]


def torch_operands(case: Case, arrays: dict, dtype) -> tuple:
    """(q as [B, Hkv, G*Sq, D], dequantized K and V, the prefill's causal mask or None)."""
    import torch

    from int8attn.reference.common import group_rows, visible

    q = torch.from_numpy(np.ascontiguousarray(group_rows(arrays["q"], case.kv_heads)))
    k = torch.from_numpy(arrays["k"]).float() * torch.from_numpy(arrays["k_scale"])[..., None]
    v = torch.from_numpy(arrays["v"]).float() * torch.from_numpy(arrays["v_scale"])[..., None]
    mask = None
    if case.mode == "prefill":
        mask = torch.from_numpy(visible(arrays["q"].shape, case.kv_heads, case.tokens))
    return q.to(dtype), k.to(dtype), v.to(dtype), mask


class Methods:
    """Each method of one case as a callable returning its output (numpy, q's shape)."""

    def __init__(self, case: Case, arrays: dict, seed: int, target_cpu: str,
                 evictor: Evictor):
        import iree.runtime as rt
        import torch

        import int8attn
        from int8attn.driver.graph import attention_graph
        from int8attn.serving import PagedAttention

        self.case, self.arrays, self.evictor = case, arrays, evictor
        self.cache_bytes = sum(arrays[n].nbytes for n in ("k", "k_scale", "v", "v_scale"))
        source = attention_graph(case.batch, case.q_heads, case.kv_heads, case.tokens,
                                 case.head_dim, mode=case.mode, query_tokens=case.query_tokens,
                                 name="attention")
        self.graph = int8attn.compile(source, filename=f"{case.mode}.mlir", target="cpu",
                                      target_cpu=target_cpu)
        self.operands = [arrays[n] for n in ("q", "k", "k_scale", "v", "v_scale")]
        # The kernel alone: the module's function on views of the arrays, made once.
        loaded = self.graph.executor
        views = [loaded.host_view(a) for a in self.operands]
        if any(view is None for view in views):
            raise BenchError("the kernel's arguments could not be imported in place")
        context = rt.SystemContext(config=rt.Config(loaded.driver))
        context.add_vm_module(rt.VmModule.copy_buffer(context.instance, self.graph.vmfb))
        self._function, self._views = context.modules.module["attention"], views
        self.paged_attention = PagedAttention(case.q_heads, case.kv_heads, case.head_dim, BLOCK_SIZE,
                                    target="cpu", target_cpu=target_cpu)
        self.pool = paged_pool(case, arrays, seed)
        self.paged_q = torch.from_numpy(arrays["q"]).clone()
        self.sdpa = torch.nn.functional.scaled_dot_product_attention
        self.scale = float(np.float32(case.head_dim ** -0.5))
        self.f32 = torch_operands(case, arrays, torch.float32)
        self.bf16 = torch_operands(case, arrays, torch.bfloat16)
        self.copies = {}

    def api(self):
        out = self.graph(*self.operands)
        self.copies["api"] = [asdict(c) for c in self.graph.executor.copies]
        return out

    def kernel(self):
        return self._function(*self._views).to_host()

    def paged(self):
        out = self.paged_attention(self.paged_q, *self.pool)
        self.paged_attention.check()
        return out.numpy()

    def paged_unchecked(self):
        return self.paged_attention(self.paged_q, *self.pool, validate=False).numpy()

    def _sdpa(self, operands):
        q, k, v, mask = operands
        out = self.sdpa(q, k, v, attn_mask=mask, scale=self.scale)
        return out.float().numpy().reshape(self.arrays["q"].shape)

    def torch_f32(self):
        return self._sdpa(self.f32)

    def torch_bf16(self):
        return self._sdpa(self.bf16)

    def floor_seconds(self) -> float:
        return self.cache_bytes * self.evictor.copy_seconds() / self.evictor.copied_bytes

    def call(self, method: str):
        return getattr(self, method)()


def check(case_name: str, method: str, out: np.ndarray, exact: np.ndarray) -> dict:
    """The method's output against the exact reference; a BenchError beyond TOLERANCE."""
    magnitude = float(np.abs(exact).max())
    if out.shape != exact.shape:
        raise BenchError(f"case {case_name}: {LABELS[method]} returned shape "
                         f"{list(out.shape)}, the exact reference {list(exact.shape)}; not timed")
    error = float(np.abs(out.astype(np.float64) - exact).max()) if np.isfinite(out).all() \
        else float("inf")
    relative = error / magnitude
    if not relative <= TOLERANCE[method]:
        raise BenchError(f"case {case_name}: {LABELS[method]}'s output is {error:.3e} from the "
                         f"exact reference ({relative:.2e} of its largest magnitude "
                         f"{magnitude:.3e}; tolerance {TOLERANCE[method]:.0e}): a wrong "
                         f"output, not timed")
    return {"max_abs_error": error, "relative_error": relative}


def run_case(name: str, case: Case, args, evictor: Evictor) -> dict:
    from int8attn.reference import exact_attention

    progress(f"{name}: inputs (seed {args.seed}), compiling for --target-cpu "
             f"{args.target_cpu}")
    arrays = inputs(case, args.seed)
    methods = Methods(case, arrays, args.seed, args.target_cpu, evictor)
    progress(f"{name}: exact reference")
    exact = exact_attention(*methods.operands, methods.scale).astype(np.float64)
    row = {"case": name, "title": case.title(), **asdict(case), "target_cpu": args.target_cpu,
           "numerics": asdict(methods.graph.options.numerics), "threads": args.threads,
           "samples": args.samples, "cache_bytes": methods.cache_bytes}
    checks = {}
    for method in METHODS[:-1]:          # each checked once (and warmed up) before timing
        checks[method] = check(name, method, methods.call(method), exact)
    api_copies = methods.copies.get("api", [])
    progress(f"{name}: outputs checked ("
             + ", ".join(f"{m} {c['relative_error']:.1e}" for m, c in checks.items())
             + f"); the API copied {len(api_copies)} argument(s)")
    times = {method: [] for method in METHODS}
    for sample in range(args.samples):
        shift = sample % len(METHODS)
        for method in METHODS[shift:] + METHODS[:shift]:
            evictor.evict()
            if method == "floor":
                times[method].append(methods.floor_seconds())
                continue
            start = time.perf_counter()
            methods.call(method)
            times[method].append(time.perf_counter() - start)
        progress(f"{name}: sample {sample + 1}/{args.samples}: "
                 + ", ".join(f"{m} {times[m][-1] * 1e3:.2f}" for m in METHODS) + " ms")
    row["methods"] = {method: {"min_ms": min(t) * 1e3, "median_ms": statistics.median(t) * 1e3,
                               "times_ms": [x * 1e3 for x in t], **checks.get(method, {})}
                      for method, t in times.items()}
    row["api_copies"] = api_copies
    row["load_average"] = list(os.getloadavg())       # 1, 5, 15 minutes, as sampling ended
    copy_min = min(times["floor"]) * evictor.copied_bytes / methods.cache_bytes
    row["copy_bandwidth_gb_s"] = evictor.copied_bytes / copy_min / 1e9
    row["ratios"] = ratios(row["methods"])
    return row


def ratios(methods: dict) -> dict:
    """Ratios of mins the issue's targets read."""
    m = {name: value["min_ms"] for name, value in methods.items()}
    return {"kernel_over_floor": m["kernel"] / m["floor"],
            "torch_bf16_over_kernel": m["torch_bf16"] / m["kernel"],
            "torch_f32_over_kernel": m["torch_f32"] / m["kernel"],
            "api_over_kernel": m["api"] / m["kernel"],
            "paged_over_kernel": m["paged"] / m["kernel"],
            "paged_unchecked_over_kernel": m["paged_unchecked"] / m["kernel"]}


# ---- the table --------------------------------------------------------------------------------

def markdown(result: dict) -> str:
    rows, info = result["rows"], result["machine"]
    settings = result["settings"]
    iree = settings["iree_cpu"]
    lines = [f"CPU: {info['cpu']}, {info['cores']} cores; IREE and torch on {info['threads']} "
             f"threads; --target-cpu {settings['target_cpu']} (IREE: {iree['cpu']}, "
             f"{' '.join(iree['features'])}); seed {settings['seed']}; "
             f"{settings['samples']} samples per method, interleaved; L3 "
             f"{info['l3_bytes'] >> 20} MiB evicted before each call. Min ms (median below).",
             "", "| case | " + " | ".join(LABELS[m] for m in METHODS) + " |",
             "|:--|" + "--:|" * len(METHODS)]
    for stat in ("min_ms", "median_ms"):
        if stat == "median_ms":
            lines += ["", "Median ms:", "", lines[2], lines[3]]
        for row in rows:
            lines.append(f"| {row['title']} | " + " | ".join(
                _ms(row["methods"][m][stat]) for m in METHODS) + " |")
    names = ("kernel / floor", "torch bf16 / kernel", "torch f32 / kernel", "API / kernel",
             "PagedAttention / kernel", "PagedAttention validate=False / kernel",
             "copy GB/s", "API copies", "max rel. error (API, kernel, paged, f32, bf16)")
    lines += ["", "Ratios of mins (torch / kernel > 1: int8attn faster):", "",
              "| case | " + " | ".join(names) + " |", "|:--|" + "--:|" * len(names)]
    for row in rows:
        r, m = row["ratios"], row["methods"]
        errors = ", ".join(f"{m[k]['relative_error']:.0e}"
                           for k in ("api", "kernel", "paged", "torch_f32", "torch_bf16"))
        floor = f"{r['kernel_over_floor']:.1f}" if row["mode"] == "decode" else "—"
        lines.append(f"| {row['title']} | {floor} | "
                     f"{r['torch_bf16_over_kernel']:.2f} | {r['torch_f32_over_kernel']:.2f} | "
                     f"{r['api_over_kernel']:.2f} | {r['paged_over_kernel']:.2f} | "
                     f"{r['paged_unchecked_over_kernel']:.2f} | "
                     f"{row['copy_bandwidth_gb_s']:.1f} | {len(row['api_copies'])} | {errors} |")
    return "\n".join(lines) + "\n"


def _ms(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


# ---- the command ------------------------------------------------------------------------------

def parse(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/cpu_bench.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=9,
                        help="timed calls per method, interleaved (default 9)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help=f"IREE and torch threads (default: the machine's "
                             f"{os.cpu_count()} cores)")
    parser.add_argument("--target-cpu", default="host",
                        help="the cpu target's --target-cpu for the int8attn modules: host, "
                             "x86-64-v3, x86-64-v4 or another LLVM CPU name (default host)")
    parser.add_argument("--cases", default=",".join(CASES),
                        help=f"comma-separated, of: {', '.join(CASES)} (default all)")
    parser.add_argument("--seed", type=int, default=0, help="the inputs' random seed")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: tiny shapes ({', '.join(QUICK_CASES)}), "
                             f"{QUICK_SAMPLES} samples")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--md", help="write the table here")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error(f"--samples {args.samples}: give at least 1 timed call per method")
    if args.threads is None or args.threads < 1:
        parser.error(f"--threads {args.threads}: give a positive thread count")
    chosen = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in CASES]
    if args.quick:
        if "--cases" in (argv if argv is not None else sys.argv[1:]):
            parser.error("--quick runs its own tiny cases; give --cases or --quick, not both")
        args.cases, args.samples = dict(QUICK_CASES), QUICK_SAMPLES
    elif unknown or not chosen:
        parser.error(f"--cases {args.cases}: unknown case "
                     f"{', '.join(unknown) or '(none given)'}; cases: {', '.join(CASES)}")
    else:
        args.cases = {c: CASES[c] for c in chosen}
    return args


def main(argv=None) -> int:
    args = parse(argv)
    from int8attn.driver.targets import OptionRefused
    from int8attn.runtime.module import InputError
    from int8attn.support.diagnostics import DiagnosticError

    set_threads(args.threads)
    try:
        l3 = l3_bytes()
        info = machine(args.threads, l3)
        progress(f"seed {args.seed}; {info['cpu']}; {args.threads} threads; L3 {l3 >> 20} MiB "
                 f"(evicted with {2 * l3 >> 20} MiB before each call); {args.samples} samples")
        evictor = Evictor(l3)
        rows = [run_case(name, case, args, evictor) for name, case in args.cases.items()]
    except (BenchError, OptionRefused, DiagnosticError, InputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    result = {"machine": info, "settings": {"target_cpu": args.target_cpu,
                                            "iree_cpu": iree_cpu(args.target_cpu),
                                            "seed": args.seed,
                                            "samples": args.samples, "threads": args.threads,
                                            "tolerance": TOLERANCE},
              "rows": rows}
    table = markdown(result)
    print(table)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=1)
    if args.md:
        with open(args.md, "w") as out:
            out.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
