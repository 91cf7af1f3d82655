"""Inputs of `int8attn.paged_attention` and `int8attn.cache_write`: the checks before
every call, and random inputs.

What the verifier cannot see is checked here, before the call, and named by
argument, sequence and slot: the batch of q, block_tables and context_lens
agree, the pool's block count agrees across the caches, every length is in
[1, MB·BS] ([Sq, MB·BS] for a chunked prefill), every table slot a sequence
uses holds a block of the pool, and the scales of every token a call reads are
finite and >= 0. A batch of no sequences is legal: it reads nothing and its result
is empty. A token-major value cache is named as such. Table slots and
pool entries past a sequence's length are never read, so they are not checked.

cache_write: k_new, v_new and slot_mapping agree on the number of new tokens T,
the caches on NB, every slot is in [0, NB·BS) or negative (vLLM's padding: the
token is skipped), and no two tokens write one slot (which one the cache would
hold is ambiguous); a k_bias operand holds only finite values, and so does every
row written (k_new minus k_bias, v_new; a skipped token's row may hold anything).
A refused call writes nothing.
"""

from __future__ import annotations

import numpy as np

from ..fragments.cache_layout import EVERY, CacheLayout
from ..reference import quantize_cache
from ..runtime.module import InputError, argument_label


def _operands(info, arrays) -> dict[str, np.ndarray]:
    call = info.attention
    return {name: np.asarray(arrays[i]) for name, i in zip(call.operands, call.argument_of)}


def _label(info, name: str) -> str:
    index = info.attention.argument(name)
    return f"{argument_label(index, name)} of @{info.name}"


def read_tokens(block_tables, context_lens, block_size: int):
    """(block, offset) of every token the call reads, all sequences together."""
    layout = CacheLayout.paged(block_size)
    slots = [layout.sequence_addresses(block_tables[b], context_lens[b])
             for b in range(len(context_lens))]
    none = np.zeros(0, np.int64)                 # an empty batch reads no token
    return (np.concatenate([none, *(s[0] for s in slots)]),
            np.concatenate([none, *(s[1] for s in slots)]))


def _pool(info, ops) -> tuple[int, int]:
    """(NB, BS) of the block pool; the caches and scales must agree on NB."""
    pool = {name: ops[name].shape[0] for name in ("k_cache", "k_scale", "v_cache", "v_scale")}
    if len(set(pool.values())) != 1:
        raise InputError(f"@{info.name}: the caches disagree on the number of blocks: "
                         + ", ".join(f"{n} {c}" for n, c in pool.items()))
    return pool["k_cache"], ops["k_cache"].shape[2]


def check_paged_shapes(info, ops) -> tuple[int, int]:
    """(NB, BS) once the batch of q, block_tables and context_lens and the pool's block
    count agree; `ops` maps operand names to anything with a `shape` (numpy arrays,
    torch tensors: the shapes alone are read)."""
    q, tables, lens = ops["q"], ops["block_tables"], ops["context_lens"]
    if not q.shape[0] == tables.shape[0] == lens.shape[0]:
        raise InputError(f"@{info.name}: q has {q.shape[0]} sequences, block_tables "
                         f"{tables.shape[0]} and context_lens {lens.shape[0]}; they must agree "
                         f"(one row of each per sequence)")
    return _pool(info, ops)


