"""The paged INT8 KV cache (docs/design.md §2b): `int8attn.paged_attention` and `int8attn.cache_write`.

    %o = "int8attn.paged_attention"(%q, %k_cache, %k_scale, %v_cache, %v_scale,
                                    %block_tables, %context_lens)
        {block_size = 16 : i64, softmax_scale = 0.0883883 : f32}
        : (tensor<?x32x128xf32>, tensor<?x8x16x128xi8>, tensor<?x8x16xf32>,
           tensor<?x8x128x16xi8>, tensor<?x8x16xf32>, tensor<?x?xi32>, tensor<?xi32>)
        -> tensor<?x32x128xf32>

q [B, Hq, D] (decode) or [B, Hq, Sq, D] (chunked prefill: each sequence's
last Sq tokens are its queries, causal over the ones before, as dense
prefill); k_cache [NB, Hkv, BS, D] i8 (a token's D contiguous); v_cache
[NB, Hkv, D, BS] i8 (token-innermost); k_scale, v_scale [NB, Hkv, BS] f32;
block_tables [B, MB] i32; context_lens [B] i32. B, NB and MB may be dynamic;
Hq, Hkv, D and BS are static. Sequence b attends to its tokens 0 .. len_b - 1,
token t living in block `block_tables[b, t // BS]`, slot `t % BS`; table slots
past a sequence's length are never read. What the verifier cannot see (lengths
and block ids) the driver checks before every call (`driver.graph`).

    %kc, %ks, %vc, %vs = "int8attn.cache_write"(%k_new, %v_new, %slot_mapping,
                                                %k_cache, %k_scale, %v_cache, %v_scale)
        {block_size = 16 : i64}
        : (tensor<?x8x128xf32>, tensor<?x8x128xf32>, tensor<?xi32>, tensor<?x8x16x128xi8>,
           tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>)
        -> (tensor<?x8x16x128xi8>, tensor<?x8x16xf32>, tensor<?x8x128x16xi8>, tensor<?x8x16xf32>)

An optional last operand `k_bias` f32 [Hkv, D] is subtracted from every new
key of KV head h before it is quantized (a conditioned K cache, exact for
attention: `reference/key_bias.py`, docs/design.md §2c).

k_new, v_new [T, Hkv, D] f32 (f16/bf16 accepted, quantized in f32); slot_mapping
[T] i32; the caches as above; the results are the four caches updated: token i
goes to slot s = slot_mapping[i], block s // BS, offset s % BS, each KV head's
row quantized with the contract's `quantize` (Kq, sK at k_cache[block, h,
offset, :], k_scale[block, h, offset]; Vq token-innermost at v_cache[block, h,
:, offset]). A negative slot skips its token (vLLM's padding, `slot_mapping[i]
= -1`). T and NB may be dynamic. Slots past the pool, two tokens writing one
slot and non-finite rows written are refused by the driver before the call
(`driver.paged_inputs`);
`lower-cache-write` updates the caller's cache buffers in place.
"""

from __future__ import annotations

from iree.compiler import ir

from ..contract.constants import softmax_scale_problem
from .op_base import (DYNAMIC, FLOAT_TYPES, Int8AttnOp, _Check, _Dialect,
                      _cext, _operand, shape_of, tensor)


def _agree(a: int, b: int) -> bool:
    return a == b or DYNAMIC in (a, b)


def _check_block_size(c: _Check, op, block_size: int) -> None:
    """The op's `block_size` attribute is the pool's BS."""
    attr = op.attributes["block_size"] if "block_size" in op.attributes else None
    if not isinstance(attr, ir.IntegerAttr):
        c.fail(f"requires an integer attribute 'block_size' (the caches' BS, {block_size})")
    c.that(op.block_size == block_size,
           f"attribute 'block_size' is {op.block_size} but the caches hold blocks of "
           f"{block_size} tokens")


def _pool_operands(first: int) -> tuple[property, ...]:
    """Accessors of the block pool's four operands, from operand `first` on."""
    return (_operand(first, "key blocks i8 [NB,Hkv,BS,D]"),
            _operand(first + 1, "key scales f32 [NB,Hkv,BS]"),
            _operand(first + 2, "value blocks i8 [NB,Hkv,D,BS] (token-innermost)"),
            _operand(first + 3, "value scales f32 [NB,Hkv,BS]"))


