"""benchmarks/cpu_bench.py: the --quick smoke end to end (every method checked, timed and
tabled), a wrong output refused before timing, and bad flags named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import cpu_bench  # noqa: E402  (benchmarks/cpu_bench.py)


def test_quick_run_end_to_end(tmp_path):
    rows, table = tmp_path / "rows.json", tmp_path / "table.md"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "cpu_bench.py"), "--quick",
                          "--threads", "1", "--json", str(rows), "--md", str(table)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "sample 2/2" in run.stderr and "seed 0" in run.stderr     # progress on stderr
    result = json.loads(rows.read_text())
    assert [r["case"] for r in result["rows"]] == list(cpu_bench.QUICK_CASES)
    assert result["settings"]["samples"] == cpu_bench.QUICK_SAMPLES == 2
    assert result["machine"]["threads"] == 1
    for row in result["rows"]:
        assert set(row["methods"]) == set(cpu_bench.METHODS)
        for method, value in row["methods"].items():
            assert len(value["times_ms"]) == 2 and all(t > 0 for t in value["times_ms"])
            assert value["min_ms"] == min(value["times_ms"])
            if method != "floor":
                assert value["relative_error"] <= cpu_bench.TOLERANCE[method]
        # aligned numpy arrays: the INT8 caches read in place; q (and, in these tiny shapes,
        # scales of as many f32s) copied, as a result may be computed in their buffers
        # (runtime.module.result_aliases)
        copied = [c["argument"] for c in row["api_copies"]]
        assert 0 in copied and 1 not in copied and 3 not in copied, row["api_copies"]
        assert all("a result of its type" in c["why"] for c in row["api_copies"])
        assert row["copy_bandwidth_gb_s"] > 0
        assert row["ratios"]["kernel_over_floor"] == pytest.approx(
            row["methods"]["kernel"]["min_ms"] / row["methods"]["floor"]["min_ms"])
    text = table.read_text()
    assert text in run.stdout
    header = next(line for line in text.splitlines() if line.startswith("| case |"))
    assert [c.strip() for c in header.strip("|").split("|")] == \
        ["case"] + [cpu_bench.LABELS[m] for m in cpu_bench.METHODS]
    for case in cpu_bench.QUICK_CASES.values():
        assert sum(line.startswith(f"| {case.title()} |") for line in text.splitlines()) == 3


def test_a_wrong_output_is_not_timed(monkeypatch, capsys):
    """The API call returning zeros (of the right shape): the check before timing stops
    the bench, naming the method, and nothing is timed or written."""
    import int8attn.api

    monkeypatch.setattr(int8attn.api.CompiledGraph, "__call__",
                        lambda self, *arrays, **kw: np.zeros(arrays[0].shape, np.float32))
    monkeypatch.setattr(cpu_bench, "set_threads", lambda threads: None)   # this process's
    timed = []
    monkeypatch.setattr(cpu_bench.Evictor, "evict", lambda self: timed.append(1))
    assert cpu_bench.main(["--quick", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert "int8attn API's output is" in err and "a wrong output, not timed" in err
    assert "sample 1/" not in err and not timed


def test_a_kernel_off_by_a_little_is_caught():
    exact = np.random.default_rng(0).standard_normal((2, 8, 64))
    off = exact.copy()
    off[1, 3, 5] += 3e-3 * np.abs(exact).max()         # beyond the int8 methods' 2e-3
    with pytest.raises(cpu_bench.BenchError, match="int8attn kernel only"):
        cpu_bench.check("c", "kernel", off.astype(np.float32), exact)
    assert cpu_bench.check("c", "torch_bf16", off.astype(np.float32), exact)[
        "relative_error"] == pytest.approx(3e-3, rel=1e-3)
    nan = exact.astype(np.float32)
    nan[0, 0, 0] = np.nan
    with pytest.raises(cpu_bench.BenchError, match="a wrong output"):
        cpu_bench.check("c", "api", nan, exact)


@pytest.mark.parametrize("flags, message", [
    (["--cases", "decode-b1-s2k"], "unknown case decode-b1-s2k; cases: decode-b1-s1k"),
    (["--samples", "0"], "--samples 0: give at least 1"),
    (["--threads", "0"], "--threads 0: give a positive thread count"),
    (["--quick", "--cases", "decode-b1-s1k"], "give --cases or --quick, not both"),
])
def test_bad_flags_are_named(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        cpu_bench.parse(flags)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_l3_size_text():
    assert cpu_bench._size_bytes("266240K\n") == 266240 << 10
    assert cpu_bench._size_bytes(" 32 MiB") == 32 << 20
    assert cpu_bench._size_bytes("1048576") == 1 << 20
