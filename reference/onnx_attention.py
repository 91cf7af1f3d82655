"""One attention in ONNX, in the forms exporters emit: what raise-int8-attention
must raise, and what it must leave alone.

`attention_model(form)` builds `o = Softmax(scores) @ V` over a dequantized
cache (B=1, Hkv=2, S=8, D=16) with constants written inline (so the
importer's IR shows them as `dense<...>`); `FORMS` names each variant and
whether it is raisable. `lit/import/raise-int8-attention.mlir` holds
`iree-import-onnx`'s output for these models; `tests/test_onnx_import.py`
runs every one of them against onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BATCH, KV_HEADS, TOKENS, HEAD_DIM = 1, 2, 8, 16
CACHE_SHAPE = [BATCH, KV_HEADS, TOKENS, HEAD_DIM]


@dataclass(frozen=True)
class Form:
    raisable: bool
    q_heads: int = 4
    query_tokens: int = 1
    scales: str = "token"            # token ([B,Hkv,S] unsqueezed), token4 ([B,Hkv,S,1]),
                                     # channel ([1,Hkv,1,D]) or tensor ([])
    mask: str | None = None          # add (0/-inf), where (bool, -3.4e38), shifted
                                     # (drops tokens 0-1: not causal) or bias (+0.5)
    heads: str = "expand"            # expand (Unsqueeze axis 2 / Expand / Reshape: head h
                                     # reads KV head h // g), outer (the same on axis 1:
                                     # h mod Hkv) or tile (h mod Hkv)
    float_cache: bool = False        # K is an f32 input, not int8
    scale_on: str = "scores"         # scores (Mul), scores-div (Div by sqrt D) or q
    attention_op: bool = False       # ONNX's Attention op (opset 23; GQA its own, `mask`
                                     # "where" as its bool attn_mask) instead of MatMuls
    is_causal: bool = False          # its is_causal: upper-left, unlike int8attn's


FORMS = {
    "decode_gqa": Form(True),
    "prefill_add": Form(True, q_heads=2, query_tokens=4, mask="add", scale_on="scores-div"),
    "prefill_where": Form(True, query_tokens=4, mask="where", scales="token4", scale_on="q"),
    "per_channel": Form(False, scales="channel"),
    "per_tensor": Form(False, scales="tensor"),
    "not_causal": Form(False, query_tokens=4, mask="shifted"),
    "no_mask": Form(False, query_tokens=4),
    "tile": Form(False, heads="tile"),
    "heads_outer": Form(False, heads="outer"),
    "float_cache": Form(False, float_cache=True),
    "bias": Form(False, mask="bias"),
    "attention_op": Form(True, attention_op=True),
    "attention_op_prefill": Form(True, query_tokens=4, mask="where", attention_op=True),
    "attention_op_causal": Form(False, query_tokens=4, attention_op=True, is_causal=True),
}

_SCALE_SHAPES = {"token": [BATCH, KV_HEADS, TOKENS], "token4": [BATCH, KV_HEADS, TOKENS, 1],
                 "channel": [1, KV_HEADS, 1, HEAD_DIM], "tensor": []}


def _keep(query_tokens: int) -> np.ndarray:
    last = TOKENS - query_tokens + np.arange(query_tokens)   # each query's own position
    causal = np.arange(TOKENS)[None, :] <= last[:, None]
    return causal[None, None]


class NodeList:
    """ONNX nodes in order, each named after its one output: `node` appends one and
    returns that output's name, `const` a Constant node of `values` (numpy-shaped)."""

    def __init__(self):
        self.nodes = []

    def node(self, op, ins, out, **attrs):
        from onnx import helper as h

        self.nodes.append(h.make_node(op, ins, [out], name=out, **attrs))
        return out

    def const(self, out, values, dtype):
        from onnx import helper as h

        values = np.asarray(values)
        return self.node("Constant", [], out, value=h.make_tensor(out, dtype, values.shape,
                                                                  values.flatten().tolist()))


