"""What a graph's public functions take and return, and inputs to call them with.

For `int8attn run` without `--inputs`: a function whose result is one
`int8attn.attention` of its own arguments gets random inputs (Gaussian q, a
Gaussian K/V cache quantized per token) and its outputs can be compared with
both references.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from ..contract.constants import softmax_scale_problem
from ..contract.numerics import Numerics
from ..dialects import int8attn as d
from .onnx_import import INPUT_NAMES, OUTPUT_NAMES
from ..passes.onnx_ops import builtin_type, onnx_name
from ..reference import exact_attention, fragment_attention, quantize_cache
from .signature import (CACHE_WRITE_OPERANDS, OPERANDS, PAGED_OPERANDS,  # noqa: F401
                        AttentionCall, FunctionInfo)
from ..runtime.module import (BF16, NUMPY_DTYPES, InputError, TensorSpec, bf16_values,
                              argument_label, check_signature, host_dtype)
from ..support.ir import walk


def _spec(t: ir.Type) -> TensorSpec:
    if str(t).startswith("!torch.vtensor"):   # an imported ONNX graph's signature
        t = builtin_type(t)
    if not isinstance(t, ir.RankedTensorType):
        return TensorSpec((), str(t))
    return TensorSpec(tuple(None if t.is_dynamic_dim(i) else n for i, n in enumerate(t.shape)),
                      str(t.element_type))


def describe_functions(module: ir.Operation) -> dict[str, FunctionInfo]:
    """Public functions of `module` with their signatures (before any pass)."""
    infos = {}
    for op in module.regions[0].blocks[0].operations:
        op = op.operation
        if op.name != "func.func" or "sym_visibility" in op.attributes:
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        block = op.regions[0].blocks[0]
        arguments = tuple(_spec(a.type) for a in block.arguments)
        terminator = block.operations[len(block.operations) - 1].operation
        results = tuple(_spec(v.type) for v in terminator.operands)
        infos[name] = FunctionInfo(name, arguments, results,
                                   _attention_call(block, terminator),
                                   _names(op, INPUT_NAMES), _names(op, OUTPUT_NAMES),
                                   _scale_arguments(op))
    return infos


# Ops (MLIR names, or ONNX op types) that move a scale without changing it.
_MOVES = ("tensor.collapse_shape", "torch_c.to_builtin_tensor", "Concat", "Unsqueeze",
          "Reshape", "Identity")


def choose_function(functions: dict[str, FunctionInfo], function: str | None) -> FunctionInfo:
    """The named public function, or the only one; otherwise an InputError naming them
    (`int8attn run` asks this of the graph stage, before compiling the rest)."""
    if function is not None:
        if function not in functions:
            raise InputError(f"no public function @{function}; the module has "
                             f"{', '.join('@' + f for f in functions) or 'none'}")
        return functions[function]
    if len(functions) != 1:
        raise InputError(f"the module has {len(functions)} public functions "
                         f"({', '.join('@' + f for f in functions) or 'none'}); "
                         f"choose one with --function")
    return next(iter(functions.values()))


def _scale_arguments(func: ir.Operation) -> tuple[int, ...]:
    """Arguments whose values a nested attention reads as k_scale / v_scale, through
    casts and data movement: an imported model's cache scales (e.g. a Concat of the
    past tokens' scales and the new ones), or those of a graph whose result is not one
    attention of its arguments (attention chained or in a loop). A value that is an
    argument of a nested block (a loop's) is not the function's: left unchecked."""
    entry = func.regions[0].blocks[0]
    found, pending = set(), [v for op in walk(func) if op.name == d.ATTENTION
                             for v in (op.operands[2], op.operands[4])]
    while pending:
        value = pending.pop()
        if isinstance(value, ir.BlockArgument):
            if value.owner == entry:
                found.add(value.arg_number)
        elif value.owner.operation.name in _MOVES or onnx_name(value.owner.operation) in _MOVES:
            pending += list(value.owner.operation.operands)
    return tuple(sorted(found))


def _names(func: ir.Operation, attribute: str) -> tuple[str, ...]:
    if attribute not in func.attributes:
        return ()
    return tuple(ir.StringAttr(a).value for a in ir.ArrayAttr(func.attributes[attribute]))


def _attention_call(block, terminator) -> AttentionCall | None:
    for index, value in enumerate(terminator.operands):
        attention = value.owner
        if not isinstance(attention, (d.AttentionOp, d.PagedAttentionOp, d.CacheWriteOp)):
            continue
        argument_of = []
        for operand in attention.operands:
            if not isinstance(operand, ir.BlockArgument) or operand.owner != block:
                return None
            argument_of.append(operand.arg_number)
        if isinstance(attention, d.CacheWriteOp):
            tied = tuple((i, argument_of[3 + ir.OpResult(v).result_number])
                         for i, v in enumerate(terminator.operands) if v.owner == attention)
            return AttentionCall(tuple(argument_of), "cache_write", 0.0, index, tied)
        mode = "paged" if isinstance(attention, d.PagedAttentionOp) else attention.mode
        return AttentionCall(tuple(argument_of), mode, attention.softmax_scale, index)
    return None




def check_arguments(info: FunctionInfo, arrays, *, scales: bool = True) -> list[np.ndarray]:
    """The input checks every target runs before a call (the CPU runtime, CUDA and
    the lane simulator alike): count, dtype and shape per argument, then the
    cache-scale rule (paged: `scales=False` leaves it out, for a caller that
    writes the tokens it reads after this check). Returns the arrays as
    contiguous numpy arrays."""
    call = info.attention
    names = dict(zip(call.argument_of, call.operands)) if call is not None else \
        dict(enumerate(info.argument_names))
    if call is not None and call.mode in ("paged", "cache_write"):
        from .paged_inputs import check_value_layout

        check_value_layout(info, list(arrays))
    arrays = check_signature(info.name, list(info.arguments), list(arrays), names)
    if call is not None and call.mode == "paged":
        from .paged_inputs import check_paged_arguments

        check_paged_arguments(info, arrays, scales=scales)
    elif call is not None and call.mode == "cache_write":
        from .paged_inputs import check_cache_write_arguments

        check_cache_write_arguments(info, arrays)
    else:
        check_cache_scales(info, arrays)
    return arrays


def check_cache_scales(info: FunctionInfo, arrays, read=None) -> None:
    """k_scale and v_scale must be finite and >= 0 (docs/numerics.md,
    *Non-finite and extreme inputs*);
    `read` (operand -> bool mask) limits the check to the entries a call reads.
    An imported ONNX model has no attention of its arguments: the arguments its
    raised attentions read as cache scales (`scale_arguments`) are checked whole."""
    if info.attention is None:
        scales = [(info.argument_name(i), i) for i in info.scale_arguments]
    else:
        scales = [(name, index) for name, index in zip(info.attention.operands,
                                                       info.attention.argument_of)
                  if name.endswith("scale")]
    for name, index in scales:
        values = np.asarray(arrays[index])
        if values.dtype.kind != "f":
            continue
        mask = np.ones(values.shape, bool) if read is None else read[name]
        for problem, bad in (("NaN", np.isnan(values)), ("Inf", np.isinf(values)),
                             ("a negative value", values < 0)):
            bad = bad & mask
            if bad.any():
                where = [int(i) for i in np.argwhere(bad)[0]]
                raise InputError(
                    f"{argument_label(index, name)} of @{info.name} holds {problem} at "
                    f"{where} ({int(bad.sum())} of {bad.size}); cache scales are max|row|/127 of "
                    f"each token and must be finite and >= 0")


def nonfinite_query_rows(info: FunctionInfo, arrays) -> tuple[int, int]:
    """(rows of q holding NaN or Inf, all rows of q): those rows' results are NaN.
    `arrays` as `check_arguments` returns them: a bf16 q rounded as the call passes it
    (a finite f32 past bf16's range is Inf there)."""
    if info.attention is None or info.attention.mode == "cache_write":
        return 0, 0
    q = np.asarray(arrays[info.attention.argument_of[0]])
    rows = q.reshape(-1, q.shape[-1]) if q.ndim else q.reshape(1, 1)
    return int((~np.isfinite(rows)).any(axis=-1).sum()), rows.shape[0]


def memory_bytes(info: FunctionInfo, float_caches: bool = False) -> int:
    """Bytes the arguments (and the float caches behind random k, v) take."""
    size = lambda spec: int(np.prod(spec.shape, dtype=np.int64))
    total = sum(size(s) * np.dtype(NUMPY_DTYPES.get(s.element, np.float32)).itemsize
                for s in info.arguments)
    if float_caches and info.attention is not None:
        for index in (info.attention.argument_of[1], info.attention.argument_of[3]):
            total += size(info.arguments[index]) * 4
    return total


def check_memory(info: FunctionInfo, float_caches: bool = False) -> None:
    """Refuse, before allocating, inputs that would not fit in this machine's memory."""
    import os

    if any(d is None for spec in info.arguments for d in spec.shape):
        return  # dynamic shapes: the inputs' sizes are chosen, not declared
    needed = memory_bytes(info, float_caches)
    try:
        available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if needed > available // 2:
        raise InputError(f"the inputs of @{info.name} need {needed / 2**30:.1f} GiB (with the "
                         f"references, several times that); this machine has "
                         f"{available / 2**30:.1f} GiB: use a smaller graph")


def draw_gaussian(rng: np.random.Generator, spec: TensorSpec, shape=None) -> np.ndarray:
    """Standard normal values of `spec`'s element type in `shape` (default the spec's):
    f32 or f16, or for bf16 f32 values rounded to bf16 (as a call passes them)."""
    values = rng.standard_normal(spec.shape if shape is None else shape)
    if spec.element == BF16:
        return bf16_values(values.astype(np.float32))
    return values.astype(host_dtype(spec.element) or np.float32)


def as_called(info: FunctionInfo, arrays) -> list:
    """The arrays with every bf16 argument rounded to bf16, as the call passes it (what
    the references must see: the rounded q, not the f32 given)."""
    return [bf16_values(a) if i < len(info.arguments) and info.arguments[i].element == BF16
            else a for i, a in enumerate(arrays)]


def random_inputs(info: FunctionInfo, seed: int, *, float_caches: bool = False):
    """Gaussian q (bf16 q: f32 values rounded to bf16); K and V Gaussian, quantized per
    token (int8 + f32 scale).

    With `float_caches`, also returns {"k": K, "v": V} before quantization.
    """
    if info.attention is None:
        raise ValueError(f"@{info.name} does not return an int8attn.attention of its own "
                         f"arguments, so random inputs cannot be made for it; pass --inputs")
    if info.attention.mode in ("paged", "cache_write"):
        from .paged_inputs import random_cache_write_inputs, random_paged_inputs

        make = random_paged_inputs if info.attention.mode == "paged" else random_cache_write_inputs
        arrays = make(info, seed)
        return (arrays, None) if float_caches else arrays
    check_memory(info, float_caches)
    rng = np.random.default_rng(seed)
    q_arg, k_arg, ks_arg, v_arg, vs_arg = info.attention.argument_of
    arrays: list[np.ndarray | None] = [None] * len(info.arguments)
    arrays[q_arg] = draw_gaussian(rng, info.arguments[q_arg])
    floats = {"k": rng.standard_normal(info.arguments[k_arg].shape).astype(np.float32)}
    arrays[k_arg], arrays[ks_arg] = quantize_cache(floats["k"])
    if k_arg == v_arg or ks_arg == vs_arg:
        # One argument serves as both caches (or both scales): V is K, so the
        # float caches behind them stay consistent with what the call reads.
        floats["v"] = floats["k"]
    else:
        floats["v"] = rng.standard_normal(info.arguments[v_arg].shape).astype(np.float32)
    arrays[v_arg], arrays[vs_arg] = quantize_cache(floats["v"])
    return (arrays, floats) if float_caches else arrays


def references(info: FunctionInfo, arrays, *, pv: str, model: str,
               partition_tokens: int = 256, tile_tokens: int = 64,
               scale_groups: str = "fragment", numerics: Numerics = Numerics(),
               progress=None) -> dict[str, np.ndarray]:
    """The exact and the fragment-level reference for the attention result.

    `numerics` is the module's variant (`graph.options.numerics`), default the
    contract's `Numerics()`. `progress` (a callable taking a short string) gets a line
    after each chunk of query rows of the dense references.
    """
    call = info.attention
    arrays = as_called(info, arrays)   # bf16 arguments rounded, as the call sees them
    if call.mode == "cache_write":   # exact: the numpy quantization of the written tokens
        from ..reference import paged_cache_write

        caches = paged_cache_write(*(arrays[i] for i in call.argument_of))
        tied = dict(call.tied)
        expected = caches[call.argument_of.index(tied[call.result_index]) - 3]
        return {"exact": expected, "fragment": expected}
    if call.mode == "paged":
        from ..reference import exact_paged_attention, fragment_paged_attention

        operands = [arrays[i] for i in call.argument_of]
        return {"exact": exact_paged_attention(*operands, call.softmax_scale),
                "fragment": fragment_paged_attention(*operands, call.softmax_scale, pv=pv,
                                                     model=model,
                                                     partition_tokens=partition_tokens,
                                                     scale_groups=scale_groups,
                                                     numerics=numerics)}
    q, k, k_scale, v, v_scale = (arrays[i] for i in call.argument_of)
    return {
        "exact": exact_attention(q, k, k_scale, v, v_scale, call.softmax_scale,
                                 progress=progress),
        "fragment": fragment_attention(q, k, k_scale, v, v_scale, call.softmax_scale, pv=pv,
                                       model=model, partition_tokens=partition_tokens,
                                       tile_tokens=tile_tokens, scale_groups=scale_groups,
                                       numerics=numerics, progress=progress),
    }


def error_stats(actual: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    diff = actual.astype(np.float64) - expected.astype(np.float64)
    return {"max_abs": float(np.max(np.abs(diff))), "rms": float(np.sqrt(np.mean(diff * diff)))}


def decode_graph(batch: int, q_heads: int, kv_heads: int, tokens: int, head_dim: int, *,
                 softmax_scale: float | None = None, name: str = "decode",
                 q_element: str = "f32") -> str:
    """MLIR text of a function returning one decode `int8attn.attention`."""
    return attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode="decode",
                           softmax_scale=softmax_scale, name=name, q_element=q_element)


def prefill_graph(batch: int, q_heads: int, kv_heads: int, tokens: int, query_tokens: int,
                  head_dim: int, *, softmax_scale: float | None = None, name: str = "prefill",
                  q_element: str = "f32") -> str:
    """MLIR text of a function returning one causal prefill `int8attn.attention`."""
    return attention_graph(batch, q_heads, kv_heads, tokens, head_dim, mode="prefill",
                           query_tokens=query_tokens, softmax_scale=softmax_scale, name=name,
                           q_element=q_element)


def attention_graph(batch: int, q_heads: int, kv_heads: int, tokens: int, head_dim: int, *,
                    mode: str, query_tokens: int = 1, softmax_scale: float | None = None,
                    name: str = "attention", q_element: str = "f32") -> str:
    from iree.compiler.dialects import func

    from ..support.ir import new_context

    check_graph_sizes(batch=batch, q_heads=q_heads, kv_heads=kv_heads, tokens=tokens,
                      head_dim=head_dim, mode=mode, query_tokens=query_tokens,
                      softmax_scale=softmax_scale, q_element=q_element)
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        cache = d.tensor([batch, kv_heads, tokens, head_dim], "i8")
        scales = d.tensor([batch, kv_heads, tokens], "f32")
        q_shape = [batch, q_heads] + ([query_tokens] if mode == "prefill" else []) + [head_dim]
        q_type = d.tensor(q_shape, q_element)
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(q_type, cache, scales, cache, scales, name=name)
            def _(q, k, k_scale, v, v_scale):
                return d.attention(q, k, k_scale, v, v_scale, mode=mode, softmax_scale=scale)
        return str(module)


Q_ELEMENTS = ("f32", "f16", "bf16")


def check_graph_sizes(*, batch, q_heads, kv_heads, tokens, head_dim, mode: str,
                      query_tokens=1, softmax_scale=None, q_element: str = "f32") -> None:
    """The arguments of `decode_graph` / `prefill_graph` / `attention_graph`, refused
    with a ValueError naming the argument: every size a positive integer, q_heads a
    multiple of kv_heads (GQA), a prefill's query_tokens at most tokens (its queries are
    the last Sq of the S tokens), softmax_scale finite and > 0, q_element f32/f16/bf16."""
    if mode not in ("decode", "prefill"):
        raise ValueError(f"mode must be 'decode' or 'prefill', got {mode!r}")
    sizes = dict(batch=batch, q_heads=q_heads, kv_heads=kv_heads, tokens=tokens,
                 head_dim=head_dim)
    if mode == "prefill":
        sizes["query_tokens"] = query_tokens
    check_head_sizes(sizes, softmax_scale)
    if mode == "prefill" and query_tokens > tokens:
        raise ValueError(f"query_tokens ({query_tokens}) must be at most tokens ({tokens}): "
                         f"a prefill's queries are the last Sq of the S cached tokens")
    if q_element not in Q_ELEMENTS:
        raise ValueError(f"q_element must be one of {', '.join(Q_ELEMENTS)}, got {q_element!r}")


def check_head_sizes(sizes: dict, softmax_scale=None) -> None:
    """What every graph builder checks (ValueError naming the argument): each of `sizes`
    (name -> value; q_heads and kv_heads among them) a positive integer, q_heads a
    multiple of kv_heads (GQA), and a softmax_scale the contract takes."""
    for name, value in sizes.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be a positive integer, got {value!r} "
                             f"({type(value).__name__})")
        if value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value}"
                             + (" (the default softmax_scale is head_dim ** -0.5)"
                                if name == "head_dim" else ""))
    if sizes["q_heads"] % sizes["kv_heads"]:
        raise ValueError(f"q_heads ({sizes['q_heads']}) must be a multiple of kv_heads "
                         f"({sizes['kv_heads']}): each KV head serves q_heads / kv_heads "
                         f"query heads (GQA)")
    problem = None if softmax_scale is None else softmax_scale_problem(softmax_scale)
    if problem is not None:
        raise ValueError(f"softmax_scale {problem} (omit it for head_dim ** -0.5)")
