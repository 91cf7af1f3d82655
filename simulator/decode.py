"""Decode attention through the generated lane-level kernels, simulated.

The host part is the same work the IREE host function does (dense: K/V padded
to whole partitions, V to the token-innermost layout; paged: the partition
count from the table width); the kernels themselves run in the lane simulator.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from ..contract.numerics import Numerics
from ..fragments import NUMPY_OPS, FragmentModel, ceil_div
from ..kernels.decode import build_decode_kernels, dense_access, paged_access
from ..kernels.target_spec import target_spec
from ..kernels.shapes import DenseShape, PagedShape
from ..kernels.abi import DENSE_INPUTS, PAGED_INPUTS, paged_sizes
from ..kernels.cache_write import inputs as cache_write_inputs
from .run import dense_kernel_inputs, run_abi
from ..support.ir import new_context


def _real_rows(out, q_heads):
    batch, kv_heads, _, head_dim = out.shape
    return out[:, :, :q_heads // kv_heads].reshape(batch, q_heads, head_dim)


def run_dense_kernels(module: ir.Operation, layout: dict, q, k, k_scale, v, v_scale, *,
                      seed: int = 0):
    """The dense graph's host work in numpy (K/V padded to whole partitions, V
    token-innermost), its kernels in the simulator as their KernelABI says (`seed`:
    the order of their atomics, `run_abi`)."""
    unit = layout["partition_tokens"]
    padded = ceil_div(NUMPY_OPS, k.shape[2], unit) * unit
    tensors = dict(zip(DENSE_INPUTS, dense_kernel_inputs(q, k, k_scale, v, v_scale, padded)))
    return _real_rows(run_abi(module, layout["abi"], {}, tensors, seed)["out"], q.shape[1])


def run_paged_kernels(module: ir.Operation, layout: dict, q, k_cache, k_scale, v_cache, v_scale,
                      block_tables, context_lens, *, seed: int = 0):
    """The paged graph's kernels on the pool as it is (no copy, no padding), called as
    their KernelABI says."""
    batch, q_heads, _ = q.shape
    blocks, _, block_size, _ = k_cache.shape
    sizes = paged_sizes(batch, blocks, block_tables.shape[1], block_size,
                        layout["partition_tokens"])
    tensors = dict(zip(PAGED_INPUTS, [np.asarray(q, np.float32), k_cache, k_scale, v_cache,
                                      v_scale, np.asarray(block_tables, np.int32),
                                      np.asarray(context_lens, np.int32)]))
    return _real_rows(run_abi(module, layout["abi"], sizes, tensors, seed)["out"], q_heads)


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


def _build(access, target, fragments, pv, numerics, pv_atom):
    spec = target_spec(target)
    spec = spec.with_model(fragments) if fragments is not None else spec
    built = build_decode_kernels(access(spec), spec, numerics=numerics, pv=pv, pv_atom=pv_atom)
    return built.module, built.layout


def simulate_decode(q, k, k_scale, v, v_scale, softmax_scale: float, *, target: str = "gfx936",
                    fragments: FragmentModel | None = None, pv: str = "int8",
                    numerics: Numerics | None = None, pv_atom: str | None = None) -> np.ndarray:
    """Output [B, Hq, D] of the dense decode kernels for `target`, run in the simulator.

    `fragments` overrides the model the kernels are generated from (the
    simulator's instruction semantics stay the real ones of `target`);
    `pv="bf16"` runs the BF16-PV baseline kernel (targets with a bf16 MMA);
    `numerics` are the contract's variants (docs/design.md §2c; default the target's);
    `pv_atom` names another INT8 PV instruction of the target (its `TargetSpec`).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads, tokens = k.shape[1], k.shape[2]
    shape = DenseShape(batch, kv_heads, q_heads // kv_heads, tokens, head_dim,
                       float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        module, layout = _build(lambda m: dense_access(shape, m), target, fragments, pv,
                                numerics, pv_atom)
        return run_dense_kernels(module, layout, q, k, k_scale, v, v_scale)


def simulate_paged(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens,
                   softmax_scale: float, *, target: str = "gfx936",
                   fragments: FragmentModel | None = None, pv: str = "int8",
                   numerics: Numerics | None = None, pv_atom: str | None = None) -> np.ndarray:
    """Output [B, Hq, D] of the paged decode kernels, run in the simulator."""
    q_heads, head_dim = q.shape[1:]
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    shape = PagedShape(kv_heads, q_heads // kv_heads, head_dim, block_size,
                       float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        module, layout = _build(lambda m: paged_access(shape, m), target, fragments, pv,
                                numerics, pv_atom)
        return run_paged_kernels(module, layout, q, k_cache, k_scale, v_cache, v_scale,
                                 block_tables, context_lens)
