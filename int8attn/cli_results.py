"""What `int8attn run` prints about a call's results: the accuracy of an attention
against both references, a cache_write's caches against the numpy write, an ONNX
model's outputs against onnxruntime."""

from __future__ import annotations

import sys
import time

import numpy as np


class SlowProgress:
    """Progress lines on stderr, once a step has run longer than `after` seconds."""

    def __init__(self, after: float = 2.0):
        self.start, self.after = time.perf_counter(), after

    def __call__(self, message: str) -> None:
        elapsed = time.perf_counter() - self.start
        if elapsed >= self.after:
            print(f"  {message} ({elapsed:.0f} s)", file=sys.stderr, flush=True)


def print_accuracy(result, arrays, info, options) -> None:
    from .driver.graph import error_stats, references

    numerics = options.numerics
    refs = references(info, arrays, pv=options.pv, model=options.pv_model_name,
                      partition_tokens=options.partition_tokens, tile_tokens=options.tile_tokens,
                      scale_groups=options.scale_groups, numerics=numerics,
                      progress=SlowProgress())
    variant = f", {numerics.describe()}" if options.pv == "int8" \
        else f", q-terms {numerics.q_terms}"
    print(f"accuracy of @{info.name} (target {options.target}, pv={options.pv}, fragment "
          f"model {options.pv_model_name}{variant}):")
    for name, label in (("exact", "vs exact f32 reference      "),
                        ("fragment", "vs fragment-level reference")):
        stats = error_stats(result, refs[name])
        print(f"  {label}  max abs {stats['max_abs']:.3e}   rms {stats['rms']:.3e}")


_CACHES = ("k_cache", "k_scale", "v_cache", "v_scale")


def check_cache_write(outputs, before, info, options) -> bool:
    """A cache_write's four caches against `reference.paged_cache_write` of the pool as
    it was before the call (`before`: the module writes the caller's arrays in place,
    so the arrays themselves no longer hold it): every slot bit for bit, but for a
    tiny row's subnormal scale stored as +0 (`reference.paged.flushed_scales_equal`).
    Prints a line per cache; False if any differs."""
    from .reference import paged_cache_write
    from .reference.paged import flushed_scales_equal

    call = info.attention
    expected = dict(zip(_CACHES, paged_cache_write(*(before[i] for i in call.argument_of))))
    print(f"cache_write of @{info.name} (target {options.target}) against "
          f"reference.paged_cache_write of the pool before the call:")
    good = True
    for result, argument in call.tied:
        name = call.operands[call.argument_of.index(argument)]
        got, want = np.asarray(outputs[result]), expected[name]
        same = (flushed_scales_equal(got, want) if name.endswith("scale")
                else got == want)
        differ = int(same.size - np.count_nonzero(same))
        good &= differ == 0
        print(f"  {name:8} {'bit for bit' if not differ else f'{differ} of {same.size} differ'}")
    return good


def compare_with_onnxruntime(model: bytes, info, arrays, outputs) -> None:
    from .driver.onnx_inputs import comparison_lines, onnxruntime_outputs

    expected = onnxruntime_outputs(model, info, arrays)
    if expected is None:
        print("note: install onnxruntime (pip install -e '.[onnx]') to compare with it",
              file=sys.stderr)
        return
    print("vs onnxruntime (f32) on the same inputs:")
    for line in comparison_lines(info, outputs, expected):
        print(f"  {line}")
