"""Prepare paged bench modules with another cuda decode schedule (`DecodeTuning`, the
digit join `digits_join_i32` among its fields) or numerics (`Numerics`: q_terms,
q_second, w_quant, w_terms, w_second).

    python benchmarks/paged_schedules.py DIR merge_chunks=16 merge_splits=32 merge_unroll=2
    python benchmarks/paged_schedules.py DIR q_terms=1 w_quant=s8 w_terms=1   # the seed's
    python -m int8attn.bench_paged --run DEFAULT_DIR,DIR,... --pv int8   # on the GPU

Each folder holds the modules `int8attn bench --mode paged --prepare-only`
writes, built with the cuda target's default schedule (kernels/target_spec.py,
TargetSpec.default_tuning) changed in the named fields; `bench_paged --run` with several
folders times them on the same data, every output checked as in the bench.
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from pathlib import Path

from int8attn import bench_paged
from int8attn.kernels import target_spec as specs

NUMERICS_FIELDS = {"q_terms": int, "q_second": str, "w_quant": str, "w_terms": int,
                   "w_second": str}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/paged_schedules.py")
    parser.add_argument("directory", type=Path)
    parser.add_argument("fields", nargs="*", metavar="FIELD=VALUE",
                        help=", ".join([f.name for f in fields(specs.DecodeTuning)]
                                       + list(NUMERICS_FIELDS)))
    parser.add_argument("--q-heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--waves", type=int, default=None,
                        help="waves per partition (the fragment model's; default 4: "
                             "256-token partitions)")
    args = parser.parse_args(argv)
    if args.waves is not None and (args.waves < 1 or args.waves & (args.waves - 1)):
        parser.error(f"--waves {args.waves}: a power of two (the partition's rows and head "
                     f"dim split over its threads)")
    tuning_fields = {f.name for f in fields(specs.DecodeTuning)}
    changes, numerics = {}, {}
    for pair in args.fields:
        name, _, value = pair.partition("=")
        if name in NUMERICS_FIELDS:
            try:
                numerics[name] = NUMERICS_FIELDS[name](value)
            except ValueError:
                parser.error(f"{name} takes an integer, not {value!r}")
        elif name in tuning_fields:
            try:
                changes[name] = specs.field_value(name, value)
            except ValueError as error:
                parser.error(str(error))
        else:
            parser.error(f"{name!r} is no field of DecodeTuning or of the kernels' numerics")
    cuda = specs.TARGET_SPECS["cuda"]
    try:
        chosen = cuda.numerics.updated(**numerics)
    except ValueError as error:
        parser.error(str(error))
    wanted = changes.get("workgroups_per_sm")
    table = tuple((bound, wanted or int8, wanted or bf16)
                  for bound, int8, bf16 in cuda.occupancy_by_head_dim)
    model = cuda.model if args.waves is None else replace(cuda.model,
                                                          waves_per_partition=args.waves)
    specs.TARGET_SPECS["cuda"] = replace(cuda, tuning=replace(cuda.tuning, **changes),
                                         occupancy_by_head_dim=table, model=model)
    print(f"{args.directory}: {specs.target_spec('cuda').default_tuning(args.head_dim)}",
          flush=True)
    print(f"{args.directory}: {chosen.describe()}", flush=True)
    bench_paged.prepare(args.directory, args.q_heads, args.kv_heads, args.head_dim,
                        numerics=chosen, partition_tokens=model.partition_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
