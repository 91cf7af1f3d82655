"""The bench harness (issue 23 item 7) without a GPU: the case tables, the results
writer's Markdown and JSON from fake measurements, the table of bench kinds, and each
kind's run on a fake IREE runtime (each 'module' computes the fragment reference on
the host) with a fake timer: the rows keep their keys, in order, and their checks.

The Markdown below is what the benches wrote before the harness (the same rows
through the previous per-module `markdown` functions): results files stay
reproducible."""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from int8attn import bench_cuda, bench_paged, bench_paged_cases, bench_prefill
from int8attn.bench_numerics import manifest_numerics
from int8attn.bench_harness import (
    BenchSettings, Check, Column, Timer, Timing, markdown_table, measure, output_paths, report,
    write_results)
from int8attn.bench_kinds import BENCH_KINDS, bench_kind, mode_flags
from int8attn.support.diagnostics import UsageError

REPO = Path(__file__).resolve().parent.parent

# ---- fake measurements, and the Markdown the benches wrote for them -------------------

DECODE_ROWS = [
    dict(context=4096, batch=16, q_heads=32, kv_heads=8, head_dim=128,
         int8_max_abs_vs_fragment=1.2e-6, int8_within_tolerance=True,
         int8_wall_s=9.1e-5, int8_s=4.25e-5, int8_timing="cupti kernels",
         bf16_max_abs_vs_fragment=2.5e-7, bf16_within_tolerance=True,
         int8_vs_bf16_max_abs=0.00123456, int8_vs_bf16_rms=0.0001234,
         bf16_wall_s=9.9e-5, bf16_s=5.5e-5, bf16_timing="cupti kernels",
         int8_transpose_v_max_abs_vs_fragment=1.2e-6, int8_transpose_v_within_tolerance=True,
         int8_transpose_v_wall_s=1.3e-4, int8_transpose_v_s=8.0e-5,
         int8_transpose_v_timing="cupti kernels", int8_bytes=67_305_472,
         torch_sdpa_bf16_s=1.1e-4, copy_ceiling_bytes_per_s=4.1e12),
    dict(context=8192, batch=16, q_heads=32, kv_heads=8, head_dim=128,
         int8_max_abs_vs_fragment=3.0e-6, int8_within_tolerance=False,
         int8_wall_s=1.2e-4, int8_s=1.2e-4, int8_timing="wall per call",
         bf16_max_abs_vs_fragment=2.5e-7, bf16_within_tolerance=True,
         int8_vs_bf16_max_abs=0.002, int8_vs_bf16_rms=0.0002,
         bf16_wall_s=1.5e-4, bf16_s=1.5e-4, bf16_timing="wall per call",
         int8_transpose_v_max_abs_vs_fragment=3.0e-6, int8_transpose_v_within_tolerance=True,
         int8_transpose_v_wall_s=2.0e-4, int8_transpose_v_s=2.0e-4,
         int8_transpose_v_timing="wall per call", int8_bytes=134_414_336,
         torch_sdpa_bf16_s=None, copy_ceiling_bytes_per_s=None),
]

_META = dict(q_heads=32, kv_heads=8, head_dim=128, block_size=16, q_terms=1, w_quant="s8")
PAGED_ROWS = [
    dict(case="uniform 4096", batch=16, mean_length=4096.0, max_length=4096,
         bytes_read=67_000_000, copy_ceiling_bytes_per_s=4.0e12, seed=0, **_META,
         int8_max_abs_vs_fragment=1.0e-6, int8_within_tolerance=True, int8_wall_s=9e-5,
         int8_s=4.5e-5, int8_kernels_s={"partition": 4.0e-5, "merge": 5.0e-6},
         int8_max_abs_vs_exact=3.25e-5, bf16_max_abs_vs_exact=4.0e-4,
         bf16_max_abs_vs_fragment=2.0e-7, bf16_within_tolerance=True, bf16_wall_s=9e-5,
         bf16_s=5.5e-5, bf16_kernels_s={"partition_bf16": 5.0e-5, "merge": 5.0e-6},
         torch_sdpa_bf16_padded_s=1.2e-4),
    dict(case="ragged mean 8192 (uniform [1, 16383])", batch=16, mean_length=7900.5,
         max_length=16000, bytes_read=130_000_000, copy_ceiling_bytes_per_s=4.0e12, seed=0,
         **_META, int8_max_abs_vs_fragment=1.0e-6, int8_within_tolerance=True,
         int8_wall_s=9e-5, int8_s=8.0e-5, int8_kernels_s={"partition": 7.0e-5},
         bf16_max_abs_vs_fragment=2.0e-3, bf16_within_tolerance=False, bf16_wall_s=9e-5,
         bf16_s=9.5e-5, bf16_kernels_s={}, torch_sdpa_bf16_padded_s=None),
]
PAGED_ROWS_TWO_FOLDERS = [
    dict(case="B=1 16384", batch=1, mean_length=16384.0, max_length=16384,
         bytes_read=17_000_000, copy_ceiling_bytes_per_s=4.0e12, seed=0, **_META,
         modules=folder, int8_max_abs_vs_fragment=1.0e-6, int8_within_tolerance=True,
         int8_wall_s=3e-5, int8_s=2.0e-5, int8_kernels_s={"partition": 1.5e-5, "merge": 5e-6},
         torch_sdpa_bf16_padded_s=4.0e-5)
    for folder in ("default", "merge16")]