def check_paged_arguments(info, arrays, *, scales: bool = True) -> None:
    """Batch, pool, lengths and block ids; with `scales`, the scales of every token
    read (a caller that writes those tokens first checks the rest before writing)."""
    ops = _operands(info, arrays)
    q, tables, lens = ops["q"], ops["block_tables"], ops["context_lens"]
    blocks, block_size = check_paged_shapes(info, ops)
    layout = CacheLayout.paged(block_size)
    capacity = layout.capacity(tables.shape[1])
    # A chunked prefill's queries are each sequence's last Sq tokens.
    shortest = q.shape[2] if q.ndim == 4 else 1
    for b, length in enumerate(lens):
        if q.ndim == 4 and shortest > capacity:
            raise InputError(chunk_too_long(info, b, int(length), shortest,
                                             tables.shape[1], block_size))
        if not shortest <= length <= capacity:
            raise InputError(length_problem(info, b, int(length), shortest, tables.shape[1],
                                            block_size))
        used = layout.blocks_needed(int(length))
        ids = tables[b, :used]
        bad = np.flatnonzero((ids < 0) | (ids >= blocks))
        if bad.size:
            slot = int(bad[0])
            raise InputError(block_id_problem(info, b, slot, int(length), int(ids[slot]),
                                              blocks, block_size))
    if scales:
        _check_read_scales(info, ops, layout, *read_tokens(tables, lens, block_size))


def length_problem(info, b: int, length: int, shortest: int, slots: int,
                   block_size: int) -> str:
    """Sequence `b`'s length outside [shortest, its table's capacity]."""
    capacity = CacheLayout.paged(block_size).capacity(slots)
    return (f"{_label(info, 'context_lens')}: sequence {b} has length {length}, outside "
            f"[{shortest}, {capacity}] "
            f"({_length_hint(length, shortest, slots, block_size)})")


def block_id_problem(info, b: int, slot: int, length: int, block: int, blocks: int,
                     block_size: int) -> str:
    """Table slot `slot` of sequence `b`, which its length uses, outside the pool."""
    layout = CacheLayout.paged(block_size)
    # the slot's tokens: from those of the slots before it to its last used one
    first, end = layout.capacity(slot), min(layout.capacity(slot + 1), length)
    return (f"{_label(info, 'block_tables')}: sequence {b}, slot {slot} "
            f"(tokens {first}..{end - 1}) "
            f"holds block {block}, not a block of the pool [0, {blocks})")


def read_scale_problem(info, name: str, problem: str, block: int, head: int,
                       offset: int) -> str:
    """A scale a sequence reads that is NaN, Inf or negative (`problem` says which)."""
    return (f"{_label(info, name)} holds {problem} at [{block}, {head}, {offset}], a slot "
            f"a sequence reads; cache scales are max|row|/127 of each token "
            f"and must be finite and >= 0")


SCALE_PROBLEMS = ("NaN", "Inf", "a negative value")   # the order they are looked for in


def _slots(slots: int, block_size: int) -> str:
    return f"{slots} slot{'' if slots == 1 else 's'} of {block_size} tokens"


def chunk_too_long(info, b: int, length: int, query_tokens: int, slots: int,
                    block_size: int) -> str:
    """A chunked prefill whose Sq new tokens exceed what a block table can hold."""
    layout = CacheLayout.paged(block_size)
    capacity = layout.capacity(slots)
    needed = int(layout.blocks_needed(query_tokens))
    split = (f", or split the prefill into chunks of at most {capacity} tokens"
             if capacity else "")
    return (f"{_label(info, 'q')}: a chunk of Sq = {query_tokens} new tokens cannot fit a "
            f"block table of {capacity} tokens ({_slots(slots, block_size)}; sequence {b} "
            f"has length {length}): give block_tables at least {needed} "
            f"slot{'' if needed == 1 else 's'}{split}")


def _length_hint(length: int, shortest: int, slots: int, block_size: int) -> str:
    """Why a sequence's length is refused, and what to do about it."""
    capacity = CacheLayout.paged(block_size).capacity(slots)
    if length > capacity:
        return (f"its block table has {_slots(slots, block_size)}: give it a wider "
                f"table or a shorter length")
    if shortest > 1:
        return (f"its {shortest} new query tokens are the last of its tokens: write them to "
                f"the cache first (cache_write)")
    return ("a decoding sequence attends to at least the token it just wrote: write it "
            "first, or leave the sequence out of the batch")


