"""What the numpy runner takes and gives back (runtime/module.py, driver/graph.py,
driver/paged_inputs.py, int8attn/api.py CompiledGraph.run):

- a bf16 q (or bf16 cache_write rows) is given as f32 (or f16), rounded to bf16 to
  nearest even (reference.common.round_to_bf16) and passed to IREE as a bf16 buffer;
  random inputs draw bf16 values, and the references see the rounded q;
- a read-only array for a cache the call updates in place is refused, naming it;
- a tiny row's scale (a subnormal a/127) may be stored as +0 (IREE's CPU flushes it):
  reference.paged.same_written_caches allows exactly that;
- a chunked prefill longer than its block table is named as such;
- decode_graph / prefill_graph refuse bad sizes with a ValueError.
"""

from __future__ import annotations

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import seeded_rng

import int8attn
from int8attn import reference as ref
from int8attn.driver.graph import decode_graph, prefill_graph, random_inputs, references
from int8attn.driver.paged_decode import cache_write_graph, paged_attention_graph
from int8attn.reference.paged import flushed_scales_equal, same_written_caches
from int8attn.runtime.module import InputError, bf16_values

SHAPE = (1, 8, 2, 300, 64)         # batch, Hq, Hkv, S, D
SCALE = SHAPE[-1] ** -0.5


def is_bf16(x) -> bool:
    return not (np.asarray(x, np.float32).view(np.uint32) & 0xFFFF).any()


@pytest.fixture(scope="module")
def bf16_decode():
    return int8attn.compile(decode_graph(*SHAPE, q_element="bf16"))


@pytest.fixture(scope="module")
def f32_decode():
    return int8attn.compile(decode_graph(*SHAPE))


# bf16 q ---------------------------------------------------------------------------------

def test_bf16_values_round_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)                       # bf16's step at 1
    x = np.array([one + ulp / 2,                      # a tie: to the even 1.0
                  one + ulp * 1.5,                    # a tie: to the even 1 + 2 ulp
                  one + ulp / 2 + np.float32(2.0 ** -20),   # past the tie: up
                  -3.0, 0.0, np.inf, np.nan, 3.4e38], np.float32)
    got = bf16_values(x)
    assert got.dtype == np.float32 and is_bf16(got[np.isfinite(got)])
    assert got[0] == one and got[1] == one + 2 * ulp and got[2] == one + ulp
    assert got[3] == -3.0 and got[4] == 0.0 and got[5] == np.inf
    assert np.isnan(got[6]) and got[7] == np.inf      # past bf16's range: Inf
    assert np.array_equal(got[:6], ref.round_to_bf16(x)[:6])
    assert np.array_equal(bf16_values(x[:4].astype(np.float16)),
                          ref.round_to_bf16(x[:4].astype(np.float16).astype(np.float32)))


def test_random_inputs_draw_bf16_q(bf16_decode):
    seed = 4100
    print(f"random inputs: int8attn random_inputs seed {seed}")
    arrays = random_inputs(bf16_decode.entry(), seed=seed)
    assert arrays[0].dtype == np.float32 and arrays[0].shape == SHAPE[:2] + SHAPE[-1:]
    assert is_bf16(arrays[0]) and np.abs(arrays[0]).max() > 0


def test_bf16_q_decode_against_both_references(bf16_decode, f32_decode):
    """The bf16 module on the rounded q: both references, and the f32 module on the
    same values bit for bit (the bf16 buffer carries exactly the rounded q)."""
    seed = 4101
    print(f"random inputs: int8attn random_inputs seed {seed}")
    arrays = random_inputs(bf16_decode.entry(), seed=seed)
    out = bf16_decode(*arrays)
    check_against_references(out, arrays, SCALE)
    assert np.array_equal(out, f32_decode(*arrays))


