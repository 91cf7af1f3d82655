"""A paged INT8 KV cache for transformers' `generate`: the pool, its free list, block tables.

    attn = paged_attention_for(model.config, target="cuda")   # or PagedAttention.load(dir)
    cache = PagedInt8Cache(model.config, attn, blocks=1024, device="cuda")
    install(model)                                  # serving/transformers_attention.py
    model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=64)

Each layer owns its pool in vLLM's layout (docs/design.md §2b): k_cache [NB, Hkv, BS, D]
i8, k_scale [NB, Hkv, BS] f32, v_cache [NB, Hkv, D, BS] i8 (token-innermost), v_scale,
allocated once and only ever written in place (`PagedAttention.write`). The bookkeeping
is shared by all layers: a shuffled free list (as `driver.paged_decode.PagedCache`: a
sequence's blocks lie scattered over the pool), every sequence's block table and length.
Batch row b of the model's input is sequence b, for the cache's whole life (`reset`
empties it).

A forward is one *step*, a transaction. `begin_step(attention_mask, query_length, batch)`
(called by the pre-hook `install` puts on the model, before any layer runs) reads which
of the step's new positions are real tokens -- left padding is the only padding allowed
-- and *plans* the step: the blocks its tokens need (taken from a copy of the free list),
the block tables and lengths they give, and, once for all layers, the slot mapping (-1
for a padding position: `write` skips it), the tables and lengths of the attention calls
and the gathers that route each query position to them. `update` then quantizes and
writes one layer's new keys and values, and the attention function (`attend`) reads them
from the pool. `end_step(ok)` (the hook after the forward, run even when it raises)
commits the plan -- tables, lengths, free list, positions seen -- only if the forward
returned and every layer wrote and attended in this step; otherwise the cache is left as
it was before the step (a refused write in layer 1 does not leave layer 1's slot counted
as written). While a step runs, `seen`, `lengths`, `tables`, `get_seq_length` and
`get_mask_sizes` describe the cache before it (the positions the model's forward numbers
the new tokens from); after the forward they include it.
Scales start NaN: a slot nobody wrote is refused if it is ever read, never silently used
(a rolled-back step's writes lie past the committed lengths, where no read comes
before the next write: `end_step`).
"""

from __future__ import annotations

import weakref

import numpy as np

from ..driver.paged_decode import PoolExhausted
from ..fragments.cache_layout import CacheLayout
from ..runtime.module import InputError
from .deferred_checks import TORCH_WRITE_KIND, write_record
from .paged_attention import is_deferred
from .tensors import torch_module
from .torch_cache_write import torch_cache_write


torch = torch_module()
try:
    from transformers import cache_utils
except ImportError:
    raise InputError("the transformers attention needs transformers: pip install "
                     "'int8attn[transformers]'") from None


def model_shape(config) -> tuple[int, int, int, int]:
    """(layers, query heads, KV heads, head dim) of a decoder config."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    q_heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // q_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or q_heads
    return config.num_hidden_layers, q_heads, kv_heads, head_dim


class PagedLayer(cache_utils.CacheLayerMixin):
    """One layer's pool (allocated at once, never reallocated); the bookkeeping is the
    owning `PagedInt8Cache`'s."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner, blocks, kv_heads, block_size, head_dim, device):
        super().__init__()
        self.owner = weakref.proxy(owner)       # no cycle: the pool goes with the cache
        k, ks, v, vs = CacheLayout.paged(block_size).shapes(blocks, kv_heads, head_dim)
        self.k_cache = torch.zeros(k, dtype=torch.int8, device=device)
        self.v_cache = torch.zeros(v, dtype=torch.int8, device=device)
        self.k_scale = torch.full(ks, float("nan"), device=device)
        self.v_scale = torch.full(vs, float("nan"), device=device)
        self.device, self.is_initialized = torch.device(device), True
        self.written = self.attended = -1      # the last step that wrote / attended this layer

    @property
    def pool(self):
        """(k_cache, k_scale, v_cache, v_scale): the operand order of both kernels."""
        return self.k_cache, self.k_scale, self.v_cache, self.v_scale

    def lazy_initialization(self, key_states, value_states) -> None:
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        raise InputError("a PagedLayer is written through its PagedInt8Cache.update")

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.seen + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.written = self.attended = -1

    def reorder_cache(self, beam_idx) -> None:
        raise InputError("PagedInt8Cache does not reorder sequences (no beam search)")