def _check_read_scales(info, ops, layout, block, offset) -> None:
    """The scales of every token a call reads are finite and >= 0."""
    for name in ("k_scale", "v_scale"):
        scales = ops[name][layout.scale_index(block, EVERY, offset)]   # [tokens read, Hkv]
        for problem, bad in zip(SCALE_PROBLEMS, (np.isnan(scales), np.isinf(scales),
                                                 scales < 0)):
            if bad.any():
                token, head = (int(i) for i in np.argwhere(bad)[0])
                raise InputError(read_scale_problem(info, name, problem, int(block[token]),
                                                    head, int(offset[token])))


NUMPY_TRANSPOSE = "numpy.ascontiguousarray(v.transpose(0, 1, 3, 2))"
TORCH_TRANSPOSE = "v.transpose(2, 3).contiguous()"


def check_value_layout(info, arrays, transpose: str = NUMPY_TRANSPOSE) -> None:
    """A token-major value cache ([NB, Hkv, BS, D], the dense layout) where the op takes
    vLLM's token-innermost one ([NB, Hkv, D, BS]) is named as such, before the shape
    check's plainer message, with the `transpose` that fixes it (numpy's or torch's)."""
    if info.attention is None or len(arrays) != len(info.arguments):
        return
    index = info.attention.argument("v_cache")
    _, kv_heads, head_dim, block_size = info.arguments[index].shape
    shape = np.shape(arrays[index])
    token_major = CacheLayout.paged(block_size, v_token_innermost=False)
    if head_dim != block_size and len(shape) == 4 and shape[1:] == token_major.v_shape(
            None, kv_heads, block_size, head_dim)[1:]:
        _refuse_swapped_caches(info, arrays)
        raise InputError(f"{_label(info, 'v_cache')} has shape {list(shape)}, the token-major "
                         f"layout [NB, Hkv, BS, D]; the paged value cache is token-innermost "
                         f"[NB, Hkv, D, BS] = [?, {kv_heads}, {head_dim}, {block_size}] (vLLM's "
                         f"value cache): pass {transpose}")


def _refuse_swapped_caches(info, arrays) -> None:
    """The value cache given in the key cache's place and the key cache in the value
    cache's (each has the other's layout): a swap, not a layout to transpose."""
    key, value = (info.attention.argument(name) for name in ("k_cache", "v_cache"))
    wants = lambda index: info.arguments[index].shape[1:]
    if tuple(np.shape(arrays[key])[1:]) == wants(value) and \
            tuple(np.shape(arrays[value])[1:]) == wants(key) and len(np.shape(arrays[key])) == 4:
        order = ", ".join(info.attention.operands)
        raise InputError(f"{_label(info, 'k_cache')} has shape {list(np.shape(arrays[key]))}, "
                         f"the value cache's layout [NB, Hkv, D, BS], and "
                         f"{_label(info, 'v_cache')} has shape {list(np.shape(arrays[value]))}, "
                         f"the key cache's [NB, Hkv, BS, D]: the two caches look swapped; "
                         f"pass them in the order {order}")


def _gaussian(rng, spec, shape) -> np.ndarray:
    """Standard normal values of `spec`'s float element type (bf16: f32 values rounded
    to bf16, as the call passes them; anything else: f32)."""
    from .graph import draw_gaussian

    return draw_gaussian(rng, spec if spec.element in ("f16", "bf16") else
                         type(spec)(spec.shape, "f32"), shape)


