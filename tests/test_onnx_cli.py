"""`int8attn compile|run MODEL.onnx` as a user runs it: names, remarks, errors."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from test_cli import run  # noqa: E402

from int8attn.reference.onnx_attention import attention_inputs, attention_model  # noqa: E402

RAISED = "remark: [Passed] raise-int8-attention: raised to int8attn.attention (decode"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """decode_gqa (raised) with inputs saved by ONNX name; seed 3."""
    directory = tmp_path_factory.mktemp("onnx")
    proto = attention_model("decode_gqa")
    (directory / "decode.onnx").write_bytes(proto.SerializeToString())
    inputs = attention_inputs(proto, 3)
    np.savez(directory / "named.npz", **inputs)
    np.savez(directory / "positional.npz", **{f"arg{i}": inputs[v.name]
                                              for i, v in enumerate(proto.graph.input)})
    return directory


def test_inputs_and_outputs_keep_the_model_names(model):
    named = run("int8attn", "run", model / "decode.onnx", "--inputs", model / "named.npz",
                "--output", model / "named-out.npz", check_rc=0)
    assert f"{model / 'decode.onnx'}: node 'softmax': {RAISED}" in named.stderr
    assert "wrote" in named.stdout and "(o)" in named.stdout
    assert "vs onnxruntime (f32) on the same inputs" in named.stdout
    run("int8attn", "run", model / "decode.onnx", "--inputs", model / "positional.npz",
        "--output", model / "positional-out.npz", check_rc=0)
    first, second = np.load(model / "named-out.npz"), np.load(model / "positional-out.npz")
    assert first.files == ["o"] and np.array_equal(first["o"], second["o"])


def test_random_inputs_are_compared_with_onnxruntime(model):
    proc = run("int8attn", "run", model / "decode.onnx", "--seed", "4", check_rc=0)
    assert "random inputs, seed 4" in proc.stdout
    line = next(l for l in proc.stdout.splitlines() if l.strip().startswith("o "))
    max_abs = float(line.split()[1])
    assert 0 < max_abs < 2e-2, line   # the INT8 contract's error, not a float match


def test_compile_emits_the_raised_graph(model):
    proc = run("int8attn", "compile", model / "decode.onnx", "--emit", "graph", "-o", "-",
               check_rc=0)
    assert '"int8attn.attention"' in proc.stdout and "onnx.Softmax" not in proc.stdout
    assert RAISED in proc.stderr


def test_a_model_with_nothing_to_raise_still_runs(tmp_path):
    proto = attention_model("per_tensor")
    path = tmp_path / "per_tensor.onnx"
    path.write_bytes(proto.SerializeToString())
    proc = run("int8attn", "run", path, "--seed", "0", check_rc=0)
    assert "[Missed] raise-int8-attention: not raised: K has one scale for the whole tensor" \
        in proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.strip().startswith("o "))
    assert float(line.split()[1]) < 1e-5   # IREE's float attention: f32 rounding


@pytest.mark.parametrize("content, message", [
    (None, "ONNX model '{path}' does not exist"),
    (b"not a protobuf", "is not an ONNX model"),
    (b"", "holds no ONNX graph"),
])
def test_bad_model_files_are_refused_without_a_traceback(tmp_path, content, message):
    path = tmp_path / "bad.onnx"
    if content is not None:
        path.write_bytes(content)
    proc = run("int8attn", "run", path, check_rc=1)
    assert message.format(path=path) in proc.stderr


def test_inputs_missing_a_model_input_are_named(model, tmp_path):
    arrays = dict(np.load(model / "named.npz"))
    del arrays["v_scale"]
    np.savez(tmp_path / "partial.npz", **arrays)
    proc = run("int8attn", "run", model / "decode.onnx", "--inputs", tmp_path / "partial.npz",
               check_rc=1)
    assert "has no array 'v_scale' or 'arg4' for argument 4" in proc.stderr


@pytest.mark.parametrize("flags, message", [
    (["--target", "gfx936", "--simulate"], "an ONNX model (its float ops too) compiles with "
                                           "--target cpu"),
    (["--report"], "an ONNX model is compared with onnxruntime instead"),
])
def test_flags_that_do_not_apply_to_a_model_are_refused(model, flags, message):
    proc = run("int8attn", "run", model / "decode.onnx", *flags, check_rc=2)
    assert message in proc.stderr


def test_the_example_matches_onnxruntime_up_to_the_contracts_error():
    import re
    import subprocess
    import sys

    from conftest import REPO

    proc = subprocess.run([sys.executable, str(REPO / "examples" / "onnx_decoder_layer.py")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "[Passed] raise-int8-attention" in proc.stderr
    found = re.search(r"max \|int8attn - onnxruntime\| (\S+); the INT8 contract's own error on "
                      r"these inputs (\S+)", proc.stdout)
    difference, contract = float(found[1]), float(found[2])
    assert 0 < contract and difference <= 1.25 * contract + 1e-4, proc.stdout
