"""Bad input to the serving surfaces (`int8attn bench`, `run` / `compile` outputs,
ONNX models), tried as a user would (issue 21).

The commands run in-process through `cli.main(argv)`: an exception escaping
`main` (what a user would see as a traceback) fails the test. Misuse gives a
usage message and exit status 2; bad input (files, folders, values in them) a
named error and exit status 1. Neither writes anything, and `bench`'s checks
all come before any compilation or device work: the tests replace every bench
kind's `prepare` and `run` in the CLI's table of kinds with functions that fail the
test if called, so they hold on a machine without a GPU (and without IREE's CUDA
runtime).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from int8attn import cli
from int8attn.bench_kinds import BENCH_KINDS


def _untouched(tmp_path: Path, before: set) -> list[str]:
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")
                  if p not in before)


def _snapshot(tmp_path: Path) -> set:
    return set(tmp_path.rglob("*"))


@pytest.fixture
def no_work(monkeypatch):
    """`bench` must refuse before it compiles (prepare) or touches a device (run)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("the bench started work before its arguments were checked")

    for mode, kind in list(BENCH_KINDS.items()):
        monkeypatch.setitem(BENCH_KINDS, mode, replace(kind, prepare=forbidden, run=forbidden))


# ---- int8attn bench: misuse (usage message, exit 2) ------------------------------------

BENCH_MISUSE = {
    "context_suffix": (["--context", "4k"],
                       "argument --context: '4k' is not a positive token count; give whole "
                       "numbers of tokens separated by commas, e.g. 4096,8192 (no suffixes"),
    "context_empty_item": (["--context", "4096,,8192"],
                           "argument --context: '4096,,8192' has an empty item"),
    "context_trailing_comma": (["--context", "4096,"], "'4096,' has an empty item"),
    "context_negative": (["--context", "-4096"],
                         "argument --context: '-4096' is not a positive token count"),
    "context_zero": (["--context", "4096,0"],
                     "argument --context: '0' in '4096,0' is not a positive token count"),
    "batch_negative": (["--batch", "-2"], "argument --batch: must be a positive integer, got -2"),
    "batch_zero": (["--batch", "0"], "argument --batch: must be a positive integer, got 0"),
    "batch_text": (["--batch", "many"], "argument --batch: invalid int value: 'many'"),
    "q_heads_zero": (["--q-heads", "0"], "argument --q-heads: must be a positive integer"),
    "kv_heads_zero": (["--kv-heads", "0"], "argument --kv-heads: must be a positive integer"),
    "head_dim_zero": (["--head-dim", "0"], "argument --head-dim: must be a positive integer"),
    "iterations_zero": (["--iterations", "0"],
                        "argument --iterations: must be a positive integer, got 0"),
    "new_tokens_negative": (["--mode", "prefill", "--new-tokens", "-5"],
                            "argument --new-tokens: must be a non-negative integer, got -5"),
    "history_negative": (["--mode", "prefill", "--history", "-1"],
                         "argument --history: must be a non-negative integer, got -1"),
    "ragged_mean_zero": (["--mode", "paged", "--ragged-mean", "0"],
                         "argument --ragged-mean: must be a positive integer, got 0"),
    "mode": (["--mode", "encode"], "argument --mode: invalid choice: 'encode'"),
    "target": (["--target", "gfx936"], "argument --target: invalid choice: 'gfx936'"),
    "history_in_decode": (["--history", "100"],
                          "--history applies to --mode prefill, not --mode decode"),
    "new_tokens_in_paged": (["--mode", "paged", "--new-tokens", "8"],
                            "--new-tokens applies to --mode prefill, not --mode paged"),
    "ragged_mean_in_prefill": (["--mode", "prefill", "--ragged-mean", "100"],
                               "--ragged-mean applies to --mode paged, not --mode prefill"),
    "numerics_in_decode": (["--numerics", "defaults"],
                           "--numerics applies to --mode paged or prefill, not --mode decode"),
    "prepare_and_from": (["--prepare-only", "{tmp}/prep", "--from", "{tmp}/prep"],
                         "--prepare-only compiles the modules and --from runs compiled ones; "
                         "give one"),
    "gqa": (["--q-heads", "6", "--kv-heads", "4"],
            "--q-heads 6 is not a multiple of --kv-heads 4"),
    "rows_per_kv_head": (["--mode", "paged", "--q-heads", "64", "--kv-heads", "2"],
                         "--q-heads 64 over --kv-heads 2 is 32 query heads per KV head; the "
                         "decode kernels' MMAC tile holds 16 (raise --kv-heads)"),
    "head_dim": (["--mode", "prefill", "--head-dim", "48"],
                 "--head-dim 48 is not a multiple of 32, the K of the cuda kernels' int8 "
                 "mma.sync"),
    "context_past_int32": (["--context", "4096,99999999999"],
                           "--context (99999999999 tokens) is past the kernels' token counts, "
                           "which are int32 (at most 2147483647)"),
    "history_past_int32": (["--mode", "prefill", "--history", "2147483000", "--new-tokens",
                            "1000"], "--history plus --new-tokens (2147484000 tokens) is past"),
    "ragged_past_int32": (["--mode", "paged", "--ragged-mean", "1500000000"],
                          "--ragged-mean 1500000000's longest sequence (2999999999 tokens)"),
    "prepare_only_out": (["--prepare-only", "{tmp}/modules", "--out", "{tmp}/p"],
                         "--out applies to the run, and --prepare-only only compiles"),
    "prepare_only_iterations": (["--prepare-only", "{tmp}/modules", "--iterations", "7"],
                                "--iterations applies to the run, and --prepare-only only "
                                "compiles; give it where the modules run (int8attn bench "
                                "--from DIR --iterations ...)"),
}


