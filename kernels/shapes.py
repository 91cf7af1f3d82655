"""The shapes a decode or prefill kernel is built for: what is static in its module.

A dense cache fixes every size (`DenseShape`, `PrefillShape`); over the block pool
the batch, the pool and the table width are the host's run-time values and the
shape holds the rest (`PagedShape`, `PagedPrefillShape`).
"""

from __future__ import annotations

from dataclasses import dataclass


class _GroupedHeads:
    """Query heads: `rows` per KV head (the GQA group), `kv_heads` of them."""

    kv_heads: int
    rows: int

    @property
    def q_heads(self) -> int:
        return self.kv_heads * self.rows


@dataclass(frozen=True)
class DenseShape(_GroupedHeads):
    batch: int
    kv_heads: int
    rows: int          # query heads per KV head (<= 16)
    tokens: int
    head_dim: int
    softmax_scale: float


@dataclass(frozen=True)
class PagedShape(_GroupedHeads):
    kv_heads: int
    rows: int
    head_dim: int
    block_size: int
    softmax_scale: float


@dataclass(frozen=True)
class PrefillShape(_GroupedHeads):
    batch: int
    kv_heads: int
    rows: int          # query heads per KV head
    tokens: int        # S: the cached tokens, the new ones last
    query_tokens: int  # Sq: the new tokens, causal over the history
    head_dim: int
    softmax_scale: float


@dataclass(frozen=True)
class PagedPrefillShape(_GroupedHeads):
    kv_heads: int
    rows: int          # query heads per KV head
    query_tokens: int  # Sq: the new tokens, the last Sq of each sequence
    head_dim: int
    block_size: int
    softmax_scale: float
