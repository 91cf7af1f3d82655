"""Compile time of an N-layer ONNX decoder (one attention per layer), stage by stage.

    python benchmarks/onnx_compile_time.py [--layers 32] [--query-tokens 1] [--repeats 3]

import: ONNX checker, shape inference, IREE's importer, constants made dense;
raise: raise-int8-attention; algorithm, linalg: int8attn's pipelines; the
Python passes are raise + algorithm + linalg; iree-compile of the result
(int8attn's linalg and the model's torch ops together), and of the model
as imported (all float, nothing raised) for comparison. Best of `--repeats`
runs for the Python steps; each iree-compile once.
"""

from __future__ import annotations

import argparse
import time

from int8attn.driver.onnx_import import import_model
from int8attn.driver.options import CompileOptions
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS
from int8attn.passes import RaiseInt8Attention
from int8attn.pipelines import algorithm_to_linalg, to_algorithm
from int8attn.pipelines.manager import run_passes
from int8attn.reference.onnx_decoder import DecoderShape, decoder_model
from int8attn.support.ir import new_context
from int8attn.support.remarks import collect


def python_steps(data: bytes) -> tuple[dict[str, float], str, str, int]:
    options = CompileOptions().resolved().pipeline_options()
    seconds, imported = {}, None
    with new_context() as context:
        remarks = collect(context)
        for name, step in (("import", None), ("raise", [RaiseInt8Attention()]),
                           ("algorithm", to_algorithm(options)),
                           ("linalg", algorithm_to_linalg(options))):
            start = time.perf_counter()
            if step is None:
                module = import_model(data, "decoder.onnx")
                imported = str(module)
            else:
                run_passes(module, step)
            seconds[name] = time.perf_counter() - start
        raised = sum("[Passed]" in r for r in remarks)
        return seconds, imported, str(module), raised


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--query-tokens", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = DecoderShape(query_tokens=args.query_tokens, layers=args.layers)
    data = decoder_model(shape, 0).SerializeToString()
    runs = [python_steps(data) for _ in range(args.repeats)]
    best = {name: min(r[0][name] for r in runs) for name in runs[0][0]}
    imported, lowered, raised = runs[0][1:]
    seconds = {}
    for name, text in (("raised", lowered), ("float", imported)):
        start = time.perf_counter()
        iree_compile(text, TARGETS["cpu"])
        seconds[name] = time.perf_counter() - start
    passes = best["raise"] + best["algorithm"] + best["linalg"]
    print(f"{args.layers} layers, {raised} attentions raised, model {len(data) / 2**20:.1f} MiB")
    print("  " + ", ".join(f"{name} {s:.2f} s" for name, s in best.items()))
    print(f"  Python passes (raise + algorithm + linalg) {passes:.2f} s; iree-compile "
          f"{seconds['raised']:.1f} s (the model as imported, all float: {seconds['float']:.1f} s)")


if __name__ == "__main__":
    main()