@pytest.mark.parametrize("name", sorted(BENCH_MISUSE))
def test_bench_misuse_is_a_usage_error_before_any_work(name, tmp_path, capsys, no_work):
    flags, message = BENCH_MISUSE[name]
    flags = [f.format(tmp=tmp_path) for f in flags]
    if "--out" not in flags and "--prepare-only" not in flags:    # (a run's, refused there)
        flags += ["--out", str(tmp_path / "bench")]
    before = _snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "usage: int8attn bench" in err and message in err, err
    assert not _untouched(tmp_path, before)


# ---- int8attn bench: bad files and folders (a named error, exit 1) ---------------------

def _prepared(directory: Path, mode: str, *, drop: str | None = None,
              manifest: str | None = None) -> Path:
    """A folder as `--prepare-only` leaves it (modules are placeholders: never loaded)."""
    kind = BENCH_KINDS[mode]
    meta = {"decode": dict(contexts=[4096], batch=16, q_heads=32, kv_heads=8, head_dim=128),
            "paged": dict(q_heads=32, kv_heads=8, head_dim=128, block_size=16),
            "prefill": dict(cases=[["Sq=S=128", 128, 128]], batch=1, q_heads=32, kv_heads=8,
                            head_dim=128)}[mode]
    directory.mkdir()
    (directory / kind.manifest).write_text(manifest if manifest is not None
                                           else json.dumps(meta))
    for name in kind.module_files(meta):
        if name != drop:
            (directory / name).write_bytes(b"vmfb")
    return directory


