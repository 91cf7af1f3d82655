"""The timing variants that leave stages out (benchmarks/*_stage_variants.py).

Their time means something only if they keep what they claim to keep: the same global
loads as the real kernel (decode), the same MMAs with fewer epilogue operations
(prefill). Both are checked on the printed IR of the cuda kernels.
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from iree.compiler import ir

from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.kernels import decode, prefill
from int8attn.kernels.decode import build_decode_kernels, paged_access
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.shapes import PagedShape, PrefillShape
from int8attn.kernels.target_spec import target_spec
from int8attn.simulator.decode import simulate_paged
from int8attn.support.ir import new_context

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import decode_stage_variants  # noqa: E402
import prefill_stage_variants  # noqa: E402

CUDA = target_spec("cuda")
GLOBAL_LOAD = re.compile(r"= (vector|memref)\.load [^\n]*?: (memref<[^\n]*?>)(?:, (vector<[^>]*>))?\n")


def partition_loads(text: str, element: str | None = None) -> Counter:
    """(op, memref type, result type) of the partition kernel's loads from global
    memory, optionally only those of memrefs of `element`."""
    body = text[text.index(decode.PARTITION_KERNEL):text.index(decode.MERGE_KERNEL)]
    found = Counter()
    for match in GLOBAL_LOAD.finditer(body):
        op, memref, result = match.groups()
        if "address_space<workgroup>" in memref or (element and f"x{element}" not in memref):
            continue
        found[(op, memref, result)] += 1
    return found


def paged_text(monkeypatch=None, variant: str | None = None) -> str:
    shape = PagedShape(8, 4, 128, 16, 0.125)      # 32 query heads over 8 KV heads (the bench)
    if variant is not None:
        monkeypatch.setattr(decode.PartitionKernel, "body", decode_stage_variants._body(variant))
    with new_context(), ir.Location.unknown():
        return str(build_decode_kernels(paged_access(shape, CUDA), CUDA).module)


def test_the_decode_variants_read_what_the_kernel_reads(monkeypatch):
    real = paged_text()
    with monkeypatch.context() as patch:
        qk = paged_text(patch, "qk")
    with monkeypatch.context() as patch:
        loads = paged_text(patch, "loads")
    assert partition_loads(real) and partition_loads(qk) == partition_loads(real)
    # every K/V byte and scale as the kernel loads them; only q's loads are left out
    missing = partition_loads(real) - partition_loads(loads)
    assert not partition_loads(loads) - partition_loads(real)
    assert [memref for _, memref, _ in missing] == ["memref<?x32x128xf32>"]    # q

@pytest.mark.parametrize("variant", decode_stage_variants.VARIANTS)
def test_the_decode_variants_run_in_the_simulator(variant, monkeypatch):
    """A variant must be a kernel the GPU can run: the simulator refuses a race or a read
    out of bounds. `loads` once read the block ids it staged in LDS with no barrier
    (the real kernel's is quantize_rows', which it leaves out); on the GPU the stale ids
    sent its loads out of the pool, and the run ended ABORTED (H100 and H200,
    2026-12-05)."""
    seed = 24
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    lengths, kv_heads, head_dim, block_size = [300, 40], 2, 128, 16
    used = [-(-n // block_size) for n in lengths]
    blocks = sum(used) + 3
    k = rng.integers(-127, 128, (blocks, kv_heads, block_size, head_dim), dtype=np.int8)
    v = rng.integers(-127, 128, (blocks, kv_heads, head_dim, block_size), dtype=np.int8)
    k_scale, v_scale = (rng.random((blocks, kv_heads, block_size), np.float32) * 0.01
                        for _ in range(2))
    order = rng.permutation(blocks)
    tables = np.zeros((len(lengths), max(used)), np.int32)
    for b, n in enumerate(used):
        tables[b, :n] = order[sum(used[:b]):sum(used[:b]) + n]
    q = rng.standard_normal((len(lengths), 4 * kv_heads, head_dim)).astype(np.float32)
    monkeypatch.setattr(decode.PartitionKernel, "body", decode_stage_variants._body(variant))
    out = simulate_paged(q, k, k_scale, v, v_scale, tables, np.array(lengths, np.int32), 0.088,
                         target="cuda")
    assert out.shape == q.shape


def test_one_scale_keeps_the_mmas_and_drops_the_epilogue(monkeypatch):
    shape = PrefillShape(1, 32, 8, 256, 256, 128, 0.125)

    def tile_loop(pv_stage) -> str:
        monkeypatch.setattr(prefill, "pv_stage", pv_stage)
        with new_context(), ir.Location.unknown():
            text = str(build_prefill_kernels(shape, CUDA, numerics=ONE_TERM_NUMERICS).module)
        start = text.index("scf.for")
        return text[start:text.index("scf.for", start + 1)]

    real = tile_loop(prefill.pv_stage)
    one = tile_loop(prefill_stage_variants.pv_one_scale)
    inst, mmacs = CUDA.model.instruction, CUDA.model.mmacs_per_wave
    assert real.count("nvgpu.mma.sync") == one.count("nvgpu.mma.sync") > 0
    # each of a lane's PV C elements (16 rows, every row live): one FMA per MMAC
    # group in the contract, one per tile in the variant
    c_elements = shape.head_dim // inst.n * inst.c.slots
    assert real.count("math.fma") - one.count("math.fma") == (mmacs - 1) * c_elements > 0

def test_one_scale_is_refused_for_numerics_it_does_not_model():
    with pytest.raises(SystemExit):
        prefill_stage_variants.main(["/nonexistent", "two-scales"])
