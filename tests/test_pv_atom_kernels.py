"""A second PV atom in the kernels: gfx942's v_mfma_i32_32x32x16_i8 (issue 23).

The atom is one definition (fragments: instruction, linear layouts, PV_ATOMS; the
TargetSpec lists it) plus the simulator's own ISA table. QK stays on the 16x16x32
MFMA; W is quantized per the new atom's 16-token MMAC groups (derived from its B
layout and the 16-byte V loads), staged in LDS in its 32-row A layout, and PV runs
on 32x32 tiles. Decode, paged decode and prefill are simulated against both
references: the fragment-level one with the atom's model (its groups) and the
exact one (tolerances of tests/accuracy.py, derived from the quantization).
"""

import numpy as np
import pytest

from accuracy import check_against_references
from conftest import decode_inputs, seeded_rng
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.fragments import pv_model
from int8attn.kernels.target_spec import target_spec
from int8attn.reference import sequence_cache
from int8attn.simulator import simulate_decode, simulate_paged, simulate_prefill
from test_paged import paged_batch
from test_prefill import prefill_inputs

ATOM = "v_mfma_i32_32x32x16_i8"
MODEL = pv_model("gfx942", ATOM).name          # "gfx942:v_mfma_i32_32x32x16_i8"
NUMERICS = [ONE_TERM_NUMERICS, Numerics(q_terms=2, w_quant="u8", w_terms=1)]


def _check(out, args, numerics, model=MODEL):
    scale = np.float32(args[0].shape[-1] ** -0.5)
    return check_against_references(out, args, scale, numerics=numerics, model=model)


def test_the_target_spec_offers_the_atom():
    spec = target_spec("gfx942")
    assert spec.pv_model("int8", ATOM).instruction.name == ATOM
    assert spec.pv_model("int8").instruction.name == "v_mfma_i32_16x16x32_i8"
    with pytest.raises(ValueError, match="--target gfx936 has no PV atom"):
        target_spec("gfx936").pv_model("int8", ATOM)


@pytest.mark.parametrize("numerics", NUMERICS, ids=["one-term", "q2_u8"])
@pytest.mark.parametrize("shape", [(2, 8, 2, 300, 64), (1, 16, 1, 130, 128)])
def test_decode_on_the_second_atom_matches_both_references(numerics, shape):
    seed = 241 + shape[1]
    print(f"seed {seed}")
    args = decode_inputs(seed, *shape)
    scale = shape[-1] ** -0.5
    out = simulate_decode(*args, scale, target="gfx942", numerics=numerics, pv_atom=ATOM)
    err = _check(out, args, numerics)
    print(f"{shape} {numerics.describe()}: vs fragment {err['fragment']:.2e}, "
          f"vs exact {err['exact']:.2e} (x max|V|)")
    # Its groups are not the 16x16x32 atom's: the outputs differ, and the default
    # atom's fragment reference is not what this kernel computes.
    default = simulate_decode(*args, scale, target="gfx942", numerics=numerics)
    assert not np.array_equal(out, default)
    with pytest.raises(AssertionError, match="vs fragment reference"):
        _check(out, args, numerics, model="gfx942")


def test_paged_decode_on_the_second_atom_matches_both_references():
    seed = 251
    print(f"seed {seed}")
    rng = seeded_rng(seed)
    arrays = paged_batch(rng, [1, 200, 700], 8, 2, 64, 16)
    numerics = Numerics(q_terms=2, w_quant="u8", w_terms=1)
    out = simulate_paged(*arrays, 0.125, target="gfx942", numerics=numerics, pv_atom=ATOM)
    q, k, ks, v, vs, tables, lens = arrays
    for b in range(q.shape[0]):
        _check(out[b:b + 1], (q[b:b + 1], *sequence_cache(k, ks, v, vs, tables, lens, b)),
               numerics)


@pytest.mark.parametrize("numerics", NUMERICS, ids=["one-term", "q2_u8"])
def test_prefill_on_the_second_atom_matches_both_references(numerics):
    # The 32x32 C layout holds a row in other lanes than the 16x16 scores do: the
    # online softmax's alpha and the final l reach PV's rows through LDS.
    seed = 261
    print(f"seed {seed}")
    args = prefill_inputs(seed, 1, 8, 2, 150, 70, 64)
    out = simulate_prefill(*args, 0.125, target="gfx942", numerics=numerics, pv_atom=ATOM)
    err = _check(out, args, numerics)
    print(f"prefill {numerics.describe()}: vs fragment {err['fragment']:.2e}, "
          f"vs exact {err['exact']:.2e} (x max|V|)")


def test_the_compile_api_builds_the_atom_and_names_its_groups():
    # --pv-atom / pv_atom= reaches the kernels through CompileOptions; the options name
    # the model the W groups follow, which the references then take.
    import int8attn
    from int8attn.driver.graph import decode_graph

    seed = 281
    print(f"seed {seed}")
    args = decode_inputs(seed, 1, 8, 2, 200, 64)
    graph = int8attn.compile(decode_graph(1, 8, 2, 200, 64), target="gfx942", pv_atom=ATOM,
                             simulate=True, cache=False)
    assert graph.options.pv_model_name == MODEL
    out = graph(*args)
    _check(out, args, graph.options.numerics)
    default = int8attn.compile(decode_graph(1, 8, 2, 200, 64), target="gfx942", simulate=True,
                               cache=False)
    assert default.options.pv_model_name == "gfx942"
    assert not np.array_equal(out, default(*args))


@pytest.mark.parametrize("options, message", [
    (dict(target="cpu"), "does not apply to --target cpu"),
    (dict(target="cuda"), "--target cuda's INT8 PV atoms are mma.sync.m16n8k32.s8"),
    (dict(target="gfx936"), "--target gfx936's INT8 PV atoms are v_mmac_i32_16x16x32_i8"),
])
def test_an_atom_the_target_does_not_have_is_refused(options, message):
    import int8attn
    from int8attn.driver.graph import decode_graph

    with pytest.raises(Exception, match=message):
        int8attn.compile(decode_graph(1, 8, 2, 200, 64), pv_atom=ATOM, cache=False,
                         simulate=options["target"] != "cpu", **options)
