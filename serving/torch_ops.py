"""`torch.ops.int8attn.paged_attention` and `torch.ops.int8attn.cache_write`.

    from . import torch_ops
    handle = torch_ops.register(attn)               # a PagedAttention
    torch.ops.int8attn.cache_write(k_new, v_new, slots, kc, ks, vc, vs, handle, False)
    out = torch.ops.int8attn.paged_attention(q, kc, ks, vc, vs, tables, lens, handle, False)

Custom ops (torch.library) so that `torch.compile` traces through them (their
fake implementations give the result's shape and dtype without running
anything) and CUDA graphs capture them: `cache_write` declares the four caches
it updates in place (`mutates_args`), `paged_attention` returns a new f32
tensor of q's shape. A `PagedAttention` is not a tensor, so an op names it by
the int handle `register` returns. `validate` True (the default) checks the
values on the device without a host sync, inside a captured graph too (once a
call outside the capture has made the record): `attention.check()` raises what
the calls recorded; False checks none (serving/paged_attention.py).

The registry holds each registered PagedAttention (and so its compiled modules and
IREE contexts) for the handle's sake until the interpreter exits; an exit hook then
empties it, so that they are released while IREE's runtime is still there to release
them (else nanobind reports them leaked at teardown).
"""

from __future__ import annotations

import atexit
import gc

from .tensors import torch_module

torch = torch_module()
Tensor = torch.Tensor

_REGISTRY: dict[int, object] = {}


@atexit.register
def _release() -> None:
    """Drop the registered PagedAttention objects at exit (module docstring)."""
    _REGISTRY.clear()
    gc.collect()


def register(attention) -> int:
    """A handle naming `attention` (a PagedAttention) in the ops' calls."""
    for handle, known in _REGISTRY.items():
        if known is attention:
            return handle
    handle = len(_REGISTRY) + 1
    _REGISTRY[handle] = attention
    return handle


def _attention(handle: int):
    if handle not in _REGISTRY:
        raise ValueError(f"int8attn op handle {handle} names no PagedAttention: get one from "
                         f"int8attn.serving.torch_ops.register(attention)")
    return _REGISTRY[handle]


@torch.library.custom_op("int8attn::paged_attention", mutates_args=())
def paged_attention(q: Tensor, k_cache: Tensor, k_scale: Tensor, v_cache: Tensor,
                    v_scale: Tensor, block_tables: Tensor, context_lens: Tensor,
                    handle: int, validate: bool = True) -> Tensor:
    return _attention(handle)(q, k_cache, k_scale, v_cache, v_scale, block_tables,
                              context_lens, validate=validate)


@paged_attention.register_fake
def _(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, handle,
      validate=True):
    return q.new_empty(q.shape, dtype=torch.float32)


@torch.library.custom_op("int8attn::cache_write",
                         mutates_args=("k_cache", "k_scale", "v_cache", "v_scale"))
def cache_write(k_new: Tensor, v_new: Tensor, slot_mapping: Tensor, k_cache: Tensor,
                k_scale: Tensor, v_cache: Tensor, v_scale: Tensor, handle: int,
                validate: bool = True) -> None:
    _attention(handle).write(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale,
                             validate=validate)


@cache_write.register_fake
def _(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale, handle, validate=True):
    return None