def attention_model(name: str):
    from onnx import TensorProto as T, checker, helper as h

    form = FORMS[name]
    inputs = [h.make_tensor_value_info("q", T.FLOAT, [BATCH, form.q_heads, form.query_tokens,
                                                      HEAD_DIM])]
    built = NodeList()
    nodes, node, const = built.nodes, built.node, built.const

    def cache(role):
        if form.float_cache and role == "k":
            inputs.append(h.make_tensor_value_info(role, T.FLOAT, CACHE_SHAPE))
            return role
        inputs.append(h.make_tensor_value_info(f"{role}_int8", T.INT8, CACHE_SHAPE))
        inputs.append(h.make_tensor_value_info(f"{role}_scale", T.FLOAT,
                                               _SCALE_SHAPES[form.scales]))
        scale = f"{role}_scale"
        if form.scales == "token":
            axis = const(f"{role}_axis", [3], T.INT64)
            scale = node("Unsqueeze", [scale, axis], f"{role}_scale4")
        values = node("Cast", [f"{role}_int8"], f"{role}_float", to=T.FLOAT)
        return node("Mul", [values, scale], f"{role}_dequant")

    def repeat_heads(x, role):
        group = form.q_heads // KV_HEADS
        if group == 1:
            return x
        if form.heads == "tile":
            repeats = const(f"{role}_reps", [1, group, 1, 1], T.INT64)
            return node("Tile", [x, repeats], f"{role}_tile")
        axis = 1 if form.heads == "outer" else 2
        wide_shape = list(CACHE_SHAPE)
        wide_shape.insert(axis, group)
        heads_shape = [BATCH, form.q_heads, TOKENS, HEAD_DIM]
        unit = node("Unsqueeze", [x, const(f"{role}_heads_axis", [axis], T.INT64)],
                    f"{role}_unit")
        wide = node("Expand", [unit, const(f"{role}_wide_shape", wide_shape, T.INT64)],
                    f"{role}_wide")
        return node("Reshape", [wide, const(f"{role}_heads_shape", heads_shape, T.INT64)],
                    f"{role}_heads")

    if form.attention_op:
        mask = [const("keep", _keep(form.query_tokens), T.BOOL)] if form.mask == "where" else []
        node("Attention", ["q", cache("k"), cache("v"), *mask], "o",
             is_causal=int(form.is_causal))
        return _model(h, checker, name, nodes, inputs, form, opset=23)
    k, v = repeat_heads(cache("k"), "k"), repeat_heads(cache("v"), "v")
    q = "q"
    if form.scale_on == "q":
        q = node("Mul", [q, const("q_factor", HEAD_DIM ** -0.5, T.FLOAT)], "q_scaled")
    scores = node("MatMul", [q, node("Transpose", [k], "k_transposed", perm=[0, 1, 3, 2])], "qk")
    if form.scale_on == "scores":
        scores = node("Mul", [scores, const("factor", HEAD_DIM ** -0.5, T.FLOAT)], "scaled")
    elif form.scale_on == "scores-div":
        scores = node("Div", [scores, const("divisor", HEAD_DIM ** 0.5, T.FLOAT)], "scaled")
    keep = _keep(form.query_tokens)
    if form.mask == "where":
        scores = node("Where", [const("keep", keep, T.BOOL), scores,
                                const("fill", -3.4e38, T.FLOAT)], "masked")
    elif form.mask is not None:
        if form.mask == "shifted":
            keep = keep & (np.arange(TOKENS) >= 2)
        additive = (np.full(keep.shape, 0.5) if form.mask == "bias" else
                    np.where(keep, 0.0, -np.inf)).astype(np.float32)
        scores = node("Add", [scores, const("mask", additive, T.FLOAT)], "masked")
    probabilities = node("Softmax", [scores], "softmax", axis=-1)
    node("MatMul", [probabilities, v], "o")
    return _model(h, checker, name, nodes, inputs, form, opset=18)


def _model(h, checker, name, nodes, inputs, form: Form, opset: int):
    from onnx import TensorProto

    outputs = [h.make_tensor_value_info("o", TensorProto.FLOAT,
                                        [BATCH, form.q_heads, form.query_tokens, HEAD_DIM])]
    model = h.make_model(h.make_graph(nodes, name, inputs, outputs),
                         opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 23 else 8   # what onnxruntime reads
    checker.check_model(model)
    return model


def attention_inputs(model, seed: int) -> dict[str, np.ndarray]:
    """Gaussian q and float caches, int8 uniform, positive scales ~ 1/127."""
    from onnx import TensorProto

    rng = np.random.default_rng(seed)
    arrays = {}
    for value in model.graph.input:
        dims = [d.dim_value for d in value.type.tensor_type.shape.dim]
        if value.type.tensor_type.elem_type == TensorProto.INT8:
            arrays[value.name] = rng.integers(-127, 128, dims, dtype=np.int8)
        elif value.name.endswith("_scale"):
            arrays[value.name] = np.asarray(rng.uniform(0.5, 1.5, dims) / 127, np.float32)
        else:
            arrays[value.name] = np.asarray(rng.standard_normal(dims), np.float32)
    return arrays
