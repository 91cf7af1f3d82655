"""Bad inputs of `int8attn.paged_attention`, tried as a user would (issue 21).

Each bad array must be a named error (the argument, what was expected, how to
fix it) from the Python API of every executor (the CPU runtime and the lane
simulator of every kernel target) and from `int8attn run --inputs IN.npz` (cpu
and `--simulate`), with exit status 1, no traceback and no output written.
Bad inputs files, bad paged graphs (located errors from `compile` and `run`
of every target) and a chunked prefill longer than its sequence likewise;
cache_write's bad inputs are tests/test_cache_write_bad_inputs.py. The inputs
are drawn from a fixed, printed seed (tests/conftest.py).
"""

from dataclasses import dataclass

import numpy as np
import pytest

import int8attn
from conftest import seeded_rng
from int8attn import cli
from int8attn.driver.paged_decode import paged_attention_graph
from int8attn.runtime.module import InputError
from test_paged import paged_batch

HEADS = (4, 2, 32, 16)                    # Hq, Hkv, D, BS
LENGTHS = [20, 1, 300]
QUERY_TOKENS = 5                          # a chunked prefill's Sq
NAMES = ("q", "k_cache", "k_scale", "v_cache", "v_scale", "block_tables", "context_lens")
KERNEL_TARGETS = ("gfx936", "gfx942", "cuda")
EXECUTORS = [("cpu", False)] + [(t, True) for t in KERNEL_TARGETS]


def _set(index, value):
    def change(a):
        a[index] = value
        return a
    return change


@dataclass(frozen=True)
class _ReadScale:
    """A scale set to `value` at a slot sequence 0 reads (its token 3, KV head 1)."""

    value: float

    def __call__(self, scales, tables):
        scales[tables[0, 0], 1, 3] = self.value
        return scales


def _op(name):
    return f"argument {NAMES.index(name)} ({name}, arg{NAMES.index(name)}) of @paged"


def _sig(name):      # the signature checks name an argument as the value checks do
    return f"{_op(name)} must"


