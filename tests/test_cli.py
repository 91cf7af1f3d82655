"""The int8attn and int8attn-opt commands, as a user runs them."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import decode_inputs
from int8attn.driver.graph import decode_graph

BIN = Path(sys.executable).parent


def run(*args, check_rc=None, stdin=None):
    tool = shutil.which(args[0], path=str(BIN)) or shutil.which(args[0])
    assert tool, f"{args[0]} is not installed"
    proc = subprocess.run([tool, *map(str, args[1:])], capture_output=True, text=True,
                          input=stdin, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    if check_rc is not None:
        assert proc.returncode == check_rc, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    path = tmp_path_factory.mktemp("graphs") / "decode.mlir"
    path.write_text(decode_graph(1, 8, 2, 1000, 64))
    return path


@pytest.fixture(scope="module")
def inputs(graph):
    arrays = decode_inputs(31, 1, 8, 2, 1000, 64)
    path = graph.parent / "inputs.npz"
    np.savez(path, **{f"arg{i}": a for i, a in enumerate(arrays)})
    return path, arrays


def test_compile_writes_a_module_that_iree_run_module_runs(graph, inputs, tmp_path):
    vmfb = tmp_path / "decode.vmfb"
    run("int8attn", "compile", graph, "--target", "cpu", "-o", vmfb, check_rc=0)
    _, arrays = inputs
    flags = []
    for i, array in enumerate(arrays):
        np.save(tmp_path / f"a{i}.npy", array)
        flags.append(f"--input=@{tmp_path / f'a{i}.npy'}")
    result = tmp_path / "out.npy"
    run("iree-run-module", f"--module={vmfb}", "--device=local-task", "--function=decode",
        *flags, f"--output=@{result}", check_rc=0)
    import int8attn

    expected = int8attn.compile(graph.read_text(), filename=str(graph))(*arrays)
    assert np.array_equal(np.load(result), expected)


def test_compile_emit_linalg_leaves_standard_dialects(graph, tmp_path):
    out = tmp_path / "decode.linalg.mlir"
    run("int8attn", "compile", graph, "--emit", "linalg", "-o", out, check_rc=0)
    text = out.read_text()
    assert "int8attn." not in text and "linalg.generic" in text


def test_run_with_inputs_writes_results(graph, inputs, tmp_path):
    path, arrays = inputs
    out = tmp_path / "out.npz"
    proc = run("int8attn", "run", graph, "--inputs", path, "--output", out, "--pv", "bf16",
               check_rc=0)
    assert "wrote" in proc.stdout
    import int8attn

    expected = int8attn.compile(graph.read_text(), filename=str(graph), pv="bf16")(*arrays)
    with np.load(out) as results:
        assert list(results.files) == ["result0"]
        assert np.array_equal(results["result0"], expected)


def test_run_without_inputs_reports_accuracy_from_a_printed_seed(graph):
    first = run("int8attn", "run", graph, check_rc=0).stdout
    seed = re.search(r"seed (\d+)", first).group(1)
    again = run("int8attn", "run", graph, "--seed", seed, check_rc=0).stdout
    errors = lambda text: re.findall(r"max abs ([0-9.e+-]+)\s+rms ([0-9.e+-]+)", text)
    assert errors(first) == errors(again) and len(errors(first)) == 2
    (exact_max, _), (fragment_max, _) = [(float(a), float(b)) for a, b in errors(first)]
    assert fragment_max <= 5e-5
    # the cpu defaults (two-term Q, two-term u8 W) leave a few 1e-6 vs exact
    assert 1e-7 < exact_max < 2e-2
    assert "cached module" in again


def test_no_cache_recompiles(graph):
    assert "compiled in" in run("int8attn", "run", graph, "--seed", "1", "--no-cache",
                                check_rc=0).stdout


@pytest.mark.parametrize("mutate, message", [
    (lambda a: a.pop("arg3"), "has no array 'arg3' for argument 3"),
    (lambda a: a.update(arg1=a["arg1"].astype(np.int32)), "argument 1 (k, arg1) of @decode must be int8"),
    (lambda a: a.update(arg0=a["arg0"][:, :4]), "must have shape [1, 8, 64]"),
    (lambda a: a["arg4"].__setitem__((0, 0, 5), np.nan),
     "argument 4 (v_scale, arg4) of @decode holds NaN at [0, 0, 5] (1 of 2000)"),
    (lambda a: a["arg2"].__setitem__((0, 1, 7), -np.inf),
     "argument 2 (k_scale, arg2) of @decode holds Inf at [0, 1, 7] (1 of 2000)"),
    (lambda a: a["arg2"].__setitem__((0, 1, 9), -0.5),
     "argument 2 (k_scale, arg2) of @decode holds a negative value at [0, 1, 9]"),
    (lambda a: a.update(extra=np.zeros(3)), "arrays extra that are not arguments"),
    # q is checked before the note on its non-finite rows reads it
    (lambda a: a.update(arg0=np.zeros((1, 8, 0), np.float32)),
     "argument 0 (q, arg0) of @decode must have shape [1, 8, 64] for tensor<1x8x64xf32>, got "
     "[1, 8, 0]"),
    (lambda a: a.update(arg0=np.full((64,), np.nan, np.float32)), "got [64]"),
    (lambda a: a.update(arg0=np.array(["a"] * 512).reshape(1, 8, 64)),
     "argument 0 (q, arg0) of @decode must be float32"),
    (lambda a: a.update(arg0=np.zeros((1, 8, 64), [("x", "f4")])), "must be float32"),
])
def test_bad_inputs_are_named_and_no_output_is_written(graph, inputs, tmp_path, mutate, message):
    _, arrays = inputs
    bad = {f"arg{i}": a.copy() for i, a in enumerate(arrays)}
    mutate(bad)
    path = tmp_path / "bad.npz"
    np.savez(path, **bad)
    out = tmp_path / "out.npz"
    proc = run("int8attn", "run", graph, "--inputs", path, "--output", out, check_rc=1)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and "note:" not in proc.stderr
    assert not out.exists()
    assert not list(tmp_path.glob("*.partial"))


def test_inputs_that_are_not_an_npz_of_arrays(graph, inputs, tmp_path):
    _, arrays = inputs
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, **{f"arg{i}": a for i, a in enumerate(arrays)
                         if i}, arg0=np.array([{"q": 1}], dtype=object))
    single, text = tmp_path / "q.npy", tmp_path / "q.npz"
    np.save(single, arrays[0])
    text.write_text("arg0 = 1\n")
    for path, message in ((pickled, "array 'arg0' of inputs file '{}' cannot be read without pickle"),
                          (single, "inputs file '{}' holds a single array (.npy), not an .npz"),
                          (text, "inputs file '{}' is not an .npz archive"),
                          (tmp_path, "inputs file '{}' is a directory")):
        assert message.format(path) in run("int8attn", "run", graph, "--inputs", path,
                                           check_rc=1).stderr


def test_nonfinite_q_rows_give_nan_rows_and_a_note(graph, inputs, tmp_path):
    _, arrays = inputs
    q = arrays[0].copy()
    q[0, 3, 10] = np.nan
    path, out = tmp_path / "nan_q.npz", tmp_path / "out.npz"
    np.savez(path, **{f"arg{i}": a for i, a in enumerate([q, *arrays[1:]])})
    proc = run("int8attn", "run", graph, "--inputs", path, "--output", out, check_rc=0)
    assert "note: arg0 (q) holds NaN or Inf in 1 of its 8 rows" in proc.stderr
    with np.load(out) as results:
        nan_rows = np.isnan(results["result0"]).all(axis=-1)
    assert nan_rows.tolist() == [[h == 3 for h in range(8)]]


def test_a_bf16_q_is_noted_as_the_call_rounds_it(graph, inputs, tmp_path):
    # 3.4e38 is a finite f32 past bf16's largest value: the call rounds it to Inf
    bf16 = tmp_path / "bf16_q.mlir"
    bf16.write_text(graph.read_text().replace("%arg0: tensor<1x8x64xf32>",
                                              "%arg0: tensor<1x8x64xbf16>")
                    .replace(": (tensor<1x8x64xf32>,", ": (tensor<1x8x64xbf16>,"))
    _, arrays = inputs
    q = arrays[0].copy()
    q[0, 5, 3] = 3.4e38
    path = tmp_path / "big_q.npz"
    np.savez(path, **{f"arg{i}": a for i, a in enumerate([q, *arrays[1:]])})
    proc = run("int8attn", "run", bf16, "--inputs", path, check_rc=0)
    assert "note: arg0 (q) holds NaN or Inf in 1 of its 8 rows" in proc.stderr


def test_missing_files_are_reported(graph, tmp_path):
    proc = run("int8attn", "run", tmp_path / "nope.mlir", check_rc=1)
    assert "graph file" in proc.stderr and "does not exist" in proc.stderr
    proc = run("int8attn", "run", graph, "--inputs", tmp_path / "nope.npz", check_rc=1)
    assert "inputs file" in proc.stderr and "does not exist" in proc.stderr


def test_output_never_overwrites_an_input(graph, inputs, tmp_path):
    before = graph.read_text()
    proc = run("int8attn", "compile", graph, "-o", graph, check_rc=1)
    assert "is the input file" in proc.stderr
    assert graph.read_text() == before
    npz, _ = inputs
    npz_before = npz.read_bytes()
    proc = run("int8attn", "run", graph, "--inputs", npz, "--output", npz, check_rc=1)
    assert f"output '{npz}' is the input file '{npz}'" in proc.stderr
    assert npz.read_bytes() == npz_before
    link = tmp_path / "link.mlir"
    link.symlink_to(graph)
    for target in (graph, link):
        proc = run("int8attn-opt", graph, "-p", "int8-qk", "-o", target, check_rc=1)
        assert f"output '{target}' is the input file '{graph}'" in proc.stderr
    assert graph.read_text() == before


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    from int8attn.support import files

    out = tmp_path / "out.mlir"
    out.write_text("previous")
    real_replace = files.os.replace

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(out, "x" * 100_000)
    monkeypatch.setattr(files.os, "replace", real_replace)
    assert out.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.mlir"]
    with pytest.raises(files.OutputError, match="output directory .* does not exist"):
        files.write_atomic(tmp_path / "missing" / "out.mlir", "x")


def test_parse_and_verifier_errors_have_locations(tmp_path):
    broken = tmp_path / "broken.mlir"
    broken.write_text("func.func @f() {\n  %0 = arith.constant 1.0 : f32\n  return %0\n}\n")
    proc = run("int8attn", "compile", broken, "-o", tmp_path / "x.vmfb", check_rc=1)
    assert re.search(r"broken\.mlir:3:\d+: error:", proc.stderr), proc.stderr
    bad = tmp_path / "gqa.mlir"
    # 6 query heads over 4 KV heads (decode_graph itself refuses to write it)
    bad.write_text(decode_graph(1, 4, 4, 8, 16).replace("1x4x16xf32", "1x6x16xf32"))
    proc = run("int8attn", "run", bad, check_rc=1)
    assert re.search(r"gqa\.mlir:\d+:\d+: error: 'int8attn.attention' op query heads \(6\) "
                     r"must be a multiple of KV heads \(4\)", proc.stderr), proc.stderr
    assert not (tmp_path / "x.vmfb").exists()


def test_misuse_is_a_usage_error(graph, tmp_path):
    assert "usage:" in run("int8attn", "run", graph, "--pv", "int4", check_rc=2).stderr
    assert "usage:" in run("int8attn", "frobnicate", check_rc=2).stderr
    assert "usage:" in run("int8attn", "compile", graph, check_rc=2).stderr  # no -o


def test_several_public_functions_need_function(tmp_path):
    two = tmp_path / "two.mlir"
    text = decode_graph(1, 4, 4, 40, 16, name="a").strip()
    text = text[:text.rindex("}")] + decode_graph(1, 4, 4, 40, 16, name="b").split("module {", 1)[1]
    two.write_text(text)
    proc = run("int8attn", "run", two, check_rc=2)   # refused before compiling
    assert "2 public functions (@a, @b); choose one with --function" in proc.stderr
    assert "accuracy of @b" in run("int8attn", "run", two, "--function", "b", check_rc=0).stdout


def test_opt_runs_passes_and_writes_output(graph, tmp_path):
    out = tmp_path / "qk.mlir"
    run("int8attn-opt", graph, "-p", "int8-qk,canonicalize", "-o", out, check_rc=0)
    assert '"int8attn.softmax_pv"' in out.read_text()
    proc = run("int8attn-opt", "-", "-p", "int8-qk", check_rc=0, stdin=graph.read_text())
    assert '"int8attn.quantize"' in proc.stdout


def test_opt_split_input_file_keeps_going_and_line_numbers(tmp_path):
    good = decode_graph(1, 4, 4, 40, 16)
    text = "// first\n" + good + "// -----\n" + "func.func @f() {\n  retur\n}\n"
    path = tmp_path / "split.mlir"
    path.write_text(text)
    proc = run("int8attn-opt", path, "--split-input-file", "-p", "int8-qk", check_rc=1)
    assert "// -----" not in proc.stdout or '"int8attn.softmax_pv"' in proc.stdout
    line = text.splitlines().index("  retur") + 1
    assert re.search(rf"split\.mlir:{line}:\d+: error:", proc.stderr), proc.stderr


def test_opt_lists_passes():
    listing = run("int8attn-opt", "--list-passes", check_rc=0).stdout
    for name in ("int8-qk", "decode-split-kv", "fold-v-scale", "quantize-w-groups",
                 "pv-to-mmac", "lower-mmac-tiles", "lower-quantize", "float-pv",
                 "int8attn-to-linalg"):
        assert name in listing