def _unwritable(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    if Path("/proc/self").is_dir():   # root may write any folder, but cannot add files here
        return Path("/proc")
    pytest.skip("no folder this user cannot write to")


BENCH_BAD = {
    "from_missing": (["--from", "{tmp}/nowhere"],
                     "--from folder '{tmp}/nowhere' does not exist; prepare it with int8attn "
                     "bench --mode decode --prepare-only {tmp}/nowhere"),
    "from_missing_paged": (["--mode", "paged", "--from", "{tmp}/nowhere"],
                           "--from folder '{tmp}/nowhere' does not exist; prepare it with "
                           "int8attn bench --mode paged --prepare-only"),
    "from_missing_prefill": (["--mode", "prefill", "--from", "{tmp}/nowhere"],
                             "--from folder '{tmp}/nowhere' does not exist"),
    "from_a_file": (["--from", "{tmp}/file"],
                    "--from '{tmp}/file' is not a folder; give the folder that --prepare-only "
                    "wrote"),
    "from_other_mode": (["--mode", "paged", "--from", "{tmp}/decode"],
                        "--from folder '{tmp}/decode' has no paged.json, so no --mode paged "
                        "modules; it holds --mode decode modules (add --mode decode)"),
    "from_empty_folder": (["--mode", "prefill", "--from", "{tmp}/empty"],
                          "--from folder '{tmp}/empty' has no prefill.json, so no --mode "
                          "prefill modules; prepare it with int8attn bench --mode prefill "
                          "--prepare-only {tmp}/empty"),
    "from_damaged_manifest": (["--from", "{tmp}/damaged"],
                              "--from folder '{tmp}/damaged': manifest.json is damaged"),
    "from_missing_module": (["--mode", "paged", "--from", "{tmp}/partial"],
                            "--from folder '{tmp}/partial' lacks paged_bf16.vmfb that its "
                            "paged.json lists; prepare the folder again with --prepare-only"),
    "prepare_into_a_file": (["--prepare-only", "{tmp}/file"],
                            "--prepare-only '{tmp}/file' is a file, not a folder; give a folder "
                            "to write the modules to (it is made if missing)"),
    "prepare_under_a_file": (["--mode", "paged", "--prepare-only", "{tmp}/file/modules"],
                             "--prepare-only '{tmp}/file/modules': '{tmp}/file' is a file, so "
                             "the folder cannot be made"),
    "out_in_a_missing_folder": (["--out", "{tmp}/missing/bench"],
                                "--out {tmp}/missing/bench: output directory '{tmp}/missing' "
                                "does not exist; create it or give another path"),
    "out_is_a_folder": (["--out", "{tmp}/taken"],
                        "--out {tmp}/taken: output '{tmp}/taken.md' is a directory"),
    "out_in_an_unwritable_folder": (["--out", "{unwritable}/bench"],
                                    "--out {unwritable}/bench: cannot write "
                                    "'{unwritable}/bench.md': its directory '{unwritable}' is "
                                    "not writable"),
    "out_checked_before_from": (["--from", "{tmp}/decode", "--out", "{tmp}/missing/bench"],
                                "--out {tmp}/missing/bench: output directory"),
}


@pytest.mark.parametrize("name", sorted(BENCH_BAD))
def test_bench_bad_paths_are_named_before_any_work(name, tmp_path, capsys, no_work):
    flags, message = BENCH_BAD[name]
    (tmp_path / "file").write_text("not a folder")
    (tmp_path / "empty").mkdir()
    (tmp_path / "taken.md").mkdir()
    _prepared(tmp_path / "decode", "decode")
    _prepared(tmp_path / "partial", "paged", drop="paged_bf16.vmfb")
    _prepared(tmp_path / "damaged", "decode", manifest="{not json")
    unwritable = _unwritable(tmp_path) if "{unwritable}" in " ".join(flags) else None
    fill = lambda text: text.format(tmp=tmp_path, unwritable=unwritable)
    flags = [fill(f) for f in flags]
    if "--out" not in flags and "--prepare-only" not in flags:
        flags += ["--out", str(tmp_path / "bench")]
    before = _snapshot(tmp_path)
    assert cli.main(["bench", *flags]) == 1
    err = capsys.readouterr().err
    assert fill(message) in err, err
    assert not _untouched(tmp_path, before)
    assert not (tmp_path / "file").is_dir()


def test_bench_from_a_good_folder_gets_past_the_checks(tmp_path, capsys, monkeypatch):
    """The checks accept what --prepare-only writes: the run itself is reached."""
    ran = []
    monkeypatch.setitem(BENCH_KINDS, "paged", replace(
        BENCH_KINDS["paged"], run=lambda directory, settings: ran.append(directory) or [],
        markdown=lambda rows: "| table |"))
    directory = _prepared(tmp_path / "paged", "paged")
    assert cli.main(["bench", "--mode", "paged", "--from", str(directory), "--out",
                     str(tmp_path / "bench")]) == 0
    assert ran == [directory]
    assert (tmp_path / "bench.md").read_text() == "| table |\n"


RUNNER_BAD = {
    "paged_missing": ("bench_paged", ["--run", "{tmp}/nowhere"], 1,
                      "--run folder '{tmp}/nowhere' does not exist; prepare it with int8attn "
                      "bench --mode paged --prepare-only {tmp}/nowhere"),
    "paged_second_folder_of_other_mode": (
        "bench_paged", ["--run", "{tmp}/paged,{tmp}/decode"], 1,
        "--run folder '{tmp}/decode' has no paged.json, so no --mode paged modules; it holds "
        "--mode decode modules"),
    "paged_folders_prepared_unlike": (
        "bench_paged", ["--run", "{tmp}/paged,{tmp}/seed,{tmp}/d64"], 1,
        "--run folders '{tmp}/paged' and '{tmp}/d64' hold modules of different shapes "
        "(paged.json: head_dim 128 against 64); folders timed on the same data must be "
        "prepared for the same shapes"),
    "paged_manifest_no_object": (
        "bench_paged", ["--run", "{tmp}/paged,{tmp}/listed"], 1,
        "--run folder '{tmp}/listed': paged.json is damaged (not a JSON object but list)"),
    "paged_manifest_bad_numerics": (
        "bench_paged", ["--run", "{tmp}/q3"], 1,
        "--run folder '{tmp}/q3': paged.json is damaged (numerics q_terms=3: expected one "
        "of 1, 2)"),
    "paged_manifest_without_shape": (
        "bench_paged", ["--run", "{tmp}/shapeless"], 1,
        "paged.json is damaged (q_heads is None, not a positive integer)"),
    "paged_one_folder_twice": (
        "bench_paged", ["--run", "{tmp}/paged,{tmp}/seed,{tmp}/./paged"], 1,
        "--run folders '{tmp}/paged' and '{tmp}/paged' are one folder; give each once"),
    "paged_missing_module": ("bench_paged", ["--run", "{tmp}/partial"], 1,
                             "--run folder '{tmp}/partial' lacks paged_bf16.vmfb"),
    "paged_context_with_suffix": ("bench_paged", ["--run", "{tmp}/paged", "--contexts", "4k"],
                                  2, "'4k' is not a positive token count"),
    "paged_unknown_pv": ("bench_paged", ["--run", "{tmp}/paged", "--pv", "int4"], 2,
                         "--pv 'int4' is not one of int8, bf16"),
    "paged_zero_batch": ("bench_paged", ["--run", "{tmp}/paged", "--batch", "0"], 2,
                         "argument --batch: must be a positive integer, got 0"),
    "prefill_a_file": ("bench_prefill", ["--run", "{tmp}/file"], 1,
                       "--run '{tmp}/file' is not a folder"),
    "prefill_damaged": ("bench_prefill", ["--run", "{tmp}/damaged"], 1,
                        "--run folder '{tmp}/damaged': prefill.json is damaged"),
    "prefill_negative_seed": ("bench_prefill", ["--run", "{tmp}/paged", "--seed", "-1"], 2,
                              "argument --seed: must be a non-negative integer"),
    "prefill_empty_run": ("bench_prefill", ["--run", ""], 2,
                          "argument --run: an empty path names no file"),
    "paged_empty_json": ("bench_paged", ["--run", "{tmp}/paged", "--json", ""], 2,
                         "argument --json: an empty path names no file"),
    "paged_empty_folder_in_list": ("bench_paged", ["--run", "{tmp}/paged,"], 2,
                                   "--run '{tmp}/paged,' has an empty folder name"),
}


@pytest.mark.parametrize("name", sorted(RUNNER_BAD))
def test_bench_runners_name_bad_folders_and_flags(name, tmp_path, capsys, monkeypatch):
    """`python -m int8attn.bench_paged / bench_prefill --run DIR` (the GPU machine's
    runners, docs/benchmarks.md) check their folders as `--from` does and their flags as `int8attn
    bench` does: a message and exit 1 or 2, never a traceback, before any device."""
    import importlib

    module, flags, status, message = RUNNER_BAD[name]
    runner = importlib.import_module(f"int8attn.{module}")
    monkeypatch.setattr(runner, "run", lambda *a, **k: pytest.fail("the run was reached"))
    (tmp_path / "file").write_text("not a folder")
    _prepared(tmp_path / "paged", "paged")
    _prepared(tmp_path / "decode", "decode")
    _prepared(tmp_path / "partial", "paged", drop="paged_bf16.vmfb")
    _prepared(tmp_path / "seed", "paged", manifest=json.dumps(dict(
        q_heads=32, kv_heads=8, head_dim=128, block_size=16, q_terms=1)))
    _prepared(tmp_path / "d64", "paged", manifest=json.dumps(dict(
        q_heads=32, kv_heads=8, head_dim=64, block_size=16)))
    _prepared(tmp_path / "listed", "paged", manifest="[1, 2]")
    _prepared(tmp_path / "q3", "paged", manifest=json.dumps(dict(
        q_heads=32, kv_heads=8, head_dim=128, block_size=16, q_terms=3)))
    _prepared(tmp_path / "shapeless", "paged", manifest=json.dumps(dict(q_terms=2)))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "prefill.json").write_text("{not json")
    with pytest.raises(SystemExit) as exit_:
        runner.main([flag.format(tmp=tmp_path) for flag in flags])
    assert exit_.value.code == status
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err, err
    assert "Traceback" not in err