# case -> ({operand: change of its array}, message).
BAD_ARRAYS = {
    "block_tables i64": (dict(block_tables=lambda a: a.astype(np.int64)),
                         _sig("block_tables") + " be int32 for tensor<?x?xi32>, got int64 "
                         "(convert it: array.astype(numpy.int32))"),
    "block_tables f32": (dict(block_tables=lambda a: a.astype(np.float32)),
                         _sig("block_tables") + " be int32 for tensor<?x?xi32>, got float32"),
    "context_lens i64": (dict(context_lens=lambda a: a.astype(np.int64)),
                         _sig("context_lens") + " be int32 for tensor<?xi32>, got int64"),
    "context_lens f32": (dict(context_lens=lambda a: a.astype(np.float32)),
                         _sig("context_lens") + " be int32 for tensor<?xi32>, got float32"),
    "q f64": (dict(q=lambda a: a.astype(np.float64)),
              _sig("q") + " be float32 for tensor<?x4x32xf32>, got float64"),
    "q f16": (dict(q=lambda a: a.astype(np.float16)), _sig("q") + " be float32"),
    "k_cache f32": (dict(k_cache=lambda a: a.astype(np.float32)), _sig("k_cache") + " be int8"),
    "v_cache u8": (dict(v_cache=lambda a: a.view(np.uint8)), _sig("v_cache") + " be int8"),
    "k_scale f64": (dict(k_scale=lambda a: a.astype(np.float64)), _sig("k_scale") + " be float32"),
    "v_scale f16": (dict(v_scale=lambda a: a.astype(np.float16)), _sig("v_scale") + " be float32"),
    "q rank 2": (dict(q=lambda a: a[0]),
                 _sig("q") + " have shape [?, 4, 32] for tensor<?x4x32xf32>, got [4, 32]"),
    "q rank 4": (dict(q=lambda a: a[:, :, None]), _sig("q") + " have shape [?, 4, 32]"),
    "k_cache rank 3": (dict(k_cache=lambda a: a[0]), _sig("k_cache") + " have shape [?, 2, 16, 32]"),
    "k_scale rank 2": (dict(k_scale=lambda a: a[:, 0]), _sig("k_scale") + " have shape [?, 2, 16]"),
    "v_scale rank 4": (dict(v_scale=lambda a: a[..., None]), _sig("v_scale") + " have shape [?, 2, 16]"),
    "block_tables rank 1": (dict(block_tables=lambda a: a[:, 0]),
                            _sig("block_tables") + " have shape [?, ?] for tensor<?x?xi32>, got [3]"),
    "context_lens rank 2": (dict(context_lens=lambda a: a[:, None]),
                            _sig("context_lens") + " have shape [?] for tensor<?xi32>, got [3, 1]"),
    "v_cache token-major": (dict(v_cache=lambda a: np.ascontiguousarray(a.transpose(0, 1, 3, 2))),
                            _op("v_cache") + " has shape [25, 2, 16, 32], the token-major layout "
                            "[NB, Hkv, BS, D]; the paged value cache is token-innermost [NB, Hkv, "
                            "D, BS] = [?, 2, 32, 16] (vLLM's value cache): pass "
                            "numpy.ascontiguousarray(v.transpose(0, 1, 3, 2))"),
    "v_cache blocks of 32": (dict(v_cache=lambda a: np.concatenate([a, a], 3)),
                             _sig("v_cache") + " have shape [?, 2, 32, 16] for "
                             "tensor<?x2x32x16xi8>, got [25, 2, 32, 32]"),
    "k_scale blocks of 8": (dict(k_scale=lambda a: a[:, :, :8]),
                            _sig("k_scale") + " have shape [?, 2, 16]"),
    "length 0": (dict(context_lens=_set(1, 0)),
                 _op("context_lens") + ": sequence 1 has length 0, outside [1, 336] (a "
                 "decoding sequence attends to at least the token it just wrote: write it "
                 "first, or leave the sequence out of the batch)"),
    "negative length": (dict(context_lens=_set(0, -5)),
                        _op("context_lens") + ": sequence 0 has length -5, outside [1, 336]"),
    "length past the table": (dict(context_lens=_set(2, 337)),
                              _op("context_lens") + ": sequence 2 has length 337, outside [1, "
                              "336] (its block table has 21 slots of 16 tokens: give it a "
                              "wider table or a shorter length)"),
    "largest i32 length": (dict(context_lens=_set(0, 2 ** 31 - 1)),
                           "sequence 0 has length 2147483647, outside [1, 336]"),
    "table of no slots": (dict(block_tables=lambda a: a[:, :0]),
                          "sequence 0 has length 20, outside [1, 0] (its block table has 0 slots"),
    "block past the pool": (dict(block_tables=_set((2, 1), 10 ** 6)),
                            _op("block_tables") + ": sequence 2, slot 1 (tokens 16..31) holds "
                            "block 1000000, not a block of the pool [0, 25)"),
    "block just past the pool": (dict(block_tables=_set((0, 1), 25)),
                                 "sequence 0, slot 1 (tokens 16..19) holds block 25, not a "
                                 "block of the pool [0, 25)"),
    "negative block": (dict(block_tables=_set((1, 0), -1)),
                       "sequence 1, slot 0 (tokens 0..0) holds block -1, not a block of the pool"),
    "empty pool": ({n: (lambda a: a[:0]) for n in NAMES[1:5]},
                   "sequence 0, slot 0 (tokens 0..15) holds block"),
    "NaN k_scale read": (dict(k_scale=_ReadScale(np.nan)),
                         _op("k_scale") + " holds NaN at"),
    "Inf v_scale read": (dict(v_scale=_ReadScale(np.inf)),
                         _op("v_scale") + " holds Inf at"),
    "-Inf k_scale read": (dict(k_scale=_ReadScale(-np.inf)),
                          _op("k_scale") + " holds Inf at"),
    "negative v_scale read": (dict(v_scale=_ReadScale(-0.5)),
                              _op("v_scale") + " holds a negative value at"),
    "q batch": (dict(q=lambda a: a[:2]),
                "@paged: q has 2 sequences, block_tables 3 and context_lens 3; they must agree "
                "(one row of each per sequence)"),
    "block_tables batch": (dict(block_tables=lambda a: a[:4].repeat(2, 0)[:4]),
                           "@paged: q has 3 sequences, block_tables 4 and context_lens 3"),
    "context_lens batch": (dict(context_lens=lambda a: a[:1]),
                           "@paged: q has 3 sequences, block_tables 3 and context_lens 1"),
    "pools disagree": (dict(v_scale=lambda a: a[:-1]),
                       "@paged: the caches disagree on the number of blocks: k_cache 25, "
                       "k_scale 25, v_cache 25, v_scale 24"),
}


def good_arrays():
    return paged_batch(seeded_rng(2101), LENGTHS, *HEADS)


