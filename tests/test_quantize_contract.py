"""One quantization contract (docs/design.md §2) in every compiler consumer.

contract/scalar_ir.py builds the scalar ops that lower-quantize and the
lane-level decode kernels share. These tests run them in the lane simulator
against the numpy reference: the scalars on their own over the special rows
(zero, tiny, threshold, NaN, Inf, huge, ties), and the decode kernels of every
target with a NaN/Inf query row (its W groups are NaN), W groups that are
exactly zero, and W groups below 2^-118.

fptosi of NaN or of an out-of-range value is poison in LLVM; the simulator
raises on it, so a kernel that reaches it fails here.
"""

import numpy as np
import pytest
from iree.compiler.dialects import memref

from conftest import seeded_rng, simulate_workgroup
from int8attn import reference as ref
from int8attn.contract.numerics import DIGIT_NUMERICS  # the simulated kernels' default
from int8attn.fragments import fragment_model
from int8attn.contract import scalar_ir as contract
from int8attn.contract.constants import QMAX
from int8attn.reference.common import QUANTIZE_MIN_ABSMAX
from int8attn.driver.stages import iree_compile
from int8attn.driver.targets import TARGETS as COMPILE_TARGETS
from int8attn.passes import LowerQuantize
from int8attn.pipelines.manager import UpstreamPass, run_passes
from int8attn.runtime import LoadedModule
from int8attn.runtime.module import TensorSpec
from int8attn.simulator import simulate_decode
from int8attn.support.ir import new_context, parse_module

TARGETS = ("gfx936", "gfx942", "cuda")
SHAPE = (1, 4, 1, 300, 32)            # B, Hq, Hkv, S, D: two partitions, the second ragged
SCALE = SHAPE[-1] ** -0.5
FRAGMENT_TOL = 5e-5                   # as tests/test_kernels.py
TINY = np.float32(1e-38)              # v_scale: every W = P * sV < 2^-118


# the scalar contract ------------------------------------------------------------
def special_rows(rng, width=8):
    threshold = np.float32(QUANTIZE_MIN_ABSMAX)
    f32max = np.finfo(np.float32).max
    rows = [
        rng.standard_normal(width),
        np.zeros(width),
        -np.zeros(width),
        rng.uniform(-1, 1, width) * threshold,
        np.full(width, threshold),
        np.full(width, np.nextafter(threshold, np.float32(0))),
        rng.uniform(-1, 1, width) * TINY,
        np.full(width, np.float32(2.0 ** -140)),                     # subnormal
        np.r_[rng.standard_normal(width - 1), np.nan],
        np.r_[np.inf, rng.standard_normal(width - 1)],
        np.r_[rng.standard_normal(width - 1), -np.inf],
        np.r_[np.nan, np.inf, np.zeros(width - 2)],
        np.r_[f32max, -f32max, rng.standard_normal(width - 2)],
        np.r_[127.0, 0.5, -0.5, 1.5, -2.5, 3.5, 126.5, -126.5],     # exact ties (inv = 1)
        rng.standard_normal(width) * 1e30,
        rng.standard_normal(width) * 1e-30,
        # fl(a * fl(127 / a)) > 127 for these absmaxes: the implied clamp's edge
        np.r_[9.3554366e-12, -9.3554366e-12, rng.uniform(-1, 1, width - 2) * 9.3e-12],
        np.r_[-7.5224012e+24, 7.5224012e+24, rng.uniform(-1, 1, width - 2) * 7.5e24],
        np.r_[-127.0, 64.5, -63.5, 125.5, -124.5, 0.49999997, -0.50000006, 99.5],
    ]
    return np.array(rows, dtype=np.float32)


