"""`int8attn bench --target cuda --mode prefill`: the prefill kernel on a GPU.

Cases: causal prefill without history (Sq = S) at each context, and a
history case (`--history` cached tokens + `--new-tokens` new ones). Per case
the INT8-PV kernel module and its BF16-PV twin (one module each: the dense
prefill graph has static shapes), the INT8 kernel as a chunked prefill over a
paged pool holding the same cache (BLOCK_SIZE-token blocks, shuffled), and
torch SDPA on the same data in bf16
(causal, aligned to the end of the sequence). For each: device time of all
kernels of a call (CUPTI; the host function's V transpose included, the
prefill kernel alone in the JSON), TFLOP/s on the causal work (4·D flops per
visible (query, key) pair and head), the output checked against the
fragment-level reference on three 64-token slices of the query tokens (first,
middle, last: each slice is the prefill of a shorter sequence, so the
reference stays cheap at 16K), and INT8 vs BF16 PV over the whole output.
The data, the slices' check and the SDPA timing are in bench_prefill_data.py.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from dataclasses import dataclass

from .bench_harness import (BenchKind, BenchSettings, Check, Column, IreeDevice, Timer,
                            markdown_table, measure, nan_or, report, run_cases, run_main)
from .bench_numerics import bench_numerics, manifest_numerics
from .bench_prefill_data import (BLOCK_SIZE, block_pool, causal_pairs, check_slices, inputs,
                                 sdpa_seconds)
from .contract.numerics import Numerics

PV = ("int8", "bf16")
# The INT8 kernel again, as a chunked prefill over a paged pool of BLOCK_SIZE-token
# blocks in shuffled order (the same data; the same kernel reading through the table).
PAGED = "paged"
HISTORY, NEW_TOKENS = 8192, 512   # the history case, unless --history / --new-tokens
# The numerics `prepare` compiles the modules with unless `--numerics` names others (the
# manifest records them, and `run` checks against them): one-term numerics, those of the
# prefill tables in benchmarks/results/.
NUMERICS = "one-term"
MANIFEST = "prefill.json"   # what `prepare` wrote: the cases and shapes, for `run`
# With --w-chain: the INT8 prefill at each chain c > 1 beside today's (chain 1), named
# CHAINED + c; each checked against the reference of its own chained W groups.
CHAINED = "int8-chain"


def w_chains(text: str) -> tuple[int, ...]:
    """--w-chain's comma-separated chains, each one the cuda prefill kernel takes."""
    from .fragments import fragment_model
    from .kernels.pv_stages import kernel_chains

    offered = kernel_chains(fragment_model("cuda"))
    try:
        chains = tuple(int(part) for part in text.split(","))
    except ValueError:
        chains = ()
    if not chains or any(c not in offered for c in chains):
        from argparse import ArgumentTypeError

        model = fragment_model("cuda")
        raise ArgumentTypeError(f"'{text}': give comma-separated chains of "
                                f"{', '.join(map(str, offered))} (the cuda prefill kernel's: "
                                f"a chain divides the {model.mmacs_per_wave} PV K-steps a warp "
                                f"issues per {model.wave_tokens}-token tile)")
    return tuple(sorted(set(chains)))


def chain_of(variant: str) -> int:
    """The PV chain of a variant (1 but for CHAINED + c)."""
    return int(variant[len(CHAINED):]) if variant.startswith(CHAINED) else 1


@dataclass(frozen=True)
class PrefillCase:
    """S tokens of which the last Sq are new (causal, aligned to the end): a module
    per PV precision (`variants`), each checked on slices; torch SDPA beside."""
    name: str
    tokens: int
    query_tokens: int
    variants: tuple[str, ...] = PV + (PAGED,)

    def chained(self, chains) -> "PrefillCase":
        """The case with today's INT8 prefill and one per chain c > 1 (None: as it is)."""
        if chains is None:
            return self
        return dataclasses.replace(self, variants=("int8",) + tuple(
            f"{CHAINED}{c}" for c in chains if c != 1))

    def manifest_entry(self) -> list:
        """The case as the manifest lists it: [name, S, Sq]."""
        return [self.name, self.tokens, self.query_tokens]


