"""A decoder layer over an INT8 KV cache, in ONNX: onnxruntime vs `int8attn run`.

    pip install -e '.[onnx]'
    python examples/onnx_decoder_layer.py [--query-tokens 1] [--layers 1] [--seed 0] [--keep DIR]

Builds the layer with onnx.helper (`int8attn.reference.onnx_decoder`: RMSNorm,
QKV projections, rotary embedding, the new tokens quantized per token into a
300-token INT8 cache, attention with GQA 4:1, output projection, SiLU MLP),
writes it and random inputs next to each other, runs `int8attn run MODEL.onnx
--inputs ... --output ...` (its attention raised into int8attn's pipeline,
the rest compiled by IREE, on IREE's CPU runtime) and onnxruntime, and prints
the difference, next to the INT8 contract's own error on the same inputs
(onnxruntime around `fragment_attention`): the difference should be that.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from int8attn.reference.onnx_decoder import (DecoderShape, around_attention, contract_attention,
                                             decoder_inputs, decoder_model, run_onnxruntime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query-tokens", type=int, default=1, help="1: decode; more: prefill")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--past-tokens", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="weights (seed) and inputs (seed+1)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the model, inputs and outputs here and keep them (default: "
                             "a temporary folder, deleted at exit)")
    args = parser.parse_args()
    shape = DecoderShape(query_tokens=args.query_tokens, layers=args.layers,
                         past_tokens=args.past_tokens)
    if args.keep:
        return run(shape, args.seed, Path(args.keep), kept=True)
    with tempfile.TemporaryDirectory(prefix="int8attn-onnx-") as scratch:
        return run(shape, args.seed, Path(scratch), kept=False)


def run(shape: DecoderShape, seed: int, directory: Path, kept: bool) -> int:
    import onnx

    directory.mkdir(parents=True, exist_ok=True)
    model = decoder_model(shape, seed)
    inputs = decoder_inputs(shape, seed + 1)
    onnx.save(model, directory / "decoder.onnx")
    np.savez(directory / "inputs.npz", **inputs)
    print(f"{shape}, weights seed {seed}, inputs seed {seed + 1}")
    # The int8attn command of this Python's environment (a venv need not be active).
    tool = shutil.which("int8attn", path=str(Path(sys.executable).parent)) or "int8attn"
    # run in the folder, on its file names: the command and its messages name no path
    # that a temporary folder takes with it
    command = [tool, "run", "decoder.onnx", "--inputs", "inputs.npz", "--output", "outputs.npz"]
    where = shlex.quote(str(directory.resolve())) if kept else "DIR"
    print(f"$ cd {where} && {shlex.join(command)}", flush=True)
    if not kept:
        print("  (DIR: a temporary folder, deleted at exit; to repeat this command, run the "
              "example with --keep DIR, which keeps the model and its inputs there)", flush=True)
    if subprocess.run(command, cwd=directory).returncode:
        return 1
    y = np.load(directory / "outputs.npz")["y"]
    expected = run_onnxruntime(model, inputs)["y"]
    contract = around_attention(shape, seed, inputs,
                                lambda outputs, layer: contract_attention(outputs, layer)[0])
    print(f"y: max |int8attn - onnxruntime| {np.abs(y - expected).max():.3e}; the INT8 "
          f"contract's own error on these inputs {np.abs(contract['y'] - expected).max():.3e} "
          f"(max |y| {np.abs(expected).max():.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
