"""The driver's kernel artifact run in the simulator: the host work per kernel kind.

One table maps (the graph's mode, the kernel the driver built) to the host side
that calls its executables; decode and prefill hosts live in their own modules,
which import only `run` (no simulator module imports a sibling but this one).
"""

from __future__ import annotations

import numpy as np
from iree.compiler import ir

from .decode import (run_cache_write_kernel, run_dense_kernels,
                     run_paged_kernels)
from .prefill import run_paged_prefill_kernels, run_prefill_kernels
from ..support.ir import new_context

# (the graph's mode, the kernel the driver built for it) -> the host work around it.
RUNNERS = {("decode", "decode"): run_dense_kernels, ("paged", "decode"): run_paged_kernels,
           ("prefill", "prefill"): run_prefill_kernels,
           ("paged", "prefill"): run_paged_prefill_kernels,
           ("cache_write", "cache_write"): run_cache_write_kernel}


def simulate_kernel_ir(kernel_ir: str, layout: dict, arrays) -> np.ndarray:
    """The driver's `kernel` artifact (MLIR text) run in the simulator on the
    function's arguments (dense decode and prefill: q, k, k_scale, v, v_scale;
    paged decode and chunked prefill: the seven)."""
    with new_context():
        module = ir.Operation.parse(kernel_ir)
        return RUNNERS[layout["mode"], layout["kernel"]](module, layout, *arrays)
