"""The lane simulator's LDS hazards: what the hardware would race on is an error.

Threads run in lockstep in the simulator, so a kernel missing a barrier computes the
right numbers there and wrong ones on a GPU. The simulator therefore tracks, per LDS
element, who wrote and read it in which barrier interval (simulator/memory.py,
`_Hazards`). Each case below is a small kernel of 8 threads: the correct form runs and
gives the expected data, the form with the barrier (or the wait) left out is refused.
"""

import numpy as np
import pytest
from iree.compiler.dialects import arith, memref

from conftest import simulate_workgroup
from int8attn.simulator.interpreter import SimulationError

THREADS = 8


def run(body) -> np.ndarray:
    """Run `body(lanes, source, out)` over one workgroup of THREADS threads (one wave);
    `source` holds 0..THREADS-1 (f32), `out` [THREADS] is returned."""
    source = np.arange(THREADS, dtype=np.float32)
    out = np.zeros(THREADS, np.float32)
    simulate_workgroup("hazards", [source, out], THREADS,
                       lambda lanes, views: body(lanes, *views))
    return out


def neighbour(lanes):
    return arith.remui(arith.addi(lanes.thread, lanes.index(1)), lanes.index(THREADS))


def exchange(barrier: bool):
    def body(lanes, src, dst):
        lds = lanes.shared([THREADS], "f32")
        memref.store(memref.load(src, [lanes.thread]), lds, [lanes.thread])
        if barrier:
            lanes.barrier()
        memref.store(memref.load(lds, [neighbour(lanes)]), dst, [lanes.thread])
    return body


def test_a_read_of_another_threads_write_needs_a_barrier():
    np.testing.assert_array_equal(run(exchange(barrier=True)), np.roll(np.arange(THREADS), -1))
    with pytest.raises(SimulationError, match="another thread wrote"):
        run(exchange(barrier=False))


def test_a_thread_reads_its_own_write_without_one():
    def body(lanes, src, dst):
        lds = lanes.shared([THREADS], "f32")
        memref.store(memref.load(src, [lanes.thread]), lds, [lanes.thread])
        memref.store(memref.load(lds, [lanes.thread]), dst, [lanes.thread])
    np.testing.assert_array_equal(run(body), np.arange(THREADS))


def overwrite(barrier: bool):
    # read the neighbour's element, then overwrite one's own: the neighbour's
    # overwrite may come first on the hardware unless a barrier separates them
    def body(lanes, src, dst):
        lds = lanes.shared([THREADS], "f32")
        memref.store(memref.load(src, [lanes.thread]), lds, [lanes.thread])
        lanes.barrier()
        seen = memref.load(lds, [neighbour(lanes)])
        if barrier:
            lanes.barrier()
        memref.store(lanes.f32(-1.0), lds, [lanes.thread])
        memref.store(seen, dst, [lanes.thread])
    return body


def test_a_write_over_another_threads_read_needs_a_barrier():
    np.testing.assert_array_equal(run(overwrite(barrier=True)), np.roll(np.arange(THREADS), -1))
    with pytest.raises(SimulationError, match="another thread\\s+read"):
        run(overwrite(barrier=False))


def copy(wait: bool, barrier: bool, reread: bool = False):
    # each thread copies its element into LDS asynchronously and reads the neighbour's;
    # with `reread`, first reads the neighbour's old element in the same interval (a
    # ring stage that is refilled while another thread may still be reading it)
    def body(lanes, src, dst):
        lds = lanes.shared([THREADS], "f32")
        memref.store(lanes.f32(0.0), lds, [lanes.thread])
        lanes.barrier()
        old = memref.load(lds, [neighbour(lanes)]) if reread else lanes.f32(0.0)
        group = lanes.async_group([lanes.async_copy(src, [lanes.thread], lds,
                                                    [lanes.thread], 1)])
        if wait:
            lanes.async_wait(group)
        if barrier:
            lanes.barrier()
        memref.store(arith.addf(old, memref.load(lds, [neighbour(lanes)])), dst, [lanes.thread])
    return body


def test_an_asynchronous_copy_is_read_after_its_wait_and_a_barrier():
    np.testing.assert_array_equal(run(copy(wait=True, barrier=True)),
                                  np.roll(np.arange(THREADS), -1))
    with pytest.raises(SimulationError, match="has not landed"):
        run(copy(wait=False, barrier=True))
    with pytest.raises(SimulationError, match="another thread wrote"):
        run(copy(wait=True, barrier=False))


def test_an_asynchronous_copy_may_not_overwrite_what_another_thread_reads():
    with pytest.raises(SimulationError, match="another thread\\s+read"):
        run(copy(wait=True, barrier=True, reread=True))


def test_a_barrier_in_divergent_control_flow_is_refused():
    def body(lanes, src, dst):
        with lanes.when(arith.cmpi(arith.CmpIPredicate.ult, lanes.thread, lanes.index(2))):
            lanes.barrier()
    with pytest.raises(SimulationError, match="do not\\s+reach"):
        run(body)


@pytest.mark.parametrize("alignment", [None, 16])
def test_a_vector_load_claims_no_more_alignment_than_its_lds_allocation_has(alignment):
    # IREE packs a workgroup's LDS allocations back to back at their alignment attribute
    # (else their element's size): a 4-byte flag before a staged operand left its 16-byte
    # loads at offsets 4 mod 16 on an H100 (a misaligned-address fault). Lanes.shared gives
    # every allocation 16; the simulator holds each access to its allocation's alignment.
    from iree.compiler.dialects import vector

    from int8attn.kernels.lanes import load_vector, memref_type

    def body(lanes, src, dst):
        lds = memref.AllocOp(memref_type([THREADS], "f32", workgroup=True), [], [],
                             alignment=alignment).result
        memref.store(memref.load(src, [lanes.thread]), lds, [lanes.thread])
        lanes.barrier()
        first = arith.andi(lanes.thread, lanes.index(THREADS - 4))
        four = load_vector(lds, [first], 4, "f32", alignment=16)
        memref.store(vector.extract(four, [], [3]), dst, [lanes.thread])

    if alignment is None:
        with pytest.raises(SimulationError, match="aligned to 4 bytes only"):
            run(body)
    else:
        assert np.array_equal(run(body), (np.arange(THREADS) | 3).astype(np.float32))
