"""Decode attention through the generated lane-level kernels, simulated.

The host part is the same work the IREE host function does (dense: K/V padded
to whole partitions, V to the token-innermost layout; paged: the partition
count from the table width); the kernels themselves run in the lane simulator.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from int8attn.contract.numerics import Numerics
from int8attn.fragments import FragmentModel, fragment_model
from int8attn.kernels.decode import (MERGE_KERNEL, PARTITION_KERNEL, ROWS, build_decode_kernels,
                                     dense_access, paged_access)
from int8attn.kernels.kv_access import DenseShape, PagedShape
from int8attn.kernels.abi import PAGED_INPUTS, paged_sizes
from int8attn.kernels.cache_write import inputs as cache_write_inputs
from int8attn.simulator.run import (KERNEL_DEFAULT_NUMERICS, dense_kernel_inputs, kernel_numerics,
                                    run_abi, run_executable)
from int8attn.support.ir import new_context


def _partials(batch, kv_heads, partitions, rows_out, head_dim):
    parts = (batch, kv_heads, partitions)
    return [np.zeros(parts + (rows_out, head_dim), np.float32),
            np.zeros(parts + (ROWS,), np.float32), np.zeros(parts + (ROWS,), np.float32)]


def _real_rows(out, q_heads):
    batch, kv_heads, _, head_dim = out.shape
    return out[:, :, :q_heads // kv_heads].reshape(batch, q_heads, head_dim)


def run_dense_kernels(module: ir.Operation, layout: dict, q, k, k_scale, v, v_scale):
    """The dense graph's host work in numpy, its two kernels in the simulator."""
    batch, q_heads, head_dim = q.shape
    kv_heads, tokens = k.shape[1], k.shape[2]
    unit = layout["partition_tokens"]
    partitions = -(-tokens // unit)
    padded = partitions * unit
    inputs = dense_kernel_inputs(q, k, k_scale, v, v_scale, padded)
    partials = _partials(batch, kv_heads, partitions, layout["rows_out"], head_dim)
    run_executable(module, PARTITION_KERNEL, (partitions, kv_heads, batch), inputs + partials)
    out = np.zeros((batch, kv_heads, layout["rows_out"], head_dim), np.float32)
    run_executable(module, MERGE_KERNEL, (kv_heads, batch), partials + [out])
    return _real_rows(out, q_heads)


def run_paged_kernels(module: ir.Operation, layout: dict, q, k_cache, k_scale, v_cache, v_scale,
                      block_tables, context_lens):
    """The paged graph's kernels on the pool as it is (no copy, no padding), called as
    their KernelABI says."""
    batch, q_heads, _ = q.shape
    blocks, _, block_size, _ = k_cache.shape
    sizes = paged_sizes(batch, blocks, block_tables.shape[1], block_size,
                        layout["partition_tokens"])
    tensors = dict(zip(PAGED_INPUTS, [np.asarray(q, np.float32), k_cache, k_scale, v_cache,
                                      v_scale, np.asarray(block_tables, np.int32),
                                      np.asarray(context_lens, np.int32)]))
    return _real_rows(run_abi(module, layout["abi"], sizes, tensors)["out"], q_heads)


def run_cache_write_kernel(module: ir.Operation, layout: dict, k_new, v_new, slot_mapping,
                           k_cache, k_scale, v_cache, v_scale, k_bias=None):
    """The cache-write kernel (its KernelABI) on copies of the caches; returns them."""
    caches = [np.array(c, copy=True) for c in (k_cache, k_scale, v_cache, v_scale)]
    bias = [] if k_bias is None else [np.asarray(k_bias, np.float32)]
    tensors = dict(zip(cache_write_inputs(k_bias is not None),
                       [np.asarray(k_new, np.float32), np.asarray(v_new, np.float32),
                        np.asarray(slot_mapping, np.int32), *caches, *bias]))
    run_abi(module, layout["abi"], {"T": np.shape(k_new)[0], "NB": caches[0].shape[0]}, tensors)
    return tuple(caches)


def _build(access, target, fragments, pv, numerics: Numerics):
    model = fragments or fragment_model(target)
    built = build_decode_kernels(access(model), model, target, pv, **kernel_numerics(numerics))
    return built.module, built.layout


def simulate_decode(q, k, k_scale, v, v_scale, softmax_scale: float, *, target: str = "gfx936",
                    fragments: FragmentModel | None = None, pv: str = "int8",
                    numerics: Numerics = KERNEL_DEFAULT_NUMERICS) -> np.ndarray:
    """Output [B, Hq, D] of the dense decode kernels for `target`, run in the simulator.

    `fragments` overrides the model the kernels are generated from (the
    simulator's instruction semantics stay the real ones of `target`);
    `pv="bf16"` runs the BF16-PV baseline kernel (targets with a bf16 MMA);
    `numerics` is the variant the kernels are built for (docs/design.md §2c; default the
    kernel targets', the seed's; w-terms 1 only).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads, tokens = k.shape[1], k.shape[2]
    shape = DenseShape(batch, kv_heads, q_heads // kv_heads, tokens, head_dim,
                       float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        module, layout = _build(lambda m: dense_access(shape, m), target, fragments, pv,
                                numerics)
        return run_dense_kernels(module, layout, q, k, k_scale, v, v_scale)


def simulate_paged(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens,
                   softmax_scale: float, *, target: str = "gfx936",
                   fragments: FragmentModel | None = None, pv: str = "int8",
                   numerics: Numerics = KERNEL_DEFAULT_NUMERICS) -> np.ndarray:
    """Output [B, Hq, D] of the paged decode kernels, run in the simulator
    (`fragments`, `pv` and `numerics` as for `simulate_decode`)."""
    q_heads, head_dim = q.shape[1:]
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    shape = PagedShape(kv_heads, q_heads // kv_heads, head_dim, block_size,
                       float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        module, layout = _build(lambda m: paged_access(shape, m), target, fragments, pv,
                                numerics)
        return run_paged_kernels(module, layout, q, k_cache, k_scale, v_cache, v_scale,
                                 block_tables, context_lens)
