"""The KV cache layouts: where a token's K, V and scales live (docs/design.md §2b).

Every consumer that turns a token into an address reads it here: the numpy
references and input checks, the tensor-level lowerings, the lane kernels' KV
access and the serving bookkeeping. Each rule is written once, in `PagedRules`,
against a small builder of index arithmetic (`IndexOps`, fragments/index_rules.py):
`NUMPY_OPS` evaluates a rule on Python ints, numpy
arrays (vectorised) or torch tensors, `TEXT_OPS` writes it out, and `arith_ops`
emits it as `arith` ops on IR values. The `CacheLayout` methods are the numpy face
of the same rules.

The arrays (positions are tokens of a dense cache, offsets in a block of a paged one):

    dense      K [B, Hkv, S, D]  (a token's D contiguous)    scales [B, Hkv, S]
               V [B, Hkv, D, S]  token-innermost (the kernels'), or
               V [B, Hkv, S, D]  token-major (the numpy references')
    paged      K [NB, Hkv, BS, D]                            scales [NB, Hkv, BS]
               V [NB, Hkv, D, BS] token-innermost (vLLM's), or [NB, Hkv, BS, D]

Both index as (lead, head, position, column): lead b and position t in a dense
cache, lead block and position offset in a paged one (`k_index`, `v_index`,
`scale_index`).

The paged rules. Token t of a sequence lives in block `table[t // BS]` at offset
`t % BS` (its table row `table`, `table_slot` and `offset`); a token past the
sequence's length reads the last table slot the sequence uses, `(length - 1) // BS`
(`last_table_slot`, `used_table_slot`), so an unused table slot is never read
whatever it holds; the token is live when `t < length`. A sequence of n tokens
uses ceil(n / BS) blocks (`blocks_needed`). A pool slot (cache_write's
slot_mapping) is `block * BS + offset` (`slot`), split as `s // BS`, `s % BS`; a
negative slot skips its token (vLLM's padding, `kept`) and one at or past the
pool's NB * BS slots (`capacity`) is outside it (`pool_slot`).

Signedness. `arith_ops(signed=False)` emits divui / remui / minui / cmpi ult on
index values (tokens, lengths and blocks are never negative where they are used);
`signed=True` divsi / remsi / minsi / slt, as cache_write's i32 slots are lowered.
The slot sign tests `sge` / `slt` are signed in both. The address rules take a
length >= 1: a sequence of length 0 reads no token (no partition, no tile), and
its `last_table_slot` is -1 in numpy but wraps to the largest index unsigned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .index_rules import NUMPY_OPS, IndexOps, arith_ops, ceil_div

EVERY = slice(None)
"""An index tuple's `:` (every head, every column): `cache[layout.k_index(b, EVERY, o, EVERY)]`."""


def paged_ir_rules(block_size: int, const: Callable[[int], Any], *,
                   signed: bool = False) -> "PagedRules":
    """The paged rules of `block_size`-token blocks as `arith` ops (`arith_ops`)."""
    return CacheLayout.paged(block_size).rules(arith_ops(const, signed=signed))