def cases(contexts, history: int, new_tokens: int) -> list[PrefillCase]:
    """Sq = S at each context, and the history case (left out without new tokens)."""
    found = [PrefillCase(f"Sq=S={s}", s, s) for s in contexts]
    if new_tokens:
        found.append(PrefillCase(f"{history}+{new_tokens}", history + new_tokens, new_tokens))
    return found


def manifest_cases(meta: dict) -> list[PrefillCase]:
    return [PrefillCase(name, int(tokens), int(query_tokens)).chained(meta.get("w_chains"))
            for name, tokens, query_tokens in meta["cases"]]


def _module_name(variant: str, tokens: int, query_tokens: int) -> str:
    return f"prefill_{variant}_{tokens}_{query_tokens}.vmfb"


def module_files(meta: dict) -> list[str]:
    """The modules `prepare` wrote for the manifest `meta`."""
    return [_module_name(pv, case.tokens, case.query_tokens)
            for case in manifest_cases(meta) for pv in case.variants]


def prepare(directory: Path, contexts, history: int, new_tokens: int, batch: int,
            q_heads: int, kv_heads: int, head_dim: int,
            numerics: Numerics | None = bench_numerics(None, NUMERICS),
            chains: tuple[int, ...] | None = None) -> None:
    """Compile every case's modules for cuda with `numerics` (None: the kernel
    target's own) into `directory`, and the manifest `run` reads; with `chains`, the
    INT8 prefill per chain instead of the BF16 twin and the paged variant."""
    from .driver.compile import compile
    from .driver.graph import prefill_graph
    from .driver.options import CompileOptions
    from .driver.paged_decode import paged_attention_graph

    directory.mkdir(parents=True, exist_ok=True)
    all_cases = [case.chained(chains) for case in cases(contexts, history, new_tokens)]
    given = {} if numerics is None else dataclasses.asdict(numerics)
    resolved = dataclasses.asdict(CompileOptions(target="cuda", **given).numerics)
    for case in all_cases:
        dense = prefill_graph(batch, q_heads, kv_heads, case.tokens, case.query_tokens,
                              head_dim)
        paged = paged_attention_graph(q_heads, kv_heads, head_dim, BLOCK_SIZE,
                                      query_tokens=case.query_tokens, name="prefill")
        for variant in case.variants:
            pv = "bf16" if variant == "bf16" else "int8"
            options = CompileOptions(target="cuda", pv=pv, w_chain=chain_of(variant), **given)
            compiled = compile(paged if variant == PAGED else dense, options,
                               filename=f"prefill_{case.tokens}.mlir", until="ptx")
            (directory / _module_name(variant, case.tokens, case.query_tokens)).write_bytes(
                compiled.artifacts["vmfb"])
            print(f"prepared prefill {variant} {case.name}", flush=True)
    (directory / MANIFEST).write_text(json.dumps(dict(
        cases=[case.manifest_entry() for case in all_cases], batch=batch, q_heads=q_heads, kv_heads=kv_heads,
        head_dim=head_dim, **resolved, **({} if chains is None else {"w_chains": list(chains)}))))


def run_case(case: PrefillCase, directory: Path, meta: dict, device, timer: Timer,
             seed: int) -> list[dict]:
    arrays = inputs(seed + case.tokens, meta["batch"], meta["q_heads"], meta["kv_heads"],
                    case.tokens, case.query_tokens, meta["head_dim"])
    device_args = device.put(arrays)
    scale = float(np.float32(meta["head_dim"] ** -0.5))
    flops = 4 * meta["head_dim"] * meta["batch"] * meta["q_heads"] * \
        causal_pairs(case.tokens, case.query_tokens)
    row = dict(case=case.name, tokens=case.tokens, query_tokens=case.query_tokens,
               causal_flops=flops, seed=seed + case.tokens,
               **{k: meta[k] for k in ("batch", "q_heads", "kv_heads", "head_dim")})
    numerics = manifest_numerics(meta)
    outputs = {}
    for variant in case.variants:
        fn = device.load(directory / _module_name(variant, case.tokens, case.query_tokens),
                         "prefill")
        pv = "bf16" if variant == "bf16" else "int8"
        chain = chain_of(variant)
        args = device_args
        if variant == PAGED:
            pool = block_pool(np.random.default_rng(seed + case.tokens), *arrays[1:])
            args = device.put([arrays[0], *pool])
        outputs[variant] = measure(row, variant, fn, args,
                                   lambda out: Check(*check_slices(out, arrays, scale, pv,
                                                                   numerics, chain)),
                                   timer, record="kernels")
    if PAGED in outputs:
        row["paged_vs_dense_max_abs"] = float(np.abs(outputs[PAGED] - outputs["int8"]).max())
    if "bf16" in outputs:
        diff = (outputs["int8"] - outputs["bf16"]).astype(np.float64)
        row["int8_vs_bf16_max_abs"] = float(np.abs(diff).max())
        row["int8_vs_bf16_rms"] = float(np.sqrt(np.mean(diff ** 2)))
    row["torch_sdpa_bf16_s"] = sdpa_seconds(arrays, timer)
    if meta.get("w_chains") is not None:
        row["w_chains"] = meta["w_chains"]
        row["torch_sdpa_flash_bf16_s"] = sdpa_seconds(arrays, timer, "FLASH_ATTENTION")
    return [row]


