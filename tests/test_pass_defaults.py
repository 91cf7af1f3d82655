"""A pass run alone (`int8attn-opt -p int8-qk`) computes what the named pipeline does:
every pass option that the pipeline (`PipelineOptions`) or the driver
(`CompileOptions`, on cpu) also has defaults to the same value, and the numerics
ones to the contract's `Numerics()`."""

import dataclasses

import pytest

from int8attn.contract.numerics import Numerics
from int8attn.driver.options import CompileOptions
from int8attn.passes import PASSES
from int8attn.pipelines import PipelineOptions

# float-pv's `pv` picks the float precision of a pipeline whose pv is already not
# int8 (f32 or bf16); the pipeline's `pv` (int8 by default) chooses whether it runs.
NOT_THE_PIPELINES = {("float-pv", "pv")}

PIPELINE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(PipelineOptions)}
# Every option of a pass that the pipeline also has (the others, such as
# lower-mmac-tiles' `tokens`, are the pass's own).
PASS_OPTIONS = [(name, field) for name, cls in PASSES.items()
                if dataclasses.is_dataclass(cls) for field in dataclasses.fields(cls)
                if (name, field.name) not in NOT_THE_PIPELINES
                and field.name in PIPELINE_DEFAULTS]


def test_the_passes_share_options_with_the_pipeline():
    # the numerics and the partition/tile sizes at least: a rename would drop them
    assert {("int8-qk", "q_terms"), ("quantize-w-groups", "w_quant"),
            ("quantize-w-groups", "w_terms"), ("lower-paged-attention", "q_terms"),
            ("decode-split-kv", "partition_tokens"), ("prefill-online-softmax", "tile_tokens"),
            ("lower-mmac-tiles", "contraction")} <= {(n, f.name) for n, f in PASS_OPTIONS}


@pytest.mark.parametrize("name, field", PASS_OPTIONS,
                         ids=[f"{n}:{f.name}" for n, f in PASS_OPTIONS])
def test_a_pass_option_defaults_as_the_pipeline_and_the_cpu_driver(name, field):
    assert field.default == PIPELINE_DEFAULTS[field.name], (
        f"{name} {field.name}={field.default!r}, the pipeline's "
        f"{PIPELINE_DEFAULTS[field.name]!r}")
    cpu = CompileOptions(target="cpu").pipeline_options()
    assert field.default == getattr(cpu, field.name), f"{name} {field.name}"
    if field.name in {f.name for f in dataclasses.fields(Numerics)}:
        assert field.default == getattr(Numerics(), field.name)


def test_the_listing_shows_the_pipelines_numerics_for_the_passes_alone():
    from int8attn.opt import list_passes

    lines = list_passes().splitlines()

    def options_of(name):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"  {name} "))
        block = []
        for line in lines[start + 1:]:
            if not line.startswith(" " * 27):
                break
            block.append(line.strip())
        return block

    assert any(line.startswith(f"q-terms=<one of 1, 2> (default {Numerics().q_terms})")
               for line in options_of("int8-qk"))
    w_options = options_of("quantize-w-groups")
    assert any(line.startswith(f"w-quant=<one of s8, u8> (default {Numerics().w_quant})")
               for line in w_options)
    assert any(line.startswith(f"w-terms=<one of 1, 2> (default {Numerics().w_terms})")
               for line in w_options)


@pytest.mark.parametrize("pv", ["int8", "bf16"])
def test_the_default_pipeline_is_its_passes_run_alone_without_options(pv):
    # `int8attn-opt -p "int8-qk,lower-cache-write,..."` by hand, no options given, is
    # `--pipeline int8attn-to-linalg` (float-pv's own pv aside)
    from int8attn.pipelines import to_linalg

    ours = [p for p in to_linalg(PipelineOptions(pv=pv)) if type(p) in PASSES.values()]
    assert len(ours) >= 8
    for configured in ours:
        alone = type(configured)(**({"pv": pv} if configured.argument == "float-pv" else {}))
        assert alone == configured, f"{configured.argument}: {alone} alone, {configured} " \
                                    f"in the pipeline"