PREFILL_ROWS = [
    dict(case="Sq=S=4096", tokens=4096, query_tokens=4096, causal_flops=4 * 128 * 32 * 8390656,
         seed=4096, batch=1, q_heads=32, kv_heads=8, head_dim=128,
         int8_max_abs_vs_fragment=2.0e-6, int8_within_tolerance=True, int8_wall_s=1.1e-3,
         int8_s=1.0e-3, int8_kernels_s={"prefill": 9.0e-4, "transpose": 1.0e-4},
         bf16_max_abs_vs_fragment=3.0e-7, bf16_within_tolerance=True, bf16_wall_s=1.3e-3,
         bf16_s=1.2e-3, bf16_kernels_s={"prefill_bf16": 1.1e-3},
         paged_max_abs_vs_fragment=2.0e-6, paged_within_tolerance=True, paged_wall_s=1.2e-3,
         paged_s=1.05e-3, paged_kernels_s={"prefill": 1.05e-3}, paged_vs_dense_max_abs=0.0,
         int8_vs_bf16_max_abs=1.5e-3, int8_vs_bf16_rms=2.5e-4, torch_sdpa_bf16_s=8.0e-4),
    dict(case="8192+512", tokens=8704, query_tokens=512, causal_flops=4 * 128 * 32 * 4325632,
         seed=8704, batch=1, q_heads=32, kv_heads=8, head_dim=128,
         int8_max_abs_vs_fragment=2.0e-6, int8_within_tolerance=True, int8_wall_s=3e-4,
         int8_s=2.5e-4, int8_kernels_s={}, bf16_max_abs_vs_fragment=3.0e-4,
         bf16_within_tolerance=False, bf16_wall_s=3e-4, bf16_s=3.0e-4, bf16_kernels_s={},
         int8_vs_bf16_max_abs=1.5e-3, int8_vs_bf16_rms=2.5e-4, torch_sdpa_bf16_s=None),
]


DECODE_MD = "\n".join([
    "Times are the device time of all kernels of one module call (CUPTI through torch.profiler): the partition and merge kernels (the query rows are quantized inside the partition kernel), plus the V transpose in that column; not the copy of the result to the host. The wall time per synchronized IREE call is in the JSON.",
    "",
    "| context | batch | INT8 PV (us) | BF16 PV (us) | INT8/BF16 speedup | + V transpose (us) | torch SDPA bf16 KV (us) | vs SDPA | achieved GB/s | copy ceiling GB/s | of ceiling | max abs vs fragment | INT8 vs BF16 max abs / RMS |",
    "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    "| 4096 | 16 | 42.5 | 55.0 | 1.29x | 80.0 | 110.0 | 2.59x | 1584 | 4100 | 39% | 1.2e-06 | 0.001235 / 0.000123 |",
    "| 8192 | 16 | 120.0 | 150.0 | 1.25x | 200.0 | nan | nanx | 1120 | nan | nan% | 3.0e-06 | 0.002000 / 0.000200 |",
])

PAGED_MD = "\n".join([
    "| case | B | INT8 PV (us) | BF16 PV (us) | INT8/BF16 | torch SDPA bf16 padded (us) | vs SDPA | GB/s read | of ceiling | max abs vs fragment (INT8 / BF16) | max abs vs exact (INT8 / BF16) | checked |",
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|",
    "| uniform 4096 | 16 | 45.0 | 55.0 | 1.22x | 120.0 | 2.67x | 1489 | 37% | 1.0e-06 / 2.0e-07 | 3.2e-05 / 4.0e-04 | yes |",
    "| ragged mean 8192 (uniform [1, 16383]) | 16 | 80.0 | 95.0 | 1.19x | nan | nanx | 1625 | 41% | 1.0e-06 / 2.0e-03 | - / - | NO |",
    "",
    "| case | merge (us) | partition (us) |",
    "|---|--:|--:|",
    "| uniform 4096 | 5.0 | 40.0 |",
    "| ragged mean 8192 (uniform [1, 16383]) | - | 70.0 |",
])

PAGED_TWO_MD = "\n".join([
    "| case | B | INT8 PV (us) | BF16 PV (us) | INT8/BF16 | torch SDPA bf16 padded (us) | vs SDPA | GB/s read | of ceiling | max abs vs fragment (INT8 / BF16) | max abs vs exact (INT8 / BF16) | checked |",
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|",
    "| default: B=1 16384 | 1 | 20.0 | - | - | 40.0 | 2.00x | 850 | 21% | 1.0e-06 / - | - / - | yes |",
    "| merge16: B=1 16384 | 1 | 20.0 | - | - | 40.0 | 2.00x | 850 | 21% | 1.0e-06 / - | - / - | yes |",
    "",
    "| case | merge (us) | partition (us) |",
    "|---|--:|--:|",
    "| default: B=1 16384 | 5.0 | 15.0 |",
    "| merge16: B=1 16384 | 5.0 | 15.0 |",
])