def simulate_contract(x: np.ndarray, digits: bool = False, bias: bool = False):
    """q, s of each row of x through the contract's ops, one thread per row; with
    `digits`, the (high, low) digits of `quantize_digits` (signed) and s; with `bias`,
    the lane kernels' conversions through the round bias's bits (else fptosi) and
    their scale by the reciprocal (`quantize_scale(tiny_exact=False)`)."""
    rows, width = x.shape
    threads = 1 << (rows - 1).bit_length()
    x_pad = np.zeros((threads, width), np.float32)
    x_pad[:rows] = x
    q, s = np.zeros((threads, width), np.int8), np.zeros(threads, np.float32)
    low = np.zeros((threads, width), np.int8)

    def body(lanes, views):
        xs, qs, ss, lows = views
        c = contract.quantize_constants(lanes.f32, i32=lanes.i32 if bias else None)
        values = [memref.load(xs, [lanes.thread, lanes.index(j)]) for j in range(width)]
        amax = c.zero
        for value in values:
            amax = contract.absmax_step(amax, value)
        memref.store(contract.quantize_scale(amax, c, tiny_exact=not bias), ss, [lanes.thread])
        inverse = contract.quantize_inverse(amax, c)
        for j, value in enumerate(values):
            where = [lanes.thread, lanes.index(j)]
            if digits:
                high, low_digit = contract.quantize_digits(value, inverse, c)
                memref.store(high, qs, where)
                memref.store(low_digit, lows, where)
            else:
                memref.store(contract.quantize_value(value, inverse, c), qs, where)

    simulate_workgroup("contract", [x_pad, q, s, low], threads, body)
    return (q[:rows], low[:rows], s[:rows]) if digits else (q[:rows], s[:rows])


@pytest.mark.parametrize("bias", [False, True], ids=["fptosi", "lane-kernels"])
def test_the_scalar_contract_matches_the_numpy_reference(bias):
    x = special_rows(seeded_rng(60))
    q, s = simulate_contract(x, bias=bias)
    with np.errstate(invalid="ignore", over="ignore"):
        q_ref, s_ref = ref.quantize(x)
    assert np.array_equal(q, q_ref)
    if bias:
        assert_scales_of_quantizable_rows(s, s_ref, x)
        return
    assert np.array_equal(s, s_ref, equal_nan=True)
    # the rules themselves, not only agreement
    nonfinite = ~np.isfinite(x).all(axis=1)
    tiny = np.abs(x).max(axis=1) < QUANTIZE_MIN_ABSMAX
    assert np.isnan(s[nonfinite]).all() and not q[nonfinite | tiny].any()
    assert np.array_equal(s[tiny], np.abs(x[tiny]).max(axis=1) / np.float32(127))
    assert np.array_equal(q[13], [127, 0, 0, 2, -2, 4, 126, -126])


@pytest.mark.parametrize("levels, base", [(127, 1), (255, 1), (127, 256), (255, 256)])
def test_the_clamps_upper_bound_is_implied_by_the_inverse(levels, base):
    # contract/scalar_ir.py builds only max(x * inv, -L) against a row's own absmax a:
    # fl(x * fl(L / a)) for |x| <= a exceeds L by at most ulp(L), which rounds back to
    # L (digits: times 256, exactly). Over a million absmaxes of every exponent from
    # 2^-118, x = a: several percent land above L (the edge is reached), none rounds
    # past it.
    rng = seeded_rng(67)
    a = (rng.uniform(1, 2, 10 ** 6) * 2.0 ** rng.integers(-118, 100, 10 ** 6)).astype(np.float32)
    products = a * (np.float32(levels) / a)
    assert (products > levels).mean() > 0.03
    assert np.rint(products * np.float32(base)).max() == levels * base


@pytest.mark.parametrize("bias", [False, True], ids=["fptosi", "through-the-bias"])
def test_the_digits_of_a_tiny_but_quantizable_row(bias):
    # An absmax in [2^-118, 2^-112) is quantized, but inv * 256 overflows f32 there:
    # the contract's digits take (x * inv) * 256 (docs/design.md §2c), so such a row
    # gets the digits of the same row 2^100 times larger (powers of two scale exactly),
    # in the IR as in the reference. (With x * (inv * 256), every nonzero level was
    # the top one.) Both conversions: fptosi of the scaled value (the cpu pipeline), and
    # the lane kernels' bits of the sum with 1.5 * 2^15, which steps by 1/256.
    rng = seeded_rng(66)
    exponents = rng.uniform(-118, -112, (16, 1))
    x = (rng.uniform(-1, 1, (16, 8)) * 2.0 ** exponents).astype(np.float32)
    x[:, 0] = (2.0 ** exponents[:, 0]).astype(np.float32)         # the absmax
    fine_ties = np.array([[127, 1 / 512, 3 / 512, -5 / 512, 127 - 1 / 512, -7 / 512, 0, 1]],
                         np.float32)                     # inv = 1: t on ties of 1/256 steps
    x = np.concatenate([x, special_rows(rng), fine_ties])  # ties, NaN, Inf, zero, tiny rows
    high, low, s = simulate_contract(x, digits=True, bias=bias)
    with np.errstate(invalid="ignore", over="ignore"):
        (big_high, _), (big_low, _) = ref.common.quantize_digits(x[:16] * np.float32(2.0 ** 100))
        (ref_high, ref_s), (ref_low, _) = ref.common.quantize_digits(x)
    assert np.array_equal(high[:16], big_high) and np.array_equal(low[:16], big_low)
    assert np.array_equal(high, ref_high) and np.array_equal(low, ref_low)
    assert_scales_of_quantizable_rows(s, ref_s, x)
    assert (np.abs(high[:16, 1:].astype(int)) < QMAX).any()
    t = high[-1].astype(int) * 256 + low[-1]
    assert np.array_equal(t, [32512, 0, 2, -2, 32512, -4, 0, 256])       # ties to even


