"""Prepare prefill bench modules whose tile leaves part of the contract out (timing only).

    python benchmarks/prefill_stage_variants.py DIR one-scale --context 4096,16384 --new-tokens 0
    python -m int8attn.bench_prefill --run DIR --iterations 10      # on the GPU

`one-scale`: the INT8 PV of a tile chains its MMACs in int32 and rescales the sum once,
by the first MMAC group's scale, where the contract rescales every MMAC's sum by its own
group's scale (an f32 conversion and an FMA per C element per MMAC). The time saved is
what the per-MMAC W scale costs the prefill tile; the results are not the contract's
(the bench's check says "no" for the INT8 rows by design). The BF16-PV twin and
everything before PV are unchanged. For the bench's numerics (one-term numerics: one W
term, signed W).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from int8attn import bench_prefill
from int8attn.contract import scalar_ir as contract
from int8attn.contract.constants import MAX_W_V_PRODUCT, ROUND_BIAS_BITS
from int8attn.kernels import pv_stages, prefill
from int8attn.kernels.lanes import c_element

VARIANTS = ("one-scale",)


def pv_one_scale(plan, w: dict, v_tiles, start=None) -> list[list]:
    """`pv_stages.pv` with every tile's MMACs in one int32 chain, rescaled once."""
    if plan.pv != "int8":
        return pv_stages.pv_stage(plan, w, v_tiles, start)
    numerics, layout = plan.numerics, plan.pv_layout
    if numerics.w_terms != 1 or numerics.unsigned_w:
        raise SystemExit("one-scale is built for one signed W term (the bench's numerics)")
    staged = pv_stages.quantize_w(plan, w)
    inst, lanes, c = layout.instruction, plan.lanes, plan.constants()
    a = pv_stages._a_operands(plan, staged, "i8")
    mmacs = layout.model.mmacs_per_wave
    bound = MAX_W_V_PRODUCT[numerics.w_quant] * inst.k * mmacs
    biased = contract.through_bias(bound, c)
    acc0 = (lanes.splat(inst.c_vector, "i32", ROUND_BIAS_BITS) if biased
            else lanes.zeros(inst.c_vector, "i32"))
    o = []
    for tile, loads in v_tiles:
        acc = acc0
        for t in range(mmacs):
            acc = plan.mma(layout, a[t], lanes.assemble(pv_stages._v_runs(layout, loads, t),
                                                        inst.b_vector), acc)
        regs = [None] * inst.c.slots
        for i in plan.pv_live_slots():
            value = contract.exact_f32(c_element(acc, inst, i), bound, c, biased)
            regs[i] = contract.accumulate_pv(c.zero if start is None else start[tile][i], value,
                                             pv_stages._scale(plan, staged, layout.c_row(i), 0))
        o.append(regs)
    return o


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/prefill_stage_variants.py")
    parser.add_argument("directory", type=Path)
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("--context", default="4096,8192,16384")
    parser.add_argument("--history", type=int, default=8192)
    parser.add_argument("--new-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    prefill.pv_stage = pv_one_scale
    contexts = [int(c) for c in args.context.split(",")]
    bench_prefill.prepare(args.directory, contexts, args.history, args.new_tokens, 1, 32, 8, 128)
    return 0


if __name__ == "__main__":
    sys.exit(main())
