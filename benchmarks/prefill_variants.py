"""Prepare prefill bench modules with the cuda target's prefill choices changed.

    python benchmarks/prefill_variants.py DIR prefill_kv_ring=False
    python benchmarks/prefill_variants.py DIR prefill_workgroups_per_sm=2
    python benchmarks/prefill_variants.py DIR prefill_digits_join_i32=False --numerics kernel
    python -m int8attn.bench_prefill --run DIR --iterations 10      # on the GPU

Each folder holds what `int8attn bench --mode prefill --prepare-only` writes (the same
cases: `--context`, `--history`, `--new-tokens`), built with the named `TargetSpec`
fields of the cuda target changed (kernels/target_spec.py: `prefill_kv_ring`, the
K/V ring in LDS; `prefill_workgroups_per_sm`, the register cap; `ring_lds_bytes`;
`prefill_q_per_tile`, Q's operands read from LDS in every tile: cuda's default;
`reciprocal_intrinsic=None`, W's inverses by the checked division;
`prefill_digits_join_i32`, digit sums joined as integers and converted once: cuda's
default, a choice of the default numerics, `--numerics kernel`; `--numerics` as for
`int8attn bench`), so a GPU session times a choice against the default with the bench's
checks.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from int8attn import arg_types, bench_numerics, bench_prefill
from int8attn.kernels import spec_fields
from int8attn.kernels import target_spec as specs
from int8attn.support.diagnostics import DiagnosticError

CHOICES = ("prefill_kv_ring", "prefill_workgroups_per_sm", "ring_lds_bytes",
           "prefill_q_per_tile", "reciprocal_intrinsic", "prefill_digits_join_i32")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/prefill_variants.py")
    parser.add_argument("directory", type=Path)
    parser.add_argument("fields", nargs="+", metavar="FIELD=VALUE", help=", ".join(CHOICES))
    parser.add_argument("--context", type=arg_types.token_counts, default=(4096, 8192, 16384))
    parser.add_argument("--history", type=arg_types.count, default=8192)
    parser.add_argument("--new-tokens", type=arg_types.count, default=512)
    parser.add_argument("--batch", type=arg_types.positive, default=1)
    parser.add_argument("--q-heads", type=arg_types.positive, default=32)
    parser.add_argument("--kv-heads", type=arg_types.positive, default=8)
    parser.add_argument("--head-dim", type=arg_types.positive, default=128)
    parser.add_argument("--numerics", choices=bench_numerics.CHOICES,
                        default=bench_prefill.NUMERICS)
    args = parser.parse_args(argv)
    try:
        changes = spec_fields.field_changes(args.fields, CHOICES, "a prefill choice of the cuda target")
    except ValueError as error:
        parser.error(str(error))
    specs.TARGET_SPECS["cuda"] = spec_fields.with_changes(specs.TARGET_SPECS["cuda"], changes)
    print(f"{args.directory}: cuda prefill with {changes}", flush=True)
    try:
        bench_prefill.prepare(args.directory, list(args.context), args.history,
                              args.new_tokens, args.batch, args.q_heads, args.kv_heads,
                              args.head_dim,
                              bench_numerics.bench_numerics(args.numerics, bench_prefill.NUMERICS))
    except (ValueError, DiagnosticError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
