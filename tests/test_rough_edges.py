"""Rough edges a new user met, each with the error they should have got: what, where
(the argument or flag), how to fix it, and no traceback.

Covered here: MLIR text in a file named .onnx (whatever the module cache holds), a
read-only numpy cache given to PagedAttention.write, a path given to
int8attn.compile, a list or a Python scalar for an argument, swapped key and value
caches, one sequence id where PagedDecoder.step takes a list, a single-valued flag
given twice, a float or int16 cache where an INT8 one goes, and the ONNX example's
reproduce command. (An output whose parent is a file: tests/test_cli_bad_inputs.py
OUTPUT_PATHS.)
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, seeded_rng

import int8attn
from int8attn import cli
from int8attn.cli_parser import build_parser
from int8attn.driver.graph import decode_graph
from int8attn.driver.paged_decode import PagedCache, PagedDecoder, paged_decode_graph
from int8attn.reference import quantize_cache
from int8attn.runtime.module import InputError

HQ, HKV, D, S = 4, 2, 32, 40          # the dense graph
PHQ, PHKV, PD, BS, NB = 8, 2, 64, 16, 8  # the paged one


@pytest.fixture(scope="module")
def dense():
    return int8attn.compile(decode_graph(1, HQ, HKV, S, D), filename="decode.mlir")


@pytest.fixture(scope="module")
def paged():
    """@write and @attend of one paged graph."""
    return int8attn.compile(paged_decode_graph(PHQ, PHKV, PD, BS), filename="paged.mlir")


def dense_inputs(seed: int):
    rng = seeded_rng(seed)
    q = rng.standard_normal((1, HQ, D)).astype(np.float32)
    k, k_scale = quantize_cache(rng.standard_normal((1, HKV, S, D)).astype(np.float32))
    v, v_scale = quantize_cache(rng.standard_normal((1, HKV, S, D)).astype(np.float32))
    return q, k, k_scale, v, v_scale


def message(call) -> str:
    with pytest.raises(Exception) as error:
        call()
    return f"{type(error.value).__name__}: {error.value}"


# -- MLIR text in a file named .onnx ------------------------------------------------------

def test_mlir_text_named_onnx_is_no_model_even_when_the_cache_holds_its_content(tmp_path,
                                                                                capsys):
    pytest.importorskip("onnx")
    text = decode_graph(1, HQ, HKV, S, D)
    (tmp_path / "decode.mlir").write_text(text)
    (tmp_path / "x.onnx").write_text(text)
    assert cli.main(["run", str(tmp_path / "decode.mlir"), "--seed", "0"]) == 0   # cached now
    capsys.readouterr()
    for cache in ([], ["--no-cache"]):
        assert cli.main(["run", str(tmp_path / "x.onnx"), "--seed", "0", *cache]) == 1
        err = capsys.readouterr().err
        assert f"error: {tmp_path / 'x.onnx'} is not an ONNX model (protobuf: " in err, err
        assert "export it with onnx.save or torch.onnx.export" in err and "Traceback" not in err


def test_the_module_cache_keeps_mlir_text_and_model_bytes_apart(dense):
    pytest.importorskip("onnx")
    from int8attn.driver.onnx_import import ModelError

    text = decode_graph(1, HQ, HKV, S, D)   # the `dense` fixture's text, cached
    with pytest.raises(ModelError, match=r"^x.onnx is not an ONNX model \(protobuf: "):
        int8attn.compile(text.encode(), filename="x.onnx")


# -- a read-only cache given to PagedAttention.write ---------------------------------------

def test_paged_attention_write_refuses_a_read_only_cache_as_the_graph_does(paged):
    pytest.importorskip("torch")
    from int8attn.serving import PagedAttention

    rng = seeded_rng(4501)
    pool = [rng.integers(-127, 128, (NB, PHKV, BS, PD), dtype=np.int8),
            np.full((NB, PHKV, BS), 0.5, np.float32),
            rng.integers(-127, 128, (NB, PHKV, PD, BS), dtype=np.int8),
            np.full((NB, PHKV, BS), 0.5, np.float32)]
    before = [a.copy() for a in pool]
    pool[0].setflags(write=False)
    k_new, v_new = (rng.standard_normal((3, PHKV, PD)).astype(np.float32) for _ in range(2))
    slots = np.array([0, 17, 40], np.int32)
    expected = ("argument 3 (k_cache, arg3) of @write is a read-only array, and the call "
                "updates it in place: pass a writable array, e.g. numpy.array(x)")
    graph_says = message(lambda: paged(k_new, v_new, slots, *pool, function="write"))
    attention = PagedAttention(PHQ, PHKV, PD, BS, target="cpu")
    serving_says = message(lambda: attention.write(k_new, v_new, slots, *pool))
    assert expected in graph_says and expected in serving_says, (graph_says, serving_says)
    for got, want in zip(pool, before):
        np.testing.assert_array_equal(got, want)      # nothing written


# -- a path given to int8attn.compile ------------------------------------------------------

@pytest.mark.parametrize("path", [str(REPO / "examples" / "decode.mlir"), "decode.mlir",
                                  "models/layer.onnx", str(REPO / "pyproject.toml")])
def test_compile_of_a_path_points_at_compile_file(path):
    said = message(lambda: int8attn.compile(path))
    assert said == (f"TypeError: int8attn.compile takes the graph's MLIR text (or an ONNX "
                    f"model's bytes), and {path!r} looks like a file path: for a file use "
                    f"int8attn.compile_file({path!r})")


def test_a_line_of_text_that_is_no_path_gets_the_parsers_error():
    from int8attn.support.diagnostics import DiagnosticError

    with pytest.raises(DiagnosticError, match="custom op .decode. is unknown"):
        int8attn.compile("decode attention please")


# -- a list or a Python scalar for an argument ---------------------------------------------

@pytest.mark.parametrize("kind", ["list", "float", "numpy scalar"])
def test_a_list_or_a_scalar_is_named_as_such(dense, kind):
    q, *caches = dense_inputs(4502)
    given, said = {"list": (q.tolist(), "a list"), "float": (0.5, "a Python float (0.5)"),
                   "numpy scalar": (np.float64(0.5), "a numpy float64 scalar")}[kind]
    got = message(lambda: dense(given, *caches))
    assert got.startswith(f"InputError: argument 0 (q, arg0) of @decode must be a numpy array "
                          f"(or a tensor) of shape [1, {HQ}, {D}] and dtype float32 for "
                          f"tensor<1x{HQ}x{D}xf32>, got {said}"), got
    assert "pass numpy.asarray(x, dtype=numpy.float32) of that shape" in got


def test_a_list_for_an_integer_argument_is_named_as_a_list(paged):
    """context_lens as a list of ints: numpy would make int64 of it (refused by dtype);
    the message says it got a list."""
    cache = PagedCache(NB, PHKV, BS, PD)
    got = message(lambda: paged(np.zeros((1, PHQ, PD), np.float32), *cache.arrays,
                                np.zeros((1, 1), np.int32), [3], function="attend"))
    assert "argument 6 (context_lens, arg6) of @attend must be a numpy array" in got
    assert "got a list" in got


# -- swapped key and value caches ----------------------------------------------------------

SWAPPED = ("argument 1 (k_cache, arg1) of @attend has shape [8, 2, 64, 16], the value "
           "cache's layout [NB, Hkv, D, BS], and argument 3 (v_cache, arg3) of @attend has "
           "shape [8, 2, 16, 64], the key cache's [NB, Hkv, BS, D]: the two caches look "
           "swapped; pass them in the order q, k_cache, k_scale, v_cache, v_scale, "
           "block_tables, context_lens")


def test_swapped_caches_are_called_swapped_not_token_major(paged):
    cache = PagedCache(NB, PHKV, BS, PD)
    k_cache, k_scale, v_cache, v_scale = cache.arrays
    tables, lens = np.zeros((1, 1), np.int32), np.array([3], np.int32)
    q = np.zeros((1, PHQ, PD), np.float32)
    got = message(lambda: paged(q, v_cache, k_scale, k_cache, v_scale, tables, lens,
                                function="attend"))
    assert got == f"InputError: {SWAPPED}"
    # a token-major value cache alone keeps its own message and fix
    got = message(lambda: paged(q, k_cache, k_scale, np.ascontiguousarray(
        v_cache.transpose(0, 1, 3, 2)), v_scale, tables, lens, function="attend"))
    assert "the token-major layout [NB, Hkv, BS, D]" in got and "transpose" in got


def test_swapped_caches_on_the_torch_path():
    torch = pytest.importorskip("torch")
    from int8attn.serving import PagedAttention

    cache = PagedCache(NB, PHKV, BS, PD)
    k_cache, k_scale, v_cache, v_scale = (torch.from_numpy(a) for a in cache.arrays)
    attention = PagedAttention(PHQ, PHKV, PD, BS, target="cpu")
    got = message(lambda: attention(torch.zeros(1, PHQ, PD), v_cache, k_scale, k_cache,
                                    v_scale, torch.zeros(1, 1, dtype=torch.int32),
                                    torch.tensor([3], dtype=torch.int32)))
    assert "the two caches look swapped; pass them in the order q, k_cache" in got, got


# -- one sequence id where PagedDecoder.step takes a list -----------------------------------

def test_step_with_one_id_for_the_list_of_sequences(paged):
    rng = seeded_rng(4503)
    decoder = PagedDecoder(paged, PagedCache(NB, PHKV, BS, PD))
    sequence = decoder.prefill(*(rng.standard_normal((5, PHKV, PD)).astype(np.float32)
                                 for _ in range(2)))
    q = rng.standard_normal((1, PHQ, PD)).astype(np.float32)
    k, v = (rng.standard_normal((1, PHKV, PD)).astype(np.float32) for _ in range(2))
    got = message(lambda: decoder.step(q, k, v, sequence))
    assert got == (f"InputError: sequences must be a list of sequence ids, the integers "
                   f"prefill or add_sequence returned, one per row of the batch; got int "
                   f"{sequence} (for the one sequence {sequence}: [{sequence}])")
    assert decoder.cache.lengths[sequence] == 5       # nothing appended
    assert decoder.step(q, k, v, [sequence]).shape == (1, PHQ, PD)


# -- a single-valued flag given twice ------------------------------------------------------

def _a_value(action: argparse.Action) -> list[str]:
    if action.nargs == 0:
        return []
    return [str(action.choices[0])] if action.choices else ["1"]


def _commands():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return commands.choices


@pytest.mark.parametrize("command", ["compile", "run", "bench"])
def test_every_single_valued_flag_given_twice_is_refused(command, capsys):
    """Derived from the declaration: each flag of the command, given twice, exits 2
    naming it and both values."""
    sub = _commands()[command]
    positional = ["decode.mlir"] if command != "bench" else []
    flags = [a for a in sub._actions if a.option_strings and not isinstance(
        a, argparse._HelpAction)]
    assert len(flags) >= 10
    for action in flags:
        flag = action.option_strings[-1]
        given = [flag, *_a_value(action)]
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args([command, *positional, *given, *given])
        err = capsys.readouterr().err
        assert exit_.value.code == 2, (flag, err)
        shown = " ".join(given)
        assert (f"int8attn {command}: error: argument {'/'.join(action.option_strings)}: "
                f"given twice ({shown} and {shown}); give it once") in err, err


def test_a_flag_given_twice_names_both_values(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["run", "decode.mlir", "--pv", "int8", "--seed", "0", "--pv", "bf16"])
    assert exit_.value.code == 2
    assert ("int8attn run: error: argument --pv: given twice (--pv int8 and --pv bf16); give "
            "it once") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["compile", "decode.mlir", "-o", "a.vmfb", "--output", "b.vmfb"])
    assert ("argument -o/--output: given twice (-o a.vmfb and --output b.vmfb)"
            in capsys.readouterr().err)


def test_flags_given_once_parse_as_before():
    args = build_parser().parse_args(["run", "g.mlir", "--pv", "bf16", "--q-terms", "1",
                                      "--no-cache", "--seed", "7"])
    assert (args.pv, args.q_terms, args.no_cache, args.seed) == ("bf16", 1, True, 7)
    assert not any(name.startswith("_") for name in vars(args))


def test_int8attn_opt_refuses_a_repeated_flag_by_the_same_rule(capsys):
    from int8attn import opt

    with pytest.raises(SystemExit) as exit_:
        opt.main(["decode.mlir", "-p", "int8-qk", "-p", "fold-scales"])
    assert exit_.value.code == 2
    assert ("argument -p/--pass-pipeline: given twice (-p int8-qk and -p fold-scales); give "
            "it once") in capsys.readouterr().err



@pytest.mark.parametrize("module, flags", [
    ("bench_paged", ["--run", "a", "--iterations", "3", "--iterations", "4"]),
    ("bench_prefill", ["--run", "a", "--seed", "1", "--seed", "2"]),
    ("bench_cuda", ["--prepare", "a", "--prepare", "b"]),
])
def test_the_gpu_bench_runners_refuse_a_repeated_flag_by_the_same_rule(module, flags, capsys):
    import importlib

    runner = importlib.import_module(f"int8attn.{module}")
    with pytest.raises(SystemExit) as exit_:
        runner.main(flags)
    assert exit_.value.code == 2
    assert "given twice" in capsys.readouterr().err


def test_int8attn_opt_piped_into_a_reader_that_leaves_is_quiet():
    import subprocess
    import sys

    done = subprocess.run(f"'{sys.executable}' -m int8attn.opt --list-passes | head -1",
                          shell=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("int8attn passes")
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr

# -- a float or int16 cache where an INT8 one goes -----------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.int16])
def test_a_wider_cache_is_pointed_at_quantizing_not_a_cast(dense, dtype):
    q, k, k_scale, v, v_scale = dense_inputs(4504)
    got = message(lambda: dense(q, k.astype(dtype), k_scale, v, v_scale))
    assert got == (f"InputError: argument 1 (k, arg1) of @decode must be int8 for "
                   f"tensor<1x{HKV}x{S}x{D}xi8>, got {np.dtype(dtype)} (a cast wraps or "
                   f"truncates the values: quantize the float cache instead, one scale per "
                   f"token, e.g. k, k_scale = int8attn.reference.quantize_cache(k_float))")
    assert "astype(numpy.int8)" not in got


def test_a_float_paged_cache_is_pointed_at_the_cache_write(paged):
    cache = PagedCache(NB, PHKV, BS, PD)
    k_cache, k_scale, v_cache, v_scale = cache.arrays
    got = message(lambda: paged(np.zeros((1, PHQ, PD), np.float32), k_cache, k_scale,
                                v_cache.astype(np.float32), v_scale, np.zeros((1, 1), np.int32),
                                np.array([3], np.int32), function="attend"))
    assert "argument 3 (v_cache, arg3) of @attend must be int8" in got
    assert ("a cast wraps or truncates the values: write float tokens into the pool with the "
            "cache write, which quantizes each one, e.g. int8attn.serving.PagedAttention(...)"
            ".write(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale)") in got
    assert "astype" not in got


def test_the_quantize_hint_names_a_fix_that_works(dense):
    """The hint's own example, followed, gives a call that runs."""
    rng = seeded_rng(4505)
    q, _, _, v, v_scale = dense_inputs(4505)
    k_float = rng.standard_normal((1, HKV, S, D)).astype(np.float32)
    k, k_scale = int8attn.reference.quantize_cache(k_float)
    assert dense(q, k, k_scale, v, v_scale).shape == (1, HQ, D)


# -- the ONNX example's reproduce command ---------------------------------------------------

def _example(*flags):
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "onnx_decoder_layer.py"),
                           *flags], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("$ ")]
    return proc, line[2:]


def test_the_onnx_example_prints_a_command_that_works(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    proc, command = _example()
    # a temporary folder: no path in it is printed, and --keep is named
    assert command.startswith("cd DIR && "), command
    assert "run the example with --keep DIR" in proc.stdout
    assert not re.search(r"int8attn-onnx-\w+", proc.stdout + proc.stderr)
    kept = tmp_path / "kept"
    proc, command = _example("--keep", str(kept))
    assert command.startswith(f"cd {shlex.quote(str(kept))} && ")
    (kept / "outputs.npz").unlink()
    again = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert (kept / "outputs.npz").is_file()