class PagedRules:
    """The paged cache's token -> address rules over one builder, each written once.
    The block size is made (`ops.const`) on first use and reused by the later rules of
    this object; a lowering makes one object where that constant dominates its uses."""

    def __init__(self, block_size: int, ops: IndexOps):
        self.block_size, self.ops = block_size, ops
        self._bs = None

    @property
    def bs(self):
        if self._bs is None:
            self._bs = self.ops.const(self.block_size)
        return self._bs

    # a sequence's tokens, through its block table -------------------------
    def table_slot(self, token):
        """The entry of the sequence's table row that holds token `token`'s block."""
        return self.ops.div(token, self.bs)

    def offset(self, token):
        """The token's offset in its block."""
        return self.ops.rem(token, self.bs)

    def last_table_slot(self, length):
        """The last table slot a sequence of `length` >= 1 tokens uses."""
        return self.ops.div(self.ops.sub(length, self.ops.const(1)), self.bs)

    def used_table_slot(self, token, last):
        """The table slot read for `token`: its own, or the last used one (`last`,
        `last_table_slot`) for a token past the length."""
        return self.ops.min(self.table_slot(token), last)

    def block(self, token, lookup: Callable[[Any], Any], last=None):
        """The block of `token`: `lookup(table slot)` reads the sequence's table row;
        with `last`, past the length the last used slot's block."""
        slot = self.table_slot(token) if last is None else self.used_table_slot(token, last)
        return lookup(slot)

    def address(self, token, lookup: Callable[[Any], Any], last=None):
        """(block, offset) of `token` (`block`, then `offset`)."""
        return self.block(token, lookup, last), self.offset(token)

    def tile_address(self, first, local, tile_tokens: int, lookup: Callable[[Any], Any],
                     last=None):
        """`address` of token first + local, where `first` is a multiple of
        `tile_tokens` and 0 <= local < tile_tokens: where the tile and the block nest
        (one divides the other), split into the tile's part and the token's part, so
        a kernel's per-lane `local` reads the same table slot for every token of a
        block and the tile's part is computed once per tile."""
        ops = self.ops
        if tile_tokens % self.block_size == 0:      # whole blocks per tile
            slot = ops.add(ops.div(first, self.bs), ops.div(local, self.bs))
            offset = ops.rem(local, self.bs)
        elif self.block_size % tile_tokens == 0:    # whole tiles per block
            slot = ops.div(first, self.bs)
            offset = ops.add(ops.rem(first, self.bs), local)
        else:
            return self.address(ops.add(first, local), lookup, last)
        return lookup(slot if last is None else ops.min(slot, last)), offset

    def live(self, token, length):
        """The token is one of the sequence's (`token < length`)."""
        return self.ops.lt(token, length)

    def blocks_needed(self, length):
        """Blocks a sequence of `length` >= 0 tokens uses: ceil(length / BS)."""
        return ceil_div(self.ops, length, self.block_size)

    def capacity(self, blocks):
        """Tokens (slots) of `blocks` blocks: a pool of NB, or a table row of MB slots."""
        return self.ops.mul(blocks, self.bs)

    # pool slots (cache_write's slot_mapping) ----------------------------------
    def slot(self, block, offset):
        """The pool slot of (block, offset): block * BS + offset."""
        return self.ops.add(self.ops.mul(block, self.bs), offset)

    def slot_block(self, slot):
        return self.ops.div(slot, self.bs)

    def slot_offset(self, slot):
        return self.ops.rem(slot, self.bs)

    def kept(self, slot):
        """The slot is written (a negative slot skips its token: vLLM's padding)."""
        return self.ops.sge(slot, self.ops.const(0))

    def pool_slot(self, slot, blocks):
        """(block, offset, inside) of a slot of a pool of `blocks` blocks; `inside` is
        false for a skipped (negative) slot or one past the pool's slots."""
        kept = self.kept(slot)
        below = self.ops.slt(slot, self.capacity(blocks))
        return self.slot_block(slot), self.slot_offset(slot), self.ops.and_(kept, below)


