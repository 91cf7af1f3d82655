"""The numerics variant travels as one `Numerics` value (issue 23 item 5).

- `Numerics` (contract/numerics.py) refuses a value outside its choices, naming the
  field, the value and the choices; its defaults are the contract's (the pipeline's).
- The options declare the three fields; `PipelineOptions.numerics` and
  `CompileOptions.numerics` (resolved: the cpu pipeline's, else KERNEL_TARGET_NUMERICS) give
  them as one value, and `int8attn.compile(..., numerics=)` takes one.
- In the converted layers (CONVERTED; not kernels/, passes/, dialects/, whose pass
  options and kernel builders keep their fields, nor the tests' own parameters) no
  function takes q_terms / w_quant / w_terms as loose parameters
  or a `**numerics` catch-all: the references, the simulator, the driver's reference
  hook, the benches take `numerics`, with the contract's `Numerics()` as the
  references' default.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json

import numpy as np
import pytest

import int8attn
from conftest import REPO
from int8attn import reference as ref
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.options import KERNEL_TARGET_NUMERICS, CompileOptions
from int8attn.kernels.target_spec import target_spec
from int8attn.driver.targets import OptionRefused
from int8attn.pipelines import PIPELINE_NUMERICS, PipelineOptions

LOOSE = ("q_terms", "w_quant", "w_terms")
# Folders (and files) whose functions take the variant whole. Not checked: kernels/
# (the lead's rewrite moves their builders to `numerics=`), passes/ and dialects/ (pass
# options and op attributes: one field each by design), driver/options.py and
# pipelines/ (they declare the fields).
CONVERTED = ("reference", "simulator", "serving", "int8attn", "examples", "benchmarks",
             "driver/graph.py", "driver/stages.py")
# Primitives of one quantity that take the one field they need, not the variant: the
# quantize rule of W per kind, its residual and levels (reference/common.py).
ONE_FIELD = {("reference/common.py", "quantize_w"), ("reference/common.py", "w_residual"),
             ("reference/common.py", "w_levels")}


def _functions(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield node


def test_numerics_refuses_a_value_outside_its_choices():
    for fields, message in (
            (dict(q_terms=3), "numerics q_terms=3: expected one of 1, 2"),
            (dict(q_terms=True), "numerics q_terms=True: expected one of 1, 2"),
            (dict(q_terms="2"), "numerics q_terms='2': expected one of 1, 2"),
            (dict(w_quant="u4"), "numerics w_quant='u4': expected one of s8, u8"),
            (dict(w_terms=2.0), "numerics w_terms=2.0: expected one of 1, 2")):
        with pytest.raises(ValueError) as error:
            Numerics(**fields)
        assert str(error.value) == message


def test_the_defaults_are_declared_once():
    assert Numerics() == PIPELINE_NUMERICS == PipelineOptions().numerics
    assert (PipelineOptions.q_terms, PipelineOptions.w_quant, PipelineOptions.w_terms) == \
        dataclasses.astuple(Numerics())[:3]
    # the tensor-level pipeline's second terms are the scaled ones (digits: the kernels')
    assert (Numerics().q_second, Numerics().w_second) == ("scaled", "scaled")
    assert ONE_TERM_NUMERICS == Numerics(q_terms=1, w_quant="s8", w_terms=1)
    assert Numerics().describe() == "q-terms 2, w-quant u8, w-terms 2"


def test_compile_options_resolve_one_numerics_value():
    assert CompileOptions().numerics == Numerics()
    assert CompileOptions(target="cuda").numerics == KERNEL_TARGET_NUMERICS
    assert CompileOptions(q_terms=1).numerics == Numerics(q_terms=1)            # the rest: cpu's
    assert CompileOptions(target="gfx936", w_quant="u8").numerics == \
        dataclasses.replace(KERNEL_TARGET_NUMERICS, w_quant="u8")
    options = CompileOptions(target="gfx942", q_terms=2)
    # the pipeline options carry what the tensor-level pipeline implements: scaled terms
    assert options.pipeline_options().numerics == \
        dataclasses.replace(options.numerics, q_second="scaled", w_second="scaled")
    assert (options.resolved().q_terms, options.resolved().w_quant) == (2, KERNEL_TARGET_NUMERICS.w_quant)


def test_the_api_takes_numerics_whole():
    from int8attn.api import compile_options

    variant = Numerics(q_terms=1, w_quant="u8", w_terms=2)
    assert compile_options(numerics=variant).numerics == variant
    # a kernel target refuses w-terms 2 later, in its check of the options
    assert compile_options(numerics=variant, target="cuda").w_terms == 2
    with pytest.raises(OptionRefused, match="numerics= and q_terms= both given"):
        compile_options(numerics=variant, q_terms=1)
    with pytest.raises(OptionRefused, match="numerics must be an int8attn.contract.numerics"):
        compile_options(numerics={"q_terms": 1})
    with pytest.raises(OptionRefused, match="unknown option 'numeric'"):
        int8attn.compile("", numeric=variant)


def test_no_loose_numerics_parameters_outside_the_option_declarations():
    found = []
    for entry in CONVERTED:
        paths = [REPO / entry] if entry.endswith(".py") else sorted((REPO / entry).rglob("*.py"))
        for path in paths:
            relative = path.relative_to(REPO).as_posix()
            for node in _functions(path):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                name = getattr(node, "name", "<lambda>")
                if (relative, name) in ONE_FIELD:
                    continue
                loose = [n for n in names if n in LOOSE]
                catch_all = args.kwarg is not None and args.kwarg.arg == "numerics"
                if loose or catch_all:
                    found.append(f"{relative}:{node.lineno} {name}({', '.join(loose)}"
                                 f"{'**numerics' if catch_all else ''})")
    assert not found, "loose numerics parameters (take a Numerics):\n" + "\n".join(found)


REFERENCE_FUNCTIONS = [
    ref.fragment_attention, ref.fragment_softmax_pv, ref.fragment_paged_attention,
    ref.error_split, ref.w_quantization_error_scale, ref.rounding_tie_slack,
    ref.bf16_rounding_error_scale, ref.qk_quantization_error_scale,
    ref.qk_quantization_error_bound, ref.quantize_w_terms]


@pytest.mark.parametrize("function", REFERENCE_FUNCTIONS, ids=lambda f: f.__name__)
def test_references_take_numerics_with_the_contracts_default(function):
    parameters = inspect.signature(function).parameters
    assert parameters["numerics"].default == Numerics(), function.__name__
    assert not set(LOOSE) & set(parameters), function.__name__


def test_the_other_numerics_parameters_and_their_defaults():
    from int8attn.driver.graph import references
    from int8attn.reference.common import int8_pv, int8_scores
    from int8attn.reference.fragment import blocks_for
    from int8attn.reference.onnx_decoder import contract_attention
    from int8attn.simulator import simulate_decode, simulate_paged, simulate_prefill
    from int8attn.simulator.prefill import simulate_paged_prefill

    for function in (references, int8_pv, int8_scores, blocks_for, contract_attention):
        assert inspect.signature(function).parameters["numerics"].default == Numerics()
    # The simulator builds the kernels: None, the target spec's default, which is what
    # the options resolve a kernel target to.
    for function in (simulate_decode, simulate_paged, simulate_prefill, simulate_paged_prefill):
        assert inspect.signature(function).parameters["numerics"].default is None
    for target in ("gfx936", "gfx942", "cuda"):
        assert target_spec(target).resolve_numerics(None, 128) == KERNEL_TARGET_NUMERICS
        assert CompileOptions(target=target).numerics == target_spec(target).numerics


def test_a_loose_keyword_is_refused():
    # Refused on the keyword, before any array is looked at.
    with pytest.raises(TypeError, match="q_terms"):
        ref.fragment_attention(None, None, None, None, None, 0.125, q_terms=2)
    with pytest.raises(TypeError, match="w_quant"):
        ref.rounding_tie_slack(None, None, None, None, None, 0.125, w_quant="u8")


def test_the_kernels_build_what_is_given_else_their_default():
    variant = Numerics(q_terms=2, w_quant="u8", w_terms=1)
    for target in ("gfx936", "gfx942", "cuda"):
        assert target_spec(target).resolve_numerics(variant, 128) is variant
        assert target_spec(target).resolve_numerics(None, 128) == KERNEL_TARGET_NUMERICS


def test_q_digits_refuse_a_head_dim_whose_joined_sums_could_overflow():
    # 512 x 128 x (127 * 256 + 128) < 2^31 <= 544 x 128 x 32640: the joined QK sums of
    # q digits stay exact in int32 up to D = 512; above, scaled second terms still build.
    spec = target_spec("cuda")
    assert spec.resolve_numerics(None, 512) == KERNEL_TARGET_NUMERICS
    with pytest.raises(ValueError, match="a head dim of 544 could overflow"):
        spec.resolve_numerics(None, 544)
    scaled = dataclasses.replace(KERNEL_TARGET_NUMERICS, q_second="scaled")
    assert spec.resolve_numerics(scaled, 1024) is scaled
    with pytest.raises(ValueError, match="use q-second scaled"):
        ref.fragment_attention(np.zeros((1, 1, 544), np.float32),
                               np.zeros((1, 1, 4, 544), np.int8), np.ones((1, 1, 4), np.float32),
                               np.zeros((1, 1, 4, 544), np.int8), np.ones((1, 1, 4), np.float32),
                               0.125, numerics=KERNEL_TARGET_NUMERICS)


def test_paged_attention_states_its_numerics(tmp_path):
    from int8attn.serving.paged_attention import SETTINGS, PagedAttention

    assert PagedAttention(8, 2, 64, 16).numerics == KERNEL_TARGET_NUMERICS
    assert PagedAttention(8, 2, 64, 16, target="cpu").numerics == Numerics()
    assert PagedAttention(8, 2, 64, 16, q_terms=2).numerics == \
        dataclasses.replace(KERNEL_TARGET_NUMERICS, q_terms=2)
    # A saved folder keeps the numerics its kernels were built with (before w_terms was
    # saved: one W term, the kernels' only one).
    (tmp_path / SETTINGS).write_text(json.dumps(dict(
        numerics={"q_terms": 2, "w_quant": "u8"}, q_heads=8, kv_heads=2, head_dim=64,
        block_size=16, softmax_scale=0.125, options={}, kinds=[])))
    assert PagedAttention.load(tmp_path).numerics == Numerics(q_terms=2, w_quant="u8", w_terms=1)


def test_the_old_preset_names_are_aliases_of_the_new():
    # SEED_NUMERICS / KERNEL_NUMERICS stay importable where they were, deprecated
    from int8attn import reference
    from int8attn.contract import numerics
    from int8attn.driver import options

    assert numerics.SEED_NUMERICS is numerics.ONE_TERM_NUMERICS is reference.SEED_NUMERICS
    assert numerics.ONE_TERM_NUMERICS == Numerics(q_terms=1, w_quant="s8", w_terms=1)
    assert numerics.KERNEL_NUMERICS is numerics.DIGIT_NUMERICS
    assert numerics.DIGIT_NUMERICS.q_digits and numerics.DIGIT_NUMERICS.w_digits
    assert options.KERNEL_NUMERICS is options.KERNEL_TARGET_NUMERICS == numerics.DIGIT_NUMERICS
    assert "ONE_TERM_NUMERICS" in reference.__all__ and "SEED_NUMERICS" in reference.__all__
