"""Prepare paged decode modules whose partition kernel leaves stages out (timing only).

    python benchmarks/decode_stage_variants.py DIR loads   # K, V and both scales, nothing else
    python benchmarks/decode_stage_variants.py DIR qk      # Q, QK and V's loads; no softmax, no PV
    python -m int8attn.bench_paged --run DEFAULT_DIR,DIR --pv int8   # on the GPU

Where does the partition kernel's time go: the time of a kernel that reads exactly the
bytes the real one reads, with the same lanes, the same load instructions and the same
occupancy cap, but computes nothing with them (`loads`), is the load scheme's own
ceiling; `qk` adds Q's quantization and QK back. The difference to the full kernel is
what the stages left out cost. Each variant folds what it read into the partial
output (so no load is dead code) and is not attention: the bench's check reports
"no" for it, by design; only its time means anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from iree.compiler import ir
from iree.compiler.dialects import arith, memref, vector

from int8attn import bench_paged
from int8attn.fragments import thread_distribution
from int8attn.kernels import decode
from int8attn.kernels.lanes import binding, load_vector
from int8attn.kernels.v_loads import load_v
from int8attn.kernels.qk_stages import q_operands, qk, quantize_rows

VARIANTS = ("loads", "qk")


def _fold(lanes, value: ir.Value, vectors) -> ir.Value:
    """xor of every 32-bit word of `vectors` into the i32 `value`."""
    for v in vectors:
        words = ir.VectorType(v.type).shape[0] * ir.VectorType(v.type).element_type.width // 32
        as_i32 = vector.BitCastOp(ir.VectorType.get([words], ir.IntegerType.get_signless(32)),
                                  v).result
        for i in range(words):
            value = arith.xori(value, vector.extract(as_i32, [], [i]))
    return value


def _k_loads(plan, kv, wave_token0):
    """The K bytes and both scales, exactly as `qk` loads them."""
    lanes, layout, d = plan.lanes, plan.layout, plan.head_dim
    wave_kv = kv.wave(wave_token0, plan.model.wave_tokens)
    width, alignment = layout.qk_b_width(d), layout.k_load_alignment(d)
    firsts = [lanes.of_lane(first) for first in layout.qk_b_loads(d)]
    loads, scales = [], []
    for n in range(layout.blocks):
        token = lanes.of_lane(layout.b_token(n))
        loads += [load_vector(kv.k, wave_kv.k_bytes(token, first), width, "i8", alignment)
                  for first in firsts]
        for e in plan.live_elements(n):
            row = wave_kv.token_row(lanes.of_lane(plan.token_in_wave(e)))
            scales += [memref.load(kv.k_scale, row), memref.load(kv.v_scale, row)]
    return loads, scales


def _body(variant: str):
    def body(self, plan, kv, outputs, p) -> None:
        lanes, s = plan.lanes, self.access.shape
        zero = lanes.index(0)
        parts = (kv.batch, s.kv_heads, kv.partition_count)
        out_o = binding(outputs[0], parts + (plan.rows_out, s.head_dim), "f32", zero)
        wave_token0 = lanes.affine((lanes.wave, plan.model.wave_tokens))
        kv.stage()
        folded, total = lanes.i32(0), lanes.f32(0.0)
        if variant == "loads":
            lanes.barrier()     # publishes the staged block ids (quantize_rows' barrier does it in qk)
            loads, scales = _k_loads(plan, kv, wave_token0)
            folded = _fold(lanes, folded, loads)
            for x in scales:
                total = arith.addf(total, x)
        else:
            staged = quantize_rows(plan, kv.q, plan.tile_rows,
                                   lambda row: decode._q_source(kv, s, row))
            scores = qk(plan, q_operands(plan, staged, lambda row: row), kv, wave_token0, None)
            for x in list(scores.values.values()) + list(scores.v_scales.values()):
                total = arith.addf(total, x)
        folded = _fold(lanes, folded, [v for row in load_v(plan, kv, wave_token0) for v in row])
        value = arith.addf(total, arith.bitcast(ir.F32Type.get(), folded))
        _, slots = thread_distribution(plan.rows_out, s.head_dim, lanes.threads)
        row_map, col_map = slots[0]
        memref.store(value, out_o, [kv.b, kv.h, p, lanes.of_lane(row_map, of=lanes.thread),
                                    lanes.of_lane(col_map, of=lanes.thread)])
    return body


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/decode_stage_variants.py")
    parser.add_argument("directory", type=Path)
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args(argv)
    decode.PartitionKernel.body = _body(args.variant)
    bench_paged.prepare(args.directory, args.q_heads, args.kv_heads, args.head_dim)
    return 0


if __name__ == "__main__":
    sys.exit(main())
