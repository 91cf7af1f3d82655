"""Bad inputs of `int8attn.cache_write`, tried as a user would (issue 21).

Each bad array of @write (`paged_decode_graph(..., k_bias=True)`) is a named
error (the argument, what was expected, how to fix it) from the Python API and
from `int8attn run --function write --inputs IN.npz`, exit status 1, with no
cache changed and nothing written. Two tokens may not write one slot (which one
the cache would hold is ambiguous); a negative slot skips its token, as vLLM's
slot_mapping does, and a skipped token's rows are not checked. The inputs come
from a fixed, printed seed.
"""

import numpy as np
import pytest

import int8attn
from conftest import seeded_rng
from int8attn.driver.paged_decode import PagedCache, paged_decode_graph
from int8attn.runtime.module import InputError
from test_paged_bad_inputs import HEADS, _run, _set


WRITE_NAMES = ("k_new", "v_new", "slot_mapping", "k_cache", "k_scale", "v_cache", "v_scale",
               "k_bias")
WRITE = "of @write"


def _w(name):
    return f"argument {WRITE_NAMES.index(name)} ({name}, arg{WRITE_NAMES.index(name)}) {WRITE}"


def _wsig(name):     # the signature checks name an argument as the value checks do
    return f"{_w(name)} must"


def write_arrays():
    """4 new tokens (the third skipped) into a pool of 8 blocks of 16, and a channel bias."""
    rng = seeded_rng(2103)
    k, v = (rng.standard_normal((4, HEADS[1], HEADS[2])).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((HEADS[1], HEADS[2])).astype(np.float32)
    caches = PagedCache(8, HEADS[1], HEADS[3], HEADS[2], seed=3).arrays
    return [k, v, np.array([3, 9, -1, 40], np.int32), *caches, bias]


# case -> ({operand: change}, message); the pool has 8 blocks of 16 tokens (128 slots).
BAD_WRITES = {
    "NaN key row": (dict(k_new=_set((0, 1, 5), np.nan)),
                    _w("k_new") + ": token 0 (slot 3), KV head 1, channel 5 holds NaN; a new "
                    "row must be finite (its scale max|row|/127 would not be, and every "
                    "attention reading the slot would refuse it): fix the row, or give the "
                    "token slot -1 to skip it"),
    "Inf value row": (dict(v_new=_set((1, 0, 2), np.inf)),
                      _w("v_new") + ": token 1 (slot 9), KV head 0, channel 2 holds Inf"),
    "-Inf value row": (dict(v_new=_set((3, 1, 0), -np.inf)),
                       _w("v_new") + ": token 3 (slot 40), KV head 1, channel 0 holds -Inf"),
    "key that overflows minus the bias": (
        dict(k_new=_set((3, 0, 0), 3e38), k_bias=_set((0, 0), -3e38)),
        _w("k_new") + ": token 3 (slot 40), KV head 0, channel 0 holds 3e+38, which overflows "
        "f32 once k_bias is subtracted"),
    "NaN k_bias": (dict(k_bias=_set((1, 7), np.nan)),
                   _w("k_bias") + ": holds a non-finite value at [1, 7]"),
    "slot past the pool": (dict(slot_mapping=_set(1, 128)),
                           _w("slot_mapping") + ": token 1 writes slot 128, outside the pool's "
                           "slots [0, 128) (8 blocks of 16 tokens; a negative slot skips its "
                           "token)"),
    "largest i32 slot": (dict(slot_mapping=_set(0, 2 ** 31 - 1)),
                         "token 0 writes slot 2147483647, outside the pool's slots [0, 128)"),
    "two tokens, one slot": (dict(slot_mapping=_set(3, 9)),
                             _w("slot_mapping") + ": tokens 1 and 3 both write slot 9 (block 0, "
                             "offset 9); which one the cache would hold is ambiguous"),
    "fewer values than keys": (dict(v_new=lambda a: a[:3]),
                               "@write: k_new has 4 new tokens, v_new 3 and slot_mapping 4; they "
                               "must agree (one row of each per new token)"),
    "fewer slots than tokens": (dict(slot_mapping=lambda a: a[:2]),
                                "@write: k_new has 4 new tokens, v_new 4 and slot_mapping 2"),
    "k_bias of the wrong shape": (dict(k_bias=lambda a: a[:, :16]),
                                  _wsig("k_bias") + " have shape [2, 32] for tensor<2x32xf32>, "
                                  "got [2, 16]"),
    "k_bias per channel only": (dict(k_bias=lambda a: a[0]),
                                _wsig("k_bias") + " have shape [2, 32]"),
    "i64 slot_mapping": (dict(slot_mapping=lambda a: a.astype(np.int64)),
                         _wsig("slot_mapping") + " be int32 for tensor<?xi32>, got int64"),
    "f64 keys": (dict(k_new=lambda a: a.astype(np.float64)), _wsig("k_new") + " be float32"),
    "keys of the wrong head dim": (dict(k_new=lambda a: a[..., :16]),
                                   _wsig("k_new") + " have shape [?, 2, 32]"),
    "pools disagree": (dict(k_scale=lambda a: a[:4]),
                       "@write: the caches disagree on the number of blocks: k_cache 8, "
                       "k_scale 4, v_cache 8, v_scale 8"),
    "token-major v_cache": (dict(v_cache=lambda a: np.ascontiguousarray(a.transpose(0, 1, 3, 2))),
                            _w("v_cache") + " has shape [8, 2, 16, 32], the token-major layout"),
}


@pytest.fixture(scope="module")
def write_graph():
    return int8attn.compile(paged_decode_graph(*HEADS, k_bias=True), filename="decode.mlir")


@pytest.mark.parametrize("case", sorted(BAD_WRITES))
def test_bad_writes_are_named_and_write_nothing(case, write_graph, tmp_path, capsys):
    changes, message = BAD_WRITES[case]
    arrays = write_arrays()
    for name, change in changes.items():
        arrays[WRITE_NAMES.index(name)] = change(arrays[WRITE_NAMES.index(name)])
    before = [a.copy() for a in arrays[3:7]]
    with pytest.raises(InputError) as error:
        write_graph(*arrays, function="write")
    assert message in str(error.value), str(error.value)
    for a, b in zip(arrays[3:7], before):
        assert np.array_equal(a, b, equal_nan=True), "a refused write changed the cache"
    path, npz, out = tmp_path / "decode.mlir", tmp_path / "in.npz", tmp_path / "out.npz"
    path.write_text(paged_decode_graph(*HEADS, k_bias=True))
    np.savez(npz, **{f"arg{i}": a for i, a in enumerate(arrays)})
    assert _run(path, npz, out, "cpu", "--function", "write") == 1
    err = capsys.readouterr().err
    assert "error: " in err and message in err and "Traceback" not in err, err
    assert not out.exists()


def test_a_skipped_token_may_hold_anything(write_graph):
    """vLLM's padding (slot -1) is not written, so its rows are not checked: NaN there
    is accepted and the cache equals the numpy write, the skipped token absent."""
    from int8attn.reference import paged_cache_write

    arrays = write_arrays()
    arrays[0][2] = np.nan
    arrays[1][2] = np.inf
    expected = paged_cache_write(*arrays[:7], k_bias=arrays[7])
    write_graph(*arrays, function="write")
    for name, a, e in zip(WRITE_NAMES[3:7], arrays[3:7], expected):
        assert np.array_equal(a, e, equal_nan=True), name
    assert np.isfinite(arrays[4][[0, 0, 2], :, [3, 9, 8]]).all()   # the three written slots