PREFILL_MD = "\n".join([
    "| case | B | INT8 PV (ms) | TFLOP/s | BF16 PV (ms) | INT8/BF16 | INT8 chunked, paged BS 16 (ms, vs dense) | torch SDPA bf16 (ms) | vs SDPA | max abs vs fragment (INT8 / BF16) | INT8 vs BF16 max abs / RMS | checked |",
    "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|",
    "| Sq=S=4096 | 1 | 1.00 | 137.5 | 1.20 | 1.20x | 1.05 (1.05x) | 0.80 | 0.80x | 2.0e-06 / 3.0e-07 | 1.50e-03 / 2.50e-04 | yes |",
    "| 8192+512 | 1 | 0.25 | 283.5 | 0.30 | 1.20x | - | nan | nanx | 2.0e-06 / 3.0e-04 | 1.50e-03 / 2.50e-04 | NO |",
])


@pytest.mark.parametrize("markdown, rows, expected", [
    (bench_cuda.markdown, DECODE_ROWS, DECODE_MD),
    (bench_paged.markdown, PAGED_ROWS, PAGED_MD),
    (bench_paged.markdown, PAGED_ROWS_TWO_FOLDERS, PAGED_TWO_MD),
    (bench_prefill.markdown, PREFILL_ROWS, PREFILL_MD),
], ids=["decode", "paged", "paged_two_folders", "prefill"])
def test_the_markdown_tables_are_unchanged(markdown, rows, expected):
    assert markdown(rows) == expected


def test_markdown_table_columns():
    columns = [Column("name", lambda r: r["n"], "---"), Column("x", lambda r: f"{r['x']:.1f}"),
               Column("ok", lambda r: "yes", ":-:")]
    assert markdown_table(columns, [dict(n="a", x=1), dict(n="b", x=2.25)]) == [
        "| name | x | ok |", "|---|--:|:-:|", "| a | 1.0 | yes |", "| b | 2.2 | yes |"]


def test_the_writer_writes_markdown_json_and_the_plot_where_there_is_one(tmp_path, capsys):
    prefix = str(tmp_path / "bench")
    plotted = []
    write_results(PREFILL_ROWS, bench_prefill.markdown, prefix,
                  lambda rows, path: plotted.append((rows, path)))
    assert (tmp_path / "bench.md").read_text() == PREFILL_MD + "\n"
    assert (tmp_path / "bench.json").read_text() == json.dumps(PREFILL_ROWS, indent=2)
    assert json.loads((tmp_path / "bench.json").read_text()) == PREFILL_ROWS
    assert plotted == [(PREFILL_ROWS, tmp_path / "bench.png")]
    assert capsys.readouterr().out == PREFILL_MD + "\n"
    assert output_paths(prefix, True) == [f"{prefix}.md", f"{prefix}.json", f"{prefix}.png"]
    assert output_paths(prefix, False) == [f"{prefix}.md", f"{prefix}.json"]


def test_the_writer_notes_a_missing_matplotlib(tmp_path, capsys):
    def no_matplotlib(rows, path):
        raise ImportError("matplotlib")

    write_results(DECODE_ROWS, bench_cuda.markdown, str(tmp_path / "b"), no_matplotlib)
    assert "note: no PNG written: install matplotlib" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "b.md"]


def test_report_prints_the_table_and_writes_the_rows(tmp_path, capsys):
    report(PAGED_ROWS, bench_paged.markdown, tmp_path / "rows.json")
    assert capsys.readouterr().out == PAGED_MD + "\n"
    assert json.loads((tmp_path / "rows.json").read_text()) == PAGED_ROWS


# ---- the case tables --------------------------------------------------------------------

def test_paged_cases():
    found = bench_paged_cases.cases(4, [64, 128], 100, seed=3)
    assert [c.name for c in found] == ["uniform 64", "uniform 128",
                                       "ragged mean 100 (uniform [1, 199])", "B=1 128",
                                       "key outliers, ragged [1, 9999]"]
    assert found[0].lengths == (64,) * 4 and found[3].lengths == (128,)
    outliers = found[4]
    assert outliers.data == bench_paged_cases.KEY_OUTLIERS and len(outliers.lengths) == 4
    assert all(1 <= n <= 9999 for n in outliers.lengths)
    assert {c.data for c in found[:4]} == {"gaussian"}
    ragged = found[2].lengths
    assert len(ragged) == 4 and all(1 <= n <= 199 for n in ragged)
    assert ragged == bench_paged_cases.cases(4, [64, 128], 100, seed=3)[2].lengths   # from the seed
    assert all(c.variants == ("int8", "bf16") for c in found)
    assert all(c.variants == ("int8",) for c in bench_paged_cases.cases(1, [8], 4, 0, ["int8"]))


def test_the_key_outlier_batch_is_a_per_token_quantized_cache_with_outlier_channels():
    # Same layout and dtypes as the Gaussian batch; dequantized, KEY_CHANNELS channels of
    # each KV head carry KEY_GAIN times the others' spread, every token's K and V scale is
    # its own absmax / 127 (some element hits +-127), and q is Q_GAIN times a unit normal.
    seed = 29
    print(f"seed {seed}")
    lengths, kv_heads, head_dim = [300, 1000], 2, 64
    gaussian = bench_paged_cases.batch_arrays(np.random.default_rng(seed), lengths, 8, kv_heads,
                                        head_dim, 16)
    arrays = bench_paged_cases.batch_arrays(np.random.default_rng(seed), lengths, 8, kv_heads,
                                      head_dim, 16, bench_paged_cases.KEY_OUTLIERS)
    assert [(a.shape, a.dtype) for a in arrays] == [(a.shape, a.dtype) for a in gaussian]
    q, k, k_scale, v, v_scale, tables, _ = arrays
    assert np.array_equal(tables, gaussian[5])
    for quantized, scale in ((k, k_scale), (np.swapaxes(v, -1, -2), v_scale)):
        assert (np.abs(quantized).max(axis=-1) == 127).all()
    spread = (k.astype(np.float64) * k_scale[..., None]).std(axis=(0, 2))     # [head, d]
    for head in range(kv_heads):
        ranked = np.sort(spread[head])
        outliers, others = ranked[-bench_paged_cases.KEY_CHANNELS:], ranked[:-bench_paged_cases.KEY_CHANNELS]
        assert 6 < outliers.min() / others.mean() < 10
        assert ranked[-bench_paged_cases.KEY_CHANNELS - 1] < 1.5 * others.mean()
    assert 1.3 < q.std() / 1.0 < 1.7