def test_bf16_q_is_rounded_at_the_call(bf16_decode, f32_decode):
    """An f32 (or f16) q that is not bf16 is rounded to bf16, not refused; the accuracy
    references are computed on the rounded q."""
    rng = seeded_rng(4102)
    arrays = random_inputs(bf16_decode.entry(), seed=4102)
    q = rng.standard_normal(arrays[0].shape).astype(np.float32)
    assert not is_bf16(q)
    rounded = bf16_values(q)
    out = bf16_decode(q, *arrays[1:])
    assert np.array_equal(out, f32_decode(rounded, *arrays[1:]))
    assert np.array_equal(bf16_decode(q.astype(np.float16), *arrays[1:]),
                          f32_decode(bf16_values(q.astype(np.float16)), *arrays[1:]))
    info = bf16_decode.entry()
    options = dict(pv="int8", model="gfx936", numerics=bf16_decode.options.numerics)
    given, called = references(info, [q, *arrays[1:]], **options), \
        references(info, [rounded, *arrays[1:]], **options)
    for name in ("exact", "fragment"):
        assert np.array_equal(given[name], called[name]), name
    check_against_references(out, [rounded, *arrays[1:]], SCALE)


def test_bf16_q_refuses_a_non_float_array(bf16_decode):
    arrays = random_inputs(bf16_decode.entry(), seed=4103)
    with pytest.raises(InputError, match=r"argument 0 .*q.* must be float32 \(rounded to "
                                         r"bf16 at the call\).*got int8"):
        bf16_decode(arrays[0].astype(np.int8), *arrays[1:])


def test_bf16_q_prefill_and_timing():
    graph = int8attn.compile(prefill_graph(1, 4, 1, 80, 17, 32, q_element="bf16"))
    seed = 4104
    print(f"random inputs: int8attn random_inputs seed {seed}")
    arrays = random_inputs(graph.entry(), seed=seed)
    assert is_bf16(arrays[0])
    check_against_references(graph(*arrays), arrays, 32 ** -0.5)
    seconds = graph.module.time_calls(graph.entry().name, arrays, iterations=1, warmup=0)
    assert len(seconds) == 1


def test_bf16_q_in_the_lane_simulator():
    graph = int8attn.compile(decode_graph(1, 4, 1, 100, 64, q_element="bf16"),
                             target="cuda", simulate=True)
    arrays = random_inputs(graph.entry(), seed=4105)
    out = graph(*arrays)
    fragment = ref.fragment_attention(*arrays, 0.125, model="cuda",
                                      numerics=graph.options.numerics)
    assert np.abs(out - fragment).max() <= 1e-5 * np.abs(fragment).max()


def test_cli_runs_a_bf16_graph(tmp_path, capsys):
    from int8attn.cli import main

    path = tmp_path / "bf16.mlir"
    path.write_text(decode_graph(1, 4, 1, 100, 64, q_element="bf16"))
    assert main(["run", str(path), "--seed", "0"]) == 0
    out = capsys.readouterr()
    assert "vs exact f32 reference" in out.out and "vs fragment-level reference" in out.out
    assert "Traceback" not in out.err


def test_cache_write_of_bf16_rows():
    graph = int8attn.compile(cache_write_graph(2, 64, 16, new_element="bf16"))
    seed = 4106
    print(f"random inputs: int8attn random_inputs seed {seed}")
    arrays = random_inputs(graph.entry(), seed=seed)
    assert is_bf16(arrays[0]) and is_bf16(arrays[1])
    rng = seeded_rng(seed)
    k_new = rng.standard_normal(arrays[0].shape).astype(np.float32)   # not bf16
    expected = ref.paged_cache_write(bf16_values(k_new), *arrays[1:7])
    got = graph(k_new, *arrays[1:])
    assert same_written_caches(got, expected)


# read-only caches ----------------------------------------------------------------------

def _pool(blocks=4, kv_heads=2, block_size=16, head_dim=64):
    return [np.zeros((blocks, kv_heads, block_size, head_dim), np.int8),
            np.zeros((blocks, kv_heads, block_size), np.float32),
            np.zeros((blocks, kv_heads, head_dim, block_size), np.int8),
            np.zeros((blocks, kv_heads, block_size), np.float32)]


