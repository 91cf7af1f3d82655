"""The cache write as a lane kernel: new K/V rows quantized into the block pool in place.

One workgroup of one wave per (new token t, KV head h), grid [T, Hkv, 1]. Lane l
holds channels l, l + W, l + 2W, ... of the row (W the wave size: each load is
one coalesced row segment). Per row the contract's `quantize` (docs/design.md §2:
absmax over the wave by xor shuffles, `127/a`, clamp, round to even, the rules
for a tiny or non-finite row) from `contract/scalar_ir.py`, the one
definition every kernel and pass uses. Kq goes to k_cache[blk, h, off, :], Vq to
v_cache[blk, h, :, off] (token-innermost), the scales to k_scale / v_scale at
[blk, h, off], where (blk, off) is the slot's place in the pool
(`kv_access.pool_slot`). A negative slot (vLLM's padding) or one past the pool
writes nothing: the host refuses the latter before the call, the kernel never
writes out of bounds whatever it is given.

With a `k_bias` [Hkv, D] (a graph whose cache_write has the optional last
operand, docs/design.md's conditioned K cache) each lane subtracts bias[h, col]
from its key channels in f32 before the absmax, as `reference.paged_cache_write`
does; V is never biased.

The four caches are updated in place: the IREE host function ties each result
to its cache operand, and the direct launcher passes the caller's pool.
"""

from __future__ import annotations

from dataclasses import dataclass

from iree.compiler import ir
from iree.compiler.dialects import arith, memref

from ..fragments import FragmentModel
from .abi import KernelABI
from .executable import build_kernel
from .kv_access import pool_slot
from .lanes import Lanes, binding, workgroup_id
from ..contract import scalar_ir as contract

CACHE_WRITE_KERNEL = "cache_write"
INPUTS = ("k_new", "v_new", "slot_mapping", "k_cache", "k_scale", "v_cache", "v_scale")
CACHES = INPUTS[3:]
BIAS = "k_bias"     # the optional last input, in the op's operand order


def inputs(k_bias: bool) -> tuple[str, ...]:
    """The kernel's inputs in parameter order: the op's operands, k_bias last if any."""
    return INPUTS + ((BIAS,) if k_bias else ())


@dataclass(frozen=True)
class CacheWriteShape:
    kv_heads: int
    head_dim: int
    block_size: int
    k_bias: bool = False    # new keys minus a [Hkv, D] bias before they are quantized

    @property
    def inputs(self) -> tuple[str, ...]:
        return inputs(self.k_bias)


@dataclass(frozen=True)
class CacheWriteKernels:
    """The cache-write executable, and how a host calls it."""

    module: ir.Operation
    shape: CacheWriteShape
    threads: int

    @property
    def abi(self) -> tuple[KernelABI, ...]:
        return (KernelABI(CACHE_WRITE_KERNEL, self.shape.inputs, (), ("T", "NB"),
                          ("T", self.shape.kv_heads, 1), self.threads, writes_inputs=CACHES,
                          trailing=1),)

    @property
    def layout(self) -> dict:
        return {"kernel": "cache_write", "abi": [a.to_json() for a in self.abi]}


def check_cache_write_shape(shape: CacheWriteShape, wave: int) -> None:
    if shape.head_dim % wave:
        raise ValueError(f"head dim {shape.head_dim} must be a multiple of the {wave}-lane "
                         f"wave for the cache-write kernel (each lane quantizes every "
                         f"{wave}th channel); --target cpu takes any head dim")


def build_cache_write_kernels(shape: CacheWriteShape, model: FragmentModel) -> CacheWriteKernels:
    """A module holding the cache-write stream.executable (needs an active context)."""
    wave = model.instruction.wave_size
    check_cache_write_shape(shape, wave)
    module = ir.Module.create()
    built = CacheWriteKernels(module.operation, shape, wave)
    with ir.InsertionPoint(module.body):
        build_kernel(built.abi[0], lambda args: _write_body(args, shape, wave), wave)
    return built


def _write_body(args, shape: CacheWriteShape, wave: int) -> None:
    lanes = Lanes(wave, wave)
    t, h = workgroup_id(0), workgroup_id(1)
    tokens, blocks = args[len(shape.inputs):]
    zero, hkv, d, bs = lanes.index(0), shape.kv_heads, shape.head_dim, shape.block_size
    k_new = binding(args[0], (tokens, hkv, d), "f32", zero)
    v_new = binding(args[1], (tokens, hkv, d), "f32", zero)
    slots = binding(args[2], (tokens,), "i32", zero)
    k_cache = binding(args[3], (blocks, hkv, bs, d), "i8", zero)
    k_scale = binding(args[4], (blocks, hkv, bs), "f32", zero)
    v_cache = binding(args[5], (blocks, hkv, d, bs), "i8", zero)
    v_scale = binding(args[6], (blocks, hkv, bs), "f32", zero)
    k_bias = binding(args[7], (hkv, d), "f32", zero) if shape.k_bias else None
    block, offset, inside = pool_slot(lanes, memref.load(slots, [t]), blocks, bs)
    channels = [lanes.plus(lanes.lane, wave * j) for j in range(d // wave)]
    first_lane = arith.cmpi(arith.CmpIPredicate.eq, lanes.lane, zero)
    c = contract.quantize_constants(lanes.f32)
    offsets = [1 << i for i in range(wave.bit_length() - 1)]
    for rows, bias, cache, scales, token_major in ((k_new, k_bias, k_cache, k_scale, True),
                                                   (v_new, None, v_cache, v_scale, False)):
        values = [memref.load(rows, [t, h, col]) for col in channels]
        if bias is not None:    # one f32 subtract per element, as the reference rounds it
            values = [arith.subf(x, memref.load(bias, [h, col]))
                      for x, col in zip(values, channels)]
        amax = lanes.xor_reduce(contract.absmax(values, c), offsets, contract.absmax_merge)
        inverse = contract.quantize_inverse(amax, c)
        with lanes.when(inside):
            for x, col in zip(values, channels):
                where = [block, h, offset, col] if token_major else [block, h, col, offset]
                memref.store(contract.quantize_value(x, inverse, c), cache, where)
            with lanes.when(first_lane):
                memref.store(contract.quantize_scale(amax, c), scales, [block, h, offset])
