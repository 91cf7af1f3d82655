"""The `int8attn` command line: its subcommands, their flags and the flags' value types.

`build_parser()` declares `compile`, `run`, `targets` and `bench`; the compile
flags are the fields of `CompileOptions` the CLI offers (`CLI_OPTIONS`), the
stages those of `driver.targets`. The commands themselves are in
`cli_compile_run` and `cli_bench`; `cli.main` parses and dispatches.
"""

from __future__ import annotations

import argparse

from . import arg_types, bench_numerics
from .bench_prefill import w_chains as bench_prefill_chains
from .bench_harness import BENCH_OUT
from .bench_kinds import BENCH_KINDS
from .driver.options import CompileOptions
from .driver.targets import STAGE_NAMES
from .support.options import add_arguments

# Flags of CompileOptions the CLI offers (v_token_innermost changes the
# function's signature: a Python API / bench choice).
CLI_OPTIONS = ("target", "target_cpu", "pv", "fragment_model", "scale_groups", "verify",
               "partition_tokens", "tile_tokens", "q_terms", "q_second", "w_quant", "w_terms", "w_second",
               "w_chain",
               "contraction",
               "pv_atom", "kernel_object")



def _add_compile_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("graph", type=arg_types.path,
                        help="MLIR file with int8attn.attention graphs, or an ONNX model "
                             "(.onnx: its INT8-cache attention is raised, the rest goes to "
                             "IREE; needs the onnx extra)")
    add_arguments(parser, CompileOptions, only=CLI_OPTIONS)
    parser.add_argument("--save-stages", metavar="DIR",
                        help="write every stage's artifact to DIR (00-graph.mlir, ...), so a "
                             "failing stage can be reproduced from its input")