@pytest.mark.parametrize("mode, flags", [
    ("paged", ["--head-dim", "64"]), ("paged", ["--numerics", "one-term"]),
    ("decode", ["--context", "4096"]), ("decode", ["--q-heads", "32"]),
    ("prefill", ["--history", "1024"]), ("prefill", ["--batch", "2"]),
    ("prefill", ["--numerics", "one-term"])])
def test_bench_from_refuses_the_flags_its_modules_fix(mode, flags, tmp_path, capsys,
                                                      monkeypatch):
    """A prepared folder's modules were compiled for its manifest's shape: a shape flag
    given with --from would be ignored, so it is refused (even at the manifest's value)."""
    monkeypatch.setitem(BENCH_KINDS, mode, replace(
        BENCH_KINDS[mode], run=lambda *a: pytest.fail("ran despite the flag")))
    directory = _prepared(tmp_path / mode, mode)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", "--mode", mode, "--from", str(directory), *flags])
    assert exit_.value.code == 2
    assert f"{flags[0]} is fixed by the modules in --from" in capsys.readouterr().err


def test_bench_from_takes_the_run_time_flags_and_passes_the_seed(tmp_path, monkeypatch):
    """paged draws its batch and lengths at run time: --batch, --context apply; every
    mode's data comes from --seed (decode dropped it)."""
    import int8attn.bench_cuda as bench_cuda

    seen = {}
    monkeypatch.setattr(bench_cuda, "run",
                        lambda directory, iterations, seed: seen.update(seed=seed) or [])
    monkeypatch.setitem(BENCH_KINDS, "decode", replace(BENCH_KINDS["decode"],
                                                       markdown=lambda rows: "|"))
    monkeypatch.setitem(BENCH_KINDS, "paged", replace(
        BENCH_KINDS["paged"], run=lambda d, settings: seen.update(paged=settings) or [],
        markdown=lambda rows: "|"))
    decode = _prepared(tmp_path / "decode", "decode")
    assert cli.main(["bench", "--mode", "decode", "--from", str(decode), "--seed", "7",
                     "--out", str(tmp_path / "d")]) == 0
    assert seen["seed"] == 7
    paged = _prepared(tmp_path / "paged", "paged")
    assert cli.main(["bench", "--mode", "paged", "--from", str(paged), "--batch", "4",
                     "--context", "2048", "--out", str(tmp_path / "p")]) == 0
    assert seen["paged"].batch == 4 and seen["paged"].contexts == (2048,)


