"""A serving decode loop over the paged INT8 cache, on one compiled module.

    graph = int8attn.compile(paged_decode_graph(32, 8, 128, 16))   # @write and @attend
    cache = PagedCache(blocks=4096, kv_heads=8, block_size=16, head_dim=128)
    decoder = PagedDecoder(graph, cache)
    a = decoder.prefill(k_prompt, v_prompt)           # [L, Hkv, D] each: a new sequence
    out = decoder.step(q, k_new, v_new, [a, b])       # one token per sequence, then attend

`PagedCache` holds the pool (vLLM's layout, DESIGN.md §2b) in numpy arrays the
runtime updates in place (64-byte aligned, so `@write` -- `int8attn.cache_write`
lowered by `lower-cache-write` -- stores the new tokens straight into them and
`@attend` reads them, neither copying the pool), a shuffled free list its
blocks come from, and every sequence's block table and length. A decode step
is two calls whatever the lengths: `@write` stores every sequence's new token
at the slot its table gives (blocks allocated as a sequence crosses a block
edge), then `@attend` (`int8attn.paged_attention`) attends each sequence over
its own length. B, T, NB and MB are dynamic in the graph, so one compile
serves every step.
"""

from __future__ import annotations

import numpy as np

from int8attn.runtime.module import aligned_empty


def paged_attention_graph(q_heads: int, kv_heads: int, head_dim: int, block_size: int, *,
                          batch="?", blocks="?", slots="?", softmax_scale: float | None = None,
                          query_tokens: int | None = None, name: str = "paged") -> str:
    """MLIR text of a function returning one `int8attn.paged_attention` of its seven
    arguments; B, NB and MB are dynamic ("?") unless given. With `query_tokens`,
    q is [B, Hq, Sq, D]: chunked prefill of each sequence's last Sq tokens."""
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    chunk = "" if query_tokens is None else f"{query_tokens}x"
    q = f"{batch}x{q_heads}x{chunk}{head_dim}xf32"
    types = [q, *_cache_types(kv_heads, head_dim, block_size, blocks),
             f"{batch}x{slots}xi32", f"{batch}xi32"]
    return (f"func.func @{name}({_arguments(types)}) -> tensor<{q}> {{\n"
            f"  %o = \"int8attn.paged_attention\"({_names(7)}) {{block_size = {block_size} : i64, "
            f"softmax_scale = {scale} : f32}} : ({_types(types)}) -> tensor<{q}>\n"
            f"  return %o : tensor<{q}>\n}}\n")


def paged_decode_graph(q_heads: int, kv_heads: int, head_dim: int, block_size: int, *,
                       softmax_scale: float | None = None, new_element: str = "f32",
                       k_bias: bool = False) -> str:
    """MLIR text of two public functions on one cache: @write (cache_write of T new
    tokens; with `k_bias`, a last argument [Hkv, D] f32 subtracted from the new keys
    before quantizing, reference/key_bias.py) and @attend (paged_attention of a batch)."""
    kv = f"?x{kv_heads}x{head_dim}x{new_element}"
    caches = _cache_types(kv_heads, head_dim, block_size)
    bias = [f"{kv_heads}x{head_dim}xf32"] if k_bias else []
    write_types = [kv, kv, "?xi32", *caches, *bias]
    return (
        f"// Paged decode: @write stores new tokens in the cache, @attend attends a batch.\n"
        f"func.func @write({_arguments(write_types)}) -> ({_types(caches)}) {{\n"
        f"  %c:4 = \"int8attn.cache_write\"({_names(len(write_types))}) "
        f"{{block_size = {block_size} : i64}}"
        f" : ({_types(write_types)}) -> ({_types(caches)})\n"
        f"  return %c#0, %c#1, %c#2, %c#3 : {_types(caches)}\n}}\n"
        + paged_attention_graph(q_heads, kv_heads, head_dim, block_size,
                                softmax_scale=softmax_scale, name="attend"))


def _cache_types(kv_heads, head_dim, block_size, blocks="?") -> list[str]:
    """k_cache, k_scale, v_cache (token-innermost), v_scale of a pool of `blocks`."""
    return [f"{blocks}x{kv_heads}x{block_size}x{head_dim}xi8",
            f"{blocks}x{kv_heads}x{block_size}xf32",
            f"{blocks}x{kv_heads}x{head_dim}x{block_size}xi8",
            f"{blocks}x{kv_heads}x{block_size}xf32"]


def _arguments(types) -> str:
    return ", ".join(f"%a{i}: tensor<{x}>" for i, x in enumerate(types))


def _names(count: int) -> str:
    return ", ".join(f"%a{i}" for i in range(count))


def _types(types) -> str:
    return ", ".join(f"tensor<{x}>" for x in types)


class PoolExhausted(RuntimeError):
    """No free block is left for a sequence that needs one."""


