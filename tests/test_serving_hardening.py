"""The serving layer's edges: the paged cache's step semantics (positions seen before the
step during a plain forward; a failed step rolled back whole), and the errors the
PagedAttention object, the torch tensor checks, `int8attn.compile` and the torch ops'
registry give. All on the cpu target."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, seeded_rng

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from int8attn.driver.targets import OptionRefused  # noqa: E402
from int8attn.runtime.module import InputError  # noqa: E402
from int8attn.serving import PagedAttention  # noqa: E402
from int8attn.serving.transformers_attention import (  # noqa: E402
    PagedInt8Cache, cache_keyword, install, paged_attention_for)

# as tests/test_transformers_attention.py: three int8 roundings per layer, two layers
LOGITS_RELATIVE_TOL = 6 / 254
CHUNK, SEED = 16, 2300
HQ, HKV, D, BS, NB = 8, 2, 64, 16, 8


@pytest.fixture(scope="module")
def tiny():
    """A 2-layer Llama (hidden 128, 4 query heads over 2 KV heads, head dim 32), f32,
    random weights, installed to run int8attn_paged; and its cpu PagedAttention."""
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(config).eval()
    install(model)
    return model, paged_attention_for(config, target="cpu")


def _tokens(n, seed):
    return torch.from_numpy(seeded_rng(seed).integers(3, 512, (1, n)))


def _positions(model):
    """A list the rotary embedding appends each forward's position ids to."""
    seen = []
    handle = model.model.rotary_emb.register_forward_hook(
        lambda m, args, kwargs, out: seen.append(kwargs["position_ids"][0].tolist()),
        with_kwargs=True)
    return seen, handle


def _plain_forwards(model, cache, prompt, following, with_mask):
    """A prompt and one next token as two plain forwards: no position_ids, no
    cache_position (the model numbers the tokens from the cache's length)."""
    key = cache_keyword(model)
    logits, positions, lengths = [], [], []
    seen, handle = _positions(model)
    probe = model.model.layers[0].register_forward_pre_hook(
        lambda *_: lengths.append(cache.get_seq_length()))
    try:
        with torch.no_grad():
            total = 0
            for ids in (prompt, following):
                total += ids.shape[1]
                extra = {"attention_mask": torch.ones(1, total, dtype=torch.long)} \
                    if with_mask else {}
                logits.append(model(input_ids=ids, **{key: cache}, use_cache=True,
                                    **extra).logits)
    finally:
        handle.remove()
        probe.remove()
    return logits, seen, lengths


@pytest.mark.parametrize("with_mask", [False, True], ids=["no mask", "padding mask"])
def test_plain_forwards_get_the_positions_and_logits_of_sdpa(tiny, with_mask):
    model, attention = tiny
    prompt, following = _tokens(40, SEED), _tokens(1, SEED + 1)
    model.set_attn_implementation("sdpa")
    try:
        want, want_positions, want_lengths = _plain_forwards(
            model, transformers.DynamicCache(config=model.config), prompt, following, with_mask)
    finally:
        model.set_attn_implementation("int8attn_paged")
    cache = PagedInt8Cache(model.config, attention, blocks=16, chunk=CHUNK)
    got, positions, lengths = _plain_forwards(model, cache, prompt, following, with_mask)
    assert want_positions == [list(range(40)), [40]]
    assert positions == want_positions
    assert lengths == want_lengths == [0, 40]      # during each step: the tokens before it
    assert cache.get_seq_length() == cache.seen == 41 and cache.lengths.tolist() == [41]
    assert cache.get_mask_sizes(1) == (42, 0) and cache.layers[0].get_mask_sizes(1) == (42, 0)
    for a, b in zip(got, want):
        tol = LOGITS_RELATIVE_TOL * b.abs().max().item()
        assert (a - b).abs().max().item() <= tol


def _state(cache):
    return (cache.lengths.tolist(), cache.seen, copy.deepcopy(cache.tables), list(cache.free))


def _step(model, cache, ids, total):
    """One forward after `total - ids.shape[1]` positions, as generate passes it."""
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones(1, total, dtype=torch.long),
                     position_ids=torch.arange(total - ids.shape[1], total)[None],
                     **{cache_keyword(model): cache}).logits


def _nan_keys(module, args, out):
    return out * float("nan")


def _raise(*_):
    raise RuntimeError("a failure after every layer ran")


@pytest.mark.parametrize("failure", ["second layer's write refused",
                                     "forward raises after the layers"])
