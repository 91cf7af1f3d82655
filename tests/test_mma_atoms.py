"""MMA atoms (fragments/mma_atoms.py) and shared-memory layouts (fragments/smem_layouts.py),
checked against tables written here from the ISA text, element by element, and against
the simulator's independent semantics (simulator/isa.py, simulator/wgmma.py)."""

import itertools

import numpy as np
import pytest

from int8attn.fragments import (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16, SM80_MMA_BF16,
                                SM80_MMA_S8, mma_layouts)
from int8attn.fragments.mma_atoms import (ATOMS, WARPGROUP, WGMMA_S32_N, WGMMA_SYNC, mma_atom,
                                          wgmma_atom)
from int8attn.fragments.smem_layouts import kmajor_layout, kmajor_offsets
from int8attn.simulator import wgmma as sim
from int8attn.simulator.atoms import simulate_atom

# -- the ISA tables: (lane, slot) -> (row, col), one element at a time ------------------


def _ptx_m16n8k32_a(l, s):
    # registers a0..a3 of 4 bytes: rows {g, g+8, g, g+8}, k {4t.., 4t.., 16+4t.., 16+4t..}
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return g + 8 * (reg % 2), 16 * (reg // 2) + 4 * t + byte


def _ptx_m16n8k32_b(l, s):
    # registers b0, b1 of 4 bytes: k {4t.., 16+4t..}, column g
    g, t = l // 4, l % 4
    reg, byte = divmod(s, 4)
    return 16 * reg + 4 * t + byte, g


def _ptx_m16n8_c(l, i):
    # c0..c3: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
    g, t = l // 4, l % 4
    return g + 8 * (i // 2), 2 * t + i % 2


def _ptx_m16n8k16_a(l, s):
    # bf16 a0..a3 of 2 elements: rows {g, g+8, g, g+8}, k {2t.., 2t.., 2t+8.., 2t+8..}
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return g + 8 * (reg % 2), 8 * (reg // 2) + 2 * t + element


def _ptx_m16n8k16_b(l, s):
    # bf16 b0, b1 of 2 elements: k {2t.., 2t+8..}, column g
    g, t = l // 4, l % 4
    reg, element = divmod(s, 2)
    return 8 * reg + 2 * t + element, g


_AMD_A = lambda l, j: (l % 16, 8 * (l // 16) + j)
_AMD_B = lambda l, j: (8 * (l // 16) + j, l % 16)
ISA_TABLES = {  # name: (lanes, {operand: (slots, element)})
    GFX936_MMAC.name: (64, {"a": (8, _AMD_A), "b": (8, _AMD_B),
                            "c": (4, lambda l, i: (l % 16, l // 16 + 4 * i))}),   # jump layout
    GFX942_MFMA.name: (64, {"a": (8, _AMD_A), "b": (8, _AMD_B),
                            "c": (4, lambda l, i: (4 * (l // 16) + i, l % 16))}),
    GFX942_MFMA_32X32X16.name: (64, {
        "a": (8, lambda l, j: (l % 32, 8 * (l // 32) + j)),
        "b": (8, lambda l, j: (8 * (l // 32) + j, l % 32)),
        "c": (16, lambda l, i: (8 * (i // 4) + 4 * (l // 32) + i % 4, l % 32))}),
    SM80_MMA_S8.name: (32, {"a": (16, _ptx_m16n8k32_a), "b": (8, _ptx_m16n8k32_b),
                            "c": (4, _ptx_m16n8_c)}),
    SM80_MMA_BF16.name: (32, {"a": (8, _ptx_m16n8k16_a), "b": (4, _ptx_m16n8k16_b),
                              "c": (4, _ptx_m16n8_c)}),
}
INSTRUCTIONS = {i.name: i for i in (GFX936_MMAC, GFX942_MFMA, GFX942_MFMA_32X32X16,
                                    SM80_MMA_S8, SM80_MMA_BF16)}


def _table(lanes, slots, element):
    return np.array([[element(l, s) for s in range(slots)] for l in range(lanes)])


@pytest.mark.parametrize("name", ISA_TABLES)
def test_atom_layouts_and_lane_tables_equal_the_isa_tables(name):
    atom, inst = mma_atom(name), INSTRUCTIONS[name]
    lanes, operands = ISA_TABLES[name]
    assert atom.scope.threads == inst.wave_size == lanes and atom.sync is None
    for operand, (slots, element) in operands.items():
        want = _table(lanes, slots, element)
        layout = atom.layout(operand)
        assert np.array_equal(layout.table(["lane", "register"], ["row", "col"]), want)
        assert np.array_equal(getattr(inst, operand).coords, want)      # the derived view
        assert mma_layouts(inst).operand(operand) == layout
        assert layout.is_bijective()


def test_atoms_carry_the_instruction():
    assert set(ATOMS) == set(ISA_TABLES)
    s8 = mma_atom(SM80_MMA_S8.name)
    assert s8.mnemonic == "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
    assert (s8.m, s8.n, s8.k, s8.types, s8.scope.name) == (16, 8, 32, ("s8", "s8", "s32"), "warp")
    assert s8.a.source == s8.b.source == "registers" and s8.semantics == ("isa", "cuda")
    assert mma_atom(GFX936_MMAC.name).intrinsic == "llvm.amdgcn.mmac.i32.16x16x32i8"
    with pytest.raises(KeyError, match="wgmma_atom"):
        mma_atom("wgmma")


@pytest.mark.parametrize("name", ISA_TABLES)
def test_atom_semantics_is_the_simulators_instruction(name):
    """Operands distributed by the atom's layouts through the simulator's model give A x B + C."""
    atom = mma_atom(name)
    seed = 46
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    floats = atom.types[2] == "f32"
    draw = (lambda shape: rng.integers(-8, 8, shape).astype(np.float32)) if floats else (
        lambda shape: rng.integers(-128, 128, shape))
    a, b, c = draw((atom.m, atom.k)), draw((atom.k, atom.n)), draw((atom.m, atom.n))
    regs = lambda layout, matrix: matrix[tuple(layout.table(["lane", "register"],
                                                            ["row", "col"]).transpose(2, 0, 1))]
    lane_a = regs(atom.layout("a"), a)[None].astype(np.float32 if floats else np.int8)
    lane_b = regs(atom.layout("b"), b)[None].astype(lane_a.dtype)
    lane_c = regs(atom.layout("c"), c)[None].astype(np.float32 if floats else np.int32)
    d = simulate_atom(atom, lane_a, lane_b, lane_c)
    assert np.array_equal(d[0], regs(atom.layout("c"), a @ b + c))


# -- wgmma m64nNk32: the PTX ISA's fragments, one element at a time -----------------------

def _wgmma_a(t, s):
    # PTX ISA Figure 152 (m64nNk32 A, .s8/.u8): warp t // 32 holds rows 16w..16w+15; within
    # it, a0..a15 = four .b32 of 4 bytes: rows {g, g+8, g, g+8}, k {4t'.., 4t'.., 16+4t'..}
    w, lane = divmod(t, 32)
    g, q = lane // 4, lane % 4
    reg, byte = divmod(s, 4)
    return 16 * w + g + (8 if reg in (1, 3) else 0), (16 if reg >= 2 else 0) + 4 * q + byte


def _wgmma_d(t, i):
    # PTX ISA Figure 153 (m64nNk32 D, .s32): d0..d(N/2-1); each 8 columns j take four
    # registers: (g, 2q), (g, 2q+1), (g+8, 2q), (g+8, 2q+1)
    w, lane = divmod(t, 32)
    g, q = lane // 4, lane % 4
    j, r = divmod(i, 4)
    return 16 * w + g + (8 if r >= 2 else 0), 8 * j + 2 * q + (r & 1)


@pytest.mark.parametrize("n", WGMMA_S32_N)
def test_wgmma_register_layouts_equal_the_ptx_tables(n):
    atom = wgmma_atom(n)
    assert (atom.m, atom.n, atom.k, atom.scope) == (64, n, 32, WARPGROUP)
    assert atom.sync == WGMMA_SYNC and atom.a.source == "registers" and atom.b.source == "shared"
    assert atom.mnemonic == f"wgmma.mma_async.sync.aligned.m64n{n}k32.s32.s8.s8"
    a = atom.layout("a").table(["lane", "register"], ["row", "col"])
    assert np.array_equal(a, _table(128, 16, _wgmma_a)) and atom.layout("a").is_bijective()
    assert atom.c.registers == n // 2 and atom.c.vector == (n // 2,)
    c = atom.layout("c").table(["lane", "register"], ["row", "col"])[:, :n // 2]
    want = _table(128, n // 2, _wgmma_d)
    assert np.array_equal(c, want)
    # each of the 64 x N accumulator elements once
    assert len({tuple(e) for e in want.reshape(-1, 2)}) == 64 * n and want[..., 1].max() == n - 1
    # and the simulator's tables (written from the same text, independently of fragments/)
    for byte in range(16):
        assert np.array_equal(np.stack(sim.a_register_element(byte), -1), a[:, byte])
    for register in range(n // 2):
        assert np.array_equal(np.stack(sim.d_register_element(register), -1), c[:, register])


def test_wgmma_a_is_mma_sync_a_per_warp_and_not_its_c():
    atom = wgmma_atom(32)
    a = atom.layout("a").table(["lane", "register"], ["row", "col"])
    assert np.array_equal(a[:32], SM80_MMA_S8.a.coords)
    assert np.array_equal(a[32:64, :, 0], SM80_MMA_S8.a.coords[..., 0] + 16)
    # scores in C registers (N = 32 columns) are not where A wants them: thread 0 holds
    # k 0-3 and 16-19 of rows 0 and 8 in A, columns 0-1, 8-9, 16-17, 24-25 in C
    c = atom.layout("c").table(["lane", "register"], ["row", "col"])
    assert sorted(set(a[0, :, 1].tolist())) == [0, 1, 2, 3, 16, 17, 18, 19]
    assert sorted(set(c[0, :, 1].tolist())) == [0, 1, 8, 9, 16, 17, 24, 25]


def test_wgmma_refuses_what_ptx_does_not_have():
    for n in (0, 40, 56, 72, 264):
        with pytest.raises(ValueError, match="16i from 48"):
            wgmma_atom(n)
    with pytest.raises(ValueError, match="A source 'smem'"):
        wgmma_atom(64, a="smem")
    with pytest.raises(ValueError, match="A type 's4'"):
        wgmma_atom(64, a_type="s4")
    with pytest.raises(ValueError, match="shared memory"):
        wgmma_atom(64, a="none").layout("a")
    atom = wgmma_atom(64, a="128B", b="none", a_type="u8")
    assert atom.name == "wgmma.m64n64k32.u8.s8.SS" and atom.a.swizzle == "128B"


# -- shared-memory tiles --------------------------------------------------------------------

def test_a_v_cache_block_is_the_no_swizzle_k_major_b_tile():
    # two consecutive V blocks [D = 128, BS = 16] int8, token innermost: byte 2048 b + 16 d + t
    # holds (token 16 b + t, head dim d) -- B's row n = d, k = token
    tile = kmajor_layout("none", rows=128, k_bytes=32, lbo=2048, sbo=128)
    offset = np.arange(4096)
    block, d, t = offset // 2048, offset % 2048 // 16, offset % 16
    got = tile.apply(offset=offset)
    assert np.array_equal(got["row"], d) and np.array_equal(got["k"], 16 * block + t)
    # LBO and SBO are not interchangeable
    assert kmajor_offsets("none", 128, 32, lbo=128, sbo=2048) != tile.invert()


def test_a_k_cache_block_needs_its_chunks_swizzled_for_the_128b_tile():
    # K block [BS = 16, D = 128] int8: token n, byte d at 128 n + d -- the 128B atom's shape
    tile = kmajor_layout("128B", rows=16, k_bytes=128)
    offset = np.arange(2048)
    row, chunk, byte = offset // 128, offset % 128 // 16, offset % 16
    got = tile.apply(offset=offset)
    assert np.array_equal(got["row"], row)
    assert not np.array_equal(got["k"], offset % 128)          # as stored: not the layout
    assert np.array_equal(got["k"], 16 * (chunk ^ (row % 8)) + byte)   # chunk c at c ^ (r % 8)


def test_tiles_that_overlap_or_leave_gaps_are_refused():
    with pytest.raises(ValueError, match="two elements on one byte"):
        kmajor_offsets("none", 16, 32, lbo=128, sbo=128)
    with pytest.raises(ValueError, match="leaves gaps"):
        kmajor_layout("none", 16, 32, lbo=4096, sbo=128)
    with pytest.raises(ValueError, match="power of two"):
        kmajor_offsets("none", 16, 32, lbo=96, sbo=256)
    with pytest.raises(ValueError, match="at most 128"):
        kmajor_offsets("128B", 8, 256)


@pytest.mark.parametrize("swizzle,lbo,sbo", [("none", 128, 256), ("none", 2048, 128),
                                             ("none", 1024, 2048), ("128B", None, 1024),
                                             ("128B", None, 2048)])
def test_tile_offsets_are_the_descriptors_addresses(swizzle, lbo, sbo):
    rows, k_bytes = 64, 32 if swizzle == "none" else 128
    offsets = kmajor_offsets(swizzle, rows, k_bytes, lbo, sbo)
    for step in range(k_bytes // 32):       # a K step of 32 bytes: the next descriptor start
        start = 32 * step if swizzle == "128B" else 2 * lbo * step
        row, k = np.meshgrid(np.arange(rows), np.arange(32), indexing="ij")
        desc = sim.Descriptor(start, lbo or 16, sbo, swizzle)
        want = offsets.apply(row=row, k=32 * step + k)["offset"]
        assert np.array_equal(sim.smem_address(desc, row, k), want)


# -- one warpgroup's A x B through the layouts and the simulator -------------------------------

def _smem_image(tile, matrix, rows):
    """Bytes of a shared-memory tile (offset -> (row, k)) holding `matrix` [rows, k]."""
    got = tile.apply(offset=np.arange(tile.in_size("offset")))
    image = np.zeros(tile.in_size("offset"), np.uint8)
    used = got["row"] < rows
    image[used] = matrix[got["row"][used], got["k"][used]].view(np.uint8)
    return image


def _tile_and_desc(swizzle, rows, step):
    """A dense tile of `rows` (to a power of two) and the descriptor of K step `step`."""
    padded = 1 << (rows - 1).bit_length()
    if swizzle == "none":
        tile = kmajor_layout("none", padded, 32, lbo=128, sbo=256)
        return tile, sim.Descriptor(0, 128, 256, "none")
    return kmajor_layout("128B", max(padded, 8), 128), sim.Descriptor(32 * step, 16, 1024, "128B")


@pytest.mark.parametrize("form,swizzle", [("RS", "none"), ("RS", "128B"), ("SS", "none"),
                                          ("SS", "128B")])
@pytest.mark.parametrize("n", [8, 24, 64, 256])
@pytest.mark.parametrize("types", [("s8", "s8"), ("u8", "s8"), ("s8", "u8")])
def test_wgmma_layouts_reproduce_a_times_b(form, swizzle, n, types):
    seed = 4600 + n
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    a_type, b_type = types
    atom = wgmma_atom(n, a="registers" if form == "RS" else swizzle, b=swizzle,
                      a_type=a_type, b_type=b_type)
    dtype = {"s8": np.int8, "u8": np.uint8}
    draw = lambda t, shape: rng.integers(np.iinfo(dtype[t]).min, np.iinfo(dtype[t]).max + 1,
                                         shape).astype(dtype[t])
    steps = 4 if swizzle == "128B" else 1         # K steps along one 128-byte swizzled row
    a, b = draw(a_type, (64, 32 * steps)), draw(b_type, (32 * steps, n))
    c = rng.integers(-2**20, 2**20, (64, n))
    c_table = atom.layout("c").table(["lane", "register"], ["row", "col"])[:, :n // 2]
    c_regs = c[c_table[..., 0], c_table[..., 1]].astype(np.int32)
    b_tile, _ = _tile_and_desc(swizzle, n, 0)
    b_image = _smem_image(b_tile, np.ascontiguousarray(b.T), n)       # K-major: row n
    a_tile, _ = _tile_and_desc(swizzle, 64, 0)
    a_image = _smem_image(a_tile, a, 64)
    for step in range(steps):
        a_step = a[:, 32 * step:32 * step + 32]
        if form == "RS":
            a_table = atom.layout("a").table(["lane", "register"], ["row", "col"])
            a_operand = a_step[a_table[..., 0], a_table[..., 1]]
        else:
            a_operand = (a_image, _tile_and_desc(swizzle, 64, step)[1])
        d = simulate_atom(atom, c_regs, (b_image, _tile_and_desc(swizzle, n, step)[1]), a_operand)
        want = a_step.astype(np.int64) @ b[32 * step:32 * step + 32].astype(np.int64) + c
        assert np.array_equal(d, want[c_table[..., 0], c_table[..., 1]])


def test_swapping_lbo_and_sbo_reads_other_bytes():
    seed = 47
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    b = rng.integers(-128, 128, (64, 32)).astype(np.int8)               # [n, k]
    image = _smem_image(kmajor_layout("none", 64, 32, lbo=128, sbo=256), b, 64)
    good = sim.read_operand(image, sim.Descriptor(0, 128, 256), 64, "s8")
    swapped = sim.read_operand(image, sim.Descriptor(0, 256, 128), 64, "s8")
    assert np.array_equal(good, b) and not np.array_equal(swapped, b)