def bad_arrays(case):
    arrays = [a.copy() for a in good_arrays()]
    changes, _ = BAD_ARRAYS[case]
    for name, change in changes.items():
        array = arrays[NAMES.index(name)]
        arrays[NAMES.index(name)] = (change(array, arrays[5]) if isinstance(change, _ReadScale)
                                     else change(array))
    return arrays


@pytest.fixture(scope="module")
def graphs():
    """The dynamic paged graph, compiled once per executor."""
    source = paged_attention_graph(*HEADS)
    return {target: int8attn.compile(source, filename="paged.mlir", target=target,
                                     simulate=simulate)
            for target, simulate in EXECUTORS}


def test_the_good_batch_runs_everywhere(graphs):
    arrays = good_arrays()
    for target, graph in graphs.items():
        assert graph(*arrays).shape == arrays[0].shape, target


def _run(path, npz, out, target, *extra):
    argv = ["run", str(path), "--inputs", str(npz), "--output", str(out), *extra]
    if target != "cpu":
        argv += ["--target", target, "--simulate"]
    return cli.main(argv)


@pytest.mark.parametrize("case", sorted(BAD_ARRAYS))
def test_bad_paged_arrays_are_named_by_every_executor(case, graphs, tmp_path, capsys):
    _, message = BAD_ARRAYS[case]
    arrays = bad_arrays(case)
    for target, graph in graphs.items():
        with pytest.raises(InputError) as error:
            graph(*arrays)
        assert message in str(error.value), (target, str(error.value))
    path, npz, out = tmp_path / "paged.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_attention_graph(*HEADS))
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(arrays)})
    for target in ("cpu", "gfx942"):
        assert _run(path, npz, out, target) == 1, target
        err = capsys.readouterr().err
        assert "error: " in err and message in err and "Traceback" not in err, (target, err)
        assert not out.exists(), target


def _npz_case(change):
    def make():
        arrays = {f"arg{i}": a for i, a in enumerate(good_arrays())}
        change(arrays)
        return arrays
    return make


BAD_NPZ = {
    "missing key": (_npz_case(lambda a: a.pop("arg6")),
                    "has no array 'arg6' for argument 6 (tensor<?xi32>) of @paged; it has arg0, "
                    "arg1, arg2, arg3, arg4, arg5"),
    "mistyped key": (_npz_case(lambda a: a.update(q=a.pop("arg0"))),
                     "has no array 'arg0' for argument 0 (tensor<?x4x32xf32>) of @paged; it has "
                     "arg1, arg2, arg3, arg4, arg5, arg6, q"),
    "extra key": (_npz_case(lambda a: a.update(arg7=a["arg6"])),
                  "has arrays arg7 that are not arguments of @paged (expected arg0..arg6)"),
    "mistyped array": (_npz_case(lambda a: a.update(arg6=a["arg6"].astype(np.int64))),
                       _sig("context_lens") + " be int32 for tensor<?xi32>, got int64"),
    "pickled array": (_npz_case(lambda a: a.update(arg5=np.array([None], object))),
                      "array 'arg5' of inputs file"),
}


@pytest.mark.parametrize("case", sorted(BAD_NPZ))
@pytest.mark.parametrize("target", ["cpu", *KERNEL_TARGETS])
def test_bad_inputs_files_are_named(case, target, tmp_path, capsys):
    make, message = BAD_NPZ[case]
    path, npz, out = tmp_path / "paged.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_attention_graph(*HEADS))
    np.savez(npz, **make())
    assert _run(path, npz, out, target) == 1
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "Traceback" not in err, err
    assert not out.exists()