def test_prefill_cases_and_their_manifest_entries():
    found = bench_prefill.cases([128, 256], 100, 37)
    assert [c.manifest_entry() for c in found] == [["Sq=S=128", 128, 128],
                                                   ["Sq=S=256", 256, 256], ["100+37", 137, 37]]
    assert [c.name for c in bench_prefill.cases([128], 100, 0)] == ["Sq=S=128"]  # 0: no case
    meta = dict(cases=[c.manifest_entry() for c in found])
    assert bench_prefill.manifest_cases(meta) == found
    assert bench_prefill.module_files(meta)[:2] == ["prefill_int8_128_128.vmfb",
                                                    "prefill_bf16_128_128.vmfb"]


def test_the_prefill_benchs_pool_holds_the_dense_cache():
    # Every sequence read back through its block table (reference.sequence_cache) is
    # the dense cache it came from; the blocks sit in shuffled pool rows.
    seed = 41
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    batch, kv_heads, tokens, head_dim = 2, 3, 70, 32
    k = rng.integers(-127, 128, (batch, kv_heads, tokens, head_dim), dtype=np.int8)
    v = rng.integers(-127, 128, (batch, kv_heads, tokens, head_dim), dtype=np.int8)
    ks, vs = (rng.uniform(0.5, 1.5, (batch, kv_heads, tokens)).astype(np.float32)
              for _ in range(2))
    from int8attn.reference import sequence_cache

    pool = bench_prefill.block_pool(np.random.default_rng(seed), k, ks, v, vs, 16)
    k_cache, _, v_cache, _, tables, lengths = pool
    assert k_cache.shape == (10, kv_heads, 16, head_dim)
    assert v_cache.shape == (10, kv_heads, head_dim, 16)              # token-innermost
    assert sorted(tables.ravel().tolist()) == list(range(10))
    assert tables.ravel().tolist() != list(range(10))
    assert lengths.tolist() == [tokens] * batch
    for b in range(batch):
        back = sequence_cache(*pool, b)
        for got, want in zip(back, (k, ks, v, vs)):
            np.testing.assert_array_equal(got[0], want[b])


def test_decode_cases():
    meta = dict(contexts=[64, 100], batch=2, q_heads=4, kv_heads=2, head_dim=32)
    found = bench_cuda.cases(meta)
    assert [c.name for c in found] == ["S=64", "S=100"]
    assert found[1].shape() == (2, 4, 2, 100, 32)
    assert found[0].variants == ("int8", "bf16", "int8_transpose_v")
    assert bench_cuda.module_files(meta) == [
        f"{v}_{s}.vmfb" for s in (64, 100) for v in ("int8", "bf16", "int8_transpose_v")]


# ---- the table of bench kinds -------------------------------------------------------------

def test_the_kinds_table():
    assert list(BENCH_KINDS) == ["decode", "paged", "prefill"]
    assert {m: k.manifest for m, k in BENCH_KINDS.items()} == dict(
        decode="manifest.json", paged="paged.json", prefill="prefill.json")
    assert {m: k.batch(BenchSettings()) for m, k in BENCH_KINDS.items()} == dict(
        decode=16, paged=16, prefill=1)
    assert BENCH_KINDS["paged"].batch(BenchSettings(batch=3)) == 3
    assert [m for m, k in BENCH_KINDS.items() if k.plot] == ["decode", "prefill"]
    assert mode_flags() == {"--ragged-mean": ("ragged_mean", ("paged",)),
                            "--numerics": ("numerics", ("paged", "prefill")),
                            "--history": ("history", ("prefill",)),
                            "--new-tokens": ("new_tokens", ("prefill",)),
                            "--w-chain": ("w_chains", ("prefill",))}
    assert not BENCH_KINDS["prefill"].query_heads_in_one_tile


def test_the_kinds_table_refuses_an_unknown_mode_as_the_cli_does(capsys):
    from int8attn import cli

    assert bench_kind("paged") is BENCH_KINDS["paged"]
    with pytest.raises(UsageError) as error:
        bench_kind("encode")
    with pytest.raises(SystemExit):
        cli.main(["bench", "--mode", "encode"])
    message = "argument --mode: invalid choice: 'encode' (choose from 'decode', 'paged', " \
        "'prefill')"
    assert str(error.value) == message
    assert message in capsys.readouterr().err


def test_of_two_flags_of_other_modes_the_first_in_the_help_is_named(capsys):
    from int8attn import cli

    assert list(cli.MODE_FLAGS) == ["--history", "--new-tokens", "--ragged-mean", "--numerics",
                                    "--w-chain"]
    with pytest.raises(SystemExit):
        cli.main(["bench", "--numerics", "one-term", "--history", "5"])
    assert "--history applies to --mode prefill, not --mode decode" in capsys.readouterr().err


