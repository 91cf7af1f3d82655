"""Property-based tests: compiled modules against both references.

Hypothesis draws the mode, a shape from a bounded grid (B, Hq/Hkv GQA ratios,
S around the 16/32/64/256 boundaries, Sq, D), the PV precision, a value
distribution per tensor and a numpy seed; every case must pass the derived
tolerances of `accuracy.check_against_references`. Compiled modules are cached
per (mode, shape, pv) in-process (`conftest.compiled_attention`).

    python -m pytest tests/test_fuzz.py                                  # quick (CI)
    python -m pytest tests/test_fuzz.py --hypothesis-profile=long \\
        --hypothesis-show-statistics                                     # >= 10,000 cases
"""

import numpy as np
from hypothesis import given, note, strategies as st

from accuracy import check_against_references
from conftest import compiled_attention
from int8attn.reference import quantize_cache

# (B, Hq, Hkv, S, Sq, D); decode has Sq = 1 and q [B, Hq, D].
SHAPES = {
    "decode": [(1, 1, 1, 1, 1, 16), (1, 2, 1, 17, 1, 16), (2, 4, 2, 63, 1, 32),
               (1, 4, 4, 64, 1, 16), (1, 8, 2, 100, 1, 64), (2, 2, 1, 255, 1, 48),
               (1, 4, 2, 257, 1, 32), (1, 8, 1, 600, 1, 128), (3, 6, 3, 129, 1, 16)],
    "prefill": [(1, 1, 1, 1, 1, 16), (1, 2, 1, 20, 20, 16), (1, 4, 2, 65, 7, 32),
                (2, 2, 2, 64, 64, 16), (1, 4, 1, 150, 37, 64), (1, 2, 1, 300, 1, 128),
                (2, 6, 2, 97, 33, 48)],
}
DISTRIBUTIONS = ("gaussian", "uniform", "heavy_tailed", "scaled", "token_scaled", "zero_rows")


def values(rng, kind: str, shape) -> np.ndarray:
    """float32 values of one tensor; rows are the last axis."""
    x = rng.standard_normal(shape)
    if kind == "uniform":
        x = rng.uniform(-1, 1, shape)
    elif kind == "heavy_tailed":
        x = rng.standard_t(1.5, shape)
    elif kind == "scaled":
        x = x * 10.0 ** rng.uniform(-3, 3)
    elif kind == "token_scaled":
        x = x * 10.0 ** rng.uniform(-2, 2, shape[:-1] + (1,))
    elif kind == "zero_rows":
        x[rng.random(shape[:-1]) < 0.3] = 0
        rows = x.reshape(-1, shape[-1])
        start = rng.integers(0, rows.shape[0])
        rows[start:start + 40] = 0          # often a whole 32-token W group
    return x.astype(np.float32)


@st.composite
def cases(draw):
    mode = draw(st.sampled_from(sorted(SHAPES)))
    shape = draw(st.sampled_from(SHAPES[mode]))
    pv = draw(st.sampled_from(("int8", "int8", "bf16", "f32")))
    kinds = tuple(draw(st.sampled_from(DISTRIBUTIONS)) for _ in "qkv")
    seed = draw(st.integers(0, 2 ** 32 - 1))
    return mode, shape, pv, kinds, seed


def inputs(mode, shape, kinds, seed):
    batch, q_heads, kv_heads, tokens, query_tokens, head_dim = shape
    rng = np.random.default_rng(seed)
    q_shape = (batch, q_heads) + ((query_tokens,) if mode == "prefill" else ()) + (head_dim,)
    cache_shape = (batch, kv_heads, tokens, head_dim)
    q = values(rng, kinds[0], q_shape)
    k, k_scale = quantize_cache(values(rng, kinds[1], cache_shape))
    v, v_scale = quantize_cache(values(rng, kinds[2], cache_shape))
    return q, k, k_scale, v, v_scale


@given(cases())
def test_compiled_module_matches_references(case):
    mode, shape, pv, kinds, seed = case
    note(f"{mode} B,Hq,Hkv,S,Sq,D={shape} pv={pv} q/k/v values {kinds}, numpy seed {seed}")
    args = inputs(mode, shape, kinds, seed)
    out = compiled_attention(mode, shape, pv)(*args)
    check_against_references(out, args, shape[-1] ** -0.5, pv)