# ---- int8attn run / compile: output paths ---------------------------------------------

GRAPH = """func.func @decode(%q: tensor<1x4x32xf32>, %k: tensor<1x2x40x32xi8>, %ks: tensor<1x2x40xf32>, %v: tensor<1x2x40x32xi8>, %vs: tensor<1x2x40xf32>) -> tensor<1x4x32xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x32xf32>, tensor<1x2x40x32xi8>, tensor<1x2x40xf32>, tensor<1x2x40x32xi8>, tensor<1x2x40xf32>) -> tensor<1x4x32xf32>
  return %o : tensor<1x4x32xf32>
}
"""

OUTPUT_PATHS = {
    "new_folder": ("{tmp}/newdir/", "output '{tmp}/newdir/' ends in '/', so it names a folder, "
                                    "and there is no such folder; give a file path"),
    "existing_folder": ("{tmp}/results", "output '{tmp}/results' is a directory; give a file path"),
    "existing_folder_slash": ("{tmp}/results/",
                              "output '{tmp}/results/' is a directory; give a file path"),
    "missing_parent": ("{tmp}/missing/out.npz",
                       "output directory '{tmp}/missing' does not exist; create it or give "
                       "another path"),
    # the graph file on the way: said to be a file, not a folder that does not exist
    "parent_is_a_file": ("{tmp}/decode.mlir/out.npz",
                         "cannot write '{tmp}/decode.mlir/out.npz': '{tmp}/decode.mlir' is a "
                         "file, not a directory, so it cannot hold the output; give a path "
                         "in a folder"),
    "grandparent_is_a_file": ("{tmp}/decode.mlir/x/out.npz",
                              "'{tmp}/decode.mlir' is a file, not a directory"),
}


EMPTY_PATHS = {
    "run_output": ["run", "{graph}", "--seed", "0", "--output", ""],
    "run_inputs": ["run", "{graph}", "--inputs", ""],
    "run_graph": ["run", ""],
    "compile_output": ["compile", "{graph}", "-o", ""],
    "bench_out": ["bench", "--out", ""],
    "bench_prepare_only": ["bench", "--prepare-only", ""],
    "bench_from": ["bench", "--from", ""],
}


