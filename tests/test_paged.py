"""Decode over the paged INT8 cache on the IREE CPU runtime (docs/design.md §2b).

One module per graph serves every batch: ragged lengths across block and
partition edges, shuffled block tables, unused table slots holding garbage and
unused pool slots holding NaN scales (a call never reads them). Every sequence
is checked against both references (tests/accuracy.py: fragment-level 5e-5 x
max|V| plus the rounding-tie slack; exact within the contract's quantization
bounds), and every bad table, length or shape is a named error before the call.
"""

from pathlib import Path

import numpy as np
import pytest

import int8attn
from accuracy import check_against_references
from conftest import seeded_rng
from int8attn import cli
from int8attn.driver import compile as driver_compile
from int8attn.driver.paged_decode import paged_attention_graph
from int8attn.reference import quantize_cache, sequence_cache
from int8attn.runtime.module import InputError

LENGTHS = [1, 15, 16, 17, 255, 256, 257, 1000]


def paged_graph(q_heads, kv_heads, head_dim, block_size, *, batch="?", blocks="?",
                slots="?", scale=None) -> str:
    return paged_attention_graph(q_heads, kv_heads, head_dim, block_size, batch=batch,
                                 blocks=blocks, slots=slots, softmax_scale=scale)


def paged_batch(rng, lengths, q_heads, kv_heads, head_dim, block_size, spare_blocks=3,
                query_tokens=None):
    """A pool with the sequences' blocks shuffled, garbage in unused table slots and
    NaN scales in every pool slot no sequence reads; q [B, Hq, D], or [B, Hq, Sq, D]
    with `query_tokens` (a chunked prefill)."""
    needed = [-(-n // block_size) for n in lengths]
    pool = sum(needed) + spare_blocks
    slots = max(needed) + 2
    order = rng.permutation(pool)
    tables = rng.integers(-(2 ** 31), 2 ** 31 - 1, (len(lengths), slots)).astype(np.int32)
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    k, ks = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                           .astype(np.float32))
    v, vs = quantize_cache(rng.standard_normal((pool, kv_heads, block_size, head_dim))
                           .astype(np.float32))
    read = np.zeros((pool, block_size), bool)
    for b, n in enumerate(lengths):
        t = np.arange(n)
        read[tables[b, t // block_size], t % block_size] = True
    ks[np.broadcast_to(~read[:, None], ks.shape)] = np.nan
    vs[np.broadcast_to(~read[:, None], vs.shape)] = np.nan
    chunk = () if query_tokens is None else (query_tokens,)
    q = rng.standard_normal((len(lengths), q_heads, *chunk, head_dim)).astype(np.float32)
    return [q, k, ks, np.ascontiguousarray(v.transpose(0, 1, 3, 2)), vs, tables,
            np.array(lengths, np.int32)]


def check_every_sequence(out, arrays, scale, **contract):
    """Each sequence of a paged batch against both references on its gathered cache
    (`contract`: model, numerics, as check_against_references takes them)."""
    q, k, ks, v, vs, tables, lens = arrays
    assert out.shape == q.shape
    for b in range(q.shape[0]):
        dense = (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b))
        check_against_references(out[b:b + 1], dense, scale, **contract)


@pytest.fixture(scope="module")
def counted_compiles():
    """The number of compiles the driver runs, around a module's tests."""
    calls = []
    real = driver_compile.compile

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    driver_compile.compile = counting
    import int8attn.api as api
    api_real, api.compile_stages = api.compile_stages, counting
    yield calls
    driver_compile.compile = real
    api.compile_stages = api_real


@pytest.mark.parametrize("q_heads, kv_heads, head_dim, block_size",
                         [(8, 2, 64, 16), (8, 8, 64, 32), (8, 1, 128, 16)],
                         ids=["gqa4_d64_bs16", "gqa1_d64_bs32", "gqa8_d128_bs16"])
def test_one_module_serves_ragged_batches_of_any_shape(q_heads, kv_heads, head_dim, block_size,
                                                      counted_compiles):
    scale = head_dim ** -0.5
    before = len(counted_compiles)
    graph = int8attn.compile(paged_graph(q_heads, kv_heads, head_dim, block_size),
                             filename="paged.mlir", cache=False)
    rng = seeded_rng(40 + block_size + head_dim)
    for lengths in (LENGTHS, [3, 700], [256] * 3 + [5]):
        arrays = paged_batch(rng, lengths, q_heads, kv_heads, head_dim, block_size)
        check_every_sequence(graph(*arrays), arrays, np.float32(scale))
    assert len(counted_compiles) - before == 1


def test_run_caches_one_module_whatever_the_batch(tmp_path, capsys):
    path = tmp_path / "paged.mlir"
    path.write_text(paged_graph(4, 2, 32, 16))
    for seed in (1, 2):
        assert cli.main(["run", str(path), "--seed", str(seed)]) == 0
    first, second = capsys.readouterr().out.split("random inputs")[1:]
    assert "@paged: compiled" in first and "@paged: cached module" in second
    assert "vs fragment-level reference" in second


def test_unused_slots_are_never_read():
    rng = seeded_rng(7)
    graph = int8attn.compile(paged_graph(4, 2, 32, 16), cache=False)
    arrays = paged_batch(rng, [20, 1, 300], 4, 2, 32, 16)
    out = graph(*arrays)
    garbage = [a.copy() for a in arrays]
    tables = garbage[5]
    tables[0, 2:] = -7                      # slots past length 20 (2 blocks) never read
    tables[1, 1:] = 10 ** 9
    assert np.array_equal(graph(*garbage), out)
    assert np.isfinite(out).all()


def _bad(arrays, **changes):
    names = ["q", "k_cache", "k_scale", "v_cache", "v_scale", "block_tables", "context_lens"]
    out = [a.copy() for a in arrays]
    for name, fn in changes.items():
        out[names.index(name)] = fn(out[names.index(name)])
    return out


def _set(index, value):
    def change(a):
        a[index] = value
        return a
    return change


BAD = {
    "batch": (dict(q=lambda q: q[:2]),
              "@paged: q has 2 sequences, block_tables 3 and context_lens 3; they must agree"),
    "zero length": (dict(context_lens=_set(1, 0)),
                    "argument 6 (context_lens, arg6) of @paged: sequence 1 has length 0, outside"),
    "too long": (dict(context_lens=_set(2, 10_000)),
                 "sequence 2 has length 10000, outside [1, "),
    "block past the pool": (dict(block_tables=_set((2, 3), 999)),
                            "argument 5 (block_tables, arg5) of @paged: sequence 2, slot 3 "
                            "(tokens 48..63) holds block 999, not a block of the pool"),
    "negative block": (dict(block_tables=_set((0, 0), -1)),
                       "sequence 0, slot 0 (tokens 0..15) holds block -1"),
    "NaN scale read": (dict(k_scale=lambda s: np.nan_to_num(s, nan=0.5)), None),
    "pools disagree": (dict(v_scale=lambda s: s[:-1]),
                       "the caches disagree on the number of blocks"),
    "wrong head dim": (dict(q=lambda q: q[:, :, :16]),
                       "argument 0 (q, arg0) of @paged must have shape [?, 4, 32]"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_tables_lengths_and_shapes_are_named_before_the_call(case, tmp_path, capsys):
    rng = seeded_rng(8)
    graph = int8attn.compile(paged_graph(4, 2, 32, 16))
    arrays = paged_batch(rng, [20, 1, 300], 4, 2, 32, 16)
    changes, message = BAD[case]
    bad = _bad(arrays, **changes)
    if message is None:  # NaN scales only where no sequence reads: accepted
        graph(*bad)
        tables, lens = arrays[5], arrays[6]
        bad[2][tables[2, 0], 1, 5] = np.nan
        message = "argument 2 (k_scale, arg2) of @paged holds NaN at"
    with pytest.raises(InputError, match=None) as error:
        graph(*bad)
    assert message in str(error.value), str(error.value)
    path, npz, out = tmp_path / "paged.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_graph(4, 2, 32, 16))
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(bad)})
    assert cli.main(["run", str(path), "--inputs", str(npz), "--output", str(out)]) == 1
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_kernel_targets_compile_the_paged_op_and_cache_write(tmp_path, capsys):
    path = tmp_path / "paged.mlir"
    path.write_text(paged_graph(4, 2, 32, 16))
    assert cli.main(["compile", str(path), "--target", "gfx936", "-o", str(tmp_path / "k")]) == 0
    # A block the 16-byte V loads would straddle: located at the op, with the reason.
    path.write_text(paged_graph(4, 2, 32, 8))
    assert cli.main(["compile", str(path), "--target", "cuda", "-o", str(tmp_path / "k")]) == 1
    assert (f"{path}:2:8: error: the cuda paged decode kernel: block size 8 must be a multiple "
            f"of the 16-token V load") in capsys.readouterr().err
    write = tmp_path / "write.mlir"
    example = Path(__file__).resolve().parent.parent / "examples" / "paged_decode.mlir"
    write.write_text(example.read_text().split("func.func @attend")[0])
    for target in ("gfx942", "cuda"):
        assert cli.main(["compile", str(write), "--target", target, "-o", str(tmp_path / "k")]) == 0
    # @write and @attend in one module: each function's kernels and host function.
    assert cli.main(["compile", str(example), "--target", "cuda", "-o", str(tmp_path / "k")]) == 0
    # A function that is not a kernel function is named.
    path.write_text(example.read_text() + "func.func @copy(%a: tensor<4xf32>) -> tensor<4xf32> {"
                    "\n  return %a : tensor<4xf32>\n}\n")
    assert cli.main(["compile", str(path), "--target", "cuda", "-o", str(tmp_path / "k")]) == 1
    assert "@copy does not (this graph has 3 public function(s)" in capsys.readouterr().err
