"""fragments/cache_layout.py: the one token -> address rule of the KV caches.

The numpy rules against brute force (walking a sequence's blocks and the pool's
slots one by one, no division), the IR rules (`arith_ops`, folded by MLIR's
canonicalizer on constant inputs) against the numpy ones, the text form, and the
edges: lengths 0 and 1, exact block multiples, negative and past-the-pool slots.
"""

from __future__ import annotations

import numpy as np
import pytest
from iree.compiler import ir, passmanager
from iree.compiler.dialects import arith, func, tensor

from conftest import seeded_rng
from int8attn.fragments.cache_layout import DENSE, DENSE_TOKEN_MAJOR, EVERY, CacheLayout
from int8attn.fragments.index_rules import NUMPY_OPS, TEXT_OPS, arith_ops, ceil_div
from int8attn.support.ir import new_context

SEED = 2323
BLOCK_SIZES = (1, 2, 3, 16, 32)


def _pool(rng, block_size: int, lengths):
    """A shuffled pool holding sequences of `lengths`: (tables [B, MB] with garbage past
    each sequence's blocks, pool block count)."""
    needed = [-(-n // block_size) for n in lengths]          # brute force below checks it
    width = max(needed + [0]) + 2
    blocks = sum(needed) + 3
    order = rng.permutation(blocks)
    tables = rng.integers(-1000, 1000, (len(lengths), width))
    start = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[start:start + n]
        start += n
    return tables, blocks


def _walk(table_row, length: int, block_size: int, tokens: int):
    """(block, offset) of tokens 0 .. tokens - 1 of a sequence of `length` by walking its
    table row block by block; past the length, the last used block (brute force)."""
    blocks, offsets, token, last = [], [], 0, None
    for entry in table_row:
        for offset in range(block_size):
            if token == tokens:
                return np.array(blocks), np.array(offsets)
            if token < length:
                last = entry if offset == 0 else last
            blocks.append(entry if token < length or last is None else last)
            offsets.append(offset)
            token += 1
    return np.array(blocks), np.array(offsets)


def _lengths(rng, block_size: int):
    edges = [1, 2, block_size - 1, block_size, block_size + 1, 2 * block_size,
             3 * block_size - 1, 5 * block_size]
    return sorted({n for n in edges if n >= 1} | set(rng.integers(1, 8 * block_size, 6).tolist()))


# ----------------------------------------------------------------------------
# numpy rules against brute force
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_sequence_addresses_walk_the_table(block_size):
    rng = seeded_rng(SEED + block_size)
    layout = CacheLayout.paged(block_size)
    lengths = _lengths(rng, block_size)
    tables, _ = _pool(rng, block_size, lengths)
    for b, length in enumerate(lengths):
        # every token of the table row's width, past the length too (the clamp)
        tokens = tables.shape[1] * block_size
        want_block, want_offset = _walk(tables[b], length, block_size, tokens)
        block, offset = layout.addresses(tables[b], np.arange(tokens), length)
        np.testing.assert_array_equal(block, want_block, err_msg=f"length {length}")
        np.testing.assert_array_equal(offset, want_offset)
        # the sequence's own tokens, no clamp needed
        block, offset = layout.sequence_addresses(tables[b], length)
        np.testing.assert_array_equal(block, want_block[:length])
        np.testing.assert_array_equal(offset, want_offset[:length])
        assert layout.live(np.arange(tokens), length).sum() == length
        # blocks needed: count blocks until the tokens are covered
        count, covered = 0, 0
        while covered < length:
            count, covered = count + 1, covered + block_size
        assert layout.blocks_needed(length) == count
        assert set(block.tolist()) == set(tables[b, :count].tolist())  # no unused entry read
    np.testing.assert_array_equal(layout.blocks_needed(np.array(lengths)),
                                  [layout.blocks_needed(n) for n in lengths])


@pytest.mark.parametrize("block_size", BLOCK_SIZES + (64, 128, 48))
@pytest.mark.parametrize("tile_tokens", [16, 64])
def test_tile_addresses_are_the_token_addresses(block_size, tile_tokens):
    # A kernel's tile split (the tile's part + the lane's part, where blocks and tiles
    # nest; the whole token's otherwise: 48 against 64) reads what `address` reads for
    # every token of every tile of the table row, past the length too.
    rng = seeded_rng(SEED + 500 + block_size + tile_tokens)
    layout = CacheLayout.paged(block_size)
    rules = layout.rules()
    width = 5
    table = rng.permutation(100)[:width]
    lookup = lambda slot: table[slot]
    tokens = width * block_size
    for length in (1, block_size, tokens - 3, tokens):
        last = rules.last_table_slot(length)
        for first in range(0, tokens, tile_tokens):
            local = np.arange(min(tile_tokens, tokens - first))
            want = rules.address(first + local, lookup, last)
            got = rules.tile_address(first, local, tile_tokens, lookup, last)
            np.testing.assert_array_equal(got[0], want[0], err_msg=f"length {length}")
            np.testing.assert_array_equal(got[1], want[1], err_msg=f"length {length}")


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_pool_slots_enumerate_the_pool(block_size):
    rng = seeded_rng(SEED + 100 + block_size)
    layout = CacheLayout.paged(block_size)
    pool = int(rng.integers(1, 9))
    slot_of, slot = {}, 0
    for block in range(pool):
        for offset in range(block_size):
            slot_of[block, offset] = slot
            slot += 1
    assert layout.capacity(pool) == slot
    blocks, offsets = (np.array(x) for x in zip(*slot_of))
    np.testing.assert_array_equal(layout.slots(blocks, offsets), list(slot_of.values()))
    np.testing.assert_array_equal(np.stack(layout.split_slots(list(slot_of.values()))),
                                  [blocks, offsets])
    # inside the pool exactly the enumerated slots; negative ones skipped, not kept
    probe = np.concatenate([np.arange(-2 * block_size - 3, slot + 2 * block_size + 3),
                            rng.integers(-10 ** 6, 10 ** 6, 50)])
    block, offset, inside = layout.pool_slots(probe, pool)
    np.testing.assert_array_equal(inside, [s in slot_of.values() for s in probe])
    np.testing.assert_array_equal(layout.kept(probe), probe >= 0)
    for s, b, o in zip(probe[inside], block[inside], offset[inside]):
        assert slot_of[b, o] == s
    # a sequence's token slots: the enumerated slots of its blocks, token by token
    length = int(rng.integers(1, slot + 1))
    table = rng.permutation(pool)
    tokens = np.arange(length)
    want = [slot_of[b, o] for b, o in zip(*_walk(table, length, block_size, length))]
    np.testing.assert_array_equal(layout.token_slots(table, tokens), want)


@pytest.mark.parametrize("layout", [DENSE, DENSE_TOKEN_MAJOR, CacheLayout.paged(4),
                                    CacheLayout.paged(4, v_token_innermost=False)],
                         ids=["dense", "dense-token-major", "paged", "paged-token-major"])
def test_index_tuples_address_the_documented_arrays(layout):
    """Each element of K / V / scales holds a code of (lead, head, position, column),
    written in the documented layout; the index tuples read them back."""
    rng = seeded_rng(SEED + 200)
    lead, heads, positions, dim = 3, 2, layout.block_size or 5, 6
    k_shape, s_shape, v_shape, _ = layout.shapes(lead, heads, dim, positions)
    assert k_shape == (lead, heads, positions, dim) and s_shape == (lead, heads, positions)
    assert v_shape == ((lead, heads, dim, positions) if layout.v_token_innermost else k_shape)
    code = lambda l, h, p, c: ((l * 10 + h) * 10 + p) * 10 + c
    k, v = np.empty(k_shape, np.int64), np.empty(v_shape, np.int64)
    scale = np.empty(s_shape, np.int64)
    for l, h, p, c in np.ndindex(lead, heads, positions, dim):
        k[l, h, p, c] = code(l, h, p, c)
        v[(l, h, c, p) if layout.v_token_innermost else (l, h, p, c)] = code(l, h, p, c)
        scale[l, h, p] = code(l, h, p, 0)
    for _ in range(20):
        l, h, p, c = (int(rng.integers(n)) for n in (lead, heads, positions, dim))
        assert k[layout.k_index(l, h, p, c)] == v[layout.v_index(l, h, p, c)] == code(l, h, p, c)
        assert scale[layout.scale_index(l, h, p)] == code(l, h, p, 0)
    # whole token rows of N tokens: [N, Hkv, D] and [N, Hkv]
    where = (rng.integers(lead, size=7), rng.integers(positions, size=7))
    rows = layout.token_rows(k, scale, v, scale, *where)
    assert rows[0].shape == rows[2].shape == (7, heads, dim)
    for i, (l, p) in enumerate(zip(*where)):
        for h, c in np.ndindex(heads, dim):
            assert rows[0][i, h, c] == rows[2][i, h, c] == code(l, h, p, c)
            assert rows[1][i, h] == rows[3][i, h] == code(l, h, p, 0)
    assert k[layout.k_index(0, EVERY, 1, EVERY)].shape == (heads, dim)
    assert v[layout.v_index(0, EVERY, 1, EVERY)].shape == (heads, dim)


def test_edges():
    layout = CacheLayout.paged(16)
    table = np.array([5, 9, 2, 7])
    # length 0 reads nothing and needs no block; length 1 one token of one block
    assert layout.blocks_needed(0) == 0
    assert [len(x) for x in layout.sequence_addresses(table, 0)] == [0, 0]
    assert layout.blocks_needed(1) == 1
    np.testing.assert_array_equal(layout.sequence_addresses(table, 1), [[5], [0]])
    np.testing.assert_array_equal(layout.addresses(table, [0, 1, 15, 16, 40], 1),
                                  [[5, 5, 5, 5, 5], [0, 1, 15, 0, 8]])
    # exact block multiples: the last token is its block's last slot, no extra block
    for k in (1, 2, 3):
        assert layout.blocks_needed(16 * k) == k and layout.blocks_needed(16 * k + 1) == k + 1
        assert layout.rules().last_table_slot(16 * k) == k - 1
        np.testing.assert_array_equal(layout.addresses(table, [16 * k - 1, 16 * k], 16 * k),
                                      [[table[k - 1]] * 2, [15, 0]])
    # negative slots are skipped, past-the-pool ones outside it
    _, _, inside = layout.pool_slots([-1, -16, -17, 0, 63, 64, 65, 10 ** 9], 4)
    np.testing.assert_array_equal(inside, [0, 0, 0, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(layout.kept([-1, 0, 64]), [0, 1, 1])
    with pytest.raises(ValueError, match="dense cache has no block table"):
        DENSE.rules()
    with pytest.raises(ValueError, match="block size"):
        CacheLayout.paged(0)


def test_numpy_rules_work_on_torch_tensors():
    """serving/device_checks evaluates the rules on the tensors' own device."""
    torch = pytest.importorskip("torch")
    rules = CacheLayout.paged(16).rules()
    lengths = torch.tensor([0, 1, 15, 16, 17, 64, -3])
    assert rules.blocks_needed(lengths).tolist() == [0, 1, 1, 1, 2, 4, 0]
    assert rules.kept(torch.tensor([-1, 0, 5])).tolist() == [False, True, True]
    assert rules.capacity(3) == 48


# ----------------------------------------------------------------------------
# the IR rules against the numpy ones
# ----------------------------------------------------------------------------

def _folded(emit) -> list[int]:
    """The values `emit()` returns, built as a function of constants and folded by
    MLIR's canonicalizer (arith's own folding semantics, index 64 bits wide)."""
    with new_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            func.FuncOp.from_py_func(name="rules")(lambda: emit())
        passmanager.PassManager.parse("builtin.module(func.func(canonicalize))").run(
            module.operation)
        body = module.body.operations[0].regions[0].blocks[0]
        values = []
        for operand in list(body.operations)[-1].operands:
            op = operand.owner
            assert op.name == "arith.constant", f"not folded: {op}"
            value = ir.IntegerAttr(op.attributes["value"]).value
            values.append(bool(value) if str(operand.type) == "i1" else value)
        return values


def _index(n: int):
    return arith.constant(ir.IndexType.get(), int(n))


def _i32(n: int):
    return arith.constant(ir.IntegerType.get_signless(32), int(n))


def _table(row):
    """A lookup reading an i32 constant table row, as the lowerings read block_tables."""
    row = np.asarray(row, np.int32)
    value = arith.constant(ir.RankedTensorType.get([len(row)], ir.IntegerType.get_signless(32)),
                           ir.DenseElementsAttr.get(row))
    return lambda slot: arith.index_cast(ir.IndexType.get(), tensor.extract(value, [slot]))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_ir_sequence_rules_match_numpy(block_size):
    rng = seeded_rng(SEED + 300 + block_size)
    layout = CacheLayout.paged(block_size)
    lengths = _lengths(rng, block_size)
    tables, _ = _pool(rng, block_size, lengths)
    cases = [(b, length, int(t)) for b, length in enumerate(lengths)
             for t in rng.integers(0, tables.shape[1] * block_size, 12)]
    cases += [(b, length, t) for b, length in enumerate(lengths)
              for t in (0, length - 1, length)]

    def emit():
        out = []
        for b, length, token in cases:
            rules = layout.rules(arith_ops(_index))
            last = rules.last_table_slot(_index(length))
            block, offset = rules.address(_index(token), _table(tables[b]), last)
            out += [last, block, offset, rules.live(_index(token), _index(length)),
                    rules.blocks_needed(_index(length)), rules.capacity(_index(length)),
                    ceil_div(arith_ops(_index), _index(length), 7)]
        return out

    got = np.array(_folded(emit), dtype=np.int64).reshape(len(cases), 7)
    for (b, length, token), row in zip(cases, got):
        rules = layout.rules()
        block, offset = layout.addresses(tables[b], token, length)
        want = [rules.last_table_slot(length), block, offset, token < length,
                layout.blocks_needed(length), layout.capacity(length), -(-length // 7)]
        np.testing.assert_array_equal(row, want, err_msg=f"table {b} length {length} "
                                                         f"token {token}")


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("signed", [False, True], ids=["index", "i32-signed"])
def test_ir_slot_rules_match_numpy(block_size, signed):
    """The kernels' split (index, unsigned division) and cache_write's lowering (i32,
    signed): the same block and offset for every slot inside the pool, the same
    kept / inside verdicts for every slot."""
    rng = seeded_rng(SEED + 400 + block_size)
    layout, pool = CacheLayout.paged(block_size), int(rng.integers(1, 9))
    capacity = pool * block_size
    slots = np.concatenate([np.arange(-block_size - 2, capacity + block_size + 2),
                            rng.integers(-10 ** 6, 10 ** 6, 40)])
    const = _i32 if signed else _index

    def emit():
        out = []
        for slot in slots:
            rules = layout.rules(arith_ops(const, signed=signed))
            block, offset, inside = rules.pool_slot(const(slot), const(pool))
            out += [block, offset, inside, rules.kept(const(slot)),
                    rules.slot(rules.slot_block(const(slot)), rules.slot_offset(const(slot)))]
        return out

    got = np.array(_folded(emit), dtype=np.int64).reshape(len(slots), 5)
    block, offset, inside = layout.pool_slots(slots, pool)
    np.testing.assert_array_equal(got[:, 2], inside)
    np.testing.assert_array_equal(got[:, 3], layout.kept(slots))
    np.testing.assert_array_equal(got[inside, 0], block[inside])
    np.testing.assert_array_equal(got[inside, 1], offset[inside])
    kept = slots >= 0
    np.testing.assert_array_equal(got[kept, 4], slots[kept])   # slot(split(s)) == s


def test_text_rules():
    rules = CacheLayout.paged(16).rules(TEXT_OPS)
    last = rules.last_table_slot("len")
    assert last == "((len - 1) / 16)"
    assert rules.address("t", lambda slot: f"table[{slot}]", last) == (
        "table[min((t / 16), ((len - 1) / 16))]", "(t % 16)")
    assert rules.pool_slot("s", "NB") == ("(s / 16)", "(s % 16)",
                                          "((s >= 0) & (s < (NB * 16)))")
    assert rules.blocks_needed("n") == "((n + 15) / 16)"
    # NUMPY_OPS evaluates the same expressions
    assert CacheLayout.paged(16).rules(NUMPY_OPS).last_table_slot(33) == 2