@pytest.mark.parametrize("name", sorted(EMPTY_PATHS))
def test_an_empty_path_is_a_usage_error_not_a_flag_left_out(name, tmp_path, capsys, no_work):
    # argparse keeps "" as given; read as "not given" it would run with random inputs,
    # write no output, or write bench files into the current folder
    graph = tmp_path / "decode.mlir"
    graph.write_text(GRAPH)
    args = [a.format(graph=graph) for a in EMPTY_PATHS[name]]
    with pytest.raises(SystemExit) as exit_:
        cli.main(args)
    assert exit_.value.code == 2
    assert "an empty path names no file; give a file name" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode.mlir"]


def test_opt_refuses_an_empty_output_path(tmp_path, capsys):
    from int8attn import opt

    graph = tmp_path / "decode.mlir"
    graph.write_text(GRAPH)
    with pytest.raises(SystemExit) as exit_:
        opt.main([str(graph), "-p", "int8-qk", "-o", ""])
    assert exit_.value.code == 2
    assert "argument -o/--output: an empty path names no file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "compile"])
@pytest.mark.parametrize("name", sorted(OUTPUT_PATHS))
def test_an_output_that_cannot_be_a_file_is_refused_first(command, name, tmp_path, capsys,
                                                          monkeypatch):
    import int8attn.api as api
    import int8attn.driver.compile as driver

    def forbidden(*args, **kwargs):
        raise AssertionError("compiled before the output path was checked")

    # both names of the driver: the API binds its own at import (imported above, so
    # that the binding it keeps after this test is the real one)
    monkeypatch.setattr(driver, "compile", forbidden)
    monkeypatch.setattr(api, "compile_stages", forbidden)
    path, message = OUTPUT_PATHS[name]
    graph = tmp_path / "decode.mlir"
    graph.write_text(GRAPH)
    (tmp_path / "results").mkdir()
    output = path.format(tmp=tmp_path)
    flag = ["--output", output, "--seed", "0"] if command == "run" else ["-o", output]
    before = _snapshot(tmp_path)
    assert cli.main([command, str(graph), *flag]) == 1
    err = capsys.readouterr().err
    assert message.format(tmp=tmp_path) in err, err
    assert not _untouched(tmp_path, before)
    assert not (tmp_path / "newdir").exists() and not list((tmp_path / "results").iterdir())


# ---- ONNX models -----------------------------------------------------------------------

def _onnx():
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return onnx


@pytest.fixture(scope="module")
def decode_model(tmp_path_factory):
    """decode_gqa (raised) and its inputs by ONNX name, seed 3."""
    _onnx()
    from int8attn.reference.onnx_attention import attention_inputs, attention_model

    directory = tmp_path_factory.mktemp("onnx")
    proto = attention_model("decode_gqa")
    (directory / "decode.onnx").write_bytes(proto.SerializeToString())
    return directory / "decode.onnx", attention_inputs(proto, 3)


BAD_SCALES = {
    "k_nan": ("k_scale", (0, 1, 3), np.nan, "argument 2 (k_scale, arg2) of @decode_gqa holds "
                                            "NaN at [0, 1, 3] (1 of 16)"),
    "k_inf": ("k_scale", (0, 0, 7), np.inf, "argument 2 (k_scale, arg2) of @decode_gqa holds "
                                            "Inf at [0, 0, 7] (1 of 16)"),
    "v_negative": ("v_scale", (0, 1, 0), -0.5, "argument 4 (v_scale, arg4) of @decode_gqa "
                                               "holds a negative value at [0, 1, 0] (1 of 16)"),
    "v_minus_inf": ("v_scale", (0, 0, 0), -np.inf, "argument 4 (v_scale, arg4) of @decode_gqa "
                                                   "holds Inf at [0, 0, 0]"),
}


@pytest.mark.parametrize("name", sorted(BAD_SCALES))
def test_an_onnx_models_cache_scales_are_checked(name, decode_model, tmp_path, capsys):
    path, inputs = decode_model
    scale, where, value, message = BAD_SCALES[name]
    bad = {k: a.copy() for k, a in inputs.items()}
    bad[scale][where] = value
    np.savez(tmp_path / "bad.npz", **bad)
    before = _snapshot(tmp_path)
    assert cli.main(["run", str(path), "--inputs", str(tmp_path / "bad.npz"), "--output",
                     str(tmp_path / "out.npz")]) == 1
    err = capsys.readouterr().err
    assert message in err and "must be finite and >= 0" in err, err
    assert not _untouched(tmp_path, before)


def test_the_api_checks_an_onnx_models_cache_scales_too(decode_model):
    import int8attn
    from int8attn.runtime.module import InputError

    path, inputs = decode_model
    graph = int8attn.compile_file(path)
    assert graph.entry().scale_arguments == (2, 4)
    arrays = [inputs[name].copy() for name in graph.entry().argument_names]
    arrays[4][0, 1, 2] = np.nan
    with pytest.raises(InputError, match=r"argument 4 \(v_scale, arg4\) of @decode_gqa holds NaN"):
        graph(*arrays)