def run(directory: Path, seed: int = 0, warmup: int = 3, iterations: int = 20, *,
        device=None, timer: Timer | None = None) -> list[dict]:
    """A row per case of the folder `prepare` wrote (`device`: IREE's CUDA runtime
    unless given; `timer`: Timer(warmup, iterations) unless given)."""
    meta = json.loads((directory / MANIFEST).read_text())
    device = device or IreeDevice()
    timer = timer or Timer(warmup, iterations)
    return run_cases(manifest_cases(meta),
                     lambda case: run_case(case, directory, meta, device, timer, seed))


def _checked(r) -> str:
    variants = [v for v in PV + (PAGED,) if f"{v}_within_tolerance" in r]
    return "yes" if all(r[f"{v}_within_tolerance"] for v in variants) else "NO"


def _paged(r) -> str:
    if "paged_s" not in r:
        return "-"
    return f"{r['paged_s'] * 1e3:.2f} ({r['paged_s'] / r['int8_s']:.2f}x)"


COLUMNS = (
    Column("case", lambda r: r["case"], "---"),
    Column("B", lambda r: f"{r['batch']}"),
    Column("INT8 PV (ms)", lambda r: f"{r['int8_s'] * 1e3:.2f}"),
    Column("TFLOP/s", lambda r: f"{r['causal_flops'] / r['int8_s'] / 1e12:.1f}"),
    Column("BF16 PV (ms)", lambda r: f"{r['bf16_s'] * 1e3:.2f}"),
    Column("INT8/BF16", lambda r: f"{r['bf16_s'] / r['int8_s']:.2f}x"),
    Column(f"INT8 chunked, paged BS {BLOCK_SIZE} (ms, vs dense)", _paged),
    Column("torch SDPA bf16 (ms)", lambda r: f"{nan_or(r['torch_sdpa_bf16_s']) * 1e3:.2f}"),
    Column("vs SDPA", lambda r: f"{nan_or(r['torch_sdpa_bf16_s']) / r['int8_s']:.2f}x"),
    Column("max abs vs fragment (INT8 / BF16)",
           lambda r: f"{r['int8_max_abs_vs_fragment']:.1e} / {r['bf16_max_abs_vs_fragment']:.1e}"),
    Column("INT8 vs BF16 max abs / RMS",
           lambda r: f"{r['int8_vs_bf16_max_abs']:.2e} / {r['int8_vs_bf16_rms']:.2e}"),
    Column("checked", _checked, ":-:"),
)


def _chain_columns(rows: list[dict]) -> tuple[Column, ...]:
    """Per chain: ms / TFLOP/s and the max abs vs its own chained reference; SDPA's two."""
    variants = ["int8"] + [f"{CHAINED}{c}" for c in rows[0]["w_chains"] if c != 1]
    rate = lambda r, key: f"{r[key] * 1e3:.2f} / {r['causal_flops'] / r[key] / 1e12:.0f}"
    columns = [Column("case", lambda r: r["case"], "---")]
    for v in variants:
        columns.append(Column(f"INT8 chain {chain_of(v)} (ms / TFLOP/s)",
                              lambda r, v=v: rate(r, f"{v}_s")))
    for key, label in (("torch_sdpa_bf16_s", "SDPA default"),
                       ("torch_sdpa_flash_bf16_s", "SDPA flash")):
        columns.append(Column(f"torch {label} bf16 (ms / TFLOP/s)",
                              lambda r, key=key: rate(r, key) if r.get(key) else "-"))
    columns.append(Column("max abs vs own chained fragment ref", lambda r: " / ".join(
        f"{r[f'{v}_max_abs_vs_fragment']:.1e}" for v in variants)))
    columns.append(Column("checked", lambda r: "yes" if all(
        r[f"{v}_within_tolerance"] for v in variants) else "NO", ":-:"))
    return tuple(columns)


