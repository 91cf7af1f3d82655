"""The value checks without a host sync (validate=True, the default): a bad call's first
violation is recorded on the device and raised at the next check point (check(), or a
later call) as the error validate="sync" raises; the bad call writes nothing and its
bad sequences' output rows are NaN; good calls are the sync mode's bit for bit; a
default-mode call reads nothing back. On torch CPU tensors here; the GPU part (no host
sync by torch's sync debug mode, CUDA graph capture) skips without a GPU."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from conftest import seeded_rng

torch = pytest.importorskip("torch")
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from int8attn.runtime.module import InputError  # noqa: E402
from int8attn.serving import PagedAttention  # noqa: E402
from int8attn.serving.deferred_checks import TORCH_WRITE_KIND, write_record  # noqa: E402
from int8attn.serving.device_checks import passes_value_rules  # noqa: E402
from test_serving import BS, D, HKV, HQ, NB, pool_and_batch  # noqa: E402

SEED = 2300
LENGTHS = [20, 50, 33]
SQ = 4
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def attn():
    pytest.importorskip("iree.compiler", reason="the cpu target compiles its kernels here")
    return PagedAttention(HQ, HKV, D, BS, target="cpu")


def filled(attn, seed=SEED, device="cpu"):
    """A pool the batch's tokens were written to, its tables and lengths, q, and the new
    tokens of a next write (to free slots), on `device`."""
    print(f"random inputs: seed {seed}", file=sys.stderr)
    rng = seeded_rng(seed)
    pool, tables, lens, (k_new, v_new), slots = pool_and_batch(rng, LENGTHS)
    q = torch.from_numpy(rng.standard_normal((len(LENGTHS), HQ, D)).astype(np.float32))
    free = np.setdiff1d(np.arange(NB * BS), slots.numpy())
    new_slots = torch.from_numpy(rng.permutation(free)[:12].astype(np.int32))
    new = [torch.from_numpy(rng.standard_normal((12, HKV, D)).astype(np.float32))
           for _ in range(2)]
    pool = [t.to(device) for t in pool]
    tables, lens, q, k_new, v_new, slots = (t.to(device) for t in (tables, lens, q, k_new,
                                                                     v_new, slots))
    attn.write(k_new, v_new, slots, *pool, validate="sync")
    return pool, tables, lens, q, tuple(t.to(device) for t in (*new, new_slots))


def pool_bytes(pool):
    return [t.view(torch.uint8).clone() for t in pool]


def same_bytes(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def sync_error(call) -> str:
    with pytest.raises(InputError) as error:
        call()
    return str(error.value)


def raised_at(attn, point, good_call) -> str:
    """The message the check point raises: check(), or the next (good) call."""
    with pytest.raises(InputError) as error:
        attn.check() if point == "check" else good_call()
    attn.check()                                  # taken: nothing left to raise
    return str(error.value)


# (what is spoiled, the sequences that read it); a = [q, kc, ks, vc, vs, tables, lens]
BAD_ATTEND = {
    "NaN k scale in a read slot": (lambda a: a[2].__setitem__((int(a[5][1, 1]), 0, 3), NAN),
                                   [1]),
    "Inf v scale in a read slot": (lambda a: a[4].__setitem__((int(a[5][2, 0]), 1, 5), INF),
                                   [2]),
    "negative v scale in a read slot": (
        lambda a: a[4].__setitem__((int(a[5][0, 1]), 1, 0), -1.0), [0]),
    "block id past the pool": (lambda a: a[5].__setitem__((1, 2), NB), [1]),
    "negative block id": (lambda a: a[5].__setitem__((2, 0), -3), [2]),
    "context length past the table": (
        lambda a: a[6].__setitem__(0, a[5].shape[1] * BS + 1), [0]),
    "context length 0": (lambda a: a[6].__setitem__(2, 0), [2]),
    # two faults: the sync check names sequence 2's length before sequence 1's scale
    "a scale and a later length": (
        lambda a: (a[2].__setitem__((int(a[5][1, 0]), 0, 0), NAN), a[6].__setitem__(2, -1)),
        [1, 2]),
    "an empty block table": (lambda a: a.__setitem__(5, a[5][:, :0].contiguous()), [0, 1, 2]),
}


@pytest.mark.parametrize("point", ["check", "next call"])
@pytest.mark.parametrize("case", sorted(BAD_ATTEND))
def test_a_bad_attention_input_is_raised_later_as_the_sync_error(attn, case, point):
    pool, tables, lens, q, _ = filled(attn)
    good = attn(q, *pool, tables, lens, validate="sync")
    args = [q, *(t.clone() for t in pool), tables.clone(), lens.clone()]
    spoil, bad = BAD_ATTEND[case]
    spoil(args)
    expected = sync_error(lambda: attn(*args, validate="sync"))
    out = attn(*args)                                          # no error yet
    rows = torch.zeros(len(LENGTHS), dtype=torch.bool)
    rows[bad] = True
    assert torch.isnan(out[rows]).all()                       # bad sequences: NaN rows
    assert torch.equal(out[~rows], good[~rows])               # the others as a good call
    assert raised_at(attn, point, lambda: attn(q, *pool, tables, lens)) == expected
    assert torch.equal(attn(q, *pool, tables, lens), good)    # and calls go on


# w = [k_new, v_new, slots, kc, ks, vc, vs]
BAD_WRITE = {
    "slot mapping past the pool": lambda w: w[2].__setitem__(0, NB * BS),
    "duplicate slot": lambda w: w[2].__setitem__(5, w[2][9]),
    "NaN in a new k row": lambda w: w[0].__setitem__((4, 1, 7), NAN),
    "Inf in a new v row": lambda w: w[1].__setitem__((0, 0, 0), INF),
    "a NaN row and a slot past the pool": lambda w: (w[0].__setitem__((2, 0, 0), NAN),
                                         w[2].__setitem__(7, -5 + NB * BS * 2)),
}


@pytest.mark.parametrize("point", ["check", "next call"])
@pytest.mark.parametrize("case", sorted(BAD_WRITE))
def test_a_bad_write_writes_nothing_and_is_raised_later_as_the_sync_error(attn, case, point):
    pool, tables, lens, q, new = filled(attn)
    args = [*(t.clone() for t in new), *pool]
    BAD_WRITE[case](args)
    before = pool_bytes(pool)
    expected = sync_error(lambda: attn.write(*args, validate="sync"))
    assert same_bytes(pool_bytes(pool), before)
    pointers = [t.data_ptr() for t in pool]
    attn.write(*args)                                          # no error yet
    assert same_bytes(pool_bytes(pool), before)                # nothing written
    assert [t.data_ptr() for t in pool] == pointers
    assert raised_at(attn, point, lambda: attn(q, *pool, tables, lens)) == expected


def test_a_write_of_one_token(attn):
    pool, tables, lens, q, (k_new, v_new, slots) = filled(attn)
    one = [k_new[:1].clone(), v_new[:1].clone(), slots[:1].clone()]
    twin = [t.clone() for t in pool]
    attn.write(*one, *pool)
    attn.write(*one, *twin, validate="sync")
    attn.check()
    assert same_bytes(pool_bytes(pool), pool_bytes(twin))
    one[1][0, 1, 2] = NAN
    expected = sync_error(lambda: attn.write(*one, *twin, validate="sync"))
    attn.write(*one, *pool)
    assert same_bytes(pool_bytes(pool), pool_bytes(twin))
    assert raised_at(attn, "check", None) == expected


def test_a_skipped_token_may_hold_anything(attn):
    pool, tables, lens, q, (k_new, v_new, slots) = filled(attn)
    k_new[3], slots[3] = NAN, -1
    twin = [t.clone() for t in pool]
    attn.write(k_new, v_new, slots, *pool)
    attn.write(k_new, v_new, slots, *twin, validate="sync")
    attn.check()
    assert same_bytes(pool_bytes(pool), pool_bytes(twin))
    assert not same_bytes(pool_bytes(pool), pool_bytes(filled(attn)[0]))   # it wrote


@pytest.fixture(scope="module")
def prefill_attn(attn):
    attn.executor(("prefill", SQ))
    return attn


def test_good_calls_are_the_sync_modes_bit_for_bit(prefill_attn):
    attn = prefill_attn
    pool, tables, lens, q, new = filled(attn)
    twin = [t.clone() for t in pool]
    attn.write(*new, *pool)
    attn.write(*new, *twin, validate="sync")
    assert same_bytes(pool_bytes(pool), pool_bytes(twin))
    for query in (q, torch.randn(len(LENGTHS), HQ, SQ, D, generator=torch.Generator()
                                 .manual_seed(SEED))):
        deferred = attn(query, *pool, tables, lens)
        assert not torch.isnan(deferred).any()
        assert torch.equal(deferred, attn(query, *pool, tables, lens, validate="sync"))
        assert torch.equal(deferred, attn(query, *pool, tables, lens, validate=False))
    attn.check()


def test_a_prefill_chunk_longer_than_the_table_or_its_sequence(prefill_attn):
    attn = prefill_attn
    pool, tables, lens, _, _ = filled(attn)
    q = torch.randn(len(LENGTHS), HQ, SQ, D)
    short = lens.clone()
    short[1] = SQ - 1
    for case in (short, tables[:, :0].contiguous()):
        args = [q, *pool, *((tables, case) if case.dim() == 1 else (case, lens))]
        expected = sync_error(lambda: attn(*args, validate="sync"))
        out = attn(*args)
        assert torch.isnan(out[1]).all()
        assert raised_at(attn, "check", None) == expected


class HostReads:
    """Every torch.Tensor method that reads a value back to the host, counted."""

    NAMES = ("item", "tolist", "cpu", "__bool__", "__int__", "__float__", "__index__")

    def __init__(self, monkeypatch):
        self.calls = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._spy(name, original))

    def _spy(self, name, original):
        def spy(tensor, *args, **kwargs):
            self.calls.append(name)
            return original(tensor, *args, **kwargs)
        return spy


def test_a_default_mode_call_reads_nothing_back(attn, monkeypatch):
    pool, tables, lens, q, new = filled(attn)
    bad = tables.clone()
    bad[0, 0] = NB
    attn(q, *pool, tables, lens)                  # the first call makes the record
    reads = HostReads(monkeypatch)
    attn.write(*new, *pool)
    out = attn(q, *pool, tables, lens)
    attn(q, *pool, bad, lens)                     # a bad call reads nothing back either
    assert reads.calls == []
    # the detector sees the sync mode's verdict (the check the cuda path makes)
    info = attn.executor("decode").info
    passes_value_rules(info, [q, *pool, tables, lens])
    assert "__bool__" in reads.calls
    monkeypatch.undo()
    assert not torch.isnan(out).any()
    with pytest.raises(InputError, match="holds block 40"):
        attn.check()


class OpCount(TorchDispatchMode):
    """The aten ops a call dispatches; `kernels`: those that are not views."""

    VIEWS = {"view", "_unsafe_view", "slice", "select", "unsqueeze", "transpose", "expand",
             "detach", "alias", "as_strided", "squeeze", "lift_fresh", "permute", "t"}

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))

    @property
    def kernels(self):
        return [op for op in self.ops if op not in self.VIEWS]


def ops_of(call) -> OpCount:
    with OpCount() as counted:
        call()
    return counted


# The ops a default-mode call adds to an unchecked one (records, fold, NaN rows, safe
# inputs): each is a host-side launch on a GPU, so their number is the checks' host cost.
OP_BOUNDS = {"attend": (46, 26), "write": (42, 28)}     # (all ops, non-view ops)


def test_the_checks_add_a_bounded_number_of_ops(attn):
    pool, tables, lens, q, new = filled(attn)
    calls = {"attend": lambda validate: attn(q, *pool, tables, lens, validate=validate),
             "write": lambda validate: attn.write(*new, *pool, validate=validate)}
    for name, call in calls.items():
        call(True)                                # constants and the record made
        checked, unchecked = ops_of(lambda: call(True)), ops_of(lambda: call(False))
        added = (len(checked.ops) - len(unchecked.ops),
                 len(checked.kernels) - len(unchecked.kernels))
        print(f"{name}: {added[0]} ops added, {added[1]} not views: {checked.kernels}")
        assert added[0] <= OP_BOUNDS[name][0] and added[1] <= OP_BOUNDS[name][1], added
    attn.check()


def random_faults(rng, args, count):
    """`count` faults drawn among every attention rule, at random places (the scales
    of read and unread slots, used and unused table slots, lengths)."""
    tables, lens = args[5], args[6]
    for _ in range(count):
        b = int(rng.integers(len(LENGTHS)))
        kind = rng.choice(["scale", "scale", "scale", "block", "length"])
        if kind == "scale":
            token = int(rng.integers(int(lens[b]) + BS))   # now and then an unread slot
            column = min(token // BS, tables.shape[1] - 1)
            value = rng.choice([NAN, INF, -INF, -1.0, -0.0, 0.0])
            args[int(rng.choice([2, 4]))][int(tables[b, column]) % NB,
                                          int(rng.integers(HKV)), token % BS] = value
        elif kind == "block":
            tables[b, int(rng.integers(tables.shape[1]))] = int(rng.choice([-1, NB, 10**6]))
        else:
            lens[b] = int(rng.choice([0, -5, tables.shape[1] * BS + 1]))


def test_random_faults_are_named_as_the_sync_check_names_them(attn):
    pool, tables, lens, q, _ = filled(attn)
    rng = seeded_rng(SEED + 3)
    for case in range(30):
        args = [q, *(t.clone() for t in pool), tables.clone(), lens.clone()]
        random_faults(rng, args, int(rng.integers(1, 4)))
        try:
            attn(*args, validate="sync")
            expected = None
        except InputError as error:
            expected = str(error)
        attn(*args)
        if expected is None:
            attn.check()
        else:
            assert raised_at(attn, "check", None) == expected, case


def test_validate_takes_three_modes(attn):
    pool, tables, lens, q, new = filled(attn)
    for call in (lambda: attn(q, *pool, tables, lens, validate="yes"),
                 lambda: attn.write(*new, *pool, validate=1)):
        with pytest.raises(InputError, match=r"validate must be True .* 'sync' .* or False"):
            call()


def test_the_torch_write_skips_a_bad_call_on_the_device():
    from int8attn.serving.transformers_cache import torch_cache_write

    rng = seeded_rng(SEED + 1)
    pool, _, _, (k_new, v_new), slots = pool_and_batch(rng, [9, 12])
    blocks, offsets = slots.long() // BS, slots.long() % BS
    before = pool_bytes(pool)
    torch_cache_write(k_new, v_new, blocks, offsets, *pool, skip=torch.tensor([True]))
    assert same_bytes(pool_bytes(pool), before)
    twin = [t.clone() for t in pool]
    torch_cache_write(k_new, v_new, blocks, offsets, *pool, skip=torch.tensor([False]))
    torch_cache_write(k_new, v_new, blocks, offsets, *twin)
    assert same_bytes(pool_bytes(pool), pool_bytes(twin))
    assert not same_bytes(pool_bytes(pool), before)


def test_a_torch_write_record_names_its_layer():
    attn = PagedAttention(HQ, HKV, D, BS, target="cpu")          # compiles nothing
    rng = seeded_rng(SEED + 2)
    pool, _, _, (k_new, v_new), slots = pool_and_batch(rng, [5])
    v_new[2, 1, 9] = NAN
    record, bad = write_record({"k_new": k_new, "v_new": v_new, "slot_mapping": slots,
                                "k_cache": pool[0]})
    assert bool(bad)
    attn.violations.add(record, k_new.device, TORCH_WRITE_KIND, 3, 0, NB)
    with pytest.raises(InputError, match=r"layer 3: a new key or value row holds NaN or Inf "
                                         r"\(token 2, KV head 1, channel 9 of v_new\)"):
        attn.check()


# --- on a GPU -----------------------------------------------------------------------
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")


@pytest.fixture(scope="module")
def cuda_attn():
    """This file's sizes on cuda: compiled here, or saved by
    `PagedAttention(8, 2, 64, 16, target="cuda").save(DIR)` and named by
    INT8ATTN_DEFERRED_PACKAGES=DIR (a GPU server without the compiler)."""
    folder = os.environ.get("INT8ATTN_DEFERRED_PACKAGES")
    attn = (PagedAttention.load(folder) if folder
            else PagedAttention(HQ, HKV, D, BS, target="cuda"))
    if not attn.has_kernel("write"):
        pytest.skip("no IREE compiler and no INT8ATTN_DEFERRED_PACKAGES")
    return attn


def cuda_batch(attn):
    return filled(attn, device="cuda")


@gpu
def test_no_host_sync_on_the_gpu(cuda_attn):
    attn = cuda_attn
    pool, tables, lens, q, new = cuda_batch(attn)
    out = torch.empty_like(q)
    attn.write(*new, *pool)
    attn(q, *pool, tables, lens, out=out)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            attn.write(*new, *pool)
            attn(q, *pool, tables, lens, out=out)
        with pytest.raises(RuntimeError):        # the detector sees the sync mode's sync
            attn(q, *pool, tables, lens, out=out, validate="sync")
    finally:
        torch.cuda.set_sync_debug_mode(0)
    attn.check()


@gpu
def test_a_captured_graph_records_into_the_persistent_record(cuda_attn):
    attn = cuda_attn
    pool, tables, lens, q, new = cuda_batch(attn)
    out = torch.empty_like(q)
    attn.write(*new, *pool)                       # warm-up: kernels and the record
    attn(q, *pool, tables, lens, out=out)
    attn.check()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attn.write(*new, *pool)
        attn(q, *pool, tables, lens, out=out)
    graph.replay()
    attn.check()                                  # good inputs: clean
    good = out.clone()
    before = pool_bytes(pool)
    new[0][1, 0, 0] = NAN                         # refilled in place, as a loop does
    graph.replay()
    with pytest.raises(InputError, match="token 1 .* holds NaN"):
        attn.check()
    assert same_bytes(pool_bytes(pool), before)
    new[0][1, 0, 0] = 0.5
    tables[1, 0] = NB
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(out[1]).all() and torch.equal(out[0], good[0])
    with pytest.raises(InputError, match="sequence 1, slot 0"):
        attn.check()


@gpu
def test_capture_before_any_call_is_refused_by_name(cuda_attn):
    pool, tables, lens, q, _ = cuda_batch(cuda_attn)
    fresh = PagedAttention(HQ, HKV, D, BS, target="cuda")
    fresh._executors = cuda_attn._executors
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(InputError, match="make one call with validate=True before capturing"):
        with torch.cuda.graph(graph):
            fresh(q, *pool, tables, lens)
