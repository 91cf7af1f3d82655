"""Where a decode kernel finds the K/V of a token: a dense or a paged cache.

A kernel asks for tokens by their index inside its partition or tile (`local`,
from the fragment model's lane maps). An access object binds the kernel's
arguments into a frozen `KVView` (the memrefs, the workgroup's sequence and KV
head, the run-time lengths), which turns a token into memref indices; the
prefill kernel moves a view to each tile with `view.at(first)`. The paged
address rules are the `CacheLayout`'s (fragments/cache_layout.py):

  DenseKV  [B, Hkv, S_pad, D] K, [B, Hkv, D, S_pad] V (host-padded to whole
           partitions); S is static, every partition is live.
  PrefillKV  the dense cache of a prefill graph, [B, Hkv, S_pad, D] K and
           [B, Hkv, D, S_pad] V (host-padded to whole tiles); the kernel's
           view moves to each tile it visits, liveness is the causal mask.
  PagedPrefillKV  a chunked prefill over the block pool: each sequence's last
           Sq tokens are its queries; tokens through the block table as for
           PagedKV (a token past the length reads the last used slot), the
           history len_b - Sq and B, NB, MB are run-time values.
  PagedKV  the block pool [NB, Hkv, BS, D] / [NB, Hkv, D, BS] read through the
           block table (docs/design.md §2b). The partition's block ids are read once
           into LDS; a token past the sequence's length reads its last used
           block (so an unused table slot is never read, whatever it holds)
           and is masked; a workgroup past the sequence's last partition does
           nothing. B, NB, MB and the partition count are run-time values.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from iree.compiler import ir
from iree.compiler.dialects import arith, memref

from ..fragments import NUMPY_OPS, ceil_div
from ..fragments.cache_layout import paged_ir_rules
from .lanes import Lanes, binding
from .shapes import DenseShape, PagedPrefillShape, PagedShape


def pool_slot(lanes: Lanes, slot: ir.Value, blocks: ir.Value, block_size: int):
    """(block, offset, inside) of a pool slot (i32, block * BS + offset): the one place
    the slot number of `cache_write`'s slot_mapping is split; `inside` is false for a
    negative slot (skipped) or one past the pool's NB * BS slots (the paged
    `CacheLayout`'s rule)."""
    index = arith.index_cast(ir.IndexType.get(), slot)
    return paged_ir_rules(block_size, lanes.index).pool_slot(index, blocks)


def _bind_kv(args, lead: tuple, tokens, head_dim: int, zero):
    """k [*lead, tokens, D] i8, k_scale [*lead, tokens], v [*lead, D, tokens] i8
    (token-innermost), v_scale [*lead, tokens] from arguments 1..4."""
    return (binding(args[1], lead + (tokens, head_dim), "i8", zero),
            binding(args[2], lead + (tokens,), "f32", zero),
            binding(args[3], lead + (head_dim, tokens), "i8", zero),
            binding(args[4], lead + (tokens,), "f32", zero))


