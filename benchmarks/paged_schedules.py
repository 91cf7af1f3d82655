"""Prepare paged bench modules with another cuda decode schedule (`DecodeTuning`, the
digit join `digits_join_i32` among its fields) or numerics (`Numerics`: q_terms,
q_second, w_quant, w_terms, w_second).

    python benchmarks/paged_schedules.py DIR merge_chunks=16 merge_splits=32 merge_unroll=2
    python benchmarks/paged_schedules.py DIR q_terms=1 w_quant=s8 w_terms=1   # one-term numerics
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

from int8attn import arg_types, bench_paged
from int8attn.kernels import spec_fields
from int8attn.support.diagnostics import DiagnosticError
from int8attn.kernels import target_spec as specs

NUMERICS_FIELDS = {"q_terms": int, "q_second": str, "w_quant": str, "w_terms": int,
                   "w_second": str}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/paged_schedules.py")
    parser.add_argument("directory", type=Path)
    known = [f.name for f in fields(specs.DecodeTuning)] + list(NUMERICS_FIELDS)
    parser.add_argument("fields", nargs="*", metavar="FIELD=VALUE", help=", ".join(known))
    parser.add_argument("--q-heads", type=arg_types.positive, default=32)
    parser.add_argument("--kv-heads", type=arg_types.positive, default=8)
    parser.add_argument("--head-dim", type=arg_types.positive, default=128)
    parser.add_argument("--waves", type=int, default=None,
                        help="waves per partition (the fragment model's; default 4: "
                             "256-token partitions)")
    args = parser.parse_args(argv)
    if args.waves is not None and (args.waves < 1 or args.waves & (args.waves - 1)):
        parser.error(f"--waves {args.waves}: a power of two (the partition's rows and head "
                     f"dim split over its threads)")
    changes, numerics = {}, {}
    for pair in args.fields:
        name, _, value = pair.partition("=")
        if name not in known:
            parser.error(f"{name!r} is no field of DecodeTuning or of the kernels' numerics "
                         f"({', '.join(known)})")
        if name in changes or name in numerics:
            parser.error(f"{name} is given twice; give each field once")
        try:
            if name in NUMERICS_FIELDS:
                numerics[name] = _numerics_value(name, value)
            else:
                changes[name] = spec_fields.field_value(name, value)
        except ValueError as error:
            parser.error(str(error))
    cuda = specs.TARGET_SPECS["cuda"]
    try:
        chosen = cuda.numerics.updated(**numerics)
        chosen.check_head_dim(args.head_dim)
        tuning = replace(cuda.tuning, **changes)
    except (ValueError, DiagnosticError) as error:
        parser.error(str(error))
    wanted = changes.get("workgroups_per_sm")
    table = tuple((bound, wanted or int8, wanted or bf16)
                  for bound, int8, bf16 in cuda.occupancy_by_head_dim)
    model = cuda.model if args.waves is None else replace(cuda.model,
                                                          waves_per_partition=args.waves)
    specs.TARGET_SPECS["cuda"] = replace(cuda, tuning=tuning, occupancy_by_head_dim=table,
                                         model=model)
    print(f"{args.directory}: {specs.target_spec('cuda').default_tuning(args.head_dim)}",
          flush=True)
    print(f"{args.directory}: {chosen.describe()}", flush=True)
    try:
        bench_paged.prepare(args.directory, args.q_heads, args.kv_heads, args.head_dim,
                            numerics=chosen, partition_tokens=model.partition_tokens)
    except (ValueError, DiagnosticError) as error:
        parser.exit(1, f"{parser.prog}: error: {error}\n")
    return 0


def _numerics_value(name: str, text: str):
    if NUMERICS_FIELDS[name] is int:
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"{name} takes an integer, not {text!r}")
        return int(text)
    return text


if __name__ == "__main__":
    raise SystemExit(main())