def _check_pool(c: _Check, k_cache, k_scale, v_cache, v_scale) -> list[int]:
    """The block pool's [NB, Hkv, BS, D]: the caches and scales must agree on it."""
    ks = c.ranked(k_cache, "k_cache", 4, ("i8",), dynamic=(0,))
    vs = c.ranked(v_cache, "v_cache", 4, ("i8",), dynamic=(0,))
    kss = c.ranked(k_scale, "k_scale", 3, ("f32",), dynamic=(0,))
    vss = c.ranked(v_scale, "v_scale", 3, ("f32",), dynamic=(0,))
    blocks, kv_heads, block_size, head_dim = ks
    c.that(_agree(vs[0], blocks) and vs[1:] == [kv_heads, head_dim, block_size],
           f"v_cache has shape {_dims(vs)}, expected [NB, Hkv, D, BS] = "
           f"{_dims([blocks, kv_heads, head_dim, block_size])} (token-innermost blocks)")
    for name, shape in (("k_scale", kss), ("v_scale", vss)):
        c.that(_agree(shape[0], blocks) and shape[1:] == [kv_heads, block_size],
               f"{name} has shape {_dims(shape)}, expected [NB, Hkv, BS] = "
               f"{_dims([blocks, kv_heads, block_size])}")
    return ks


@_cext.register_operation(_Dialect)
class PagedAttentionOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.paged_attention"
    ATTRIBUTES = ("block_size", "softmax_scale")
    q = _operand(0, "queries f32/f16/bf16 [B,Hq,D] (decode) or [B,Hq,Sq,D] (chunked prefill)")
    k_cache, k_scale, v_cache, v_scale = _pool_operands(1)
    block_tables = _operand(5, "i32 [B,MB]: block of each sequence's BS-token slot")
    context_lens = _operand(6, "i32 [B]: tokens of each sequence")

    @property
    def block_size(self) -> int:
        return ir.IntegerAttr(self.attributes["block_size"]).value

    @property
    def softmax_scale(self) -> float:
        return ir.FloatAttr(self.attributes["softmax_scale"]).value

    @classmethod
    def build(cls, q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, *,
              softmax_scale: float, loc=None) -> "PagedAttentionOp":
        attrs = {"block_size": ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                  shape_of(k_cache)[2]),
                 "softmax_scale": ir.FloatAttr.get(ir.F32Type.get(), softmax_scale)}
        return cls._create([tensor(shape_of(q), "f32")],
                           [q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens],
                           attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        c.arity(7, 1)
        rank = 4 if len(shape_of(self.q)) == 4 else 3
        qs = c.ranked(self.q, "q", rank, FLOAT_TYPES, dynamic=(0,))
        blocks, kv_heads, block_size, head_dim = _check_pool(
            c, self.k_cache, self.k_scale, self.v_cache, self.v_scale)
        tables = c.ranked(self.block_tables, "block_tables", 2, ("i32",), dynamic=(0, 1))
        lens = c.ranked(self.context_lens, "context_lens", 1, ("i32",), dynamic=(0,))
        c.that(_agree(tables[0], qs[0]) and _agree(lens[0], qs[0]),
               f"q, block_tables and context_lens disagree on the batch: {_dims([qs[0]])}, "
               f"{_dims([tables[0]])}, {_dims([lens[0]])}")
        c.that(qs[-1] == head_dim, f"q has head dim {qs[-1]} but k_cache has head dim {head_dim}")
        c.that(qs[1] % kv_heads == 0,
               f"query heads ({qs[1]}) must be a multiple of KV heads ({kv_heads}) for GQA")
        _check_block_size(c, self, block_size)
        scale = c.f32_attr("softmax_scale", "0.088")
        problem = softmax_scale_problem(scale)
        c.that(problem is None, f"attribute 'softmax_scale' {problem}")
        result = c.ranked(self.result, "result", rank, ("f32",), dynamic=(0,))
        c.that(_agree(result[0], qs[0]) and result[1:] == qs[1:],
               f"result has shape {_dims(result)}, expected {_dims(qs)}")
        return True


def _dims(shape) -> str:
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in shape) + "]"


def paged_attention(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, *,
                    softmax_scale: float, loc=None) -> ir.Value:
    return PagedAttentionOp.build(q, k_cache, k_scale, v_cache, v_scale, block_tables,
                                  context_lens, softmax_scale=softmax_scale, loc=loc).result


