"""transformers' generate() with attention "int8attn_paged" on a PagedInt8Cache, on the
CPU target: a tiny Llama (transformers' own modeling code, random weights) against its
sdpa f32 baseline, the pool kept in place, ragged left-padded batches, bad inputs named.

Prompts of 5, 23 and 40 tokens with a prefill chunk of 16 take every route: per-token
decode calls (5 < 16), one full chunk plus an overlapping last chunk (23), two full
chunks plus an overlapping one (40)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import seeded_rng

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from int8attn.driver.paged_decode import PoolExhausted  # noqa: E402
from int8attn.runtime.module import InputError  # noqa: E402
from int8attn.serving.transformers_attention import (  # noqa: E402
    PagedInt8Cache, cache_keyword, install, paged_attention_for)
from int8attn.serving.transformers_cache import torch_cache_write  # noqa: E402

PROMPTS, CHUNK, STEPS, SEED = [5, 23, 40], 16, 6, 2200

# Tolerance, from the quantization: K and V are stored as int8 per token and head, and the
# softmax weights W enter PV as int8 per group, each with a step of absmax/127, so each
# rounding moves its values by at most half a step, 1/254 of the row's absmax. Three such
# roundings per layer, two layers: the logits may move by 6/254 (~2.4%) of their range.
# (Measured: ~0.5%.) A logit shift of at most `tol` everywhere bounds the KL divergence
# by ~tol^2/2 (second order in the shift).
LOGITS_RELATIVE_TOL = 6 / 254


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer Llama (hidden 128, 4 query heads over 2 KV heads, head dim 32), f32,
    installed to run int8attn_paged; and its PagedAttention on the cpu target."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, eos_token_id=None, pad_token_id=0)
    print(f"random weights: torch.manual_seed({SEED})", file=sys.stderr)
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    install(model)
    return model, paged_attention_for(config, target="cpu")


def left_padded(lengths, seed=SEED):
    rng = seeded_rng(seed)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.from_numpy(rng.integers(3, 512, n))
        mask[row, width - n:] = 1
    return ids, mask


def paged_generate(model, attention, ids, mask, steps=STEPS, **cache_options):
    model.set_attn_implementation("int8attn_paged")
    options = {"chunk": CHUNK, **cache_options}
    cache = PagedInt8Cache(model.config, attention, blocks=32, **options)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, **{cache_keyword(model): cache},
                             max_new_tokens=steps, do_sample=False, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1), cache


def sdpa_teacher_forced(model, ids, mask, tokens):
    """The sdpa baseline's logits on the prefixes `tokens` extends the prompts by."""
    model.set_attn_implementation("sdpa")
    key, cache = cache_keyword(model), transformers.DynamicCache(config=model.config)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                    **{key: cache}, use_cache=True)
        logits = [out.logits[:, -1]]
        for step in range(tokens.shape[1] - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            out = model(input_ids=tokens[:, step:step + 1], attention_mask=mask,
                        position_ids=mask.sum(-1, keepdim=True) - 1, **{key: cache},
                        use_cache=True)
            logits.append(out.logits[:, -1])
    model.set_attn_implementation("int8attn_paged")
    return torch.stack(logits, 1)


def test_each_step_logits_are_within_the_quantization_tolerance_of_sdpa(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    tokens, logits, _ = paged_generate(model, attention, ids, mask)
    baseline = sdpa_teacher_forced(model, ids, mask, tokens)
    tol = LOGITS_RELATIVE_TOL * baseline.abs().max().item()
    diff = (logits - baseline).abs().amax(-1)                     # [B, steps]
    log_p, log_q = baseline.log_softmax(-1), logits.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    print(f"logits max abs diff per step {diff.amax(0).tolist()}, tol {tol:.3g}; "
          f"KL max {kl.max().item():.3g}", file=sys.stderr)
    assert diff.max().item() <= tol
    assert kl.max().item() <= tol ** 2 / 2
    assert diff.max().item() > 0          # int8attn ran: sdpa would match to rounding


def test_the_pool_is_written_in_place_and_never_reallocated(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    writer = attention.executor("write")
    run, aliased = writer.run_positional, []

    def spy(tensors, **how):
        results = run(tensors, **how)
        aliased.append([r.data_ptr() == t.data_ptr() for r, t in zip(results, tensors[3:])])
        return results

    cache = PagedInt8Cache(model.config, attention, blocks=32, chunk=CHUNK)
    pool = [t for layer in cache.layers for t in layer.pool]
    pointers = [t.data_ptr() for t in pool]
    writer.run_positional = spy
    try:
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, **{cache_keyword(model): cache},
                           max_new_tokens=STEPS, do_sample=False)
    finally:
        del writer.run_positional
    assert [t for layer in cache.layers for t in layer.pool] == pool    # the same tensors
    assert [t.data_ptr() for t in pool] == pointers
    # one write per layer per forward, each one straight into the pool (no copy back)
    assert len(aliased) == model.config.num_hidden_layers * STEPS
    assert all(all(row) for row in aliased)
    assert cache.lengths.tolist() == [n + STEPS - 1 for n in PROMPTS]   # last token unwritten


def test_a_ragged_left_padded_batch_equals_each_prompt_alone(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    tokens, logits, _ = paged_generate(model, attention, ids, mask)
    width = ids.shape[1]
    for row, n in enumerate(PROMPTS):
        alone, alone_logits, _ = paged_generate(model, attention, ids[row:row + 1, width - n:],
                                                mask[row:row + 1, width - n:])
        assert torch.equal(alone[0], tokens[row])
        torch.testing.assert_close(alone_logits[0], logits[row], atol=1e-4, rtol=0)


def test_chunked_prefill_equals_token_by_token_prefill(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    tokens, logits, _ = paged_generate(model, attention, ids, mask, steps=2)
    by_token, by_token_logits, _ = paged_generate(model, attention, ids, mask, steps=2,
                                                  chunk=None)
    assert torch.equal(tokens, by_token)
    torch.testing.assert_close(logits, by_token_logits, atol=1e-5, rtol=0)


def test_torch_cache_write_is_the_write_kernel_bit_for_bit(tiny):
    _, attention = tiny
    rng = seeded_rng(2201)
    blocks, heads, size, dim, tokens = 6, 2, attention.block_size, 32, 50
    k = torch.from_numpy(rng.standard_normal((tokens, heads, dim)).astype(np.float32))
    k *= torch.logspace(-6, 6, tokens)[:, None, None]              # every exponent range
    v = torch.from_numpy(rng.standard_normal((tokens, heads, dim)).astype(np.float32))
    k[0, 0], k[1, 1], v[2, 0] = 0.0, 1e-37, -0.0                    # zero and tiny rows
    k[3, 0] = torch.arange(dim) * (0.5 / 127)                       # rounding ties
    slots = torch.from_numpy(rng.permutation(blocks * size)[:tokens].astype(np.int32))
    slots[7] = -1

    def pool():
        return [torch.zeros(blocks, heads, size, dim, dtype=torch.int8),
                torch.full((blocks, heads, size), float("nan")),
                torch.zeros(blocks, heads, dim, size, dtype=torch.int8),
                torch.full((blocks, heads, size), float("nan"))]

    kernel, ours = pool(), pool()
    attention.write(k, v, slots, *kernel)
    kept = slots >= 0
    torch_cache_write(k[kept], v[kept], slots[kept].long() // size, slots[kept].long() % size,
                      *ours)
    for a, b in zip(kernel, ours):
        assert torch.equal(a.view(torch.int8 if a.dtype == torch.int8 else torch.int32),
                           b.view(torch.int8 if b.dtype == torch.int8 else torch.int32))


def test_generation_through_the_torch_write_is_the_kernel_write(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    tokens, logits, _ = paged_generate(model, attention, ids, mask, steps=2)
    torch_tokens, torch_logits, cache = paged_generate(model, attention, ids, mask, steps=2,
                                                       write="torch")
    assert cache.writer == "torch"
    assert torch.equal(tokens, torch_tokens) and torch.equal(logits, torch_logits)


def _contiguous_view_dropped(cache):
    layer = cache.layers[0]
    wide = torch.zeros(*layer.k_cache.shape[:-1], 2 * layer.k_cache.shape[-1],
                       dtype=torch.int8)
    layer.k_cache = wide[..., ::2]                                   # right shape, strided


def _f64_scale(cache):
    cache.layers[1].v_scale = cache.layers[1].v_scale.double()


@pytest.mark.parametrize("spoil, message", [
    (_contiguous_view_dropped, r"k_cache.*not contiguous"),
    (_f64_scale, r"v_scale.*must be torch.float32"),
])
def test_a_bad_pool_gets_a_named_input_error(tiny, spoil, message):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    cache = PagedInt8Cache(model.config, attention, blocks=32, chunk=CHUNK)
    spoil(cache)
    with pytest.raises(InputError, match=message), torch.no_grad():
        model.generate(ids, attention_mask=mask, **{cache_keyword(model): cache},
                       max_new_tokens=2)


def test_bad_setups_are_named(tiny):
    model, attention = tiny
    ids, mask = left_padded(PROMPTS)
    key = cache_keyword(model)
    other = paged_attention_for(transformers.LlamaConfig(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
        num_hidden_layers=2), target="cpu")
    with pytest.raises(InputError, match=r"KV heads, head dim\) \(4, 4, 32\)"):
        PagedInt8Cache(model.config, other, blocks=32)
    right_padded = mask.flip(1)
    cache = PagedInt8Cache(model.config, attention, blocks=32, chunk=CHUNK)
    with pytest.raises(InputError, match="left padding only"), torch.no_grad():
        model(input_ids=ids, attention_mask=right_padded, **{key: cache})
    with pytest.raises(InputError, match="runs on a PagedInt8Cache"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask,
              **{key: transformers.DynamicCache(config=model.config)})
    small = PagedInt8Cache(model.config, attention, blocks=4, chunk=CHUNK)
    with pytest.raises(PoolExhausted, match="more blocks"), torch.no_grad():
        model(input_ids=ids, attention_mask=mask, **{key: small})