def test_cli_bench_dispatches_through_the_table(tmp_path, monkeypatch):
    from int8attn import cli

    import tempfile

    calls = []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(tmp_path / "modules"))
    monkeypatch.setitem(BENCH_KINDS, "prefill", replace(
        BENCH_KINDS["prefill"], prepare=lambda d, s: calls.append(("prepare", d, s)),
        run=lambda d, s: calls.append(("run", d, s)) or PREFILL_ROWS))
    assert cli.main(["bench", "--mode", "prefill", "--context", "128", "--history", "64",
                     "--q-heads", "8", "--kv-heads", "2", "--head-dim", "64",
                     "--out", str(tmp_path / "b")]) == 0
    (_, prepared, settings), (_, ran, _) = calls
    assert prepared == ran == tmp_path / "modules"
    assert settings == BenchSettings(contexts=(128,), q_heads=8, kv_heads=2, head_dim=64,
                                     history=64)
    assert (tmp_path / "b.md").read_text() == PREFILL_MD + "\n"
    # the prefill plot, where matplotlib is installed (else a note says how)
    assert (tmp_path / "b.png").exists() == (importlib.util.find_spec("matplotlib") is not None)


# ---- the timer and one variant's measurement ------------------------------------------------

class FakeCall:
    def __init__(self, value):
        self.value, self.calls = value, 0

    def __call__(self, *args):
        self.calls += 1
        return self

    def to_host(self):
        return self.value


def test_the_timer_falls_back_to_wall_time_without_kernel_times(monkeypatch):
    fn = FakeCall(np.zeros(3))
    timer = Timer(warmup=2, iterations=5)
    monkeypatch.setattr(Timer, "kernel_seconds", lambda self, f, a: (None, {}))
    timing = timer.call(fn, [])
    assert fn.calls == 7 and timing.kernel_s is None and timing.kernels == {}
    assert timing.seconds == timing.wall_s and timing.source == "wall per call"
    cupti = Timing(1e-4, 4e-5, {"k": 4e-5})
    assert cupti.seconds == 4e-5 and cupti.source == "cupti kernels"


@pytest.mark.parametrize("record, key", [("timing", "v_timing"), ("kernels", "v_kernels_s")])
def test_measure_checks_then_times(record, key):
    class FakeTimer(Timer):
        def call(self, fn, device_args):
            return Timing(2e-4, 1e-4, {"k": 1e-4})

    fn = FakeCall(np.ones(4))
    row = {}
    out = measure(row, "v", fn, [], lambda o: Check(0.5, False, dict(extra=1)), FakeTimer(),
                  record=record)
    assert list(row) == ["v_max_abs_vs_fragment", "v_within_tolerance", "extra", "v_wall_s",
                         "v_s", key]
    assert (out == 1).all() and row["v_s"] == 1e-4 and not row["v_within_tolerance"]
    assert row[key] == ("cupti kernels" if record == "timing" else {"k": 1e-4})
    with pytest.raises(ValueError):
        measure({}, "v", fn, [], lambda o: Check(0, True), FakeTimer(), record="neither")