def _save_with_external_data(onnx, model, path: Path, location: str = "weights.bin") -> None:
    # Tensors of 1 KiB and more go to the data file (onnx's default threshold; the small
    # shape constants stay inline, where onnxruntime's shape inference reads them).
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=1024)


def test_a_model_with_external_data_runs_from_another_folder(tmp_path, monkeypatch, capsys):
    """The weights live in a file beside the model and the command runs elsewhere: the
    result is the inline model's bit for bit, and onnxruntime's (reading the model
    from its path) up to the INT8 contract's own error (tests/test_onnx_import.py)."""
    onnx = _onnx()
    import onnxruntime

    from int8attn.reference.onnx_decoder import (
        DecoderShape, around_attention, contract_attention, decoder_inputs, decoder_model)

    shape, weights_seed = DecoderShape(query_tokens=1), 7
    model = decoder_model(shape, weights_seed, expose_attention=True)
    inputs = decoder_inputs(shape, 11)
    inline = tmp_path / "inline.onnx"
    inline.write_bytes(model.SerializeToString())
    (tmp_path / "model").mkdir()
    external = tmp_path / "model" / "decoder.onnx"
    _save_with_external_data(onnx, model, external)   # (moves model's tensors out)
    assert external.stat().st_size < 100_000 < (tmp_path / "model" / "weights.bin").stat().st_size
    np.savez(tmp_path / "inputs.npz", **inputs)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    for path, out in ((external, "external.npz"), (inline, "inline.npz")):
        assert cli.main(["run", str(path), "--inputs", str(tmp_path / "inputs.npz"),
                         "--output", str(tmp_path / out)]) == 0
        assert "[Passed] raise-int8-attention" in capsys.readouterr().err
    with np.load(tmp_path / "external.npz") as a, np.load(tmp_path / "inline.npz") as b:
        assert a.files == b.files
        outputs = {name: a[name] for name in a.files}
        for name in a.files:
            np.testing.assert_array_equal(outputs[name], b[name])
    session = onnxruntime.InferenceSession(str(external), providers=["CPUExecutionProvider"])
    expected = session.run(["y"], inputs)[0]
    fragment, slack = contract_attention(outputs, 0)
    assert (np.abs(outputs["attention_0"] - fragment) <= 5e-5 + slack).all()
    contract = around_attention(shape, weights_seed, inputs,
                                lambda out, layer: contract_attention(out, layer)[0])["y"]
    quantization, error = np.abs(contract - expected).max(), np.abs(outputs["y"] - expected).max()
    print(f"max |y - onnxruntime| {error:.3e}, the contract's own error {quantization:.3e}")
    assert 0 < quantization and error <= 1.25 * quantization + 1e-4


def _external_model(onnx, directory: Path) -> Path:
    """decode_gqa followed by a projection whose weight is external data."""
    from onnx import TensorProto, helper, numpy_helper

    from int8attn.reference.onnx_attention import attention_model

    model = attention_model("decode_gqa")
    weight = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(weight, "W"))
    model.graph.node.append(helper.make_node("MatMul", ["o", "W"], ["y"], name="projection"))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                 [1, 4, 1, 16]))
    directory.mkdir()
    _save_with_external_data(onnx, model, directory / "m.onnx")
    return directory / "m.onnx"


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


BAD_MODELS = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:300]),
                  "error: {model} is not an ONNX model (protobuf: Error parsing message"),
    # Two bytes parse as a model of nothing but its IR version.
    "truncated_to_its_header": (lambda p: p.write_bytes(p.read_bytes()[:2]),
                                "error: {model} holds no ONNX graph (no nodes; an empty or "
                                "truncated file?); export it again with onnx.save"),
    "empty": (lambda p: p.write_bytes(b""), "error: {model} holds no ONNX graph (no nodes"),
    "external_data_missing": (lambda p: (p.parent / "weights.bin").unlink(),
                              "error: ONNX model '{model}' keeps tensor 'W' in the external data "
                              "file 'weights.bin', but '{folder}/weights.bin' does not exist; "
                              "put the data file beside the model"),
    "external_data_truncated": (lambda p: _truncate(p.parent / "weights.bin"),
                                "error: ONNX model '{model}': cannot read tensor 'W' from its "
                                "external data file '{folder}/weights.bin': External data length "
                                "(1024) exceeds available data (100 bytes"),
    "external_data_a_folder": (lambda p: ((p.parent / "weights.bin").unlink(),
                                          (p.parent / "weights.bin").mkdir()),
                               "keeps tensor 'W' in the external data file 'weights.bin', but "
                               "'{folder}/weights.bin' is not a file"),
}