def assert_scales_of_quantizable_rows(s, s_ref, x):
    """Bitwise where a row quantizes (or is NaN); the rows below the threshold (every
    level 0, so no output sees s) within an ulp: the lane kernels' scale by the
    reciprocal is correctly rounded only where a / L is normal."""
    quantizable = ~(np.abs(x).max(axis=1) < QUANTIZE_MIN_ABSMAX)
    assert np.array_equal(s[quantizable], s_ref[quantizable], equal_nan=True)
    tiny = ~quantizable
    ulps = np.abs(s[tiny].view(np.int32).astype(np.int64) - s_ref[tiny].view(np.int32))
    assert (ulps <= 1).all()


def test_the_lane_kernels_scale_is_correctly_rounded_for_every_mantissa():
    # quantize_scale(tiny_exact=False): q0 = a y, r = fma(-L, q0, a), s = fma(r, y, q0)
    # with y = fl(1 / L). Scaling a by a power of two scales q0, r and s exactly while
    # q0 is normal (r, a multiple of ulp(q0), stays exact even where subnormal), so
    # every mantissa of the lowest quantizable binade, of [1, 2) and of the top
    # binade covers every quantizable a. Emulated exactly: q0 and r in f64 are exact;
    # q0 + r y in f64 is rounded once more, so each sum must lie farther than its f64
    # error from an f32 midpoint (asserted), and then rounds to f32 as the exact sum.
    mantissas = np.arange(1 << 23, dtype=np.int64)
    for levels in (QMAX, 255.0):
        y = np.float64(np.float32(1) / np.float32(levels))
        for exponent in (-118, 0, 127):
            bits = mantissas | ((exponent + 127) << 23)
            a = bits.astype(np.int32).view(np.float32).astype(np.float64)
            q0 = (a * y).astype(np.float32).astype(np.float64)
            r = a - levels * q0                              # exact in f64, and in f32
            assert np.array_equal(r.astype(np.float32).astype(np.float64), r)
            t = q0 + r * y
            s = t.astype(np.float32)
            # the f32 neighbour on t's side of s, and the midpoint between them
            neighbour = np.nextafter(s, np.where(t > s, np.float32(np.inf), np.float32(0)))
            midpoint = (s.astype(np.float64) + neighbour.astype(np.float64)) / 2
            assert (np.abs(t - midpoint) > 2 * np.spacing(np.abs(t))).all()
            assert np.array_equal(s, (a / levels).astype(np.float32)), (levels, exponent)


