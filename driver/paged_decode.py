"""A serving decode loop over the paged INT8 cache, on one compiled module.

    graph = int8attn.compile(paged_decode_graph(32, 8, 128, 16))   # @write and @attend
    cache = PagedCache(blocks=4096, kv_heads=8, block_size=16, head_dim=128)
    decoder = PagedDecoder(graph, cache)
    a = decoder.prefill(k_prompt, v_prompt)           # [L, Hkv, D] each: a new sequence
    out = decoder.step(q, k_new, v_new, [a, b])       # one token per sequence, then attend

`PagedCache` holds the pool (vLLM's layout, docs/design.md §2b) in numpy arrays the
runtime updates in place (64-byte aligned, so `@write` -- `int8attn.cache_write`
lowered by `lower-cache-write` -- stores the new tokens straight into them and
`@attend` reads them, neither copying the pool), a shuffled free list its
blocks come from, and every sequence's block table and length (the tables,
lengths and slots it makes are 64-byte aligned too: the runtime reads them, and
aligned q, k_new and v_new, in place; `runtime.module`). A decode step
is two calls whatever the lengths: `@write` stores every sequence's new token
at the slot its table gives (blocks allocated as a sequence crosses a block
edge), then `@attend` (`int8attn.paged_attention`) attends each sequence over
its own length. B, T, NB and MB are dynamic in the graph, so one compile
serves every step.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..fragments.cache_layout import CacheLayout
from ..runtime.module import InputError, aligned_copy, aligned_empty, check_out


def paged_attention_graph(q_heads: int, kv_heads: int, head_dim: int, block_size: int, *,
                          batch="?", blocks="?", slots="?", softmax_scale: float | None = None,
                          query_tokens: int | None = None, name: str = "paged") -> str:
    """MLIR text of a function returning one `int8attn.paged_attention` of its seven
    arguments; B, NB and MB are dynamic ("?") unless given. With `query_tokens`,
    q is [B, Hq, Sq, D]: chunked prefill of each sequence's last Sq tokens. Bad sizes
    or a bad softmax_scale are refused (ValueError), as by `graph.decode_graph`."""
    from .graph import check_head_sizes

    sizes = dict(q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size)
    check_head_sizes(sizes if query_tokens is None else {**sizes, "query_tokens": query_tokens},
                     softmax_scale)
    scale = _float_literal(softmax_scale if softmax_scale is not None else head_dim ** -0.5)
    chunk = "" if query_tokens is None else f"{query_tokens}x"
    q = f"{batch}x{q_heads}x{chunk}{head_dim}xf32"
    types = [q, *_cache_types(kv_heads, head_dim, block_size, blocks),
             f"{batch}x{slots}xi32", f"{batch}xi32"]
    return (f"func.func @{name}({_arguments(types)}) -> tensor<{q}> {{\n"
            f"  %o = \"int8attn.paged_attention\"({_names(7)}) {{block_size = {block_size} : i64, "
            f"softmax_scale = {scale} : f32}} : ({_types(types)}) -> tensor<{q}>\n"
            f"  return %o : tensor<{q}>\n}}\n")


def _float_literal(value: float) -> str:
    """`value` as an MLIR float literal: Python's shortest repr, with the '.' MLIR's
    lexer needs before an exponent (repr gives 1e-05, MLIR takes 1.0e-05)."""
    text = repr(float(value))
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        text = f"{mantissa}.0e{exponent}"
    return text


def cache_write_graph(kv_heads: int, head_dim: int, block_size: int, *,
                      new_element: str = "f32", k_bias: bool = False,
                      name: str = "write") -> str:
    """MLIR text of one public function @name returning `int8attn.cache_write` of its
    arguments: T new tokens stored at their slots (with `k_bias`, a last argument
    [Hkv, D] f32 subtracted from the new keys before quantizing, reference/key_bias.py)."""
    kv = f"?x{kv_heads}x{head_dim}x{new_element}"
    caches = _cache_types(kv_heads, head_dim, block_size)
    bias = [f"{kv_heads}x{head_dim}xf32"] if k_bias else []
    write_types = [kv, kv, "?xi32", *caches, *bias]
    return (f"func.func @{name}({_arguments(write_types)}) -> ({_types(caches)}) {{\n"
            f"  %c:4 = \"int8attn.cache_write\"({_names(len(write_types))}) "
            f"{{block_size = {block_size} : i64}}"
            f" : ({_types(write_types)}) -> ({_types(caches)})\n"
            f"  return %c#0, %c#1, %c#2, %c#3 : {_types(caches)}\n}}\n")


def paged_decode_graph(q_heads: int, kv_heads: int, head_dim: int, block_size: int, *,
                       softmax_scale: float | None = None, new_element: str = "f32",
                       k_bias: bool = False) -> str:
    """MLIR text of two public functions on one cache: @write (`cache_write_graph`)
    and @attend (paged_attention of a batch)."""
    return ("// Paged decode: @write stores new tokens in the cache, @attend attends a batch.\n"
            + cache_write_graph(kv_heads, head_dim, block_size, new_element=new_element,
                                k_bias=k_bias)
            + paged_attention_graph(q_heads, kv_heads, head_dim, block_size,
                                    softmax_scale=softmax_scale, name="attend"))


def _cache_types(kv_heads, head_dim, block_size, blocks="?") -> list[str]:
    """k_cache, k_scale, v_cache (token-innermost), v_scale of a pool of `blocks`."""
    shapes = CacheLayout.paged(block_size).shapes(blocks, kv_heads, head_dim)
    return ["x".join(map(str, shape)) + f"x{element}"
            for shape, element in zip(shapes, ("i8", "f32", "i8", "f32"))]


def _arguments(types) -> str:
    return ", ".join(f"%a{i}: tensor<{x}>" for i, x in enumerate(types))


def _names(count: int) -> str:
    return ", ".join(f"%a{i}" for i in range(count))


def _types(types) -> str:
    return ", ".join(f"tensor<{x}>" for x in types)


class PoolExhausted(RuntimeError):
    """No free block is left for a sequence that needs one."""


class UnknownSequence(InputError):
    """A sequence id the cache does not hold: never added, or released."""


# Why each size of a pool must be at least 1.
_POOL_SIZES = {"blocks": "a pool of no blocks holds no token",
               "kv_heads": "the pool holds each token's K and V per KV head",
               "block_size": "a block holds at least one token",
               "head_dim": "a token's K and V rows have head_dim elements"}


def _check_pool_sizes(**sizes) -> None:
    """Each size of a PagedCache a positive integer (InputError naming it)."""
    for name, value in sizes.items():
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise InputError(f"PagedCache {name} must be a positive integer, got {value!r} "
                             f"({type(value).__name__}): give a whole number")
        if value < 1:
            raise InputError(f"PagedCache {name} must be a positive integer "
                             f"({_POOL_SIZES[name]}), got {value}")


# The pool sizes of k_cache [NB, Hkv, BS, D], as PagedCache names them.
_POOL_DIMS = ("blocks", "kv_heads", "block_size", "head_dim")


class PagedCache:
    """A pool of `blocks` blocks of `block_size` tokens, its free list and block tables.

    The arrays start as garbage (random int8, NaN scales): a call that read a slot
    no token was written to would be refused (NaN scale) or wrong, never silently
    right. Blocks come from a shuffled free list, so a sequence's blocks are
    scattered over the pool as in a long-running server. Sequence ids are never
    reused. A refused call changes nothing (`transaction`); a block is held by one
    sequence (the cache does not share prefixes, though `paged_attention` reads a
    block listed in two tables as readily as any other).
    """

    def __init__(self, blocks: int, kv_heads: int, block_size: int, head_dim: int, *,
                 seed: int = 0):
        _check_pool_sizes(blocks=blocks, kv_heads=kv_heads, block_size=block_size,
                          head_dim=head_dim)
        blocks, kv_heads, block_size, head_dim = map(int, (blocks, kv_heads, block_size,
                                                           head_dim))
        rng = np.random.default_rng(seed)
        self.block_size = block_size
        self.layout = CacheLayout.paged(block_size)
        k, ks, v, vs = self.layout.shapes(blocks, kv_heads, head_dim)
        self.k_cache, self.v_cache = aligned_empty(k, np.int8), aligned_empty(v, np.int8)
        self.k_scale, self.v_scale = aligned_empty(ks, np.float32), aligned_empty(vs, np.float32)
        for cache in (self.k_cache, self.v_cache):
            cache[...] = rng.integers(-127, 128, cache.shape, dtype=np.int8)
        self.k_scale[...] = np.nan
        self.v_scale[...] = np.nan
        self.free = [int(b) for b in rng.permutation(blocks)]
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.next_sequence = 0

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(k_cache, k_scale, v_cache, v_scale), the operand order of both ops."""
        return self.k_cache, self.k_scale, self.v_cache, self.v_scale

    def check_sequences(self, sequences) -> list[int]:
        """`sequences` as a list, each one held by the cache and named once."""
        if isinstance(sequences, (str, bytes)) or not hasattr(sequences, "__iter__"):
            hint = (f" (for the one sequence {sequences!r}: [{sequences!r}])"
                    if isinstance(sequences, (int, np.integer)) else "")
            raise InputError(f"sequences must be a list of sequence ids, the integers prefill "
                             f"or add_sequence returned, one per row of the batch; got "
                             f"{type(sequences).__name__} {sequences!r}{hint}")
        sequences = list(sequences)
        for s in sequences:
            # True == 1 and 1.0 == 1 would name sequence 1: an id is an integer
            if not isinstance(s, (int, np.integer)) or isinstance(s, (bool, np.bool_)):
                raise UnknownSequence(f"sequence {s!r} is not a sequence id: ids are the "
                                      f"integers prefill or add_sequence returned")
            if s not in self.tables:
                why = ("released" if isinstance(s, (int, np.integer)) and 0 <= s <
                       self.next_sequence else "never added")
                raise UnknownSequence(f"sequence {s!r} is not in the cache ({why}); it holds "
                                      f"sequences {sorted(self.tables)}: use an id that "
                                      f"prefill or add_sequence returned")
        repeated = sorted({s for s in sequences if sequences.count(s) > 1})
        if repeated:
            raise InputError(f"sequence {repeated[0]} appears {sequences.count(repeated[0])} "
                             f"times in one batch; a step gives each sequence one token: "
                             f"name it once")
        return sequences

    def check_room(self, counts: dict[int, int]) -> None:
        """Free blocks enough for `counts[s]` more tokens of each sequence s, together."""
        needed = {s: self._needed(s, n) for s, n in counts.items()}
        if sum(needed.values()) > len(self.free):
            short = {s: n for s, n in needed.items() if n}
            raise PoolExhausted(f"sequences {sorted(short)} need {sum(needed.values())} more "
                                f"blocks; {len(self.free)} are free: release a finished "
                                f"sequence or give the cache more blocks")

    @contextmanager
    def transaction(self):
        """The bookkeeping (tables, lengths, free list, ids) as it was if the body raises."""
        saved = ({s: list(t) for s, t in self.tables.items()}, dict(self.lengths),
                 list(self.free), self.next_sequence)
        try:
            yield
        except BaseException:
            self.tables, self.lengths, self.free, self.next_sequence = saved
            raise

    def _needed(self, sequence: int, count: int) -> int:
        """More blocks `sequence` needs for `count` more tokens."""
        return (self.layout.blocks_needed(self.lengths[sequence] + count)
                - len(self.tables[sequence]))

    def add_sequence(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        self.tables[sequence], self.lengths[sequence] = [], 0
        return sequence

    def append(self, sequence: int, count: int) -> np.ndarray:
        """Slots (block * BS + offset) of `count` more tokens of `sequence`; its length
        grows by `count`, blocks come from the free list as it crosses block edges."""
        self.check_sequences([sequence])
        self.check_room({sequence: count})
        start = self.lengths[sequence]
        table = self.tables[sequence]
        table += [self.free.pop() for _ in range(self._needed(sequence, count))]
        self.lengths[sequence] = start + count
        return self.slots(sequence, np.arange(start, start + count))

    def slots(self, sequence: int, tokens) -> np.ndarray:
        """i32 slots of token positions `tokens` of `sequence` (blocks already held)."""
        self.check_sequences([sequence])
        table = np.array(self.tables[sequence], np.int64)
        return aligned_copy(self.layout.token_slots(table, np.asarray(tokens, np.int64))
                            .astype(np.int32))

    def release(self, sequence: int) -> None:
        """Return a finished sequence's blocks to the free list."""
        self.check_sequences([sequence])
        self.free += self.tables.pop(sequence)
        del self.lengths[sequence]

    def batch(self, sequences) -> tuple[np.ndarray, np.ndarray]:
        """(block_tables [B, MB] i32, context_lens [B] i32) of `sequences`; table slots
        past a sequence's blocks hold -1 (never read). No sequences: [0, 0] and [0]."""
        sequences = self.check_sequences(sequences)
        slots = max((len(self.tables[s]) for s in sequences), default=0)
        tables = aligned_empty((len(sequences), slots), np.int32)
        tables[...] = -1
        for row, s in enumerate(sequences):
            tables[row, :len(self.tables[s])] = self.tables[s]
        return tables, aligned_copy(np.array([self.lengths[s] for s in sequences], np.int32))


class PagedDecoder:
    """Prefill and decode steps on a compiled `paged_decode_graph` and a `PagedCache`.

    `k_bias` [Hkv, D] (for a graph built with `k_bias=True`) is subtracted from every
    key written, a conditioned K cache (reference/key_bias.py; exact for attention).

    Atomic: a `prefill` or `step` that raises leaves the cache as it was (no
    sequence added, no length grown, no block taken, nothing written), so a retry
    after fixing the input gives what the first call would have. Every input is
    checked before the first write; the bookkeeping is restored on any failure,
    including one in the runtime after the write (the token it wrote then lies
    past its sequence's length, never read, and the retry writes the same slot).
    """

    def __init__(self, graph, cache: PagedCache, *, write: str = "write",
                 attend: str = "attend", k_bias: np.ndarray | None = None):
        self.graph, self.cache = graph, cache
        self.write_function, self.attend_function = write, attend
        self.k_bias = () if k_bias is None else (np.asarray(k_bias, np.float32),)
        takes = len(graph.entry(write).arguments)
        if takes != 7 + len(self.k_bias):   # k_new, v_new, slots, the 4 caches (+ k_bias)
            biased = bool(self.k_bias)
            raise InputError(f"@{write} takes {takes} arguments, but the decoder was given "
                             f"{'a' if biased else 'no'} k_bias: build the graph "
                             f"{'with' if biased else 'without'} one (paged_decode_graph(..., "
                             f"k_bias={biased})), or {'drop' if biased else 'give'} k_bias")
        for function in (write, attend):
            self._check_cache_fits(function)
        self.last_batch: tuple[np.ndarray, np.ndarray] | None = None

    def _check_cache_fits(self, function: str) -> None:
        """The cache's pool sizes are what `function`'s k_cache takes (a dynamic size
        takes any), refused here rather than at the first prefill."""
        info = self.graph.entry(function)
        call = info.attention
        if call is None or "k_cache" not in call.operands:
            raise InputError(f"@{function} returns no int8attn.cache_write or paged_attention "
                             f"of its arguments, so it cannot work on a PagedCache: build "
                             f"the graph with paged_decode_graph(...)")
        spec = info.arguments[call.argument_of[call.operands.index("k_cache")]]
        have = self.cache.k_cache.shape
        for name, takes, size in zip(_POOL_DIMS, spec.shape, have):
            if takes is not None and takes != size:
                graph = (f"paged_decode_graph(..., {name}={size})" if name != "blocks"
                         else f"a graph whose pool has {size} blocks")
                raise InputError(
                    f"PagedDecoder: the cache's {name} is {size} but @{function} takes "
                    f"{name} {takes} (its k_cache is {spec.describe()}): build the cache "
                    f"with PagedCache(..., {name}={takes}), or the graph with {graph}")

    def write(self, k_new, v_new, slot_mapping) -> None:
        """`@write`: the tokens' quantized rows stored at their slots, in the cache arrays
        (checked first: a refused write stores nothing)."""
        self.graph(k_new, v_new, slot_mapping, *self.cache.arrays, *self.k_bias,
                   function=self.write_function)

    def prefill(self, k, v) -> int:
        """A new sequence holding the tokens k, v [L, Hkv, D]; returns its id."""
        tokens = len(k) if np.ndim(k) else 0
        with self.cache.transaction():
            sequence = self.cache.add_sequence()
            self.write(k, v, self.cache.append(sequence, tokens))
        return sequence

    def step(self, q, k_new, v_new, sequences, *, out=None) -> np.ndarray:
        """One decode step: sequence sequences[b] gets token (k_new[b], v_new[b]), its
        length grows by one, and it attends with q[b] over all its tokens. No
        sequences: nothing is written and the result is q's empty [0, Hq, D]. `out`: a
        caller-owned f32 array of q's shape the result is written into and returned as."""
        from .graph import check_arguments

        sequences = self.cache.check_sequences(sequences)
        self.cache.check_room({s: 1 for s in sequences})
        with self.cache.transaction():
            slots = aligned_copy(np.concatenate([np.zeros(0, np.int32),
                                                 *(self.cache.append(s, 1) for s in sequences)]))
            batch = self.cache.batch(sequences)
            # @attend's inputs but the scales of the new tokens, before anything is written.
            attend = self.graph.entry(self.attend_function)
            check_arguments(attend, [q, *self.cache.arrays, *batch], scales=False)
            if out is not None:
                check_out(attend.name, attend.results, out)
            self.write(k_new, v_new, slots)
            into = {} if out is None else {"out": out}
            out = self.graph(q, *self.cache.arrays, *batch, function=self.attend_function,
                             **into)
        self.last_batch = batch
        return out
