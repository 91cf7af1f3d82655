"""Messages a user meets: an invalid ONNX model's whole checker reason, the remark of an
attention left unraised (dynamic dims, a run-time scale factor; the MatMul/Softmax form
vs ONNX's Attention op, which IREE cannot compile unraised), and the examples'
`--target cuda` / `--packages` errors on a machine without a CUDA GPU: one line, no
traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto as T  # noqa: E402
from onnx import helper as h  # noqa: E402

import int8attn  # noqa: E402
from int8attn.driver.onnx_import import REASON_CHARS, ModelError, _reason  # noqa: E402
from int8attn.support.diagnostics import StageError  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
HQ, HKV, D, S = 4, 2, 16, 8
MISSED = "remark: [Missed] raise-int8-attention: not raised: "
IN_FLOAT = "IREE compiles this attention in float"
NO_ATTENTION_OP = ("IREE cannot compile an onnx.Attention that is not raised (iree-compile "
                   "fails to legalize it), so this model will not compile: ")


# -- 1. an invalid model: the checker's whole reason ----------------------------------------

def test_an_invalid_model_says_the_whole_reason():
    vi = h.make_tensor_value_info
    graph = h.make_graph([h.make_node("Relu", ["v_scale"], ["y"], name="relu"),
                          h.make_node("Neg", ["x"], ["v_scale"], name="neg")], "g",
                         [vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    model.ir_version = 8
    with pytest.raises(ModelError) as error:
        int8attn.compile(model.SerializeToString(), filename="m.onnx")
    message = str(error.value)
    # the checker's first line stops at "of node: ": the node and the reason follow
    assert message == ("m.onnx is not a valid ONNX model: Nodes in a graph must be "
                       "topologically sorted, however input 'v_scale' of node: name: relu "
                       "OpType: Relu is not output of any previous nodes.")


def test_a_huge_checker_reason_is_trimmed_to_one_line():
    reason = _reason(ValueError("first line\n" + "x" * 10_000 + "\n  last"))
    assert "\n" not in reason and len(reason) == REASON_CHARS
    assert reason.startswith("first line xxx") and reason.endswith("...")


# -- 2. remarks of attentions left unraised -------------------------------------------------

def attention(op: bool = False, dynamic: str | None = None, factor: str = "constant"):
    """Decode attention over an int8 cache with per-token scales, GQA HQ:HKV: the
    MatMul/Softmax form (opset 18) or ONNX's Attention op (opset 23). `dynamic`: the
    cache's S is the symbolic dim "S"; `factor`: the scores' scale as a constant, a
    graph input ("input") or a constant tensor per head ("tensor")."""
    from int8attn.reference.onnx_attention import NodeList

    vi = h.make_tensor_value_info
    tokens = dynamic or S
    built = NodeList()
    nodes, node, const = built.nodes, built.node, built.const

    inputs = [vi("q", T.FLOAT, [1, HQ, 1, D])]
    for role in "kv":
        inputs += [vi(f"{role}_int8", T.INT8, [1, HKV, tokens, D]),
                   vi(f"{role}_scale", T.FLOAT, [1, HKV, tokens])]
        scale = node("Unsqueeze", [f"{role}_scale", const(f"{role}_ax", [3], T.INT64)],
                     f"{role}_scale4")
        node("Mul", [node("Cast", [f"{role}_int8"], f"{role}_f", to=T.FLOAT), scale],
             f"{role}_dq")
    if op:
        node("Attention", ["q", "k_dq", "v_dq"], "o")
    else:
        heads = {}
        for role in "kv":
            unit = node("Unsqueeze", [f"{role}_dq", const(f"{role}_hax", [2], T.INT64)],
                        f"{role}_unit")
            wide = node("Expand", [unit, const(f"{role}_ws", [1, HKV, HQ // HKV, 1, D],
                                               T.INT64)], f"{role}_wide")
            heads[role] = node("Reshape", [wide, const(f"{role}_hs", [1, HQ, -1, D], T.INT64)],
                               f"{role}_heads")
        scores = node("MatMul", ["q", node("Transpose", [heads["k"]], "kT", perm=[0, 1, 3, 2])],
                      "qk")
        if factor == "input":
            inputs.append(vi("factor", T.FLOAT, []))
            scale = "factor"
        elif factor == "tensor":
            scale = const("factor", np.full((1, HQ, 1, 1), D ** -0.5), T.FLOAT)
        else:
            scale = const("factor", D ** -0.5, T.FLOAT)
        softmax = node("Softmax", [node("Mul", [scores, scale], "scaled")], "softmax", axis=-1)
        node("MatMul", [softmax, heads["v"]], "o")
    model = h.make_model(h.make_graph(nodes, "attention", inputs,
                                      [vi("o", T.FLOAT, [1, HQ, 1, D])]),
                         opset_imports=[h.make_opsetid("", 23 if op else 18)])
    model.ir_version = 10 if op else 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def remark(data: bytes) -> str:
    """The one raise-int8-attention remark of compiling `data` (IREE CPU)."""
    graph = int8attn.compile(data, filename="m.onnx")
    assert len(graph.remarks) == 1, graph.remarks
    return graph.remarks[0]


def test_the_pattern_form_with_a_dynamic_dim_says_it_and_compiles_in_float():
    text = remark(attention(dynamic="S"))
    assert (f"{MISSED}the scores are not a static 4-d tensor [B, H, Sq, S]: [1, 4, 1, None] "
            f"(dim S is dynamic; int8attn raises static shapes only); {IN_FLOAT} (give the "
            "model static shapes to raise it)") in text


def test_the_attention_op_with_a_dynamic_dim_says_the_model_will_not_compile():
    with pytest.raises(StageError, match="onnx.Attention") as error:
        int8attn.compile(attention(op=True, dynamic="S"), filename="m.onnx")
    assert len(error.value.remarks) == 1
    assert (f"{MISSED}K's int8 cache is not a static 4-d tensor [B, Hkv, S, D]: "
            f"[1, 2, None, 16] (dim S is dynamic; int8attn raises static shapes only); "
            f"{NO_ATTENTION_OP}give the model static shapes") in error.value.remarks[0]
    assert IN_FLOAT not in error.value.remarks[0]


def test_an_unraised_static_attention_op_says_the_model_will_not_compile():
    data = attention(op=True)
    model = onnx.load_from_string(data)
    model.graph.node[-1].attribute.append(h.make_attribute("softcap", 30.0))
    with pytest.raises(StageError, match="onnx.Attention") as error:
        int8attn.compile(model.SerializeToString(), filename="m.onnx")
    assert (f"{MISSED}the Attention op caps its scores (softcap); {NO_ATTENTION_OP}make it "
            "raisable, or export the attention as MatMul, Softmax, MatMul (which IREE "
            "compiles in float)") in error.value.remarks[0]


def test_a_scale_factor_given_at_run_time_is_said():
    assert (f"{MISSED}the scores are scaled by a value computed at run time (the graph input "
            "'factor', not a constant); softmax_scale is fixed at compile time: make the "
            f"factor a constant (an initializer or a Constant node); {IN_FLOAT}") \
        in remark(attention(factor="input"))


def test_a_scale_factor_per_head_is_said():
    assert (f"{MISSED}the scores are scaled by a constant of shape [1, 4, 1, 1], not by a "
            f"scalar; {IN_FLOAT}") in remark(attention(factor="tensor"))


def test_the_static_pattern_form_is_still_raised():
    assert "[Passed] raise-int8-attention: raised to int8attn.attention (decode" \
        in remark(attention())


# -- 3. the examples' --target cuda without a CUDA GPU ---------------------------------------

def example(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "examples" / name), *args],
                          capture_output=True, text=True, timeout=600)


def one_line_error(proc: subprocess.CompletedProcess, *expected: str) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]


def _torch_without_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return not torch.cuda.is_available()


no_gpu = pytest.mark.skipif(not _torch_without_cuda(),
                            reason="needs torch on a machine without a CUDA GPU")
NO_CUDA = "error: --target cuda runs on torch CUDA tensors, but "


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """A small saved PagedAttention (decode and prefill_16; compiled here, no GPU)."""
    from int8attn.serving import PagedAttention

    folder = tmp_path_factory.mktemp("packages")
    PagedAttention(2, 1, 32, 16, target="cuda").save(folder, query_tokens=(16,), write=False)
    return folder


@no_gpu
def test_paged_decode_on_cuda_without_a_gpu_fails_before_compiling():
    proc = example("paged_decode.py", "--target", "cuda")
    one_line_error(proc, NO_CUDA, "run it on a CUDA GPU")
    assert proc.stdout == ""   # nothing compiled or run


@no_gpu
@pytest.mark.parametrize("script", ["paged_decode.py", "transformers_generate.py"])
def test_cuda_with_saved_packages_without_a_gpu_fails_before_running(script, packages):
    one_line_error(example(script, "--target", "cuda", "--packages", str(packages),
                           "--chunk", "16")
                   if script == "transformers_generate.py" else
                   example(script, "--target", "cuda", "--packages", str(packages)), NO_CUDA)


@pytest.mark.parametrize("script", ["paged_decode.py", "transformers_generate.py"])
@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_packages_folder_without_a_saved_paged_attention_is_said(script, folder, tmp_path):
    path = tmp_path / folder
    if folder == "empty":
        path.mkdir()
    one_line_error(example(script, "--target", "cuda", "--packages", str(path)),
                   f"error: {path} holds no saved PagedAttention (paged_attention.json)",
                   "write the packages with --target cuda --prepare DIR")