@pytest.fixture(scope="module")
def cpu_write():
    return int8attn.compile(cache_write_graph(2, 64, 16))


@pytest.mark.parametrize("which", [0, 1, 2, 3])
def test_a_read_only_cache_is_refused(cpu_write, which):
    rng = seeded_rng(4200 + which)
    k, v = (rng.standard_normal((1, 2, 64)).astype(np.float32) for _ in range(2))
    pool = _pool()
    pool[which].flags.writeable = False
    names = ["k_cache", "k_scale", "v_cache", "v_scale"]
    with pytest.raises(InputError, match=rf"argument {3 + which} \({names[which]}, "
                                         rf"arg{3 + which}\) of @write is a read-only array"
                                         rf".*numpy\.array\(x\)"):
        cpu_write(k, v, np.array([3], np.int32), *pool)
    for a in pool:
        assert not a.any(), "a refused call wrote into the pool"
    writable = [np.array(a) for a in pool]
    result = cpu_write(k, v, np.array([3], np.int32), *writable)
    assert all(r is a for r, a in zip(result, writable))
    assert writable[1][0, 0, 3] > 0


# a tiny row's scale ---------------------------------------------------------------------

def test_a_tiny_rows_scale_may_be_flushed(cpu_write):
    """|x| = 1e-37: levels 0 and the scale a/127 (subnormal) or +0, never anything else;
    every other row bit for bit."""
    rng = seeded_rng(4300)
    k = rng.standard_normal((2, 2, 64)).astype(np.float32)
    v = np.full((2, 2, 64), 1e-37, np.float32)
    v[1] = rng.standard_normal((2, 64))
    slots = np.array([5, 20], np.int32)
    expected = ref.paged_cache_write(k, v, slots, *_pool())
    got = cpu_write(k, v, slots, *_pool())
    assert 0 < expected[3][0, 0, 5] < 2.0 ** -126          # the contract's a/127
    assert got[3][0, 0, 5] in (expected[3][0, 0, 5], 0.0)
    assert not got[2][0, :, :, 5].any()
    assert same_written_caches(got, expected)
    assert np.array_equal(got[3][1], expected[3][1])       # the normal row: bit for bit


def test_flushed_scales_equal_allows_only_the_flush():
    sub, normal = np.float32(7.874e-40), np.float32(1e-3)
    assert flushed_scales_equal([0.0, sub, normal, np.nan], [sub, sub, normal, np.nan]).all()
    assert not flushed_scales_equal([sub], [0.0]).any()      # only expected -> +0
    assert not flushed_scales_equal([-0.0], [sub]).any()
    assert not flushed_scales_equal([0.0], [normal]).any()
    assert not flushed_scales_equal([0.0], [np.float32(2.0 ** -126)]).any()
    pool = _pool()
    other = [a.copy() for a in pool]
    other[0][0, 0, 0, 0] = 1
    assert same_written_caches(pool, pool) and not same_written_caches(other, pool)


# paged: a chunk longer than the table ------------------------------------------------

def test_a_chunk_longer_than_its_table_is_named():
    graph = int8attn.compile(paged_attention_graph(4, 1, 32, 16, query_tokens=17))
    rng = seeded_rng(4400)
    k = rng.integers(-127, 128, (2, 1, 16, 32)).astype(np.int8)
    s = np.full((2, 1, 16), .01, np.float32)
    q = rng.standard_normal((1, 4, 17, 32)).astype(np.float32)
    with pytest.raises(InputError) as error:
        graph(q, k, s, k.transpose(0, 1, 3, 2).copy(), s, np.array([[0]], np.int32),
              np.array([17], np.int32))
    message = str(error.value)
    assert "Sq = 17 new tokens cannot fit a block table of 16 tokens" in message
    assert "at least 2 slots" in message and "chunks of at most 16 tokens" in message
    assert "[17, 16]" not in message