@_cext.register_operation(_Dialect)
class CacheWriteOp(Int8AttnOp):
    OPERATION_NAME = "int8attn.cache_write"
    ATTRIBUTES = ("block_size",)
    k_new = _operand(0, "new keys f32/f16/bf16 [T,Hkv,D]")
    v_new = _operand(1, "new values f32/f16/bf16 [T,Hkv,D]")
    slot_mapping = _operand(2, "i32 [T]: slot (block * BS + offset) of each token, < 0: skip")
    k_cache, k_scale, v_cache, v_scale = _pool_operands(3)
    CACHES = ("k_cache", "k_scale", "v_cache", "v_scale")   # operands 3..6 = results 0..3

    @property
    def block_size(self) -> int:
        return ir.IntegerAttr(self.attributes["block_size"]).value

    @property
    def caches(self) -> list[ir.Value]:
        return [self.operation.operands[3 + i] for i in range(4)]

    @property
    def k_bias(self) -> ir.Value | None:
        """f32 [Hkv, D] subtracted from the new keys before quantizing, or None."""
        operands = self.operation.operands
        return operands[7] if len(operands) == 8 else None

    @classmethod
    def build(cls, k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale, *,
              k_bias=None, loc=None) -> "CacheWriteOp":
        attrs = {"block_size": ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                  shape_of(k_cache)[2])}
        caches = [k_cache, k_scale, v_cache, v_scale]
        bias = [] if k_bias is None else [k_bias]
        return cls._create([c.type for c in caches],
                           [k_new, v_new, slot_mapping, *caches, *bias], attrs, loc)

    def verify(self) -> bool:
        c = _Check(self)
        has_bias = c.optional_arity(7, 4)
        ks = c.ranked(self.k_new, "k_new", 3, FLOAT_TYPES, dynamic=(0,))
        vs = c.ranked(self.v_new, "v_new", 3, FLOAT_TYPES, dynamic=(0,))
        slots = c.ranked(self.slot_mapping, "slot_mapping", 1, ("i32",), dynamic=(0,))
        _, kv_heads, block_size, head_dim = _check_pool(
            c, self.k_cache, self.k_scale, self.v_cache, self.v_scale)
        for name, shape in (("k_new", ks), ("v_new", vs)):
            c.that(shape[1:] == [kv_heads, head_dim],
                   f"{name} has shape {_dims(shape)}, expected [T, Hkv, D] = "
                   f"{_dims([shape[0], kv_heads, head_dim])} (the caches' KV heads and head dim)")
        c.that(_agree(ks[0], vs[0]) and _agree(ks[0], slots[0]) and _agree(vs[0], slots[0]),
               f"k_new, v_new and slot_mapping disagree on the number of new tokens: "
               f"{_dims([ks[0]])}, {_dims([vs[0]])}, {_dims([slots[0]])}")
        _check_block_size(c, self, block_size)
        if has_bias:
            bias = c.ranked(self.k_bias, "k_bias", 2, ("f32",))
            c.that(bias == [kv_heads, head_dim],
                   f"k_bias has shape {_dims(bias)}, expected [Hkv, D] = "
                   f"{_dims([kv_heads, head_dim])} (one channel bias per KV head)")
        for i, (name, cache) in enumerate(zip(self.CACHES, self.caches)):
            result = self.operation.results[i]
            c.that(result.type == cache.type,
                   f"result #{i} has type {result.type}, expected {cache.type} (the updated "
                   f"{name})")
            self._check_in_place(c, name, cache)
        return True

    def _check_in_place(self, c, name: str, cache: ir.Value) -> None:
        """A cache that is a function argument is updated in the caller's buffer (the
        in-place ABI, passes/lower_cache_write.py), so nothing else may read it: another
        reader would see the update or not, as the buffer happens to be passed."""
        if not isinstance(cache, ir.BlockArgument):
            return
        readers = [use.owner for use in cache.uses]
        c.that(len(readers) == 1,
               f"{name} is argument #{cache.arg_number}, which this cache_write updates in "
               f"place (the caller's array), and {len(readers) - 1} more use of it reads "
               f"it too; give each cache to one cache_write and chain the writes (the next "
               f"one takes this one's results), or pass a separate array")


def cache_write(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale, *,
                k_bias=None, loc=None) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    op = CacheWriteOp.build(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale,
                            k_bias=k_bias, loc=loc)
    return tuple(op.operation.results)