def test_a_failed_step_leaves_the_cache_as_before_it(tiny, failure):
    model, attention = tiny
    # A 16-token prompt fills its block exactly: the next token takes a new block, so a
    # step that fails must give it back to the free list too.
    prompt, step, other = _tokens(BS, SEED + 2), _tokens(1, SEED + 3), _tokens(1, SEED + 4)
    cache = PagedInt8Cache(model.config, attention, blocks=8, chunk=CHUNK)
    clean = PagedInt8Cache(model.config, attention, blocks=8, chunk=CHUNK)
    for c in (cache, clean):
        _step(model, c, prompt, BS)
    before = _state(cache)
    assert before == _state(clean)
    if failure.startswith("second"):
        hook = model.model.layers[1].self_attn.k_proj.register_forward_hook(_nan_keys)
        error = (InputError, "holds NaN")
    else:
        hook = model.model.norm.register_forward_hook(_raise)
        error = (RuntimeError, "after every layer ran")
    try:
        with pytest.raises(error[0], match=error[1]):
            _step(model, cache, other, BS + 1)
    finally:
        hook.remove()
    assert _state(cache) == before
    assert cache.step is None
    assert all(getattr(m, "int8attn_cache", None) is None for m in model.modules())
    # the retried step sees exactly what a cache that never saw the failure sees
    retried, expected = _step(model, cache, step, BS + 1), _step(model, clean, step, BS + 1)
    assert torch.equal(retried, expected)
    assert _state(cache) == _state(clean)
    assert cache.lengths.tolist() == [BS + 1] and cache.seen == BS + 1
    following = _tokens(1, SEED + 5)
    assert torch.equal(_step(model, cache, following, BS + 2),
                       _step(model, clean, following, BS + 2))


def test_a_refused_first_step_leaves_the_cache_empty(tiny):
    model, attention = tiny
    cache = PagedInt8Cache(model.config, attention, blocks=8, chunk=CHUNK)
    free = list(cache.free)
    hook = model.model.layers[1].self_attn.v_proj.register_forward_hook(_nan_keys)
    try:
        with pytest.raises(InputError, match="holds NaN"):
            _step(model, cache, _tokens(20, SEED + 6), 20)
    finally:
        hook.remove()
    assert (cache.tables, cache.lengths.tolist(), cache.seen, cache.free) == ([], [], 0, free)
    _step(model, cache, _tokens(3, SEED + 7), 3)        # the batch is not fixed yet
    assert cache.lengths.tolist() == [3]


def test_kernel_object_on_the_cpu_target_is_named_as_such():
    import int8attn
    from int8attn.driver.graph import decode_graph

    with pytest.raises(OptionRefused, match="--kernel-object k.co does not apply to --target "
                                            "cpu"):
        int8attn.compile(decode_graph(1, 8, 2, 64, 64), target="cpu", kernel_object="k.co")


@pytest.mark.parametrize("arguments, message", [
    ((8, 0, 64, 16), "kv_heads must be a positive integer, got 0"),
    ((0, 2, 64, 16), "q_heads must be a positive integer, got 0"),
    ((8, -2, 64, 16), "kv_heads must be a positive integer, got -2"),
    ((8, 2, 0, 16), "head_dim must be a positive integer, got 0"),
    ((8, 2, 64, 0), "block_size must be a positive integer, got 0"),
    ((8, 2, 64.0, 16), "head_dim must be a positive integer, got 64.0"),
    ((6, 4, 64, 16), "6 query heads do not group over 4 KV heads"),
    ((8, 2, 64, 16, float("nan")), "softmax_scale must be positive and finite, got nan"),
    ((8, 2, 64, 16, float("inf")), "softmax_scale must be positive and finite"),
    ((8, 2, 64, 16, -0.125), "softmax_scale must be positive"),
    ((8, 2, 64, 16, 0.0), "softmax_scale must be positive"),
    ((8, 2, 64, 16, 1e-50), r"got 1e-50 \(0.0 as an f32\)"),
    ((8, 2, 64, 16, 1e39), r"softmax_scale must be positive and finite, got 1e\+39 \(inf"),
    ((8, 2, 64, 16, 3e38), r"softmax_scale must be at most about 2.3e38: 3e\+38 overflows f32 "
                           r"once the scores' constant softmax_scale \* log2 e is taken"),
], ids=lambda x: repr(x) if isinstance(x, tuple) else "")
def test_paged_attention_refuses_bad_shapes_and_scales_up_front(arguments, message):
    *shape, scale = arguments if len(arguments) == 5 else (*arguments, None)
    with pytest.raises(InputError, match=message):
        PagedAttention(*shape, softmax_scale=scale, target="cpu")