def test_no_bench_module_imports_anothers_private_names_or_keeps_global_times():
    for path in sorted((REPO / "int8attn").glob("bench_*.py")):
        text = path.read_text()
        assert "KERNEL_SECONDS" not in text, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("int8attn"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"


# ---- each kind's run on a fake IREE runtime ---------------------------------------------------

KERNELS = {"partition": 4e-5, "merge": 5e-6}


class FakeTimer(Timer):
    def call(self, fn, device_args):
        return Timing(1e-4, 4.5e-5, dict(KERNELS))

    def copy_ceiling(self):
        return 4e12


class FakeDevice:
    """Each module file names what the module computes ('int8 1': INT8 PV, V
    token-innermost); its function returns the fragment reference (of the numerics the
    bench compiles that kind of module with; a paged module's are its folder manifest's),
    off by `error` in every 7th element."""

    def __init__(self, error=1e-6):
        self.error, self.loaded = np.float32(error), []

    def load(self, path, function):
        from int8attn.reference import ONE_TERM_NUMERICS, fragment_attention, sequence_cache

        self.loaded.append(Path(path).name)
        pv, *innermost = Path(path).read_text().split()
        numerics = {"decode": bench_cuda.NUMERICS}.get(function, ONE_TERM_NUMERICS)
        if function == "paged":
            numerics = manifest_numerics(json.loads(
                (Path(path).parent / bench_paged.MANIFEST).read_text()))

        def reference(q, k, ks, v, vs):
            return fragment_attention(q, k, ks, v, vs, float(np.float32(q.shape[-1] ** -0.5)),
                                      model="cuda", pv=pv, numerics=numerics)

        def fn(*args):
            if len(args) == 7:                  # over a pool: paged decode, chunked prefill
                q, k, ks, v, vs, tables, lengths = args
                out = np.concatenate([reference(q[b:b + 1], *sequence_cache(
                    k, ks, v, vs, tables, lengths, b)) for b in range(q.shape[0])])
            else:
                q, k, ks, v, vs = args
                if innermost == ["1"]:
                    v = np.ascontiguousarray(v.transpose(0, 1, 3, 2))
                out = reference(q, k, ks, v, vs)
            out = out.astype(np.float32)
            out.reshape(-1)[::7] += self.error
            return FakeCall(out)
        return fn

    def put(self, arrays):
        return list(arrays)


@pytest.fixture
def no_torch_baselines(monkeypatch):
    monkeypatch.setattr(bench_cuda, "torch_times", lambda arrays, timer: (1.1e-4, 4e12))
    monkeypatch.setattr(bench_paged, "sdpa_seconds", lambda arrays, timer: 1.2e-4)
    monkeypatch.setattr(bench_prefill, "sdpa_seconds", lambda arrays, timer: 8e-4)


def _variant_keys(variant, record, extra=()):
    return [f"{variant}_max_abs_vs_fragment", f"{variant}_within_tolerance", *extra,
            f"{variant}_wall_s", f"{variant}_s", f"{variant}_{record}"]


def test_decode_runs_every_context_and_variant(tmp_path, no_torch_baselines, capsys):
    meta = dict(contexts=[64, 100], batch=2, q_heads=4, kv_heads=2, head_dim=32)
    (tmp_path / "manifest.json").write_text(json.dumps(meta))
    for tokens in meta["contexts"]:
        for variant, (pv, innermost) in bench_cuda.VARIANTS.items():
            (tmp_path / f"{variant}_{tokens}.vmfb").write_text(f"{pv} {int(innermost)}")
    device = FakeDevice()
    rows = bench_cuda.run(tmp_path, device=device, timer=FakeTimer(0, 1))
    assert device.loaded == bench_cuda.module_files(meta)
    assert [r["context"] for r in rows] == [64, 100]
    assert list(rows[0]) == [
        "context", "batch", "q_heads", "kv_heads", "head_dim",
        *_variant_keys("int8", "timing"),
        *_variant_keys("bf16", "timing", ("int8_vs_bf16_max_abs", "int8_vs_bf16_rms")),
        *_variant_keys("int8_transpose_v", "timing"),
        "int8_bytes", "torch_sdpa_bf16_s", "copy_ceiling_bytes_per_s"]
    for r in rows:
        for v in bench_cuda.VARIANTS:
            assert r[f"{v}_within_tolerance"] and 5e-7 < r[f"{v}_max_abs_vs_fragment"] < 5e-5
            assert (r[f"{v}_s"], r[f"{v}_wall_s"], r[f"{v}_timing"]) == \
                (4.5e-5, 1e-4, "cupti kernels")
        assert r["int8_vs_bf16_max_abs"] > r["int8_vs_bf16_rms"] > 0
    assert rows[0]["int8_bytes"] == 2 * 2 * 2 * 64 * 32 + 2 * 2 * 2 * 64 * 4 + 2 * 2 * 4 * 32 * 4
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows


def _paged_folder(folder, **numerics):
    folder.mkdir()
    (folder / "paged.json").write_text(json.dumps(dict(
        q_heads=4, kv_heads=2, head_dim=32, block_size=16, **{"q_terms": 1, "w_quant": "s8",
                                                              **numerics})))
    for pv in bench_paged.PV:
        (folder / f"paged_{pv}.vmfb").write_text(pv)
    return folder


def test_paged_runs_every_case_and_folder(tmp_path, no_torch_baselines):
    one = _paged_folder(tmp_path / "default")
    rows = bench_paged.run(one, 2, [40, 64], 30, seed=1, device=FakeDevice(),
                           timer=FakeTimer(0, 1))
    assert [r["case"] for r in rows] == [c.name for c in bench_paged_cases.cases(2, [40, 64], 30, 1)]
    assert list(rows[0]) == [
        "case", "batch", "mean_length", "max_length", "bytes_read", "copy_ceiling_bytes_per_s",
        "seed", "q_heads", "kv_heads", "head_dim", "block_size", "q_terms", "w_quant",
        *_variant_keys("int8", "kernels_s", ("int8_max_abs_vs_exact",)),
        *_variant_keys("bf16", "kernels_s", ("bf16_max_abs_vs_exact",)),
        "torch_sdpa_bf16_padded_s"]
    assert all(r["int8_within_tolerance"] and r["bf16_within_tolerance"] for r in rows)
    assert rows[0]["int8_kernels_s"] == KERNELS and rows[3]["batch"] == 1
    # vs exact: one-term numerics' INT8 rounding on Gaussian data, far more on the outlier keys
    gaussian, outliers = rows[0]["int8_max_abs_vs_exact"], rows[-1]["int8_max_abs_vs_exact"]
    assert 1e-5 < gaussian < 1e-2 and outliers > 2 * gaussian
    two = _paged_folder(tmp_path / "other")
    rows = bench_paged.run([one, two], 2, [40], 30, seed=2, pvs=["int8"], device=FakeDevice(),
                           timer=FakeTimer(0, 1))
    assert [(r["modules"], r["case"]) for r in rows][:2] == [("default", "uniform 40"),
                                                            ("other", "uniform 40")]
    assert "bf16_s" not in rows[0] and "| default: uniform 40 |" in bench_paged.markdown(rows)
    # two folders of one name are told apart by their paths
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    same = [_paged_folder(tmp_path / "a" / "x"), _paged_folder(tmp_path / "b" / "x")]
    rows = bench_paged.run(same, 1, [16], 8, pvs=["int8"], device=FakeDevice(),
                           timer=FakeTimer(0, 1))
    assert [r["modules"] for r in rows[:2]] == [str(d) for d in same]


def test_paged_folders_of_other_numerics_are_each_checked_against_their_own(
        tmp_path, no_torch_baselines):
    # the cost of the default numerics against one-term numerics, in one process on the
    # same data
    one_term = _paged_folder(tmp_path / "one-term")
    kernel = _paged_folder(tmp_path / "kernel", q_terms=2, w_quant="u8")
    rows = bench_paged.run([one_term, kernel], 2, [40], 30, seed=4, pvs=["int8"],
                           device=FakeDevice(), timer=FakeTimer(0, 1))
    assert [(r["modules"], r["q_terms"], r["w_quant"]) for r in rows[:2]] == [
        ("one-term", 1, "s8"), ("kernel", 2, "u8")]
    assert all(r["int8_within_tolerance"] for r in rows)
    # the two numerics give different outputs: one reference for both would fail a row
    one_term_numerics = manifest_numerics(json.loads((one_term / "paged.json").read_text()))
    arrays = bench_paged_cases.batch_arrays(np.random.default_rng(0), [40, 40], 4, 2, 32, 16)
    kernel_out = FakeDevice(error=0).load(kernel / "paged_int8.vmfb", "paged")(*arrays)
    assert not bench_paged.check(kernel_out.to_host(), arrays, 32 ** -0.5, "int8",
                                 one_term_numerics).ok


def test_prefill_runs_every_case_and_a_bad_output_fails_its_check(tmp_path, no_torch_baselines):
    cases = [["Sq=S=80", 80, 80], ["50+30", 80, 30]]
    (tmp_path / "prefill.json").write_text(json.dumps(dict(
        cases=cases, batch=1, q_heads=4, kv_heads=2, head_dim=32)))
    for _, tokens, query_tokens in cases:
        for variant in bench_prefill.PV + (bench_prefill.PAGED,):
            pv = "int8" if variant == bench_prefill.PAGED else variant
            (tmp_path / f"prefill_{variant}_{tokens}_{query_tokens}.vmfb").write_text(pv)
    rows = bench_prefill.run(tmp_path, device=FakeDevice(), timer=FakeTimer(0, 1))
    assert list(rows[1]) == [
        "case", "tokens", "query_tokens", "causal_flops", "seed", "batch", "q_heads",
        "kv_heads", "head_dim", *_variant_keys("int8", "kernels_s"),
        *_variant_keys("bf16", "kernels_s"), *_variant_keys("paged", "kernels_s"),
        "paged_vs_dense_max_abs", "int8_vs_bf16_max_abs", "int8_vs_bf16_rms",
        "torch_sdpa_bf16_s"]
    assert rows[1]["causal_flops"] == 4 * 32 * 4 * bench_prefill.causal_pairs(80, 30)
    assert all(r["int8_within_tolerance"] and r["bf16_within_tolerance"]
               and r["paged_within_tolerance"] for r in rows)
    # the chunked prefill read its pool through the table: the dense output, exactly
    assert all(r["paged_vs_dense_max_abs"] == 0.0 for r in rows)
    bad = bench_prefill.run(tmp_path, device=FakeDevice(error=1e-3), timer=FakeTimer(0, 1))
    assert not any(r["int8_within_tolerance"] or r["bf16_within_tolerance"] for r in bad)
    assert "| NO |" in bench_prefill.markdown(bad)


def test_the_prefill_plot_shows_each_timed_variant(tmp_path):
    # bench --mode prefill --out PREFIX writes PREFIX.png through the kind's plot; the
    # second row timed no SDPA and no chunked prefill: those bars are left out there
    assert bench_kind("prefill").plot is bench_prefill.plot
    pytest.importorskip("matplotlib")
    path = tmp_path / "prefill.png"
    bench_prefill.plot(PREFILL_ROWS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_script_refuses_what_holds_no_rows(tmp_path, capsys):
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import plot_prefill

    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"main": PREFILL_ROWS, "made_with": "a command"}))
    for argv, why in (([str(saved)], "choose one with --key"),
                      ([str(saved), "--key", "made_with"], "holds no prefill bench rows"),
                      ([str(tmp_path / "none.json")], "cannot read rows")):
        with pytest.raises(SystemExit):
            plot_prefill.main(argv + ["--out", str(tmp_path / "x.png")])
        assert why in capsys.readouterr().err
    pytest.importorskip("matplotlib")
    assert plot_prefill.main([str(saved), "--key", "main", "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").exists()


def test_the_paged_check_grants_bf16_w_its_rounding_ties():
    # A W within BF16_TIE_ULPS of a bf16 midpoint may round either way on the GPU (its
    # exp and sums differ from the reference's by ulps): the check allows what such a
    # tie moves the output by, as tests/accuracy.py does, and not a bit more. (It
    # allowed 0, so the BF16 twin's GQA 8 key-outlier row read NO in issue 24's table.)
    from int8attn.reference import (ONE_TERM_NUMERICS, fragment_attention, rounding_tie_slack,
                                    sequence_cache)

    seed = 140
    print(f"seed {seed}")
    arrays = bench_paged_cases.batch_arrays(np.random.default_rng(seed), [3000, 700], 8, 2, 64, 16)
    q, k, ks, v, vs, tables, lengths = arrays
    scale = float(np.float32(64 ** -0.5))
    contract = dict(model="cuda", pv="bf16", numerics=ONE_TERM_NUMERICS)
    expected, slack = [], []
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lengths, b))
        expected.append(fragment_attention(*dense, scale, **contract))
        slack.append(rounding_tie_slack(*dense, scale, **contract))
    expected, slack = np.concatenate(expected), np.concatenate(slack)
    assert slack.max() > 1e-5                 # the data has ties worth a bf16 step
    within = (expected + 4.9e-5 + 0.9 * slack).astype(np.float32)
    assert bench_paged.check(within, arrays, scale, "bf16").ok
    beyond = within.copy()
    at = np.unravel_index(np.argmax(slack), slack.shape)
    beyond[at] = np.float32(expected[at] + 5e-5 + 1.2 * slack[at])
    assert not bench_paged.check(beyond, arrays, scale, "bf16").ok