def random_paged_inputs(info, seed: int) -> list[np.ndarray]:
    """A ragged batch in a shuffled block pool: lengths from 1 to ~1K (the edges of blocks
    and partitions among them), unused table slots holding garbage and unused pool
    slots holding NaN scales (a call must never read them)."""
    rng = np.random.default_rng(seed)
    call = info.attention
    spec = {name: info.arguments[i] for name, i in zip(call.operands, call.argument_of)}
    _, kv_heads, block_size, head_dim = spec["k_cache"].shape
    batch = spec["q"].shape[0] or 6
    slots = spec["block_tables"].shape[1]
    layout = CacheLayout.paged(block_size)
    longest = layout.capacity(slots) if slots else 1100
    edges = [1, block_size - 1, block_size, block_size + 1, 255, 256, 257, 1000]
    lengths = np.array([edges[i] if i < len(edges) and rng.random() < 0.7 else
                        rng.integers(1, longest + 1) for i in range(batch)])
    query_tokens = spec["q"].shape[2] if len(spec["q"].shape) == 4 else 1
    lengths = np.clip(lengths, query_tokens, max(longest, query_tokens))
    needed = layout.blocks_needed(lengths)
    pool = spec["k_cache"].shape[0]
    while pool is not None and needed.sum() > pool:      # a static pool: shorten to fit
        lengths = np.maximum(lengths // 2, query_tokens)
        needed = layout.blocks_needed(lengths)
    slots = slots or int(needed.max()) + 1
    pool = pool or int(needed.sum()) + 2
    order = rng.permutation(pool)
    tables = rng.integers(-(2 ** 31), 2 ** 31 - 1, (batch, slots), dtype=np.int64).astype(np.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    k, k_scale = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                                .astype(np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                                .astype(np.float32))
    read = np.zeros((pool, block_size), bool)
    block, offset = read_tokens(tables, lengths, block_size)
    read[block, offset] = True
    k_scale[~read[:, None, :].repeat(kv_heads, 1)] = np.nan
    v_scale[~read[:, None, :].repeat(kv_heads, 1)] = np.nan
    values = {"q": _gaussian(rng, spec["q"], (batch, *spec["q"].shape[1:])),
              "k_cache": k, "k_scale": k_scale,
              "v_cache": np.ascontiguousarray(v.transpose(0, 1, 3, 2)), "v_scale": v_scale,
              "block_tables": tables, "context_lens": lengths.astype(np.int32)}
    arrays: list = [None] * len(info.arguments)
    for name, index in zip(call.operands, call.argument_of):
        arrays[index] = values[name]
    return arrays


def check_cache_write_shapes(info, ops) -> tuple[int, int]:
    """(NB, BS) once k_new, v_new and slot_mapping agree on T and the caches on NB
    (`ops`: anything with a `shape`, as `check_paged_shapes`)."""
    tokens = {name: ops[name].shape[0] for name in ("k_new", "v_new", "slot_mapping")}
    if len(set(tokens.values())) != 1:
        raise InputError(f"@{info.name}: k_new has {tokens['k_new']} new tokens, v_new "
                         f"{tokens['v_new']} and slot_mapping {tokens['slot_mapping']}; they "
                         f"must agree (one row of each per new token)")
    return _pool(info, ops)


def check_cache_write_arguments(info, arrays) -> None:
    ops = _operands(info, arrays)
    blocks, block_size = check_cache_write_shapes(info, ops)
    layout = CacheLayout.paged(block_size)
    if "k_bias" in ops:
        bad = np.argwhere(~np.isfinite(ops["k_bias"]))
        if bad.size:
            raise InputError(bias_problem(info, [int(i) for i in bad[0]]))
    slots = ops["slot_mapping"].astype(np.int64)
    _, _, inside = layout.pool_slots(slots, blocks)
    bad = np.flatnonzero(layout.kept(slots) & ~inside)
    if bad.size:
        token = int(bad[0])
        raise InputError(slot_problem(info, token, int(slots[token]), blocks, block_size))
    live = np.flatnonzero(layout.kept(slots))
    order = live[np.argsort(slots[live], kind="stable")]
    same = np.flatnonzero(slots[order][1:] == slots[order][:-1])
    if same.size:
        first, second = sorted(int(t) for t in order[same[0]:same[0] + 2])
        raise InputError(duplicate_problem(info, first, second, int(slots[first]),
                                           block_size))
    _check_new_rows(info, ops, slots)


def bias_problem(info, index) -> str:
    return (f"{_label(info, 'k_bias')}: holds a non-finite value at {list(index)}; the key "
            f"channel bias is subtracted from every new key and must be finite")


def slot_problem(info, token: int, slot: int, blocks: int, block_size: int) -> str:
    """Token `token`'s slot past the pool's slots."""
    return (f"{_label(info, 'slot_mapping')}: token {token} writes slot {slot}, outside the "
            f"pool's slots [0, {CacheLayout.paged(block_size).capacity(blocks)}) ({blocks} "
            f"blocks of {block_size} tokens; a negative slot skips its token)")


def duplicate_problem(info, first: int, second: int, slot: int, block_size: int) -> str:
    """Tokens `first` < `second` (the first two to write it) writing the same slot."""
    block, offset = (int(x) for x in CacheLayout.paged(block_size).split_slots(slot))
    return (f"{_label(info, 'slot_mapping')}: tokens {first} and {second} both write slot "
            f"{slot} (block {block}, offset {offset}); which one the cache would hold is "
            f"ambiguous")


def _check_new_rows(info, ops, slots) -> None:
    """Every row written (slot >= 0) is finite as it is quantized (k_new minus k_bias): a
    non-finite row would store a NaN or Inf scale that every later attention over its
    slot refuses. Skipped tokens (vLLM's padding) may hold anything."""
    for name in ("k_new", "v_new"):
        rows = ops[name].astype(np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            if name == "k_new" and "k_bias" in ops:
                rows = rows - ops["k_bias"]
            bad = np.argwhere(~np.isfinite(rows) & (slots >= 0)[:, None, None])
        if bad.size:
            token, head, channel = (int(i) for i in bad[0])
            raise InputError(row_problem(info, name, token, int(slots[token]), head, channel,
                                         float(ops[name][token, head, channel])))


def row_problem(info, name: str, token: int, slot: int, head: int, channel: int,
                value: float) -> str:
    """Element (token, head, channel) of a row written that is not finite once quantized
    (`value`: the element as given)."""
    what = ("NaN" if np.isnan(value) else f"{value:g}".replace("inf", "Inf")
            + ("" if np.isinf(value) else ", which overflows f32 once k_bias is subtracted"))
    return (f"{_label(info, name)}: token {token} (slot {slot}), KV head {head}, channel "
            f"{channel} holds {what}; a new row must be finite (its scale max|row|/127 would "
            f"not be, and every attention reading the slot would refuse it): fix the row, or "
            f"give the token slot -1 to skip it")


def random_cache_write_inputs(info, seed: int) -> list[np.ndarray]:
    """New tokens (Gaussian k, v) written at distinct random slots of a random pool, one of
    them skipped (slot -1) when there are several."""
    rng = np.random.default_rng(seed)
    call = info.attention
    spec = {name: info.arguments[i] for name, i in zip(call.operands, call.argument_of)}
    pool, kv_heads, block_size, head_dim = spec["k_cache"].shape
    pool = pool or 64
    capacity = CacheLayout.paged(block_size).capacity(pool)
    tokens = spec["k_new"].shape[0] or min(16, capacity)
    slots = rng.choice(capacity, tokens, replace=False).astype(np.int32)
    if tokens > 1:
        slots[rng.integers(tokens)] = -1
    k, k_scale = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                                .astype(np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                                .astype(np.float32))
    values = {"k_new": _gaussian(rng, spec["k_new"], (tokens, kv_heads, head_dim)),
              "v_new": _gaussian(rng, spec["v_new"], (tokens, kv_heads, head_dim)),
              "slot_mapping": slots, "k_cache": k, "k_scale": k_scale,
              "v_cache": np.ascontiguousarray(v.transpose(0, 1, 3, 2)), "v_scale": v_scale,
              "k_bias": rng.standard_normal((kv_heads, head_dim)).astype(np.float32)}
    arrays: list = [None] * len(info.arguments)
    for name, index in zip(call.operands, call.argument_of):
        arrays[index] = values[name]
    return arrays