# the CPU lowering, compiled by IREE ----------------------------------------------
def cpu_quantize(x: np.ndarray, w_quant: str | None):
    """lower-quantize's `quantize` (w_quant None) or one-group `group_quantize` of
    each row of x, compiled for llvm-cpu and run."""
    rows, width = x.shape
    ty = f"tensor<{rows}x{width}xf32>"
    if w_quant is None:
        q_ty, s_ty = f"tensor<{rows}x{width}xi8>", f"tensor<{rows}xf32>"
        op = f'"int8attn.quantize"(%x) : ({ty}) -> ({q_ty}, {s_ty})'
    else:
        q_ty, s_ty = f"tensor<{rows}x1x{width}xi8>", f"tensor<{rows}x1xf32>"
        groups = ", ".join(str(i) for i in range(width))
        op = (f'"int8attn.group_quantize"(%x) {{groups = [array<i64: {groups}>], '
              f'w_quant = "{w_quant}"}} : ({ty}) -> ({q_ty}, {s_ty})')
    text = (f"func.func @q(%x: {ty}) -> ({q_ty}, {s_ty}) {{\n  %q:2 = {op}\n"
            f"  return %q#0, %q#1 : {q_ty}, {s_ty}\n}}\n")
    with new_context():
        module = parse_module(text, "quantize.mlir")
        run_passes(module, [LowerQuantize(), UpstreamPass("canonicalize"), UpstreamPass("cse")])
        lowered = str(module)
    vmfb, _ = iree_compile(lowered, COMPILE_TARGETS["cpu"])
    spec = TensorSpec((rows, width), "f32")
    q, s = LoadedModule(vmfb, {"q": [spec]}).call("q", x)
    return q.reshape(rows, width), s.reshape(rows)


def near_tie_rows(rng, count: int, width: int = 8) -> np.ndarray:
    """Rows (a, x, -x, 0...) where fl(x * fl(127 / a)) is a tie k + 0.5 that the exact
    product misses: a backend that contracts the product into the rounding add (an
    FMA) rounds these the other way. The clamp between them is what keeps it apart."""
    rows = []
    while len(rows) < count:
        a = np.float32(rng.uniform(1, 100))
        inverse = np.float32(127) / a
        k = int(rng.integers(0, 126))
        x0 = np.float32((k + 0.5) / np.float64(inverse))
        for x in (x0, np.nextafter(x0, np.float32(0)), np.nextafter(x0, np.float32(1e9))):
            product = np.float32(x * inverse)
            if product == k + 0.5 and np.float64(x) * np.float64(inverse) != k + 0.5:
                rows.append([a, x, -x] + [0.0] * (width - 3))
                break
    return np.array(rows, np.float32)


def assert_same_scales(s, s_ref):
    """Bitwise, except that llvm-cpu flushes a subnormal scale (a tiny row's a/127) to 0."""
    subnormal = (s_ref != 0) & (np.abs(s_ref) < np.finfo(np.float32).tiny)
    assert np.array_equal(s[~subnormal], s_ref[~subnormal], equal_nan=True)
    assert np.isin(s[subnormal], [0]).all() or np.array_equal(s[subnormal], s_ref[subnormal])


def test_the_cpu_lowering_quantizes_like_the_numpy_reference():
    """lower-quantize compiled by IREE llvm-cpu (where LLVM contracts a multiply
    feeding an add into an fma): bitwise the reference's q and s over the special
    rows, ties, products on a tie the exact product misses, and random rows
    (signed), and over W >= 0 rows with ties, tiny, zero and non-finite groups
    (unsigned)."""
    rng = seeded_rng(61)
    special = special_rows(rng)
    magnitudes = (10.0 ** rng.integers(-20, 20, (64, 1))).astype(np.float32)
    x = np.concatenate([special, rng.standard_normal((64, 8)).astype(np.float32) * magnitudes,
                        near_tie_rows(rng, 64)])
    q, s = cpu_quantize(x, None)
    with np.errstate(invalid="ignore", over="ignore"):
        q_ref, s_ref = ref.quantize(x)
    assert np.array_equal(q, q_ref)
    assert_same_scales(s, s_ref)

    w = np.abs(x)
    ties = len(special)                     # a random row, replaced by ties with a = 255
    w[ties] = [255.0, 0.5, 1.5, 2.5, 254.5, 127.5, 128.5, 0.0]
    q, s = cpu_quantize(w, "u8")
    with np.errstate(invalid="ignore", over="ignore"):
        q_ref, s_ref = ref.quantize_w(w[:, None, :], "u8")
    assert np.array_equal(q, q_ref.reshape(q.shape))
    assert_same_scales(s, s_ref.reshape(s.shape))
    assert np.array_equal(q[ties].astype(int) + 128, [255, 0, 2, 2, 254, 128, 128, 0])
    # 63.5 * (255/127) rounds to the tie 127.5 as a product: u = 128, not 127
    assert int(q[len(special) - 1, 2]) + 128 == 128