class PagedCache:
    """A pool of `blocks` blocks of `block_size` tokens, its free list and block tables.

    The arrays start as garbage (random int8, NaN scales): a call that read a slot
    no token was written to would be refused (NaN scale) or wrong, never silently
    right. Blocks come from a shuffled free list, so a sequence's blocks are
    scattered over the pool as in a long-running server.
    """

    def __init__(self, blocks: int, kv_heads: int, block_size: int, head_dim: int, *,
                 seed: int = 0):
        rng = np.random.default_rng(seed)
        self.block_size = block_size
        self.k_cache = aligned_empty((blocks, kv_heads, block_size, head_dim), np.int8)
        self.v_cache = aligned_empty((blocks, kv_heads, head_dim, block_size), np.int8)
        self.k_scale = aligned_empty((blocks, kv_heads, block_size), np.float32)
        self.v_scale = aligned_empty((blocks, kv_heads, block_size), np.float32)
        for cache in (self.k_cache, self.v_cache):
            cache[...] = rng.integers(-127, 128, cache.shape, dtype=np.int8)
        self.k_scale[...] = np.nan
        self.v_scale[...] = np.nan
        self.free = [int(b) for b in rng.permutation(blocks)]
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(k_cache, k_scale, v_cache, v_scale), the operand order of both ops."""
        return self.k_cache, self.k_scale, self.v_cache, self.v_scale

    def add_sequence(self) -> int:
        sequence = len(self.tables)
        self.tables[sequence], self.lengths[sequence] = [], 0
        return sequence

    def append(self, sequence: int, count: int) -> np.ndarray:
        """Slots (block * BS + offset) of `count` more tokens of `sequence`; its length
        grows by `count`, blocks come from the free list as it crosses block edges."""
        start = self.lengths[sequence]
        tokens = np.arange(start, start + count)
        table = self.tables[sequence]
        needed = -(-(start + count) // self.block_size) - len(table)
        if needed > len(self.free):
            raise PoolExhausted(f"sequence {sequence} needs {needed} more blocks; "
                                f"{len(self.free)} are free")
        table += [self.free.pop() for _ in range(needed)]
        self.lengths[sequence] = start + count
        return self.slots(sequence, tokens)

    def slots(self, sequence: int, tokens) -> np.ndarray:
        """i32 slots of token positions `tokens` of `sequence` (blocks already held)."""
        tokens = np.asarray(tokens, np.int64)
        blocks = np.array(self.tables[sequence], np.int64)[tokens // self.block_size]
        return (blocks * self.block_size + tokens % self.block_size).astype(np.int32)

    def release(self, sequence: int) -> None:
        """Return a finished sequence's blocks to the free list."""
        self.free += self.tables.pop(sequence)
        del self.lengths[sequence]

    def batch(self, sequences) -> tuple[np.ndarray, np.ndarray]:
        """(block_tables [B, MB] i32, context_lens [B] i32) of `sequences`; table slots
        past a sequence's blocks hold -1 (never read)."""
        slots = max(len(self.tables[s]) for s in sequences)
        tables = np.full((len(sequences), slots), -1, np.int32)
        for row, s in enumerate(sequences):
            tables[row, :len(self.tables[s])] = self.tables[s]
        return tables, np.array([self.lengths[s] for s in sequences], np.int32)


class PagedDecoder:
    """Prefill and decode steps on a compiled `paged_decode_graph` and a `PagedCache`.

    `k_bias` [Hkv, D] (for a graph built with `k_bias=True`) is subtracted from every
    key written, a conditioned K cache (reference/key_bias.py; exact for attention).
    """

    def __init__(self, graph, cache: PagedCache, *, write: str = "write",
                 attend: str = "attend", k_bias: np.ndarray | None = None):
        self.graph, self.cache = graph, cache
        self.write_function, self.attend_function = write, attend
        self.k_bias = () if k_bias is None else (np.asarray(k_bias, np.float32),)
        self.last_batch: tuple[np.ndarray, np.ndarray] | None = None

    def write(self, k_new, v_new, slot_mapping) -> None:
        """`@write`: the tokens' quantized rows stored at their slots, in the cache arrays."""
        self.graph(k_new, v_new, slot_mapping, *self.cache.arrays, *self.k_bias,
                   function=self.write_function)

    def prefill(self, k, v) -> int:
        """A new sequence holding the tokens k, v [L, Hkv, D]; returns its id."""
        sequence = self.cache.add_sequence()
        self.write(k, v, self.cache.append(sequence, len(k)))
        return sequence

    def step(self, q, k_new, v_new, sequences) -> np.ndarray:
        """One decode step: sequence sequences[b] gets token (k_new[b], v_new[b]), its
        length grows by one, and it attends with q[b] over all its tokens."""
        slots = np.concatenate([self.cache.append(s, 1) for s in sequences])
        self.write(k_new, v_new, slots)
        self.last_batch = self.cache.batch(sequences)
        return self.graph(q, *self.cache.arrays, *self.last_batch,
                          function=self.attend_function)