@dataclass(frozen=True)
class CacheLayout:
    """One KV cache's layout: dense (`block_size` None: a row of tokens per sequence) or
    a paged pool of `block_size`-token blocks; V token-innermost or token-major (K is
    always token-major). Shapes and index tuples for both, the paged rules (`rules`)
    and their numpy forms."""

    block_size: int | None = None
    v_token_innermost: bool = True

    def __post_init__(self):
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"a paged cache's block size must be >= 1, got {self.block_size}")

    @classmethod
    def paged(cls, block_size: int, *, v_token_innermost: bool = True) -> "CacheLayout":
        return cls(int(block_size), v_token_innermost)

    @property
    def is_paged(self) -> bool:
        return self.block_size is not None

    # shapes ---------------------------------------------------------------------
    def k_shape(self, lead, kv_heads, positions, head_dim) -> tuple:
        return (lead, kv_heads, positions, head_dim)

    def v_shape(self, lead, kv_heads, positions, head_dim) -> tuple:
        return self.v_index(lead, kv_heads, positions, head_dim)

    def scale_shape(self, lead, kv_heads, positions) -> tuple:
        return (lead, kv_heads, positions)

    def shapes(self, lead, kv_heads, head_dim, positions=None) -> tuple:
        """(k_cache, k_scale, v_cache, v_scale) shapes, the ops' operand order; a pool's
        positions are its block size."""
        positions = self.block_size if positions is None else positions
        return (self.k_shape(lead, kv_heads, positions, head_dim),
                self.scale_shape(lead, kv_heads, positions),
                self.v_shape(lead, kv_heads, positions, head_dim),
                self.scale_shape(lead, kv_heads, positions))

    # element indices (IR values, ints, arrays or EVERY) ---------------------------
    def k_index(self, lead, head, position, col) -> tuple:
        """Index of K element (head, col) of the token at (lead, position)."""
        return (lead, head, position, col)

    def v_index(self, lead, head, position, col) -> tuple:
        return (lead, head, col, position) if self.v_token_innermost else (lead, head,
                                                                           position, col)

    def scale_index(self, lead, head, position) -> tuple:
        return (lead, head, position)

    def token_rows(self, k, k_scale, v, v_scale, lead, position) -> tuple:
        """(k [N, Hkv, D], k_scale [N, Hkv], v [N, Hkv, D], v_scale [N, Hkv]) of the N
        tokens at (lead[i], position[i]) (numpy or torch arrays)."""
        return (k[self.k_index(lead, EVERY, position, EVERY)],
                k_scale[self.scale_index(lead, EVERY, position)],
                v[self.v_index(lead, EVERY, position, EVERY)],
                v_scale[self.scale_index(lead, EVERY, position)])

    # the paged rules --------------------------------------------------------------
    def rules(self, ops: IndexOps = NUMPY_OPS) -> PagedRules:
        """The paged rules over `ops` (`arith_ops(...)` for IR)."""
        if self.block_size is None:
            raise ValueError("a dense cache has no block table: token t of sequence b is "
                             "at (b, t)")
        return PagedRules(self.block_size, ops)

    # ... in numpy, vectorised
    def slots(self, block, offset):
        """Pool slots block * BS + offset."""
        return self.rules().slot(np.asarray(block), np.asarray(offset))

    def split_slots(self, slots) -> tuple:
        """(block, offset) of pool slots >= 0."""
        rules, slots = self.rules(), np.asarray(slots)
        return rules.slot_block(slots), rules.slot_offset(slots)

    def kept(self, slots):
        """Slots written (>= 0; a negative slot skips its token)."""
        return self.rules().kept(np.asarray(slots))

    def pool_slots(self, slots, blocks: int) -> tuple:
        """(block, offset, inside) of pool slots; `inside` false for a negative slot
        (skipped) or one past the pool's `blocks` * BS slots (block and offset are
        then meaningless)."""
        return self.rules().pool_slot(np.asarray(slots), blocks)

    def addresses(self, table_row, tokens, length=None) -> tuple:
        """(block, offset) of tokens of a sequence through its table row; with `length`
        (>= 1), a token past it reads the last used table slot's block."""
        rules, table_row, tokens = self.rules(), np.asarray(table_row), np.asarray(tokens)
        last = None if length is None else rules.last_table_slot(length)
        return rules.address(tokens, lambda slot: table_row[slot], last)

    def sequence_addresses(self, table_row, length) -> tuple:
        """(block, offset) of each of a sequence's tokens 0 .. length - 1."""
        return self.addresses(table_row, np.arange(int(length)))

    def token_slots(self, table_row, tokens):
        """Pool slots of tokens of a sequence (in its held blocks) through its table row."""
        return self.slots(*self.addresses(table_row, tokens))

    def live(self, tokens, length):
        return self.rules().live(np.asarray(tokens), length)

    def blocks_needed(self, lengths):
        """ceil(length / BS): the blocks a sequence of each length uses (ints, arrays,
        torch tensors)."""
        return self.rules().blocks_needed(lengths)

    def capacity(self, blocks):
        """Tokens of `blocks` blocks: a pool's slots, or a table row's tokens."""
        return self.rules().capacity(blocks)


DENSE = CacheLayout()
"""The dense cache of the kernels: K [B, Hkv, S, D], V token-innermost [B, Hkv, D, S]."""

DENSE_TOKEN_MAJOR = CacheLayout(v_token_innermost=False)
"""The dense cache of the numpy references: K and V [B, Hkv, S, D]."""