# the decode kernels -------------------------------------------------------------
def inputs(seed):
    batch, q_heads, kv_heads, tokens, head_dim = SHAPE
    rng = seeded_rng(seed)
    q = rng.standard_normal((batch, q_heads, head_dim)).astype(np.float32)
    cache = (batch, kv_heads, tokens, head_dim)
    k, k_scale = ref.quantize_cache(rng.standard_normal(cache).astype(np.float32))
    v, v_scale = ref.quantize_cache(rng.standard_normal(cache).astype(np.float32))
    return [q, k, k_scale, v, v_scale]


def w_group_tokens(target, partition, group):
    """The live tokens of one MMAC's W group (the fragment model's token set)."""
    tokens = fragment_model(target).token_groups(256)[group] + 256 * partition
    return tokens[tokens < SHAPE[3]]


def assert_matches_reference(out, args, target):
    with np.errstate(invalid="ignore"):
        fragment = ref.fragment_attention(*args, SCALE, model=target, numerics=DIGIT_NUMERICS)
        slack = ref.rounding_tie_slack(*args, SCALE, model=target, numerics=DIGIT_NUMERICS)
    assert np.array_equal(np.isnan(out), np.isnan(fragment))
    finite = ~np.isnan(fragment)
    assert np.isfinite(out[finite]).all()
    err = np.abs(out - fragment)[finite]
    assert (err <= FRAGMENT_TOL + slack[finite]).all(), f"{target}: {err.max():.3e}"
    return err.max() if err.size else 0.0


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_nonfinite_q_row_is_nan_in_exactly_its_row(target, bad):
    args = inputs(61)
    clean = simulate_decode(*args, SCALE, target=target)
    q = args[0].copy()
    q[0, 2, 5] = bad                       # its sQ is NaN, so are its scores, P, W groups
    out = simulate_decode(q, *args[1:], SCALE, target=target)
    row = np.zeros(SHAPE[1], dtype=bool)
    row[2] = True
    assert np.isnan(out[0, row]).all()
    assert np.isfinite(out[0, ~row]).all()
    assert np.array_equal(out[0, ~row], clean[0, ~row])       # other rows: bitwise
    err = assert_matches_reference(out, [q] + args[1:], target)
    print(f"{target} q[0,2,5]={bad}: other rows vs fragment reference {err:.2e}")


@pytest.mark.parametrize("target", TARGETS)
def test_exactly_zero_w_groups(target):
    args = inputs(62)
    v_scale = args[4].copy()
    for partition, group in ((0, 3), (0, 4), (1, 0)):      # (1, 0) is partly past S
        v_scale[:, :, w_group_tokens(target, partition, group)] = 0
    args[4] = v_scale
    out = simulate_decode(*args, SCALE, target=target)
    err = assert_matches_reference(out, args, target)
    print(f"{target} zero W groups: vs fragment reference {err:.2e}")


@pytest.mark.parametrize("target", TARGETS)
def test_w_groups_below_the_threshold_contribute_exactly_zero(target):
    args = inputs(63)
    tokens = np.concatenate([w_group_tokens(target, 0, 5), w_group_tokens(target, 1, 1)])
    tiny, zero = args[4].copy(), args[4].copy()
    tiny[:, :, tokens], zero[:, :, tokens] = TINY, 0
    out = simulate_decode(*args[:4], tiny, SCALE, target=target)
    err = assert_matches_reference(out, args[:4] + [tiny], target)
    # Wq = 0 for a tiny group: the same output as an exactly zero group, bitwise
    assert np.array_equal(out, simulate_decode(*args[:4], zero, SCALE, target=target))
    print(f"{target} tiny W groups: vs fragment reference {err:.2e}")


@pytest.mark.parametrize("target", TARGETS)
def test_all_w_below_the_threshold_gives_exact_zeros(target):
    args = inputs(64)
    tiny = np.full_like(args[4], TINY)
    out = simulate_decode(*args[:4], tiny, SCALE, target=target)
    assert np.array_equal(ref.fragment_attention(*args[:4], tiny, SCALE, model=target,
                                                 numerics=DIGIT_NUMERICS),
                          np.zeros_like(out))
    assert not out.any() and not np.signbit(out).any(), f"{target}: max {np.abs(out).max():.3e}"
