"""Decode attention through the generated lane-level kernels, simulated.

The host part (query quantization, padding to whole partitions, V to the
token-innermost layout) is the same work the IREE host function does; the
kernels themselves run in the lane simulator.
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from int8attn.fragments import FragmentModel, fragment_model
from int8attn.kernels.decode import (MERGE_KERNEL, PARTITION_KERNEL, ROWS, DecodeShape,
                                     build_decode_kernels)
from int8attn.reference.common import pad_tokens, quantize
from int8attn.simulator.run import run_executable
from int8attn.support.ir import new_context


def host_buffers(q, k, k_scale, v, v_scale, padded: int):
    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    rows = q_heads // kv_heads
    qq, sq = quantize(np.asarray(q, np.float32).reshape(batch, kv_heads, rows, head_dim))
    qq16 = np.zeros((batch, kv_heads, ROWS, head_dim), np.int8)
    sq16 = np.zeros((batch, kv_heads, ROWS), np.float32)
    qq16[:, :, :rows], sq16[:, :, :rows] = qq, sq
    k_p = pad_tokens(k, 2, padded, 0)
    ks_p = pad_tokens(k_scale, 2, padded, 0).astype(np.float32)
    v_t = np.ascontiguousarray(pad_tokens(v, 2, padded, 0).transpose(0, 1, 3, 2))
    vs_p = pad_tokens(v_scale, 2, padded, 0).astype(np.float32)
    return [qq16, sq16, np.ascontiguousarray(k_p), ks_p, v_t, vs_p]


def simulate_decode(q, k, k_scale, v, v_scale, softmax_scale: float, *, target: str = "gfx936",
                    fragments: FragmentModel | None = None, kernels=None,
                    pv: str = "int8") -> np.ndarray:
    """Output [B, Hq, D] of the decode kernels for `target`, run in the simulator.

    `fragments` overrides the model the kernels are generated from (the
    simulator's instruction semantics stay the real ones of `target`);
    `pv="bf16"` runs the BF16-PV baseline kernel (targets with a bf16 MMA).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads, tokens = k.shape[1], k.shape[2]
    shape = DecodeShape(batch, kv_heads, q_heads // kv_heads, tokens, head_dim,
                        float(np.float32(softmax_scale)))
    with new_context(), ir.Location.unknown():
        built = kernels or build_decode_kernels(shape, fragments or fragment_model(target), target,
                                                pv)
        return run_decode_kernels(built.module, built.partitions, built.padded_tokens,
                                  q, k, k_scale, v, v_scale)


def run_decode_kernels(module: ir.Operation, partitions: int, padded_tokens: int,
                       q, k, k_scale, v, v_scale) -> np.ndarray:
    """Run the partition and merge executables of a kernel module on the arrays."""
    batch, q_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    inputs = host_buffers(q, k, k_scale, v, v_scale, padded_tokens)
    parts = (batch, kv_heads, partitions, ROWS)
    o_part = np.zeros(parts + (head_dim,), np.float32)
    m_part, l_part = np.zeros(parts, np.float32), np.zeros(parts, np.float32)
    run_executable(module, PARTITION_KERNEL, inputs + [o_part, m_part, l_part])
    out = np.zeros((batch, kv_heads, ROWS, head_dim), np.float32)
    run_executable(module, MERGE_KERNEL, [o_part, m_part, l_part, out])
    return out[:, :, :q_heads // kv_heads].reshape(batch, q_heads, head_dim)


def simulate_kernel_ir(kernel_ir: str, layout: dict, arrays) -> np.ndarray:
    """The driver's `kernel` artifact (MLIR text) run in the simulator on the
    function's arguments (q, k, k_scale, v, v_scale)."""
    with new_context():
        module = ir.Operation.parse(kernel_ir)
        return run_decode_kernels(module, layout["partitions"], layout["padded_tokens"],
                                  *arrays)