def test_a_scale_python_writes_with_an_exponent_compiles_and_runs():
    """repr(1e-05) is '1e-05', which MLIR's lexer does not take as a float: the graph
    writes 1.0e-05."""
    from int8attn.driver.paged_decode import paged_attention_graph

    assert "softmax_scale = 1.0e-05 : f32" in paged_attention_graph(8, 2, 64, 16,
                                                                    softmax_scale=1e-5)
    rng = seeded_rng(SEED + 10)
    pool, tables, lens = _pool(rng)
    attention = PagedAttention(HQ, HKV, D, BS, softmax_scale=1e-5, target="cpu")
    out = attention(torch.from_numpy(rng.standard_normal((1, HQ, D)).astype(np.float32)),
                    *pool, tables, lens)
    assert out.isfinite().all()


@pytest.fixture(scope="module")
def cpu_attention():
    return PagedAttention(HQ, HKV, D, BS, target="cpu")


def _pool(rng, length=40):
    k_cache = torch.from_numpy(rng.integers(-127, 128, (NB, HKV, BS, D), dtype=np.int8))
    v_cache = torch.from_numpy(rng.integers(-127, 128, (NB, HKV, D, BS), dtype=np.int8))
    k_scale = torch.from_numpy(rng.uniform(0.001, 0.01, (NB, HKV, BS)).astype(np.float32))
    v_scale = torch.from_numpy(rng.uniform(0.001, 0.01, (NB, HKV, BS)).astype(np.float32))
    tables = torch.tensor([[5, 2, 7]], dtype=torch.int32)
    return [k_cache, k_scale, v_cache, v_scale], tables, torch.tensor([length], dtype=torch.int32)


def test_a_numpy_prefill_query_runs_the_prefill_kernel(cpu_attention):
    rng = seeded_rng(SEED + 8)
    pool, tables, lens = _pool(rng)
    q = rng.standard_normal((1, HQ, 4, D)).astype(np.float32)
    out = cpu_attention(q, *pool, tables, lens)
    assert out.shape == (1, HQ, 4, D)
    assert torch.equal(out, cpu_attention(torch.from_numpy(q), *pool, tables, lens))


def test_a_token_major_torch_value_cache_is_named_with_its_transpose(cpu_attention):
    rng = seeded_rng(SEED + 9)
    pool, tables, lens = _pool(rng)
    token_major = pool[2].transpose(2, 3).contiguous()             # [NB, Hkv, BS, D]
    message = (r"v_cache, arg3\) of @paged has shape \[8, 2, 16, 64\], the token-major "
               r"layout .* \[\?, 2, 64, 16\].*v\.transpose\(2, 3\)\.contiguous\(\)")
    with pytest.raises(InputError, match=message):
        cpu_attention(torch.zeros(1, HQ, D), pool[0], pool[1], token_major, pool[3], tables,
                      lens)
    new = torch.zeros(1, HKV, D)
    with pytest.raises(InputError, match=r"v_cache, arg5\) of @write .*token-major"):
        cpu_attention.write(new, new, torch.zeros(1, dtype=torch.int32), pool[0], pool[1],
                            token_major, pool[3])


def test_registered_attention_is_released_before_exit(tmp_path):
    """No nanobind leak report at exit after torch_ops.register: the registry lets its
    PagedAttention objects (and their IREE contexts) go at exit."""
    script = tmp_path / "op.py"
    script.write_text(textwrap.dedent("""
        import torch
        from int8attn.serving import PagedAttention, torch_ops
        attn = PagedAttention(8, 2, 64, 16, target="cpu")
        pool = (torch.zeros(4, 2, 16, 64, dtype=torch.int8), torch.ones(4, 2, 16),
                torch.zeros(4, 2, 64, 16, dtype=torch.int8), torch.ones(4, 2, 16))
        handle = torch_ops.register(attn)
        out = torch.ops.int8attn.paged_attention(
            torch.randn(1, 8, 64), *pool, torch.zeros(1, 1, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32), handle, True)
        print("ran", tuple(out.shape))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "ran (1, 8, 64)" in done.stdout
    assert "leaked" not in done.stderr, done.stderr[:2000]
