"""A compiled function's signature: its tensors and the attention op it returns.

Kept free of the IREE compiler: a program that only runs compiled modules (a GPU
server calling saved kernel packages) reads signatures from JSON with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..runtime.module import TensorSpec

OPERANDS = ("q", "k", "k_scale", "v", "v_scale")
PAGED_OPERANDS = ("q", "k_cache", "k_scale", "v_cache", "v_scale", "block_tables", "context_lens")
CACHE_WRITE_OPERANDS = ("k_new", "v_new", "slot_mapping", "k_cache", "k_scale", "v_cache",
                        "v_scale", "k_bias")


@dataclass(frozen=True)
class AttentionCall:
    """An attention op whose operands are function arguments `argument_of`."""

    argument_of: tuple[int, ...]   # operand (`operands` order) -> argument index
    mode: str                      # decode, prefill, paged (int8attn.paged_attention) or
                                   # cache_write (int8attn.cache_write)
    softmax_scale: float           # (0 for cache_write)
    result_index: int              # which function result it is (cache_write: the first)
    tied: tuple[tuple[int, int], ...] = ()   # cache_write: (result, the argument it updates)

    @property
    def operands(self) -> tuple[str, ...]:
        names = {"paged": PAGED_OPERANDS, "cache_write": CACHE_WRITE_OPERANDS}.get(self.mode,
                                                                                    OPERANDS)
        return names[:len(self.argument_of)]     # cache_write's k_bias is optional

    def argument(self, operand: str) -> int:
        return self.argument_of[self.operands.index(operand)]


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    arguments: tuple[TensorSpec, ...]
    results: tuple[TensorSpec, ...]
    attention: AttentionCall | None
    # An imported ONNX model's input and output names (else arg<i>, result<i>).
    argument_names: tuple[str, ...] = ()
    result_names: tuple[str, ...] = ()
    # Arguments that raised attentions of an ONNX model read as cache scales.
    scale_arguments: tuple[int, ...] = ()

    def argument_name(self, index: int) -> str:
        return self.argument_names[index] if self.argument_names else f"arg{index}"

    def result_name(self, index: int) -> str:
        return self.result_names[index] if self.result_names else f"result{index}"

    def to_json(self) -> dict:
        spec = lambda s: [list(s.shape), s.element]
        return {"name": self.name, "arguments": [spec(s) for s in self.arguments],
                "argument_names": list(self.argument_names),
                "result_names": list(self.result_names),
                "scale_arguments": list(self.scale_arguments),
                "results": [spec(s) for s in self.results],
                "attention": None if self.attention is None else {
                    "argument_of": list(self.attention.argument_of), "mode": self.attention.mode,
                    "softmax_scale": self.attention.softmax_scale,
                    "result_index": self.attention.result_index,
                    "tied": [list(t) for t in self.attention.tied]}}

    @staticmethod
    def from_json(data: dict) -> "FunctionInfo":
        spec = lambda s: TensorSpec(tuple(s[0]), s[1])
        att = data["attention"]
        return FunctionInfo(
            data["name"], tuple(spec(s) for s in data["arguments"]),
            tuple(spec(s) for s in data["results"]),
            None if att is None else AttentionCall(
                tuple(att["argument_of"]), att["mode"], att["softmax_scale"],
                att["result_index"], tuple(tuple(t) for t in att.get("tied", ()))),
            tuple(data.get("argument_names", ())), tuple(data.get("result_names", ())),
            tuple(data.get("scale_arguments", ())))