@dataclass(frozen=True)
class KVView:
    """The bound cache of one workgroup: the memrefs, its (sequence, KV head), the
    first token of the tile or partition it reads (`at` moves it), and the
    run-time values the kernels read (`remaining`: tokens from `first` to the
    length; `history`: a prefill's cached tokens before its queries)."""

    lanes: Lanes
    q: ir.Value
    k: ir.Value
    k_scale: ir.Value
    v: ir.Value
    v_scale: ir.Value
    b: ir.Value
    h: ir.Value
    first: ir.Value
    batch: object = None               # an int, or the run-time index value
    partition_count: object = None
    remaining: ir.Value | None = None
    history: object = None             # an int, or the sequence's own (run time)
    # Its addresses need loads (a chunked prefill's block ids from the table): a
    # consumer that can should compute them well before it uses them (`KVRing.turn`).
    addresses_load: ClassVar[bool] = False

    def at(self, first: ir.Value) -> "KVView":
        return replace(self, first=first)

    def wave(self, wave_first: ir.Value, tokens: int) -> "KVView":
        """The view of one wave's `tokens` tokens from `wave_first` (a multiple of
        `tokens`, from this view's first): its token `local` (below `tokens`) is this
        view's wave_first + local, so an address rule can split the wave's part from
        the lane's (`PagedRules.tile_address`)."""
        return replace(self, first=arith.addi(self.first, wave_first))

    def guard(self) -> ir.Value | None:
        """Does the workgroup have work (None: always)."""
        return None

    def stage(self) -> None:
        """IR the view needs before its first read (published by the next barrier)."""

    def token_row(self, local: ir.Value) -> list[ir.Value]:
        """Indices of a token's K row (then the head-dim index) and of its scales."""
        return [self.b, self.h, arith.addi(self.first, local)]

    def k_bytes(self, local: ir.Value, first: ir.Value) -> list[ir.Value]:
        """Indices of a token's K bytes from head-dim index `first`."""
        return self.token_row(local) + [first]

    def v_row(self, col: ir.Value, local: ir.Value) -> list[ir.Value]:
        return [self.b, self.h, col, arith.addi(self.first, local)]


class DenseKV:
    """K/V of one dense batch, padded by the host to `padded` tokens."""

    def __init__(self, shape: DenseShape, partition_tokens: int):
        self.shape = shape
        self.partition_tokens = partition_tokens
        self.partitions = ceil_div(NUMPY_OPS, shape.tokens, partition_tokens)
        self.padded = self.partitions * partition_tokens

    inputs = 5                # q, k, k_scale, v, v_scale
    index_operands = 0


    def bind(self, lanes: Lanes, args, where) -> tuple[KVView, list[ir.Value]]:
        """The view of partition `where` = (b, h, p), and the output arguments."""
        s, zero = self.shape, lanes.index(0)
        b, h, p = where
        kv, d = (s.batch, s.kv_heads), s.head_dim
        q = binding(args[0], (s.batch, s.q_heads, d), "f32", zero)
        first = lanes.affine((p, self.partition_tokens))
        view = KVView(lanes, q, *_bind_kv(args, kv, self.padded, d, zero), b, h, first,
                      batch=s.batch, partition_count=self.partitions,
                      remaining=arith.subi(lanes.index(s.tokens), first))
        return view, args[self.inputs:]

    def live_partitions(self, view: KVView) -> ir.Value:
        """The partitions holding tokens of the view's sequence: all of them."""
        return view.lanes.index(self.partitions)

    # merge -------------------------------------------------------------------
    def bind_merge(self, lanes: Lanes, args, b):
        """(batch, partition count, partitions of sequence b, [o, m, l, out])."""
        return self.shape.batch, self.partitions, lanes.index(self.partitions), args


class PrefillKV(DenseKV):
    """The dense cache of a prefill graph, padded by the host to whole tiles."""

    def bind(self, lanes: Lanes, args, where) -> tuple[KVView, list[ir.Value]]:
        s, zero = self.shape, lanes.index(0)
        b, h = where
        kv, d = (s.batch, s.kv_heads), s.head_dim
        q = binding(args[0], (s.batch, s.q_heads, s.query_tokens, d), "f32", zero)
        view = KVView(lanes, q, *_bind_kv(args, kv, self.padded, d, zero), b, h, zero,
                      batch=s.batch, history=s.tokens - s.query_tokens)
        return view, args[self.inputs:]


def _block_size_hint(v_load_tokens: int) -> str:
    return (f"; use a pool of {v_load_tokens}- or {2 * v_load_tokens}-token blocks, or "
            f"--target cpu, which takes any block size")


@dataclass(frozen=True)
class _PoolView(KVView):
    """A view of the block pool: a token's K, V and scales at the (block, offset) of
    the subclass's `_block(local)` ([NB, Hkv, BS, D], [NB, Hkv, D, BS], [NB, Hkv, BS]):
    through the block table (chunked prefill) or the block ids in LDS (decode)."""

    tables: ir.Value = None
    block_size: int = 0

    def token_row(self, local: ir.Value) -> list[ir.Value]:
        block, offset = self._block(local)
        return [block, self.h, offset]

    def v_row(self, col: ir.Value, local: ir.Value) -> list[ir.Value]:
        block, offset = self._block(local)
        return [block, self.h, col, offset]