def markdown(rows: list[dict]) -> str:
    if rows and "w_chains" in rows[0]:
        return "\n".join(markdown_table(_chain_columns(rows), rows))
    return "\n".join(markdown_table(COLUMNS, rows))


PLOTTED = (("int8_s", "INT8 PV kernel (IREE)"), ("bf16_s", "BF16 PV twin (IREE)"),
           ("paged_s", f"INT8 chunked over the pool (BS {BLOCK_SIZE})"),
           ("torch_sdpa_bf16_s", "torch SDPA, bf16"))


def plot(rows: list[dict], path: Path) -> None:
    """TFLOP/s on the causal work per case, one bar per variant the rows timed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [(key, label) for key, label in PLOTTED if any(r.get(key) for r in rows)]
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(1.6 + 1.5 * len(rows), 4))
    for n, (key, label) in enumerate(shown):
        rates = [r["causal_flops"] / r[key] / 1e12 if r.get(key) else 0.0 for r in rows]
        ax.bar([i + (n - (len(shown) - 1) / 2) * width for i in range(len(rows))], rates,
               width, label=label)
    ax.set_xticks(range(len(rows)), [r["case"] for r in rows])
    ax.set_ylabel("TFLOP/s (causal work)")
    first = rows[0]
    ax.set_title(f"causal prefill, B={first['batch']}, Hq={first['q_heads']}, "
                 f"Hkv={first['kv_heads']}, D={first['head_dim']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _prepare(directory: Path, settings: BenchSettings) -> None:
    history = HISTORY if settings.history is None else settings.history
    new_tokens = NEW_TOKENS if settings.new_tokens is None else settings.new_tokens
    prepare(directory, list(settings.contexts), history, new_tokens, KIND.batch(settings),
            settings.q_heads, settings.kv_heads, settings.head_dim,
            bench_numerics(settings.numerics, NUMERICS), settings.w_chains)


def _run(directory: Path, settings: BenchSettings) -> list[dict]:
    return run(directory, seed=settings.seed, iterations=settings.iterations)


KIND = BenchKind("prefill", MANIFEST, module_files, _prepare, _run, markdown, plot=plot,
                 default_batch=1, flags=(("--history", "history"), ("--new-tokens", "new_tokens"),
                                         ("--numerics", "numerics"), ("--w-chain", "w_chains")),
                 query_heads_in_one_tile=False,
                 prepared_flags=(("--context", "contexts"), ("--batch", "batch"), ("--q-heads", "q_heads"),
                 ("--kv-heads", "kv_heads"), ("--head-dim", "head_dim"),
                                 ("--history", "history"), ("--new-tokens", "new_tokens"),
                                 ("--numerics", "numerics"), ("--w-chain", "w_chains")))


def main(argv=None) -> int:
    """Run modules prepared by `int8attn bench --mode prefill --prepare-only DIR`."""
    from . import arg_types
    from .bench_kinds import check_prepared
    from .cli_errors import UserError

    parser = arg_types.FlagParser(prog="python -m int8attn.bench_prefill")
    parser.add_argument("--run", type=arg_types.path_object, required=True, metavar="DIR",
                        help="a folder prepared by int8attn bench --mode prefill --prepare-only")
    parser.add_argument("--seed", type=arg_types.seed, default=0,
                        help="seed of the random data (default 0)")
    parser.add_argument("--iterations", type=arg_types.positive, default=20,
                        help="timed calls per case (default 20)")
    parser.add_argument("--json", type=arg_types.path_object,
                        help="also write the rows to this file")
    args = parser.parse_args(argv)
    try:
        check_prepared(args.run, "prefill", "--run")
    except UserError as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    rows = run(args.run, seed=args.seed, iterations=args.iterations)
    report(rows, markdown, args.json)
    return 0


if __name__ == "__main__":
    run_main(main)