@pytest.mark.parametrize("command", ["run", "compile"])
@pytest.mark.parametrize("name", sorted(BAD_MODELS))
def test_bad_model_files_are_named(command, name, tmp_path, capsys):
    onnx = _onnx()
    damage, message = BAD_MODELS[name]
    model = _external_model(onnx, tmp_path / "model")
    damage(model)
    out = tmp_path / ("out.npz" if command == "run" else "out.vmfb")
    flags = ["--seed", "0", "--output", str(out)] if command == "run" else ["-o", str(out)]
    before = _snapshot(tmp_path)
    assert cli.main([command, str(model), *flags]) == 1
    err = capsys.readouterr().err
    assert message.format(model=model, folder=model.parent) in err, err
    assert not _untouched(tmp_path, before)


def test_model_bytes_without_their_external_data_are_named(tmp_path):
    import int8attn
    from int8attn.driver.onnx_import import ModelError

    model = _external_model(_onnx(), tmp_path / "model")
    with pytest.raises(ModelError, match="m.onnx keeps tensor 'W' in the external data file "
                                         "'weights.bin', which the model's bytes do not carry; "
                                         r"compile the model's file \(int8attn.compile_file"):
        int8attn.compile(model.read_bytes(), filename="m.onnx")
    assert int8attn.compile_file(model).remarks   # the file: its data read beside it


# What int8attn does not raise runs in float through IREE (docs/cli.md, *ONNX models*),
# with a remark naming the reason: not an error. A dynamic shape has no random inputs.
NOT_RAISED = {
    "float_cache": ("K is not dequantized from int8 (Cast(int8) × a scale per token): it "
                    "comes from a function argument; IREE compiles this attention in float"),
    "per_tensor": "K has one scale for the whole tensor",
}


@pytest.mark.parametrize("form", sorted(NOT_RAISED))
def test_attention_that_is_not_raised_is_said_and_runs_in_float(form, tmp_path, capsys):
    _onnx()
    from int8attn.reference.onnx_attention import attention_model

    path = tmp_path / f"{form}.onnx"
    path.write_bytes(attention_model(form).SerializeToString())
    assert cli.main(["run", str(path), "--seed", "0"]) == 0
    captured = capsys.readouterr()
    assert f"{path}: node 'softmax': remark: [Missed] raise-int8-attention: not raised: " \
        f"{NOT_RAISED[form]}" in captured.err
    line = next(l for l in captured.out.splitlines() if l.strip().startswith("o "))
    assert float(line.split()[1]) < 1e-4   # IREE's float attention: f32 rounding


def test_a_model_without_attention_is_said_and_runs(tmp_path, capsys):
    onnx = _onnx()
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "mlp",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path = tmp_path / "mlp.onnx"
    onnx.save(model, str(path))
    assert cli.main(["run", str(path), "--seed", "0"]) == 0
    captured = capsys.readouterr()
    assert "remark: [Missed] raise-int8-attention: no attention (no onnx.Softmax or " \
        "onnx.Attention) in @mlp; IREE compiles the whole graph" in captured.err
    assert "y                         0.000e+00" in captured.out


def test_a_model_with_dynamic_dims_needs_inputs(tmp_path, capsys):
    onnx = _onnx()
    from int8attn.reference.onnx_attention import attention_inputs, attention_model

    model = attention_model("decode_gqa")
    inputs = attention_inputs(model, 3)   # batch 1
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, str(path))
    before = _snapshot(tmp_path)
    assert cli.main(["run", str(path), "--seed", "0", "--output", str(tmp_path / "o.npz")]) == 1
    err = capsys.readouterr().err
    assert "not raised: the scores are not a static 4-d tensor [B, H, Sq, S]: [None, 4, 1, 8]" \
        in err
    assert "error: input 'q' of @decode_gqa has a dynamic shape (tensor<?x4x1x16xf32>); pass " \
        "--inputs" in err
    assert not _untouched(tmp_path, before)
    np.savez(tmp_path / "inputs.npz", **inputs)
    assert cli.main(["run", str(path), "--inputs", str(tmp_path / "inputs.npz")]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("o "))
    assert float(line.split()[1]) < 1e-4   # in float through IREE