def test_a_run_the_device_failed_ends_at_once(tmp_path):
    # After a failed dispatch the runtime's teardown waited on the dead CUDA context for
    # minutes (an H100): a bench's command line must end right after saying so, not in
    # its exit handlers. The stand-in handler would hold the process for a minute.
    import time

    start = time.monotonic()
    done = _run_script(tmp_path, "import atexit, time\n"
                       "from int8attn.bench_harness import run_main\n"
                       "atexit.register(time.sleep, 60)\n"
                       "def main():\n"
                       "    print('{\"case\": \"measured before\"}', flush=True)\n"
                       "    raise RuntimeError('Error invoking function: ABORTED; while invoking '\n"
                       "                       'native function hal.device.queue.dealloca')\n"
                       "run_main(main)\n")
    assert time.monotonic() - start < 30
    assert done.returncode == 1
    assert '"measured before"' in done.stdout
    assert "error: the run failed on the device" in done.stderr
    assert "ABORTED" in done.stderr and "Traceback" not in done.stderr


def test_a_bench_that_succeeds_exits_with_its_code(tmp_path):
    # a teardown that aborts, as the runtimes' did after a finished run (exit 134)
    done = _run_script(tmp_path, "import atexit, os\n"
                       "from int8attn.bench_harness import run_main\n"
                       "atexit.register(os.abort)\n"
                       "def main():\n"
                       "    print('{\"case\": \"measured\"}')\n"
                       "    return 3\n"
                       "run_main(main)\n")
    assert done.returncode == 3 and done.stderr == ""
    assert done.stdout == '{"case": "measured"}\n'     # flushed before the exit