class PagedInt8Cache(cache_utils.Cache):
    """The paged INT8 cache of a decoder whose attention runs through `attention` (a
    PagedAttention of the model's heads and head dim). `chunk` is the chunked-prefill
    query length (its kernel must exist: `save(..., query_tokens=(chunk,))`); None
    sends every prompt token through the decode kernel. `validate` is passed to
    every kernel call (PagedAttention's value-check modes: True records violations on
    the device and `end_step` raises the first, one host sync per forward; "sync"
    syncs in every call; False checks no values). `write`:
    "kernel" (`PagedAttention.write`), "torch" (`torch_cache_write`, the same
    quantize in torch ops, bit for bit) or "auto": the kernel on the cpu target or
    when the PagedAttention holds a write package, else torch (a cuda PagedAttention
    loaded from packages saved without the write)."""

    def __init__(self, config, attention, blocks: int, *, device="cpu", chunk: int | None = 64,
                 validate=True, write: str = "auto", seed: int = 0):
        is_deferred(validate)
        layers, q_heads, kv_heads, head_dim = model_shape(config)
        ours = (attention.q_heads, attention.kv_heads, attention.head_dim)
        if ours != (q_heads, kv_heads, head_dim):
            raise InputError(f"the PagedAttention has (query heads, KV heads, head dim) {ours}, "
                             f"the model {(q_heads, kv_heads, head_dim)}: build it with "
                             f"paged_attention_for(model.config)")
        if chunk is not None and chunk < 2:
            raise InputError(f"chunk must be at least 2 query tokens (or None), got {chunk}")
        if write == "auto":
            write = ("kernel" if attention.target == "cpu" or attention.has_kernel("write")
                     else "torch")
        if write not in ("kernel", "torch"):
            raise InputError(f"write must be 'kernel', 'torch' or 'auto', got {write!r}")
        self.attention, self.chunk, self.validate, self.writer = attention, chunk, validate, write
        self.block_size, self.blocks = attention.block_size, blocks
        self.layout = CacheLayout.paged(self.block_size)
        self.device = torch.device(device)
        super().__init__(layers=[PagedLayer(self, blocks, kv_heads, self.block_size, head_dim,
                                            self.device) for _ in range(layers)])
        self._rng = np.random.default_rng(seed)
        self.reset()

    # bookkeeping ------------------------------------------------------------
    def reset(self) -> None:
        """Forget every sequence (the pool's data stays; no slot is read before rewritten)."""
        self.free = [int(b) for b in self._rng.permutation(self.blocks)]
        self.tables: list[list[int]] = []
        self.lengths = np.zeros(0, np.int64)    # real tokens of each sequence
        self.seen, self.step_id, self.step = 0, 0, None
        for layer in self.layers:
            layer.reset()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions seen, padding included (what generate slices its inputs by)."""
        return self.seen

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.seen + query_length, 0

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise InputError("PagedInt8Cache does not crop (no assisted decoding)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if repeats != 1:
            raise InputError("PagedInt8Cache holds one sequence per batch row (no beams)")

    def batch_select_indices(self, indices) -> None:
        raise InputError("PagedInt8Cache holds one sequence per batch row (no beams)")

    def begin_step(self, attention_mask, query_length: int, batch: int) -> None:
        """Plan one forward of `query_length` positions per row (module docstring). The
        plan (`self.step`) holds the step's tables, lengths, free list and positions seen;
        the cache's own stay as they were until `end_step` commits them."""
        self.step = None            # a step whose forward never ended is dropped
        S, B = int(query_length), int(batch)
        if self.tables and B != len(self.tables):
            raise InputError(f"the cache holds {len(self.tables)} sequences, the forward has "
                             f"batch {B}: one cache per batch (reset() to start over)")
        if attention_mask is None:
            real = np.ones((B, S), bool)
        else:
            if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (B, self.seen + S):
                raise InputError(f"attention_mask must be the 2D padding mask [{B}, "
                                 f"{self.seen + S}] (positions seen + new), got "
                                 f"{list(attention_mask.shape)}")
            real = attention_mask[:, -S:].to("cpu", torch.bool).numpy()
        if (real[:, 1:] < real[:, :-1]).any():
            row = int(np.nonzero((real[:, 1:] < real[:, :-1]).any(1))[0][0])
            raise InputError(f"attention_mask row {row} has padding after a real token: the "
                             f"paged cache takes left padding only (tokenizer padding_side="
                             f"'left')")
        tables = [list(t) for t in self.tables] or [[] for _ in range(B)]
        before = self.lengths.copy() if len(self.lengths) else np.zeros(B, np.int64)
        new = real.sum(1).astype(np.int64)
        need = [self.layout.blocks_needed(int(before[b] + new[b])) - len(tables[b])
                for b in range(B)]
        free = list(self.free)
        if sum(need) > len(free):
            raise PoolExhausted(f"this step needs {sum(need)} more blocks, {len(free)} are "
                                f"free: give the cache more blocks")
        for b in range(B):
            tables[b] += [free.pop() for _ in range(need[b])]
        self.step_id += 1
        self.step = _Step(self, self.step_id, S, before, new, tables, free)

    def end_step(self, ok: bool = True) -> bool:
        """End the step `begin_step` planned: commit its tables, lengths, free list and
        positions seen if `ok` (the forward returned) and every layer wrote and attended
        in it; else forget it, leaving the cache as before the step. Returns whether it
        committed (False too when no step was planned).

        Rolling back leaves the slots the step's layers did write holding its tokens
        (and finite scales) beyond the committed lengths, possibly in blocks that go back
        to the free list. They are never read before being rewritten: a step reads
        sequence b's tokens [0, before[b] + new[b]) only (the attention calls' lengths,
        `_Step`), of which [0, before[b]) were written in every layer by committed steps
        and [before[b], before[b] + new[b]) are the slots this step's `update` writes in
        each layer before that layer may `attend` (`attend` refuses a layer its step has
        not written); a position's slot is a function of its table and position, so the
        next step to count a token there writes its slot first, in every layer."""
        step, self.step = self.step, None
        if step is None:
            return False
        if self.validate is True:
            self._check(ok)
        done = ok and all(layer.written == step.id and layer.attended == step.id
                          for layer in self.layers)
        if done:
            self.tables, self.lengths, self.free = step.tables, step.lengths, step.free
            self.seen += step.S
        return done

    def _check(self, ok: bool) -> None:
        """Raise the first value-rule violation of the step's calls (the step is then not
        committed); after a forward that raised, drop it: that error is the one to see."""
        try:
            self.attention.check()
        except InputError:
            if ok:
                raise

    # the two per-layer operations ---------------------------------------------
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        """Write the step's new tokens of layer `layer_idx` (key/value states [B, Hkv, S, D])
        into its pool. Returns the states as given: the attention reads the pool."""
        step, layer = self.step, self.layers[layer_idx]
        if step is None or layer.written == step.id:
            raise InputError("PagedInt8Cache.update before its step began: call "
                             "int8attn.serving.transformers_attention.install(model) so that "
                             "each forward tells the cache its attention mask")
        B, H, S, D = key_states.shape
        new_k = key_states.transpose(1, 2).reshape(B * S, H, D).float().contiguous()
        new_v = value_states.transpose(1, 2).reshape(B * S, H, D).float().contiguous()
        if self.writer == "kernel":
            self.attention.write(new_k, new_v, step.slots, *layer.pool, validate=self.validate)
        else:
            skip = None
            if self.validate is True:
                record, skip = write_record({"k_new": new_k, "v_new": new_v,
                                             "slot_mapping": step.slots,
                                             "k_cache": layer.k_cache})
                self.attention.violations.add(record, new_k.device, TORCH_WRITE_KIND,
                                              layer_idx, 0, layer.k_cache.shape[0])
            new_k, new_v = new_k[step.real], new_v[step.real]
            if self.validate == "sync" and not (new_k.isfinite().all() and
                                                new_v.isfinite().all()):
                raise InputError(f"layer {layer_idx}: a new key or value row holds NaN or "
                                 f"Inf; a cached row must be finite")
            torch_cache_write(new_k, new_v, step.blocks, step.offsets, *layer.pool, skip=skip)
        layer.written = step.id
        return key_states, value_states

    def attend(self, layer_idx: int, query):
        """Attention of the step's query states [B, Hq, S, D] over layer `layer_idx`'s pool:
        [B, S, Hq, D] f32 (the layout transformers' attention functions return), zeros at
        padding positions."""
        step, layer = self.step, self.layers[layer_idx]
        if step is None or layer.written != step.id:
            raise InputError(f"layer {layer_idx}: attention before the cache wrote this step's "
                             f"tokens (update first)")
        out = step.attend(query, layer.pool)
        layer.attended = step.id
        return out