GRAPH = paged_attention_graph(*HEADS)
OP = "2:8: error: 'int8attn.paged_attention' op "
BAD_GRAPHS = {
    "caches' block sizes differ": (GRAPH.replace("?x2x32x16xi8", "?x2x32x8xi8"),
                                   OP + "v_cache has shape [?, 2, 32, 8], expected [NB, Hkv, D, "
                                   "BS] = [?, 2, 32, 16] (token-innermost blocks)"),
    "scales' block size differs": (GRAPH.replace("%a2: tensor<?x2x16xf32>", "%a2: tensor<?x2x8xf32>")
                                   .replace("tensor<?x2x16xf32>, tensor<?x2x32x16xi8>",
                                            "tensor<?x2x8xf32>, tensor<?x2x32x16xi8>"),
                                   OP + "k_scale has shape [?, 2, 8], expected [NB, Hkv, BS] = "
                                   "[?, 2, 16]"),
    "token-major v_cache": (GRAPH.replace("?x2x32x16xi8", "?x2x16x32xi8"),
                            OP + "v_cache has shape [?, 2, 16, 32], expected [NB, Hkv, D, BS] = "
                            "[?, 2, 32, 16] (token-innermost blocks)"),
    "i64 block tables": (GRAPH.replace("?x?xi32", "?x?xi64"),
                         OP + "block_tables must have element type i32, got tensor<?x?xi64>"),
    "f32 lengths": (GRAPH.replace("tensor<?xi32>", "tensor<?xf32>"),
                    OP + "context_lens must have element type i32, got tensor<?xf32>"),
    "i8 q": (GRAPH.replace("?x4x32xf32", "?x4x32xi8"), OP + "q must have element type f32"),
    "static batches disagree": (paged_attention_graph(*HEADS, batch=3).replace(
        "tensor<3xi32>", "tensor<2xi32>"),
        OP + "q, block_tables and context_lens disagree on the batch: [3], [3], [2]"),
}
KERNEL_ONLY = {
    "blocks the V loads straddle": (paged_attention_graph(4, 2, 32, 8),
                                    "2:8: error: the {target} paged decode kernel: block size 8 "
                                    "must be a multiple of the 16-token V load and divide the "
                                    "256-token partition; use a pool of 16- or 32-token blocks, "
                                    "or --target cpu, which takes any block size"),
    "prefill blocks the V loads straddle": (
        paged_attention_graph(4, 2, 32, 8, query_tokens=QUERY_TOKENS),
        "2:8: error: the {target} paged prefill kernel: block size 8 must be a multiple of the "
        "16-token V load; use a pool of 16- or 32-token blocks"),
}


@pytest.mark.parametrize("case", sorted(BAD_GRAPHS) + sorted(KERNEL_ONLY))
def test_bad_paged_graphs_are_located_errors_on_every_target(case, tmp_path, capsys):
    text, message = {**BAD_GRAPHS, **KERNEL_ONLY}[case]
    path = tmp_path / "paged.mlir"
    path.write_text(text)
    targets = KERNEL_TARGETS if case in KERNEL_ONLY else ("cpu", *KERNEL_TARGETS)
    for target in targets:
        simulate = [] if target == "cpu" else ["--simulate"]
        for argv in (["compile", str(path), "--target", target, "-o", str(tmp_path / "out")],
                     ["run", str(path), "--target", target, *simulate, "--seed", "0",
                      "--output", str(tmp_path / "out.npz")]):
            assert cli.main(argv) == 1, (target, argv[0])
            err = capsys.readouterr().err
            assert f"{path}:{message.format(target=target)}" in err, (target, argv[0], err)
            assert not [p for p in tmp_path.iterdir() if p.name.startswith("out")]
    if case in KERNEL_ONLY:       # the cpu pipeline takes any block size
        assert cli.main(["run", str(path), "--seed", "0"]) == 0
        assert "vs fragment-level reference" in capsys.readouterr().out


@pytest.mark.parametrize("target", ["cpu", *KERNEL_TARGETS])
def test_a_chunk_longer_than_its_sequence_is_refused(target, tmp_path, capsys):
    source = paged_attention_graph(*HEADS, query_tokens=QUERY_TOKENS)
    graph = int8attn.compile(source, filename="chunk.mlir", target=target,
                             simulate=target != "cpu")
    arrays = paged_batch(seeded_rng(2102), [40, QUERY_TOKENS - 1, QUERY_TOKENS], *HEADS,
                         query_tokens=QUERY_TOKENS)
    message = ("argument 6 (context_lens, arg6) of @paged: sequence 1 has length 4, outside "
               "[5, 80] (its 5 new query tokens are the last of its tokens: write them to the "
               "cache first (cache_write))")
    with pytest.raises(InputError) as error:
        graph(*arrays)
    assert message in str(error.value)
    path, npz, out = tmp_path / "chunk.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(source)
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(arrays)})
    assert _run(path, npz, out, target) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()
    arrays[5] = arrays[5][:, :0]       # no table slot: not even the chunk fits
    with pytest.raises(InputError, match=r"a chunk of Sq = 5 new tokens cannot fit a block "
                                         r"table of 0 tokens \(0 slots of 16 tokens; sequence "
                                         r"0 has length 40\): give block_tables at least 1 slot"):
        graph(*arrays)

