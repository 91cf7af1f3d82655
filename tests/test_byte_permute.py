"""cuda's byte permute (PTX prmt.b32) packs the W levels fed into PV's A operand.

The simulator's `byte_permute` is checked against the PTX ISA's definition written out
byte by byte; then the prefill kernel built with it must give the bits the shift-and-
mask packing gives, for one-term numerics and the default (digits: the high digit
is a shifted sum, the low one the biased sum itself, `LEVEL_BYTE`), and the tile loop
must hold the permutes and no byte masks.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from iree.compiler import ir

from conftest import first_loop_body, seeded_rng
from int8attn.contract.numerics import ONE_TERM_NUMERICS
from int8attn.driver.options import KERNEL_TARGET_NUMERICS
from int8attn.kernels.prefill import build_prefill_kernels
from int8attn.kernels.shapes import PrefillShape
from int8attn.kernels.target_spec import (BYTE_PERMUTE, LOW_BYTES_OF_PAIR,
                                          LOW_HALVES_OF_PAIR, target_spec)
from int8attn.simulator.compute_ops import byte_permute
from int8attn.support.ir import new_context
from test_prefill import prefill_inputs

CUDA = target_spec("cuda")


def prmt_by_the_book(a: int, b: int, c: int) -> int:
    """PTX ISA, prmt.b32 default mode, for one lane."""
    source = list((a & 0xFFFFFFFF).to_bytes(4, "little") + (b & 0xFFFFFFFF).to_bytes(4, "little"))
    out = []
    for i in range(4):
        selector = (c >> (4 * i)) & 0xF
        byte = source[selector & 7]
        if selector & 8:                    # replicate the selected byte's sign
            byte = 0xFF if byte & 0x80 else 0x00
        out.append(byte)
    return int.from_bytes(bytes(out), "little", signed=True)


def test_the_simulated_permute_is_ptxs():
    rng = seeded_rng(7301)
    a, b = (rng.integers(-2 ** 31, 2 ** 31, 500, dtype=np.int64).astype(np.int32) for _ in "ab")
    selectors = rng.integers(0, 2 ** 16, 500)
    selectors[:2] = (LOW_BYTES_OF_PAIR, LOW_HALVES_OF_PAIR)
    got = byte_permute(a, b, selectors)
    assert got.dtype == np.int32
    expected = [prmt_by_the_book(int(x), int(y), int(s)) for x, y, s in zip(a, b, selectors)]
    np.testing.assert_array_equal(got, expected)


def test_the_two_selectors_pack_four_low_bytes():
    levels = [0x4B40007F, 0x4B3FFF81, 0x4B400000, 0x4B3FFFFF]     # biased sums: 127, -127, 0, -1
    pair1 = byte_permute(levels[0], levels[1], LOW_BYTES_OF_PAIR)
    pair2 = byte_permute(levels[2], levels[3], LOW_BYTES_OF_PAIR)
    word = int(byte_permute(pair1, pair2, LOW_HALVES_OF_PAIR))
    assert list(word.to_bytes(4, "little", signed=True)) == [0x7F, 0x81, 0x00, 0xFF]


def _prefill(args, numerics, spec=CUDA) -> tuple[np.ndarray, str]:
    """The cuda prefill kernel (B 1, 8 query heads over 2, S 160, Sq 96, D 64) in the
    simulator: (its output, its first tile loop's IR)."""
    from int8attn.simulator.prefill import run_prefill_kernels

    prefill = PrefillShape(1, 2, 4, 160, 96, 64, 0.125)
    with new_context(), ir.Location.unknown():
        built = build_prefill_kernels(prefill, spec, numerics=numerics)
        return (run_prefill_kernels(built.module, built.layout, *args),
                first_loop_body(str(built.module)))


@pytest.mark.parametrize("numerics", [ONE_TERM_NUMERICS, KERNEL_TARGET_NUMERICS], ids=["one-term", "digits"])
def test_the_permute_packs_the_bits_the_masks_pack(numerics):
    args = prefill_inputs(7302, 1, 8, 2, 160, 96, 64)
    outs, loops = zip(*(_prefill(args, numerics, spec)
                        for spec in (CUDA, dataclasses.replace(CUDA, byte_permute=None))))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.isfinite(outs[0]).all() and np.abs(outs[0]).max() > 0
    with_permute, with_masks = loops
    assert with_permute.count(BYTE_PERMUTE) > 0 == with_masks.count(BYTE_PERMUTE)
    byte_masks = lambda text: len(re.findall(r"arith\.andi [^\n]*: i32\n", text))
    assert byte_masks(with_permute) < byte_masks(with_masks)


@pytest.mark.parametrize("numerics", [ONE_TERM_NUMERICS, KERNEL_TARGET_NUMERICS], ids=["one-term", "digits"])
def test_a_nonfinite_w_group_reaches_only_its_rows(numerics):
    # A level handed over as LEVEL_BYTE skips the zero of a non-finite group (its bits
    # are NaN's): the group's scale is NaN, so every product of its sum is NaN anyway.
    # That holds only if the group's levels reach its own row's sums alone: a NaN q
    # row (all of its W groups non-finite) must leave every other row bitwise as it
    # was, and a NaN V scale (its token's W non-finite in every row that sees it) must
    # turn exactly the rows that see the token to NaN.
    args = list(prefill_inputs(7303, 1, 8, 2, 160, 96, 64))
    clean, _ = _prefill(args, numerics)
    assert np.isfinite(clean).all()

    q = args[0].copy()
    q[0, 5, 40, 3] = np.nan
    out, _ = _prefill([q] + args[1:], numerics)
    bad = np.zeros(out.shape[:-1], dtype=bool)
    bad[0, 5, 40] = True
    assert np.isnan(out[bad]).all()
    np.testing.assert_array_equal(out[~bad], clean[~bad])

    v_scale = args[4].copy()
    token = 100                                  # seen by queries 36.. (history 64)
    v_scale[0, 1, token] = np.inf
    out, _ = _prefill(args[:4] + [v_scale], numerics)
    sees = np.zeros(out.shape[:-1], dtype=bool)
    sees[0, 4:8, token - 64:] = True             # KV head 1's query heads 4..7
    assert np.isnan(out[sees]).all(axis=-1).all()
    np.testing.assert_array_equal(out[~sees], clean[~sees])
