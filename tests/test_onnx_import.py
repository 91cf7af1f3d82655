"""ONNX decoder layers through int8attn (IREE CPU) against onnxruntime.

The model (`reference.onnx_decoder`) is a Llama-style layer over an INT8 KV
cache of 300 tokens with per-token scales, GQA 4:1; int8attn raises its
attention and IREE compiles the rest. Three checks per graph:

1. The raised attention is the contract: `attention_l` (an extra output) of
   the compiled graph vs `fragment_attention` on the compiled graph's own
   `q_l` and caches: <= 5e-5 + the rounding-tie slack (as test_prefill).
2. The float parts are onnxruntime's to f32 rounding: onnxruntime, given the
   compiled graph's attention outputs as inputs, reproduces its `y` to
   FLOAT_TOL relative, layer 0's int8 caches bit for bit (these seeds) and
   their scales to FLOAT_TOL.
3. Against onnxruntime's f32 graph, the error is the quantization's: the
   contract's own error on these inputs, `y_contract − y_ort` (onnxruntime
   around `fragment_attention`, layer by layer), bounds `|y − y_ort|` with
   BOUND_MARGIN for roundings that a 1e-6 change of q moves across a tie.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import int8attn  # noqa: E402
from int8attn.support.diagnostics import StageError  # noqa: E402
from int8attn import reference as ref  # noqa: E402
from int8attn.reference.onnx_attention import FORMS, attention_inputs, attention_model  # noqa: E402
from int8attn.reference.onnx_decoder import (  # noqa: E402
    DecoderShape, around_attention, contract_attention, decoder_inputs, decoder_model,
    run_onnxruntime,
)

FRAGMENT_TOL = 5e-5
FLOAT_TOL = 1e-5          # relative to max|y|: f32 rounding of the float parts
BOUND_MARGIN = 1.25       # x the contract's realized error, + 1e-4 absolute

CASES = {
    "decode": DecoderShape(query_tokens=1),
    "prefill": DecoderShape(query_tokens=16),
    "two-layers": DecoderShape(query_tokens=1, layers=2),
}


@pytest.mark.parametrize("case", CASES)
def test_decoder_against_onnxruntime(case, tmp_path):
    shape, weights_seed, inputs_seed = CASES[case], 7, 11
    print(f"{case}: weights seed {weights_seed}, inputs seed {inputs_seed}")
    model = decoder_model(shape, weights_seed, expose_attention=True)
    inputs = decoder_inputs(shape, inputs_seed)
    graph = int8attn.compile(model.SerializeToString(), filename=f"{case}.onnx")
    raised = [r for r in graph.remarks if "[Passed] raise-int8-attention" in r]
    assert len(raised) == shape.layers, graph.remarks
    info = graph.entry()
    outputs = dict(zip(info.result_names,
                       graph.run([inputs[name] for name in info.argument_names])))

    for layer in range(shape.layers):   # 1. the raised attention is the contract
        fragment, slack = contract_attention(outputs, layer)
        error = np.abs(outputs[f"attention_{layer}"] - fragment)
        assert (error <= FRAGMENT_TOL + slack).all(), f"layer {layer}: {error.max():.3e}"

    ort = run_onnxruntime(model, inputs)   # 2. the float parts are onnxruntime's
    for role in ("k", "v"):
        np.testing.assert_array_equal(outputs[f"present_{role}_0"], ort[f"present_{role}_0"])
        np.testing.assert_allclose(outputs[f"present_{role}_scale_0"],
                                   ort[f"present_{role}_scale_0"], rtol=FLOAT_TOL)
    floats = around_attention(shape, weights_seed, inputs,
                    lambda _, layer: outputs[f"attention_{layer}"])
    y = outputs["y"]
    assert np.abs(floats["y"] - y).max() <= FLOAT_TOL * np.abs(y).max()

    contract = around_attention(shape, weights_seed, inputs,   # 3. within the quantization error
                      lambda out, layer: contract_attention(out, layer)[0])
    quantization = np.abs(contract["y"] - ort["y"]).max()
    error = np.abs(y - ort["y"]).max()
    print(f"{case}: max |y - onnxruntime| {error:.3e}, the contract's own error "
          f"{quantization:.3e}, max |y| {np.abs(ort['y']).max():.2f}")
    assert 0 < quantization and error <= BOUND_MARGIN * quantization + 1e-4


@pytest.mark.parametrize("form", FORMS)
def test_attention_forms_against_onnxruntime(form):
    """Every form of lit/import/raise-int8-attention.mlir runs: a raised one is the
    contract, one left to IREE is onnxruntime's float attention to f32 rounding."""
    model, seed = attention_model(form), 5
    inputs = attention_inputs(model, seed)
    kind = "[Passed]" if FORMS[form].raisable else "[Missed]"
    if FORMS[form].attention_op and not FORMS[form].raisable:
        # IREE 3.13 has no lowering of ONNX's Attention op: what is not raised fails
        # there, after the remark saying why it was not raised.
        with pytest.raises(StageError, match="onnx.Attention") as error:
            int8attn.compile(model.SerializeToString(), filename=f"{form}.onnx")
        assert kind in error.value.remarks[0]
        return
    graph = int8attn.compile(model.SerializeToString(), filename=f"{form}.onnx")
    assert len(graph.remarks) == 1 and kind in graph.remarks[0], graph.remarks
    info = graph.entry()
    out = graph(*(inputs[name] for name in info.argument_names))
    expected = run_onnxruntime(model, inputs)["o"]
    if not FORMS[form].raisable:
        assert np.abs(out - expected).max() <= FLOAT_TOL * np.abs(expected).max()
        return
    scales = [inputs[f"{r}_scale"].reshape(inputs[f"{r}_int8"].shape[:3]) for r in "kv"]
    q = inputs["q"][:, :, 0] if FORMS[form].query_tokens == 1 else inputs["q"]
    operands = (q, inputs["k_int8"], scales[0], inputs["v_int8"], scales[1], 0.25)
    numerics = graph.options.numerics
    fragment = ref.fragment_attention(*operands, numerics=numerics)
    exact = ref.exact_attention(*operands)
    slack = ref.rounding_tie_slack(*operands, numerics=numerics)
    out = out[:, :, 0] if q.ndim == 3 else out
    assert (np.abs(out - fragment) <= FRAGMENT_TOL + slack).all()
    expected = expected[:, :, 0] if q.ndim == 3 else expected
    assert np.abs(out - expected).max() <= BOUND_MARGIN * np.abs(fragment - exact).max() + 1e-5