# graph builders --------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    ((1, 4, 1, 32, 0), "head_dim must be a positive integer, got 0"),
    ((0, 4, 1, 32, 64), "batch must be a positive integer"),
    ((1, 4, 0, 32, 64), "kv_heads must be a positive integer"),
    ((1, -4, 1, 32, 64), "q_heads must be a positive integer"),
    ((1, 4, 1, 0, 64), "tokens must be a positive integer"),
    ((1, 4, 3, 32, 64), r"q_heads \(4\) must be a multiple of kv_heads \(3\)"),
    ((1, 4, 1, 32, 64.0), "head_dim must be a positive integer, got 64.0"),
])
def test_decode_graph_refuses_bad_sizes(args, message):
    with pytest.raises(ValueError, match=message):
        decode_graph(*args)


@pytest.mark.parametrize("args, keywords, message", [
    ((1, 4, 1, 16, 32, 64), {}, r"query_tokens \(32\) must be at most tokens \(16\)"),
    ((1, 4, 1, 16, 0, 64), {}, "query_tokens must be a positive integer"),
    ((1, 4, 2, 16, 8, 0), {}, "head_dim must be a positive integer"),
    ((1, 4, 1, 16, 8, 64), {"softmax_scale": float("nan")}, "softmax_scale must be"),
    ((1, 4, 1, 16, 8, 64), {"q_element": "i8"}, "q_element must be one of"),
])
def test_prefill_graph_refuses_bad_sizes(args, keywords, message):
    with pytest.raises(ValueError, match=message):
        prefill_graph(*args, **keywords)


