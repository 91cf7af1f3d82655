"""`int8attn run --report`: where the error comes from, and INT8 vs BF16 PV."""

from __future__ import annotations

import dataclasses

import numpy as np

from .driver.graph import error_stats
from .reference import TERMS, error_split
from .support.diagnostics import UsageError

_LABELS = {
    "total": "total (INT8 module - exact)",
    "q_quantization": "INT8 Q (via P)",
    "k_cache": "K cache (via P)",
    "v_cache": "V cache       sum P*(-eV)",
    "w_quantization": "W quantization sum eW*Vq",
}


def _line(label: str, values: np.ndarray) -> str:
    stats = error_stats(values, np.zeros_like(values))
    return f"  {label:30} max abs {stats['max_abs']:.3e}   rms {stats['rms']:.3e}"


def refuse_unreportable(pv: str) -> None:
    """The split's W-quantization term is the error of W's INT8 levels
    (reference/error_split.py): a float PV has no such term (f32 PV does not quantize W;
    bf16 PV rounds it, an error the split does not model), so its breakdown would
    name an error that is not there."""
    if pv != "int8":
        raise UsageError(f"--report splits the error of INT8 PV (its W-quantization term is "
                         f"the error of W's INT8 levels); --pv {pv} does not quantize W to "
                         f"INT8, so that split does not apply: use --pv int8 (the report then "
                         f"compares it with BF16 and f32 PV), or drop --report")


def print_report(graph, source, filename, info, arrays, floats, outputs, options) -> None:
    from . import api

    refuse_unreportable(options.pv)
    call = info.attention
    if call.mode in ("paged", "cache_write"):
        raise UsageError(f"--report splits the error of the dense int8attn.attention op; "
                         f"@{info.name} is {call.mode} (drop --report)")
    q, k, k_scale, v, v_scale = (arrays[i] for i in call.argument_of)
    result = outputs[call.result_index]
    split = error_split(q, k, k_scale, v, v_scale, floats["k"], floats["v"],
                        call.softmax_scale, result, model=options.pv_model_name,
                        partition_tokens=options.partition_tokens,
                        tile_tokens=options.tile_tokens, scale_groups=options.scale_groups,
                        numerics=options.numerics)
    print(f"error split against exact attention on the float cache (unquantized q, K, V), "
          f"pv={options.pv}, {options.numerics.describe()}, "
          f"scale groups {options.scale_groups}:")
    print(_line(_LABELS["total"], split["total"]))
    for term in TERMS:
        print(_line(_LABELS[term], split[term]))
    residual = split["total"] - sum(split[t] for t in TERMS)
    print(_line("total - sum of the terms", residual))
    others = {}
    for pv in ("bf16", "f32"):
        baseline = api.compile(source, filename=filename,
                               **dataclasses.asdict(options.with_pv(pv)))
        others[pv] = baseline.run(arrays, info.name)[call.result_index]
    print("PV alone (same graph, inputs and pipeline; only PV differs):")
    print("| comparison | max abs | RMS |")
    print("|:--|--:|--:|")
    for name, a, b in (("INT8 PV vs BF16 PV", result, others["bf16"]),
                       ("INT8 PV vs f32 PV", result, others["f32"]),
                       ("BF16 PV vs f32 PV", others["bf16"], others["f32"])):
        stats = error_stats(a, b)
        print(f"| {name} | {stats['max_abs']:.3e} | {stats['rms']:.3e} |")
