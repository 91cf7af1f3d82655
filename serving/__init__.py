"""Serving: the compiled paged kernels called from a program on torch tensors.

`PagedAttention` (serving/paged_attention.py) is the entry point; `torch_ops`
registers it as `torch.ops.int8attn.paged_attention` / `cache_write`.
"""

__all__ = ["PagedAttention"]


def __getattr__(name):
    if name == "PagedAttention":
        from .paged_attention import PagedAttention

        return PagedAttention
    raise AttributeError(name)