class _Step:
    """One forward's plan, shared by all layers: the tables, lengths and free list it
    commits (`end_step`), and its routing: query position (b, s) goes to the decode
    kernel as one row, or inside a chunk of `chunk` rows of the prefill kernel."""

    def __init__(self, cache: PagedInt8Cache, step_id: int, S: int, before, new, tables,
                 free):
        self.cache, self.id, self.S, self.B = cache, step_id, S, len(new)
        self.tables, self.free, self.lengths = tables, free, before + new
        C, device = cache.chunk, cache.device
        slots = np.full((self.B, S), -1, np.int64)
        decode, chunks, keep = [], [], []   # (b, s, length); (b, s_end, length); (b, s, flat)
        for b in range(self.B):
            n, start = int(new[b]), int(before[b])
            table = np.asarray(tables[b], np.int64)
            positions = start + np.arange(n)
            slots[b, S - n:] = cache.layout.token_slots(table, positions)
            if C is None or n < C:
                decode += [(b, S - n + j, start + j + 1) for j in range(n)]
                continue
            # full chunks, then the last C tokens (overlapping: it keeps only its new rows)
            owned_from = 0
            for e in list(range(C, n + 1, C)) + ([n] if n % C else []):
                keep += [(b, S - n + j, len(chunks) * C + j - (e - C))
                         for j in range(owned_from, e)]
                chunks.append((b, S - n + e, start + e))
                owned_from = e
        slots = slots.reshape(-1)
        self.slots = _to(slots.astype(np.int32), device)
        real = np.nonzero(cache.layout.kept(slots))[0]
        self.real, self.blocks, self.offsets = (_to(a, device) for a in
                                                (real, *cache.layout.split_slots(slots[real])))
        self.decode = self._rows(decode, device)
        self.chunks = self._rows(chunks, device)
        if chunks:
            ends = np.array([c[1] for c in chunks], np.int64)
            self.chunk_positions = _to(ends[:, None] - C + np.arange(C), device)
            self.keep = [_to(np.array(column, np.int64), device) for column in zip(*keep)]
        self.dense = S == 1 and len(decode) == self.B

    def _rows(self, rows, device):
        if not rows:
            return None
        b, s, lengths = (np.array(column, np.int64) for column in zip(*rows))
        tables = self.tables
        width = max(len(tables[i]) for i in set(b.tolist()))
        table = np.full((len(b), width), -1, np.int32)
        for row, i in enumerate(b):
            table[row, :len(tables[i])] = tables[i]
        return (_to(b, device), _to(s, device), _to(table, device),
                _to(lengths.astype(np.int32), device))

    def attend(self, query, pool):
        attn, validate = self.cache.attention, self.cache.validate
        B, Hq, S, D = query.shape
        if (B, S) != (self.B, self.S):
            raise InputError(f"query states [B={B}, S={S}] do not match the step the cache "
                             f"planned ([B={self.B}, S={self.S}])")
        if self.dense:      # a plain decode step: every row one real token
            q = query[:, :, 0].contiguous()
            out = attn(q, *pool, *self.decode[2:], validate=validate)
            return out.view(B, 1, Hq, D)
        by_position = query.transpose(1, 2)                      # [B, S, Hq, D]
        out = torch.zeros(B, S, Hq, D, dtype=torch.float32, device=query.device)
        if self.decode is not None:
            b, s, tables, lengths = self.decode
            rows = attn(by_position[b, s].contiguous(), *pool, tables, lengths,
                        validate=validate)
            out[b, s] = rows
        if self.chunks is not None:
            b, _, tables, lengths = self.chunks
            q = by_position[b[:, None], self.chunk_positions].transpose(1, 2).contiguous()
            rows = attn(q, *pool, tables, lengths, validate=validate)   # [N, Hq, C, D]
            kept_b, kept_s, flat = self.keep
            out[kept_b, kept_s] = rows.transpose(1, 2).reshape(-1, Hq, D)[flat]
        return out


def _to(array, device):
    return torch.from_numpy(np.ascontiguousarray(array)).to(device)