def test_a_bench_usage_error_keeps_its_status(tmp_path):
    """argparse's exit (status 2, its message already printed) passes through run_main."""
    done = _run_script(tmp_path, "import argparse\n"
                       "from int8attn.bench_harness import run_main\n"
                       "parser = argparse.ArgumentParser(prog='bench')\n"
                       "parser.add_argument('--iterations', type=int)\n"
                       "run_main(lambda: parser.parse_args(['--iterations', 'x']) and 0)\n")
    assert done.returncode == 2
    assert "argument --iterations: invalid int value: 'x'" in done.stderr


def _run_script(tmp_path, source: str):
    """`source` run as a script in a fresh interpreter (run_main ends its process)."""
    import subprocess
    import sys

    script = tmp_path / "bench.py"
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=50)


def test_numerics_names():
    # --numerics NAME -> the numerics compiled (the old names too), and a manifest
    # written before the numerics were recorded means one-term numerics
    from int8attn.bench_numerics import CHOICES, bench_numerics, manifest_numerics
    from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS
    from int8attn.driver.options import KERNEL_TARGET_NUMERICS
    from int8attn.pipelines import PIPELINE_NUMERICS

    assert CHOICES == ("one-term", "digits", "defaults")
    assert bench_numerics(None, "one-term") == ONE_TERM_NUMERICS
    assert bench_numerics(None, "digits") == DIGIT_NUMERICS == KERNEL_TARGET_NUMERICS
    assert bench_numerics("defaults", "one-term") == PIPELINE_NUMERICS
    assert bench_numerics("seed", "digits") == ONE_TERM_NUMERICS
    assert bench_numerics("kernel", "one-term") == DIGIT_NUMERICS
    with pytest.raises(ValueError, match="one of one-term, digits, defaults"):
        bench_numerics("fast", "one-term")
    older = dict(cases=[["Sq=S=64", 64, 64]], batch=1, q_heads=2, kv_heads=1, head_dim=64)
    assert manifest_numerics(older) == ONE_TERM_NUMERICS
    assert manifest_numerics(dict(older, q_terms=2)).q_terms == 2


def test_the_old_numerics_names_are_taken_with_a_note(capsys):
    # --numerics seed / kernel still parse, as one-term / digits, with one line on stderr
    from int8attn.cli_parser import build_parser

    parser = build_parser()
    for old, new in (("seed", "one-term"), ("kernel", "digits")):
        args = parser.parse_args(["bench", "--mode", "paged", "--numerics", old])
        assert args.numerics == new
        err = capsys.readouterr().err
        assert err == f"note: --numerics {old} is deprecated; it is --numerics {new}\n"
    args = parser.parse_args(["bench", "--mode", "paged", "--numerics", "digits"])
    assert args.numerics == "digits" and capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--mode", "paged", "--numerics", "fast"])
    assert "(choose from 'one-term', 'digits', 'defaults')" in capsys.readouterr().err