@pytest.mark.parametrize("build, message", [
    # finite as a double, inf as the graph's f32 (it compiled to a verifier error)
    (lambda: decode_graph(1, 8, 2, 64, 64, softmax_scale=1e300),
     r"positive and finite, got 1e\+300 \(inf as an f32\)"),
    # the scores' constant softmax_scale * log2 e overflows f32
    (lambda: decode_graph(1, 8, 2, 64, 64, softmax_scale=3e38), "overflows f32"),
    # written as `softmax_scale = inf`, which MLIR does not parse
    (lambda: paged_attention_graph(8, 2, 64, 16, softmax_scale=float("inf")),
     "positive and finite, got inf"),
    (lambda: paged_attention_graph(6, 4, 64, 16), r"q_heads \(6\) must be a multiple"),
    (lambda: paged_attention_graph(8, 2, 64, 0), "block_size must be a positive integer"),
])
def test_the_graph_builders_take_the_contracts_softmax_scale_rule(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_an_empty_save_stages_is_refused_by_the_api_even_on_a_cache_hit(tmp_path):
    # a module already in the cache must not let save_stages='' pass unchecked
    import int8attn
    from int8attn.driver.graph import decode_graph
    from int8attn.runtime import ModuleCache
    from int8attn.support.files import OutputError

    source = decode_graph(1, 4, 1, 64, 32)
    store = ModuleCache(tmp_path / "cache")
    int8attn.compile(source, cache=store)          # now a hit
    with pytest.raises(OutputError, match="names no folder"):
        int8attn.compile(source, cache=store, save_stages="")


def test_run_checks_every_cache_a_write_updates_against_the_pool_before_it(tmp_path, capsys,
                                                                        monkeypatch):
    """The module writes the caller's arrays in place: the reference must start from a
    copy of the pool taken before the call, and all four caches are compared (a write
    whose v_cache is then zeroed is caught, where comparing k_cache with itself was not)."""
    from int8attn import api, cli

    path = tmp_path / "write.mlir"
    path.write_text(cache_write_graph(2, 32, 16, name="write"))
    assert cli.main(["run", str(path), "--seed", "3"]) == 0
    out = capsys.readouterr().out
    for cache in ("k_cache", "k_scale", "v_cache", "v_scale"):
        assert f"  {cache:8} bit for bit" in out, out
    real = api.CompiledGraph.run

    def zeroed_v(self, arrays, function=None):
        results = real(self, arrays, function)
        results[2][...] = 0
        return results

    monkeypatch.setattr(api.CompiledGraph, "run", zeroed_v)
    assert cli.main(["run", str(path), "--seed", "3"]) == 1
    captured = capsys.readouterr()
    assert "v_cache" in captured.out and "differ" in captured.out
    assert "wrote caches that differ from reference.paged_cache_write" in captured.err


CHAINED = """
func.func @twice(%q: tensor<1x4x32xf32>, %k: tensor<1x1x70x32xi8>, %ks: tensor<1x1x70xf32>,
                 %v: tensor<1x1x70x32xi8>, %vs: tensor<1x1x70xf32>) -> tensor<1x4x32xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.125 : f32} : (tensor<1x4x32xf32>, tensor<1x1x70x32xi8>, tensor<1x1x70xf32>, tensor<1x1x70x32xi8>, tensor<1x1x70xf32>) -> tensor<1x4x32xf32>
  %o2 = "int8attn.attention"(%o, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.125 : f32} : (tensor<1x4x32xf32>, tensor<1x1x70x32xi8>, tensor<1x1x70xf32>, tensor<1x1x70x32xi8>, tensor<1x1x70xf32>) -> tensor<1x4x32xf32>
  return %o2 : tensor<1x4x32xf32>
}
"""


@pytest.mark.parametrize("scale, problem", [(np.nan, "NaN"), (-0.5, "a negative value")])
def test_the_scales_of_chained_attention_are_checked_too(scale, problem):
    # the result is no attention of the arguments, but the scales the attentions read
    # are arguments all the same: refused before the call, as for one attention
    graph = int8attn.compile(CHAINED, cache=False)
    rng = seeded_rng(6200)
    q = rng.standard_normal((1, 4, 32)).astype(np.float32)
    k, ks = ref.quantize_cache(rng.standard_normal((1, 1, 70, 32)).astype(np.float32))
    v, vs = ref.quantize_cache(rng.standard_normal((1, 1, 70, 32)).astype(np.float32))
    first = graph(q, k, ks, v, vs)      # one result: the array itself
    np.testing.assert_allclose(first, ref.exact_attention(
        ref.exact_attention(q, k, ks, v, vs, 0.125).astype(np.float32), k, ks, v, vs, 0.125),
        atol=2e-2)
    vs[0, 0, 9] = scale
    with pytest.raises(InputError, match=f"argument 4 \\(arg4\\) of @twice holds {problem} at "
                                         f"\\[0, 0, 9\\]"):
        graph(q, k, ks, v, vs)


def test_aligned_empty_takes_a_shape_as_numpy_empty_does():
    from int8attn.runtime import aligned_empty

    for shape in ((3, 4), 5, np.int64(3), ()):
        out = aligned_empty(shape, np.float32)
        assert out.shape == np.empty(shape).shape and out.ctypes.data % 64 == 0
    for shape in ((2, -1), (-1,), -5):
        with pytest.raises(ValueError, match="negative dimensions are not allowed"):
            aligned_empty(shape, np.int8)
    for alignment in (0, 48, -64):
        with pytest.raises(ValueError, match="alignment must be a positive power of two"):
            aligned_empty((2, 3), np.int8, alignment)
    with pytest.raises(TypeError, match="must be integers"):
        aligned_empty((2.0, 3), np.int8)


def test_two_caches_in_one_memory_are_refused(cpu_write):
    # the same array as k_scale and v_scale: the write's v scales would overwrite its k
    # scales; interleaved halves of one buffer are separate elements, and taken
    rng = seeded_rng(4300)
    k, v = (rng.standard_normal((1, 2, 64)).astype(np.float32) for _ in range(2))
    pool = _pool()
    with pytest.raises(InputError, match=r"argument 6 \(v_scale, arg6\) of @write and "
                                         r"argument 4 \(k_scale, arg4\) share memory"):
        cpu_write(k, v, np.array([3], np.int32), pool[0], pool[1], pool[2], pool[1])
    assert not pool[1].any(), "a refused call wrote into the pool"
    both = np.zeros(pool[1].shape + (2,), np.float32)
    cpu_write(k, v, np.array([3], np.int32), pool[0], both[..., 0], pool[2], both[..., 1])
    assert both[..., 0].any() and both[..., 1].any()