def build_parser() -> argparse.ArgumentParser:
    parser = arg_types.FlagParser(
        prog="int8attn", description="Compile and run attention over an INT8 KV cache.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    compile_cmd = commands.add_parser(
        "compile", help="compile a graph through its target's stages",
        description="Run the target's chain of stages (int8attn targets lists them) up to "
                    "--emit and write that stage's artifact.")
    _add_compile_options(compile_cmd)
    compile_cmd.add_argument("-o", "--output", required=True, type=arg_types.path,
                             help="output file ('-' writes to stdout)")
    compile_cmd.add_argument("--emit", choices=STAGE_NAMES, default=None,
                             help="stop after this stage and write its artifact (default: "
                                  "vmfb on cpu, gfx942 and cuda; kernel on gfx936)")
    compile_cmd.add_argument("--print-ir-after-all", action="store_true",
                             help="print the IR to stderr after every pass")

    run_cmd = commands.add_parser(
        "run", help="compile (cached) and execute: IREE CPU/CUDA runtime or the lane simulator",
        description="Without --inputs: random inputs from a printed seed and a report of "
                    "the error against the exact and the fragment-level reference.")
    _add_compile_options(run_cmd)
    run_cmd.add_argument("--simulate", action="store_true",
                         help="with --target gfx936, gfx942 or cuda: run the generated "
                              "lane-level kernels in the lane simulator")
    run_cmd.add_argument("--inputs", type=arg_types.path,
                         help="npz with the arguments as arg0, arg1, ... (an ONNX model's: its "
                              "input names, or arg0, ...)")
    run_cmd.add_argument("--output", type=arg_types.path,
                         help="npz to write the results to (result0, ...; an ONNX model's: its "
                              "output names)")
    run_cmd.add_argument("--function", help="public function to call (default: the only one)")
    run_cmd.add_argument("--seed", type=arg_types.seed, default=None,
                         help="seed of the random inputs (default: drawn and printed; "
                              "refused with --inputs, which gives the inputs)")
    run_cmd.add_argument("--no-cache", action="store_true",
                         help="compile even if the module cache has this graph")
    run_cmd.add_argument("--report", action="store_true",
                         help="split the error against exact attention on the float cache "
                              "into its INT8-QK, V-cache and W-quantization terms, and "
                              "compare INT8 PV with BF16 and f32 PV (random inputs; --target "
                              "cpu, --pv int8)")

    commands.add_parser("targets", help="list the targets and their stages",
                        description="Print each target's chain of stages and what runs it.")

    bench_cmd = commands.add_parser(
        "bench", help="time the decode kernels on a GPU (cuda) against BF16 PV and torch SDPA",
        description="Compile (sm_80 PTX) and run the INT8-PV and BF16-PV decode kernels "
                    "through IREE's CUDA runtime; check them against the fragment-level "
                    "reference; time them, torch SDPA on a bf16 KV cache and a device copy. "
                    "Writes a Markdown table, a JSON file and a PNG plot.")
    bench_cmd.add_argument("--target", choices=("cuda",), default="cuda")
    bench_cmd.add_argument("--mode", choices=tuple(BENCH_KINDS), default="decode",
                           help="decode: dense batches, one module per context; paged: one "
                                "module for uniform batches at each --context, a ragged batch "
                                "(lengths uniform on [1, 2*mean-1]) and B=1 at the longest; "
                                "prefill: causal Sq = S at each --context and a history case "
                                "(--history cached + --new-tokens new tokens), TFLOP/s on the "
                                "causal work")
    bench_cmd.add_argument("--history", type=arg_types.count, default=None, metavar="TOKENS",
                           help="--mode prefill: cached tokens of the history case "
                                "(default 8192)")
    bench_cmd.add_argument("--new-tokens", type=arg_types.count, default=None, metavar="TOKENS",
                           help="--mode prefill: new tokens of the history case (default 512; "
                                "0 leaves the case out)")
    bench_cmd.add_argument("--ragged-mean", type=arg_types.positive, default=None, metavar="TOKENS",
                           help="--mode paged: mean length of the ragged batch (default 8192)")
    bench_cmd.add_argument("--seed", type=arg_types.seed, default=0,
                           help="seed of the random data (--mode paged: also of the lengths "
                                "and block tables)")
    bench_cmd.add_argument("--numerics", choices=bench_numerics.CHOICES, default=None,
                           type=bench_numerics.numerics_name,
                           help="--mode paged and prefill: the kernels' numerics: one-term "
                                "(q-terms 1, w-quant s8, w-terms 1), digits (the kernel "
                                "targets' default: 2, s8, 2, each second term a digit) or "
                                "defaults (the cpu pipeline's: 2, u8, 2, scaled); default: "
                                "paged digits, prefill one-term (the numerics of its tables); "
                                "the old names seed and kernel are deprecated")
    bench_cmd.add_argument("--w-chain", type=bench_prefill_chains, default=None, dest="w_chains",
                           metavar="C[,C...]",
                           help="--mode prefill: PV accumulation chains (1, 2; comma-separated) "
                                "of the INT8 prefill: one module per chain beside today's (chain "
                                "1), each checked against its own chained reference, timed "
                                "with torch SDPA's default and flash backends (no BF16 twin or "
                                "paged variant)")
    bench_cmd.add_argument("--context", type=arg_types.token_counts, default=None,
                           help="comma-separated context lengths (default 4096,8192,16384)")
    bench_cmd.add_argument("--batch", type=arg_types.positive, default=None,
                           help="batch size (default 16 for decode and paged, 1 for prefill)")
    bench_cmd.add_argument("--q-heads", type=arg_types.positive, default=None, help="(default 32)")
    bench_cmd.add_argument("--kv-heads", type=arg_types.positive, default=None, help="(default 8)")
    bench_cmd.add_argument("--head-dim", type=arg_types.positive, default=None, help="(default 128)")
    bench_cmd.add_argument("--iterations", type=arg_types.positive, default=None,
                           help="timed calls per module (default 50)")
    bench_cmd.add_argument("--prepare-only", metavar="DIR", type=arg_types.path,
                           help="only compile the modules into DIR (for a GPU machine "
                                "without IREE's compiler)")
    bench_cmd.add_argument("--from", dest="from_dir", metavar="DIR", type=arg_types.path,
                           help="run modules compiled earlier with --prepare-only")
    bench_cmd.add_argument("--out", default=None, metavar="PREFIX", type=arg_types.path,
                           help=f"writes PREFIX.md, PREFIX.json and PREFIX.png (default "
                                f"{BENCH_OUT})")
    bench_cmd.set_defaults(misuse=bench_cmd.error)   # a usage message and exit status 2
    return parser