@dataclass(frozen=True)
class PagedPrefillView(_PoolView):
    """A chunked prefill's tokens through the block table; past the length, the
    last used slot."""

    last_slot: ir.Value = None
    tile_tokens: int = 0
    addresses_load: ClassVar[bool] = True

    def _block(self, local: ir.Value):
        # `first` is the tile's first token: the table slot of a lane's token is the
        # tile's part plus the lane's own, shared by the lane's tokens of one block.
        # In i32, as the table and the lengths are: index math is 64-bit on cuda, and
        # the slots' clamps and sums were twice the instructions.
        narrow = lambda value: arith.index_cast(ir.IntegerType.get_signless(32), value)
        widen = lambda value: arith.index_cast(ir.IndexType.get(), value)
        block, offset = paged_ir_rules(self.block_size, self.lanes.i32).tile_address(
            narrow(self.first), narrow(local), self.tile_tokens,
            lambda slot: _block_id(self.tables, [self.b, widen(slot)]),
            narrow(self.last_slot))
        return block, widen(offset)


def _block_id(ids: ir.Value, indices: list[ir.Value]) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), memref.load(ids, indices))


class PagedPrefillKV:
    """A chunked prefill's K/V through the block table (the pool as PagedKV's)."""

    def __init__(self, shape: PagedPrefillShape, tile_tokens: int, v_load_tokens: int):
        if shape.block_size % v_load_tokens:
            raise ValueError(f"block size {shape.block_size} must be a multiple of the "
                             f"{v_load_tokens}-token V load{_block_size_hint(v_load_tokens)}")
        self.shape = shape
        self.partition_tokens = tile_tokens

    inputs = 7                # q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens
    index_operands = 3        # batch, pool blocks, table width


    def bind(self, lanes: Lanes, args, where) -> tuple[KVView, list[ir.Value]]:
        s, zero = self.shape, lanes.index(0)
        b, h = where
        batch, blocks, width = args[self.inputs:self.inputs + 3]
        d, bs, pool = s.head_dim, s.block_size, (blocks, s.kv_heads)
        q = binding(args[0], (batch, s.q_heads, s.query_tokens, d), "f32", zero)
        caches = _bind_kv(args, pool, bs, d, zero)
        tables = binding(args[5], (batch, width), "i32", zero)
        lengths = binding(args[6], (batch,), "i32", zero)
        length = arith.index_cast(ir.IndexType.get(), memref.load(lengths, [b]))
        history = arith.subi(length, lanes.index(s.query_tokens))
        last_slot = paged_ir_rules(bs, lanes.index).last_table_slot(length)
        view = PagedPrefillView(lanes, q, *caches, b, h, zero, batch=batch, history=history,
                                tables=tables, block_size=bs, last_slot=last_slot,
                                tile_tokens=self.partition_tokens)
        return view, args[self.inputs + self.index_operands:]


