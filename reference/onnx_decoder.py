"""A small decoder built with `onnx.helper`: what the ONNX import is checked against.

Each layer is what an exporter writes for a Llama-style block over an INT8 KV
cache: RMSNorm, Q/K/V projections, rotary embedding (rotate-half), the new
tokens' K and V quantized per token (absmax / 127, Round, Clip, Cast to int8)
and appended to the cache, attention over the dequantized cache
(Cast(int8) × scale[..., S, 1]; GQA by Unsqueeze / Expand / Reshape; a
causal mask for prefill), output projection, residual, RMSNorm, SiLU-gated
MLP, residual. onnxruntime runs it as the reference; int8attn raises its
attention.

Inputs: `x` [B, Sq, E]; `cos`, `sin` [Sq, D] (positions P .. P+Sq-1); per layer
l `k_cache_l`, `v_cache_l` int8 [B, Hkv, P, D] and `k_scale_l`, `v_scale_l`
[B, Hkv, P]. Outputs: `y`, and per layer the caches with the new tokens
(`present_k_l` int8 [B, Hkv, S, D], `present_k_scale_l` [B, Hkv, S, 1], V alike).
With `expose_attention`, also `q_l` (rotated, [B, Hq, Sq, D]) and `attention_l`
([B, Hq, Sq, D]), so a test can check the attention alone. With
`attention_inputs`, `attention_l` is an input instead of being computed (q_l
is still an output): onnxruntime then runs the float parts around any given
attention, e.g. the contract's (`reference.fragment_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..contract.numerics import Numerics
from .common import quantize_cache

OPSET = 18


@dataclass(frozen=True)
class DecoderShape:
    batch: int = 1
    query_tokens: int = 1          # Sq: 1 for decode
    past_tokens: int = 300         # P: tokens already in the cache
    q_heads: int = 8
    kv_heads: int = 2              # GQA 4:1
    head_dim: int = 32
    mlp: int = 512
    layers: int = 1

    @property
    def embed(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def tokens(self) -> int:
        return self.past_tokens + self.query_tokens


class _Graph:
    """Nodes, initializers and outputs under construction, with fresh names."""

    def __init__(self, rng: np.random.Generator):
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper, self.rng = helper, numpy_helper, rng
        self.nodes, self.initializers, self.outputs, self.count = [], [], [], 0

    def op(self, op_type: str, *inputs: str, name: str = "", **attrs) -> str:
        self.count += 1
        out = f"{name or op_type.lower()}_{self.count}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out],
                                                name=f"{name or op_type}_{self.count}", **attrs))
        return out

    def const(self, array, name: str = "c") -> str:
        self.count += 1
        full = f"{name}_{self.count}"
        self.initializers.append(self.numpy_helper.from_array(np.asarray(array), full))
        return full

    def weight(self, rows: int, cols: int) -> str:
        return self.const((self.rng.standard_normal((rows, cols)) / np.sqrt(rows))
                          .astype(np.float32), "w")

    def output(self, value: str, name: str, element: int, shape) -> None:
        self.nodes.append(self.helper.make_node("Identity", [value], [name], name=name))
        self.outputs.append(self.helper.make_tensor_value_info(name, element, list(shape)))


def _rms_norm(g: _Graph, x: str, width: int) -> str:
    mean = g.op("ReduceMean", g.op("Mul", x, x), g.const(np.array([-1], np.int64)),
                keepdims=1)
    rms = g.op("Sqrt", g.op("Add", mean, g.const(np.float32(1e-6))))
    scale = g.const((1 + 0.1 * g.rng.standard_normal(width)).astype(np.float32), "norm")
    return g.op("Mul", g.op("Div", x, rms), scale)


def _heads(g: _Graph, x: str, s: DecoderShape, heads: int) -> str:
    """[B, Sq, heads·D] -> [B, heads, Sq, D]."""
    shaped = g.op("Reshape", x, g.const(np.array([s.batch, s.query_tokens, heads, s.head_dim])))
    return g.op("Transpose", shaped, perm=[0, 2, 1, 3])


def _rotary(g: _Graph, x: str, s: DecoderShape) -> str:
    half = s.head_dim // 2
    first, second = (g.op("Slice", x, g.const(np.array([a])), g.const(np.array([b])),
                          g.const(np.array([-1]))) for a, b in ((0, half), (half, s.head_dim)))
    rotated = g.op("Concat", g.op("Neg", second), first, axis=-1)
    return g.op("Add", g.op("Mul", x, "cos"), g.op("Mul", rotated, "sin"))


def _append_quantized(g: _Graph, new: str, cache: str, scale: str) -> tuple[str, str]:
    """The new tokens quantized per token and appended: (int8 cache, scales [B,Hkv,S,1])."""
    absmax = g.op("ReduceMax", g.op("Abs", new), g.const(np.array([-1], np.int64)), keepdims=1)
    step = g.op("Div", absmax, g.const(np.float32(127)))
    levels = g.op("Clip", g.op("Round", g.op("Div", new, step)), g.const(np.float32(-127)),
                  g.const(np.float32(127)))
    from onnx import TensorProto

    values = g.op("Concat", cache, g.op("Cast", levels, to=TensorProto.INT8), axis=2)
    scales = g.op("Concat", g.op("Unsqueeze", scale, g.const(np.array([3]))), step, axis=2)
    return values, scales


def _dequantized_heads(g: _Graph, values: str, scales: str, s: DecoderShape) -> str:
    """Cast(int8) × scale, each KV head repeated for its query heads: [B, Hq, S, D]."""
    from onnx import TensorProto

    dense = g.op("Mul", g.op("Cast", values, to=TensorProto.FLOAT), scales)
    group = s.q_heads // s.kv_heads
    wide = g.op("Expand", g.op("Unsqueeze", dense, g.const(np.array([2]))),
                g.const(np.array([s.batch, s.kv_heads, group, s.tokens, s.head_dim])))
    return g.op("Reshape", wide, g.const(np.array([s.batch, s.q_heads, s.tokens, s.head_dim])))


def causal_mask(query_tokens: int, tokens: int) -> np.ndarray:
    """0 where query i (token S - Sq + i) may see token j, -inf elsewhere: [1, 1, Sq, S]."""
    keep = np.arange(tokens)[None, :] <= (tokens - query_tokens + np.arange(query_tokens))[:, None]
    return np.where(keep, 0, -np.inf).astype(np.float32)[None, None]


def _attention(g: _Graph, q: str, keys: str, values: str, s: DecoderShape, layer: int) -> str:
    scores = g.op("MatMul", q, g.op("Transpose", keys, perm=[0, 1, 3, 2]))
    scores = g.op("Mul", scores, g.const(np.float32(s.head_dim ** -0.5)))
    if s.query_tokens > 1:
        scores = g.op("Add", scores, g.const(causal_mask(s.query_tokens, s.tokens), "mask"))
    probabilities = g.op("Softmax", scores, axis=-1, name=f"attention{layer}/Softmax")
    return g.op("MatMul", probabilities, values)


def _layer(g: _Graph, x: str, s: DecoderShape, layer: int, expose: bool,
           given_attention: bool) -> str:
    from onnx import TensorProto

    h = _rms_norm(g, x, s.embed)
    q = _rotary(g, _heads(g, g.op("MatMul", h, g.weight(s.embed, s.embed)), s, s.q_heads), s)
    kv_width = s.kv_heads * s.head_dim
    k = _rotary(g, _heads(g, g.op("MatMul", h, g.weight(s.embed, kv_width)), s, s.kv_heads), s)
    v = _heads(g, g.op("MatMul", h, g.weight(s.embed, kv_width)), s, s.kv_heads)
    caches = {}
    for role, new in (("k", k), ("v", v)):
        caches[role] = _append_quantized(g, new, f"{role}_cache_{layer}", f"{role}_scale_{layer}")
        g.output(caches[role][0], f"present_{role}_{layer}", TensorProto.INT8,
                 [s.batch, s.kv_heads, s.tokens, s.head_dim])
        g.output(caches[role][1], f"present_{role}_scale_{layer}", TensorProto.FLOAT,
                 [s.batch, s.kv_heads, s.tokens, 1])
    heads_shape = [s.batch, s.q_heads, s.query_tokens, s.head_dim]
    if given_attention:
        attended = f"attention_{layer}"
    else:
        attended = _attention(g, q, _dequantized_heads(g, *caches["k"], s),
                              _dequantized_heads(g, *caches["v"], s), s, layer)
    if expose or given_attention:
        g.output(q, f"q_{layer}", TensorProto.FLOAT, heads_shape)
    if expose and not given_attention:
        g.output(attended, f"attention_{layer}", TensorProto.FLOAT, heads_shape)
    merged = g.op("Reshape", g.op("Transpose", attended, perm=[0, 2, 1, 3]),
                  g.const(np.array([s.batch, s.query_tokens, s.embed])))
    x = g.op("Add", x, g.op("MatMul", merged, g.weight(s.embed, s.embed)))
    h = _rms_norm(g, x, s.embed)
    gate = g.op("MatMul", h, g.weight(s.embed, s.mlp))
    up = g.op("MatMul", h, g.weight(s.embed, s.mlp))
    mlp = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
    return g.op("Add", x, g.op("MatMul", mlp, g.weight(s.mlp, s.embed)))


def decoder_model(s: DecoderShape, seed: int, *, expose_attention: bool = False,
                  attention_inputs: bool = False):
    """The decoder as an `onnx.ModelProto` (weights drawn from `seed`)."""
    from onnx import TensorProto, checker, helper

    g = _Graph(np.random.default_rng(seed))
    x = "x"
    for layer in range(s.layers):
        x = _layer(g, x, s, layer, expose_attention, attention_inputs)
    g.output(x, "y", TensorProto.FLOAT, [s.batch, s.query_tokens, s.embed])
    info = helper.make_tensor_value_info
    inputs = [info("x", TensorProto.FLOAT, [s.batch, s.query_tokens, s.embed]),
              info("cos", TensorProto.FLOAT, [s.query_tokens, s.head_dim]),
              info("sin", TensorProto.FLOAT, [s.query_tokens, s.head_dim])]
    cache = [s.batch, s.kv_heads, s.past_tokens]
    for layer in range(s.layers):
        for role in ("k", "v"):
            inputs += [info(f"{role}_cache_{layer}", TensorProto.INT8, cache + [s.head_dim]),
                       info(f"{role}_scale_{layer}", TensorProto.FLOAT, cache)]
        if attention_inputs:
            inputs.append(info(f"attention_{layer}", TensorProto.FLOAT,
                               [s.batch, s.q_heads, s.query_tokens, s.head_dim]))
    graph = helper.make_graph(g.nodes, "decoder", inputs, g.outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="int8attn.reference.onnx_decoder")
    model.ir_version = 8   # what onnxruntime reads
    checker.check_model(model)
    return model


def decoder_inputs(s: DecoderShape, seed: int) -> dict[str, np.ndarray]:
    """Random inputs: Gaussian x, rotary tables for positions P.., Gaussian caches
    quantized per token (int8 + absmax/127 scales, as the graph quantizes)."""
    rng = np.random.default_rng(seed)
    positions = np.arange(s.past_tokens, s.tokens)[:, None]
    frequencies = 10000.0 ** (-np.arange(s.head_dim // 2) / (s.head_dim // 2))
    angles = np.concatenate([positions * frequencies] * 2, axis=-1)
    arrays = {"x": rng.standard_normal((s.batch, s.query_tokens, s.embed)).astype(np.float32),
              "cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    for layer in range(s.layers):
        for role in ("k", "v"):
            values, scales = quantize_cache(rng.standard_normal(
                (s.batch, s.kv_heads, s.past_tokens, s.head_dim)).astype(np.float32))
            arrays[f"{role}_cache_{layer}"], arrays[f"{role}_scale_{layer}"] = values, scales
    return arrays


def run_onnxruntime(model, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output of `model` on onnxruntime's CPU provider."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def contract_attention(outputs: dict, layer: int,
                       numerics: Numerics = Numerics()) -> tuple[np.ndarray, np.ndarray]:
    """(the contract's attention of layer `layer`, its rounding-tie slack), from the
    q and caches among `outputs` (a run's outputs by name); `numerics` default to the
    contract's, the cpu pipeline's, which compiled models use."""
    from . import fragment_attention, rounding_tie_slack

    q = outputs[f"q_{layer}"]
    operands = [outputs[f"present_{n}_{layer}"] for n in ("k", "k_scale", "v", "v_scale")]
    operands[1], operands[3] = operands[1][..., 0], operands[3][..., 0]
    decode = q.shape[2] == 1
    q = q[:, :, 0] if decode else q
    scale = q.shape[-1] ** -0.5
    out = fragment_attention(q, *operands, scale, numerics=numerics)
    slack = rounding_tie_slack(q, *operands, scale, numerics=numerics)
    return (out[:, :, None], slack[:, :, None]) if decode else (out, slack)


def around_attention(s: DecoderShape, weights_seed: int, inputs: dict, attention) -> dict:
    """onnxruntime's float parts around `attention(outputs, layer)`, layer by layer:
    `contract_attention` gives the whole model under int8attn's contract."""
    model = decoder_model(s, weights_seed, attention_inputs=True)
    given = {f"attention_{layer}": np.zeros((s.batch, s.q_heads, s.query_tokens, s.head_dim),
                                            np.float32) for layer in range(s.layers)}
    for layer in range(s.layers):   # layer l's q depends on the attentions before it
        outputs = run_onnxruntime(model, {**inputs, **given})
        given[f"attention_{layer}"] = np.asarray(attention(outputs, layer), np.float32)
    return run_onnxruntime(model, {**inputs, **given})
