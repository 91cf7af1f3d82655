"""Two-term W and Q (docs/design.md §2c) in the lane kernels, in the simulator.

- Paged decode with two W terms (the second scaled on the residual, or W's low digit),
  s8 and u8 first terms, on every target, at 4 and 16 query rows per KV head: every
  sequence within both references (tests/accuracy.py, the tolerances of two W terms),
  and far from the one-term contract (a kernel that dropped the second term would be
  there); a digit kernel also far from the scaled contract (and the reverse).
- Where PV's C layout keeps a row and its shift in one lane (cuda, 4 rows: shift 8;
  gfx942, 2 rows: shift 2), the second term sits in the padding rows of the first's
  A tile: one PV MMAC per group instead of two, bitwise the same output.
- u8 with two terms on cuda: the column sums' ones rows would be the second term's
  rows, so packed, the kernel takes them from one more MMAC with A all ones: as many
  MMACs as unpacked (why the kernels' default is s8), the same output.
- Two-term Q as digits (q-second digit, the kernels' default) on every target: within
  both references and far from the scaled-Q contract (packed into the padding rows:
  tests/test_paged_kernels.py).
"""

from dataclasses import replace

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import seeded_rng
from int8attn.contract.numerics import DIGIT_NUMERICS, Numerics
from int8attn.kernels.target_spec import target_spec
from int8attn.reference import fragment_attention, sequence_cache
from int8attn.simulator.decode import simulate_paged
from test_paged import paged_batch
from test_paged_kernels import packed_and_unpacked

SCALE = np.float32(0.125)


def _sequences(out, arrays):
    q, k, ks, v, vs, tables, lens = arrays
    for b in range(q.shape[0]):
        yield out[b:b + 1], (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b))


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("w_quant", ["s8", "u8"])
@pytest.mark.parametrize("w_second", ["scaled", "digit"])
@pytest.mark.parametrize("q_heads", [8, 32])
def test_two_w_terms_in_every_kernel_within_both_references(target, w_quant, w_second, q_heads):
    seed = 310 + len(w_quant) + len(w_second) + q_heads
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 200, 700], q_heads, 2, 64, 16)
    numerics = Numerics(q_terms=2, w_quant=w_quant, w_terms=2, w_second=w_second)
    out = simulate_paged(*arrays, SCALE, target=target, numerics=numerics)
    one_term = replace(numerics, w_terms=1, w_second="scaled")
    other = replace(numerics, w_second="scaled" if w_second == "digit" else "digit")
    for got, dense in _sequences(out, arrays):
        check_against_references(got, dense, SCALE, model=target, numerics=numerics)
        if dense[1].shape[2] < 32:      # too few tokens for W rounding to show
            continue
        # One W term rounds W to ~1/254 of a group's absmax; two terms to ~1/32000,
        # each second term its own way.
        kept, dropped, swapped = (
            np.abs(got - fragment_attention(*dense, SCALE, model=target, numerics=n)).max()
            for n in (numerics, one_term, other))
        print(f"{target} {w_quant} {w_second} Hq {q_heads} seed {seed}: vs its contract "
              f"{kept:.1e}, vs one term {dropped:.1e}, vs the other second term {swapped:.1e}")
        assert dropped > 100 * max(kept, 1e-7) and swapped > 3 * max(kept, 1e-7)


def _paged_mmas(target, q_heads, kv_heads, head_dim, numerics, arrays, mma):
    """(outputs, MMA count) of the paged kernels without and with W term packing."""
    return packed_and_unpacked(target, q_heads, kv_heads, head_dim, numerics, arrays, mma,
                               "pack_w_terms", float(SCALE))


@pytest.mark.parametrize("target, q_heads, kv_heads, head_dim, mma", [
    ("cuda", 8, 2, 64, "nvgpu.mma.sync"),       # rows g and g+8 share a lane: shift 8
    ("gfx942", 4, 2, 128, "amdgpu.mfma"),       # 2 rows: rows r and r+2 share a lane
])
@pytest.mark.parametrize("w_second", ["scaled", "digit"])
def test_two_w_terms_in_the_padding_rows_are_bitwise_the_two_mmac_form(target, q_heads,
                                                                       kv_heads, head_dim, mma,
                                                                       w_second):
    seed = 331
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 300, 700], q_heads, kv_heads, head_dim, 16)
    numerics = replace(DIGIT_NUMERICS, w_second=w_second)
    (unpacked, packed), counts = _paged_mmas(target, q_heads, kv_heads, head_dim,
                                             numerics, arrays, mma)
    assert np.array_equal(unpacked, packed)
    pv_layout = target_spec(target).model
    mmacs = pv_layout.mmacs_per_wave * head_dim // pv_layout.instruction.n
    assert counts[0] - counts[1] == mmacs
    for got, dense in _sequences(packed, arrays):
        check_against_references(got, dense, SCALE, model=target, numerics=numerics)


def test_unsigned_two_terms_on_cuda_take_the_column_sums_from_one_more_mmac():
    # u8's ones rows and the second term both want row + 8: packed, the second term
    # takes them and the column sums come from an all-ones MMAC (two MMACs per group
    # either way).
    seed = 337
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [5, 400], 8, 2, 64, 16)
    numerics = Numerics(q_terms=2, w_quant="u8", w_terms=2, w_second="digit")
    (unpacked, packed), counts = _paged_mmas("cuda", 8, 2, 64, numerics, arrays,
                                             "nvgpu.mma.sync")
    assert np.array_equal(unpacked, packed)
    assert counts[0] == counts[1]
    for got, dense in _sequences(packed, arrays):
        check_against_references(got, dense, SCALE, model="cuda", numerics=numerics)


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
@pytest.mark.parametrize("q_heads", [8, 32])
def test_q_digits_in_every_kernel_within_both_references(target, q_heads):
    seed = 360 + q_heads
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 200, 700], q_heads, 2, 64, 16)
    out = simulate_paged(*arrays, SCALE, target=target)            # the kernels' default
    assert DIGIT_NUMERICS.q_digits
    scaled_q = replace(DIGIT_NUMERICS, q_second="scaled")
    for got, dense in _sequences(out, arrays):
        check_against_references(got, dense, SCALE, model=target, numerics=DIGIT_NUMERICS)
        kept, swapped = (
            np.abs(got - fragment_attention(*dense, SCALE, model=target, numerics=n)).max()
            for n in (DIGIT_NUMERICS, scaled_q))
        print(f"{target} Hq {q_heads} seed {seed}: vs its contract {kept:.1e}, vs scaled Q "
              f"{swapped:.1e}")
        if dense[1].shape[2] > 1:        # one token: every weight is 1, q's rounding gone
            assert swapped > 3 * max(kept, 1e-7)
