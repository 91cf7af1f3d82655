"""raise-int8-attention's mask semantics: exactly int8attn's causal mask, or nothing."""

import numpy as np
import pytest

from int8attn.passes.attention_match import (MASKED, NotRaised, additive_keep, causal,
                                             check_mask)


@pytest.mark.parametrize("query_tokens, tokens", [(1, 1), (1, 300), (4, 8), (16, 316), (8, 8)])
def test_the_causal_mask_is_accepted_in_any_broadcast_shape(query_tokens, tokens):
    keep = causal(query_tokens, tokens)
    assert keep[-1].all() and keep[0].sum() == tokens - query_tokens + 1
    for shaped in (keep, keep[None, None], np.broadcast_to(keep, (2, 4, query_tokens, tokens))):
        check_mask(shaped, [2, 4, query_tokens, tokens], tokens)


@pytest.mark.parametrize("shift", [-1, 1])
def test_a_mask_off_by_one_diagonal_is_refused(shift):
    keep = np.arange(8)[None, :] <= (8 - 4 + shift + np.arange(4))[:, None]
    with pytest.raises(NotRaised, match="the mask is not causal"):
        check_mask(keep, [1, 4, 4, 8], 8)


def test_an_upper_left_causal_mask_over_a_longer_cache_is_refused():
    upper_left = np.arange(8)[None, :] <= np.arange(4)[:, None]
    with pytest.raises(NotRaised, match="query token 0 .position 4. does not see token 1"):
        check_mask(upper_left, [1, 4, 4, 8], 8)


def test_one_head_with_another_mask_is_refused():
    keep = np.broadcast_to(causal(4, 8), (1, 4, 4, 8)).copy()
    keep[0, 3, 2, 0] = False
    with pytest.raises(NotRaised, match="query token 2 .position 6. does not see token 0"):
        check_mask(keep, [1, 4, 4, 8], 8)


def test_decode_takes_no_mask_or_one_that_hides_nothing():
    check_mask(None, [1, 4, 1, 8], 8)
    check_mask(np.ones((1, 8), bool), [1, 4, 1, 8], 8)
    padded = np.ones((1, 8), bool)
    padded[0, 7] = False
    with pytest.raises(NotRaised, match="does not see token 7"):
        check_mask(padded, [1, 4, 1, 8], 8)
    with pytest.raises(NotRaised, match="without a mask .bidirectional."):
        check_mask(None, [1, 4, 4, 8], 8)


def test_additive_masks_count_after_the_factors_applied_later():
    mask = np.where(causal(4, 8), 0.0, -np.inf)
    assert np.array_equal(additive_keep(mask, 0.125), causal(4, 8))
    assert additive_keep(np.array([0.0, MASKED / 100]), 100.0).tolist() == [True, False]
    with pytest.raises(NotRaised, match="a bias, not a mask"):
        additive_keep(np.array([0.0, -1e4]), 1.0)   # exp(-1e4 + s) is 0 only for small s
    with pytest.raises(NotRaised, match="not a constant"):
        additive_keep(None, 1.0)