@dataclass(frozen=True)
class PagedView(_PoolView):
    """A decode partition's tokens through its block ids, staged in LDS once."""

    length: ir.Value = None
    block_ids: ir.Value = None          # LDS [blocks per partition] i32
    blocks_per_partition: int = 0
    partition: ir.Value = None
    wave_first: ir.Value | None = None  # `wave`'s: tokens are the wave's, from here
    wave_tokens: int = 0

    def wave(self, wave_first: ir.Value, tokens: int) -> "PagedView":
        # The partition's first and remaining tokens stay (the guard and the liveness
        # are the partition's); only the addresses take the wave's tokens.
        return replace(self, wave_first=wave_first, wave_tokens=tokens)

    def guard(self) -> ir.Value:
        """The workgroup's partition holds at least one of the sequence's tokens."""
        return arith.cmpi(arith.CmpIPredicate.slt, self.first, self.length)

    def stage(self) -> None:
        """The partition's block ids into LDS, once; slots past the last used one
        are replaced by the last used one (never read from the table). The
        kernel's next barrier (after the query rows are quantized) publishes them."""
        lanes, count = self.lanes, self.blocks_per_partition
        rules = paged_ir_rules(self.block_size, lanes.index)
        last_slot = rules.last_table_slot(self.length)
        reader = arith.cmpi(arith.CmpIPredicate.ult, lanes.thread, lanes.index(count))
        with lanes.when(reader):
            # the table slot of the partition's block `thread`, or the last used one
            slot = rules.ops.min(lanes.affine((self.partition, count), (lanes.thread, 1)),
                                 last_slot)
            memref.store(memref.load(self.tables, [self.b, slot]), self.block_ids,
                         [lanes.thread])

    def _block(self, local: ir.Value):
        rules = paged_ir_rules(self.block_size, self.lanes.index)
        lookup = lambda slot: _block_id(self.block_ids, [slot])
        if self.wave_first is None:
            return rules.address(local, lookup)
        return rules.tile_address(self.wave_first, local, self.wave_tokens, lookup)


class PagedKV:
    """K/V through a block table; shapes of the batch known only at run time."""

    def __init__(self, shape: PagedShape, partition_tokens: int, v_load_tokens: int):
        if shape.block_size % v_load_tokens or partition_tokens % shape.block_size:
            raise ValueError(f"block size {shape.block_size} must be a multiple of the "
                             f"{v_load_tokens}-token V load and divide the "
                             f"{partition_tokens}-token partition"
                             f"{_block_size_hint(v_load_tokens)}")
        self.shape = shape
        self.partition_tokens = partition_tokens
        self.blocks_per_partition = partition_tokens // shape.block_size

    inputs = 7                # q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens
    index_operands = 4        # batch, pool blocks, table width, partitions


    def bind(self, lanes: Lanes, args, where) -> tuple[KVView, list[ir.Value]]:
        s, zero = self.shape, lanes.index(0)
        b, h, p = where
        batch, blocks, width, partition_count = args[self.inputs:self.inputs + 4]
        d, bs, pool = s.head_dim, s.block_size, (blocks, s.kv_heads)
        q = binding(args[0], (batch, s.q_heads, d), "f32", zero)
        caches = _bind_kv(args, pool, bs, d, zero)
        tables = binding(args[5], (batch, width), "i32", zero)
        lengths = binding(args[6], (batch,), "i32", zero)
        length = _length(lengths, b)
        first = lanes.affine((p, self.partition_tokens))
        view = PagedView(lanes, q, *caches, b, h, first, batch=batch,
                         partition_count=partition_count,
                         remaining=arith.subi(length, first), tables=tables, block_size=bs,
                         length=length,
                         block_ids=lanes.shared([self.blocks_per_partition], "i32"),
                         blocks_per_partition=self.blocks_per_partition, partition=p)
        return view, args[self.inputs + self.index_operands:]

    def live_partitions(self, view: PagedView) -> ir.Value:
        """The partitions holding tokens of the view's sequence (those whose
        workgroups pass the guard)."""
        return self._partitions(view.lanes, view.length)

    def _partitions(self, lanes: Lanes, length: ir.Value) -> ir.Value:
        """ceil(length / partition tokens): a sequence's partitions."""
        return ceil_div(lanes.ops, length, self.partition_tokens)

    # merge -------------------------------------------------------------------
    def bind_merge(self, lanes: Lanes, args, b):
        """args: o, m, l, context_lens, batch, partitions, out. Returns (batch,
        partition count, ceil(length / partition tokens) of sequence b, [o, m, l, out])."""
        batch, partition_count = args[4], args[5]
        lengths = binding(args[3], (batch,), "i32", lanes.index(0))
        parts = self._partitions(lanes, _length(lengths, b))
        return batch, partition_count, parts, args[:3] + args[6:]


def _length(lengths: ir.Value, b: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), memref.load(lengths, [b]))
