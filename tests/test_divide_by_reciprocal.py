"""The decode partition's p = e / l (contract.divide_by_reciprocal): y = RN(1/l) once per
row, then q0 = e y, r = fma(-l, q0, e), p = fma(r, y, q0) per score.

Claimed: correctly rounded wherever e >= 2^-102 (l in [1, 1024]: the residual r is then
exact, and Markstein's correction rounds once), and within one ulp below, down to the
ftz exp's smallest e, 2^-126. Checked on the scalar IR in the lane simulator, and on a
large numpy emulation with the same exactly rounded f32 fma (reference.common.fma_f32)."""

from fractions import Fraction

import numpy as np
from iree.compiler.dialects import memref

from conftest import seeded_rng, simulate_workgroup
from int8attn.contract import scalar_ir as contract
from int8attn.reference.common import fma_f32

F32 = np.float32
EXACT_FROM = 2.0 ** -102


def correctly_rounded(e: np.ndarray, l: np.ndarray) -> np.ndarray:
    """RN(e / l) in f32, exactly: f64's quotient rounds twice only on an f32 midpoint
    (or within an f64 ulp of one); those few are divided as fractions."""
    q64 = e.astype(np.float64) / l.astype(np.float64)
    q = q64.astype(F32)
    neighbour = np.nextafter(q, np.where(q64 > q, F32(np.inf), F32(0)))
    midpoint = (q.astype(np.float64) + neighbour.astype(np.float64)) / 2
    for i in np.flatnonzero(np.abs(q64 - midpoint) <= 2 * np.spacing(np.abs(q64))):
        exact = Fraction(float(e[i])) / Fraction(float(l[i]))
        below = F32(float(exact))
        candidates = [below, np.nextafter(below, F32(np.inf)), np.nextafter(below, F32(0))]
        errors = [abs(Fraction(float(c)) - exact) for c in candidates]
        best = min(errors)
        ties = [c for c, err in zip(candidates, errors) if err == best]
        q[i] = next((c for c in ties if not c.view(np.int32) & 1), ties[0])
    return q


def emulated(e: np.ndarray, l: np.ndarray) -> np.ndarray:
    y = (F32(1) / l).astype(F32)
    q0 = (e * y).astype(F32)
    return fma_f32(fma_f32(-l, q0, e), y, q0)


def draw(rng, count: int) -> tuple[np.ndarray, np.ndarray]:
    """e log-uniform over the ftz exp's range [2^-126, 1], l log-uniform in [1, 1024]."""
    e = np.exp2(rng.uniform(-126, 0, count)).astype(F32)
    l = np.exp2(rng.uniform(0, 10, count)).astype(F32)
    return e, l


def ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32))


def test_the_emulated_quotient_is_correctly_rounded_above_the_bound():
    seed = 131
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    e, l = draw(rng, 2_000_000)
    edges = np.array([1, 1, 2.0 ** -126, 2.0 ** -102, 2.0 ** -102, 0.75, 1], F32)
    e = np.r_[e, edges]
    l = np.r_[l, np.array([1, 1024, 1, 1024, 3, 3, np.nextafter(F32(1), F32(2))], F32)]
    got, want = emulated(e, l), correctly_rounded(e, l)
    above = e >= EXACT_FROM
    assert np.array_equal(got[above], want[above])
    assert (ulps(got, want) <= 1).all()
    # the bound is where the claim changes: some quotients below it are an ulp off
    assert (got[~above] != want[~above]).any()


def test_the_contract_ir_computes_the_emulated_quotient():
    # the scalar IR in the lane simulator: one row's reciprocal per thread, 64 scores
    seed = 132
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    threads, width = 64, 64
    e, l = draw(rng, threads * width)
    e, l = e.reshape(threads, width), l[:threads]
    p = np.zeros_like(e)

    def body(lanes, views):
        es, ls, ps = views
        total = memref.load(ls, [lanes.thread])
        inverse = contract.reciprocal(total)
        for j in range(width):
            at = [lanes.thread, lanes.index(j)]
            memref.store(contract.divide_by_reciprocal(memref.load(es, at), total, inverse),
                         ps, at)

    simulate_workgroup("divide", [e, l, p], threads, body)
    rows = np.broadcast_to(l[:, None], e.shape)
    assert np.array_equal(p, emulated(e, rows))
    above = e >= EXACT_FROM
    assert np.array_equal(p[above], correctly_rounded(e[above], rows[above]))
