"""Prefill attention through the generated lane-level kernel, simulated.

The host part is the IREE host function's work in numpy (dense: K/V padded to
whole tiles, V to the token-innermost layout; paged: the pool as it is); the
kernel runs in the lane simulator.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from ..contract.numerics import Numerics
from ..fragments import NUMPY_OPS, FragmentModel, ceil_div
from ..kernels.target_spec import target_spec
from ..kernels.shapes import PagedPrefillShape, PrefillShape
from ..kernels.prefill import build_prefill_kernels
from ..kernels.abi import DENSE_INPUTS, PAGED_INPUTS
from .run import dense_kernel_inputs, run_abi
from ..support.ir import new_context


def _spec(target: str, fragments: FragmentModel | None):
    spec = target_spec(target)
    return spec.with_model(fragments) if fragments is not None else spec


def run_prefill_kernels(module: ir.Operation, layout: dict, q, k, k_scale, v, v_scale):
    """The prefill graph's host work in numpy (K/V padded to whole tiles, V
    token-innermost), its kernel in the simulator as its KernelABI says."""
    tile = layout["tile_tokens"]
    padded = ceil_div(NUMPY_OPS, k.shape[2], tile) * tile
    tensors = dict(zip(DENSE_INPUTS, dense_kernel_inputs(q, k, k_scale, v, v_scale, padded)))
    return run_abi(module, layout["abi"], {}, tensors)["out"]


def simulate_prefill(q, k, k_scale, v, v_scale, softmax_scale: float, *,
                     target: str = "gfx936", fragments: FragmentModel | None = None,
                     pv: str = "int8", numerics: Numerics | None = None,
                     pv_atom: str | None = None) -> np.ndarray:
    """Output [B, Hq, Sq, D] of the prefill kernel for `target`, run in the simulator
    (`fragments`, `pv`, `numerics` and `pv_atom` as for `simulate_decode`)."""
    batch, q_heads, query_tokens, head_dim = q.shape
    kv_heads, tokens = k.shape[1], k.shape[2]
    shape = PrefillShape(batch, kv_heads, q_heads // kv_heads, tokens, query_tokens, head_dim,
                         float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(shape, _spec(target, fragments), numerics=numerics,
                                      pv=pv, pv_atom=pv_atom)
        return run_prefill_kernels(built.module, built.layout, q, k, k_scale, v, v_scale)


def run_paged_prefill_kernels(module: ir.Operation, layout: dict, q, k_cache, k_scale, v_cache,
                              v_scale, block_tables, context_lens):
    """A chunked prefill over the block pool: the kernel on the pool as it is, called as
    its KernelABI says."""
    sizes = {"B": q.shape[0], "NB": k_cache.shape[0], "MB": block_tables.shape[1]}
    tensors = dict(zip(PAGED_INPUTS, [np.asarray(q, np.float32), k_cache, k_scale, v_cache,
                                      v_scale, np.asarray(block_tables, np.int32),
                                      np.asarray(context_lens, np.int32)]))
    return run_abi(module, layout["abi"], sizes, tensors)["out"]


def simulate_paged_prefill(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens,
                           softmax_scale: float, *, target: str = "gfx936",
                           fragments: FragmentModel | None = None, pv: str = "int8",
                           numerics: Numerics | None = None, pv_atom: str | None = None) -> np.ndarray:
    """Output [B, Hq, Sq, D] of the chunked-prefill kernel over the block pool."""
    q_heads, query_tokens, head_dim = q.shape[1:]
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    shape = PagedPrefillShape(kv_heads, q_heads // kv_heads, query_tokens, head_dim, block_size,
                              float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(shape, _spec(target, fragments), numerics=numerics,
                                      pv=pv, pv_atom=pv_atom)
        return run_paged_prefill_kernels(built.module, built.layout, q, k_cache, k_scale,
                                         v_cache, v_scale, block_tables, context_lens)
