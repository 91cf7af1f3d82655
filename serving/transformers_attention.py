"""int8attn as a transformers attention implementation, "int8attn_paged", over a paged INT8 cache.

    from .transformers_attention import (PagedInt8Cache, install,
                                         paged_attention_for)
    attn = paged_attention_for(model.config, target="cpu")   # cuda: PagedAttention.load(dir)
    install(model)                                           # once per model
    cache = PagedInt8Cache(model.config, attn, blocks=256)   # one per batch of prompts
    out = model.generate(ids, attention_mask=mask, past_key_values=cache,
                         max_new_tokens=64, do_sample=False)

transformers' own modeling code runs unchanged: each attention layer projects and rotates
q, k and v, calls `cache.update` (PagedInt8Cache quantizes and writes the new tokens into
the layer's pool, in place) and then the attention function registered here, which reads
the pool through PagedAttention. A decode step is one batched decode call per layer; a
prefill of ragged left-padded prompts is one chunked-prefill call for the chunks of every
prompt of at least `chunk` tokens (full chunks, then the last `chunk` tokens) and one
decode call for the tokens of shorter prompts (query t over the first t + 1 tokens), so
the decode and one prefill kernel serve every length. Padding positions give zeros. The
result is cast back to the model's dtype (q may be bf16: the kernels take it as is).

How the function finds the cache: `install(model)` registers the function with
transformers' AttentionInterface, switches the model to it (`set_attn_implementation`)
and puts a forward pre-hook on the model's base model. Before every forward the hook
takes the cache passed to it (`past_key_values=`, or `cache=` as later 5.x name it),
hands it the forward's 2D attention mask (`PagedInt8Cache.begin_step`, which plans the
step) and binds it to every attention module as the attribute `int8attn_cache`; the
function reads `module.int8attn_cache` and `module.layer_idx`. A hook after the forward
(registered with always_call=True: it runs when the forward raises too) ends the step
(`PagedInt8Cache.end_step`: committed if the forward returned and every layer wrote and
attended, else rolled back to the cache before the step) and unbinds the cache. During
the forward the cache counts the positions seen before the step, so a plain forward
without position_ids numbers the new tokens from there, as with a DynamicCache. In a
forward without a PagedInt8Cache the function refuses to run (InputError).
"""

from __future__ import annotations

import math

from ..runtime.module import InputError
from .paged_attention import PagedAttention
from .transformers_cache import PagedInt8Cache, PagedLayer, model_shape

__all__ = ["NAME", "PagedInt8Cache", "PagedLayer", "cache_keyword", "install",
           "paged_attention_for", "paged_attention_forward", "register"]

NAME = "int8attn_paged"
CACHE_ATTRIBUTE = "int8attn_cache"


def paged_attention_for(config, *, target: str = "cuda", block_size: int = 16,
                        **options) -> PagedAttention:
    """The PagedAttention of a decoder config's heads, head dim and softmax scale
    (D^-0.5, what transformers' Llama-family attention uses)."""
    _, q_heads, kv_heads, head_dim = model_shape(config)
    return PagedAttention(q_heads, kv_heads, head_dim, block_size, target=target, **options)


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None,
                            dropout: float = 0.0, **kwargs):
    """transformers' attention-function signature: query [B, Hq, S, D] (key and value
    are the new states `update` returned; the pool holds them). Returns
    ([B, S, Hq, D] in query's dtype, None): no attention weights."""
    cache = getattr(module, CACHE_ATTRIBUTE, None)
    if not isinstance(cache, PagedInt8Cache):
        raise InputError(f"attention '{NAME}' runs on a PagedInt8Cache: call install(model) "
                         f"and pass the cache to the forward (past_key_values=cache)")
    if dropout:
        raise InputError(f"attention '{NAME}' is inference only: dropout={dropout} "
                         f"(call model.eval())")
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise InputError(f"attention '{NAME}' has no {name} (got {kwargs[name]!r})")
    wanted = cache.attention.softmax_scale
    if scaling is not None and not math.isclose(scaling, wanted, rel_tol=1e-6):
        raise InputError(f"layer {module.layer_idx} scales scores by {scaling}, the "
                         f"PagedAttention by {wanted}: build it with softmax_scale={scaling}")
    out = cache.attend(module.layer_idx, query)
    return out.to(query.dtype), None


def cache_keyword(model) -> str:
    """The name `model`'s forward and generate take the cache by: "cache" in later
    transformers 5.x, "past_key_values" before (still accepted there, deprecated)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def register() -> str:
    """Register the function as attention implementation NAME (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, paged_attention_forward)
    return NAME


def _attention_modules(model) -> list:
    return [m for m in model.modules()
            if type(m).__name__.endswith("Attention") and hasattr(m, "layer_idx")]


def install(model):
    """Run `model`'s attention through int8attn: register the function, switch the
    model to it and hook its forwards (module docstring). Returns the hooks' handle
    (`.remove()` removes them; `model.set_attn_implementation('sdpa')` switches back
    while leaving them harmless)."""
    register()
    model.set_attn_implementation(NAME)
    base = getattr(model, "base_model", model)
    modules = _attention_modules(base)
    if not modules:
        raise InputError(f"{type(model).__name__} has no attention modules with a layer_idx "
                         f"(transformers' decoder attention classes have one)")
    previous = getattr(base, "_int8attn_hooks", None)
    if previous is not None:
        previous.remove()

    def bind(cache):
        for attention in modules:
            setattr(attention, CACHE_ATTRIBUTE, cache)

    def begin_step(_, args, kwargs):
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        paged = cache if isinstance(cache, PagedInt8Cache) else None
        bind(paged)
        if paged is None:
            return
        tokens = kwargs.get("input_ids", args[0] if args else None)
        if tokens is None:
            tokens = kwargs.get("inputs_embeds")
        paged.begin_step(kwargs.get("attention_mask"), tokens.shape[1], tokens.shape[0])

    def end_step(_, args, output):
        # torch passes output None when the forward (or a pre-hook) raised: roll back.
        paged = getattr(modules[0], CACHE_ATTRIBUTE, None)
        bind(None)
        if isinstance(paged, PagedInt8Cache):
            paged.end_step(ok=output is not None)

    base._int8attn_hooks = _Hooks(
        base.register_forward_pre_hook(begin_step, with_kwargs=True),
        base.register_forward_hook(end_step, always_call=True))
    return base._int8attn_hooks


class _Hooks:
    """The pre-hook that plans the step and binds the cache, and the hook that ends the
    step and unbinds the cache after the forward (the model holds no cache between
    forwards)."""

    def __init__(self, *handles):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
