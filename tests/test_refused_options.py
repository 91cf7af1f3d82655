"""A flag that does not apply is refused, never ignored: the "applies when" table
(pipelines.APPLIES_WHEN + driver.options.COMPILE_APPLIES_WHEN) through the CLI, the
API and int8attn-opt pipeline strings alike; bounded token options; the op
verifiers' attributes, regions, f32 softmax_scale and dimension bound; the stages
that --print-ir-after-all and --kernel-object need; messages (help, summaries, a
runtime without the device).

Nothing here compiles with IREE: every compile stops at --emit graph or algorithm.
"""

import dataclasses

import numpy as np
import pytest

import int8attn
from int8attn import cli, opt
from int8attn.contract.numerics import ONE_TERM_NUMERICS, Numerics
from int8attn.driver.graph import decode_graph
from int8attn.driver.options import CompileOptions
from int8attn.driver.targets import TARGETS, OptionRefused
from int8attn.support.diagnostics import StageError
from int8attn.support.options import OptionError

SMALL = decode_graph(1, 4, 2, 64, 32)
ATTENTION = (
    'func.func @decode(%q: tensor<1x4x32xf32>, %k: tensor<1x2x{S}x32xi8>, '
    '%ks: tensor<1x2x{S}xf32>, %v: tensor<1x2x{S}x32xi8>, %vs: tensor<1x2x{S}xf32>) '
    '-> tensor<1x4x32xf32> {{\n'
    '  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs){region} {{{attrs}}} : '
    '(tensor<1x4x32xf32>, tensor<1x2x{S}x32xi8>, tensor<1x2x{S}xf32>, tensor<1x2x{S}x32xi8>, '
    'tensor<1x2x{S}xf32>) -> tensor<1x4x32xf32>\n'
    '  return %o : tensor<1x4x32xf32>\n}}\n')
GOOD_ATTRS = 'mode = "decode", softmax_scale = 0.17677669 : f32'


def graph(S=64, attrs=GOOD_ATTRS, region=""):
    return ATTENTION.format(S=S, attrs=attrs, region=region)


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "small.mlir"
    path.write_text(SMALL)
    return path


# (CLI flags, the API keywords they are, the message)
DOES_NOT_APPLY = [
    (["--pv", "f32", "--w-quant", "s8"], dict(pv="f32", w_quant="s8"),
     "--w-quant s8 does not apply with --pv f32: only PV on the INT8 instruction"),
    (["--pv", "bf16", "--w-quant", "u8"], dict(pv="bf16", w_quant="u8"),
     "--w-quant u8 does not apply with --pv bf16"),
    (["--pv", "f32", "--w-terms", "1"], dict(pv="f32", w_terms=1),
     "--w-terms 1 does not apply with --pv f32"),
    (["--pv", "bf16", "--w-second", "scaled"], dict(pv="bf16", w_second="scaled"),
     "--w-second scaled does not apply with --pv bf16"),
    (["--pv", "f32", "--scale-groups", "contiguous"], dict(pv="f32", scale_groups="contiguous"),
     "--scale-groups contiguous does not apply with --pv f32"),
    (["--pv", "bf16", "--no-verify"], dict(pv="bf16", verify=False),
     "--no-verify does not apply with --pv bf16: verify-scale-groups checks the W scale groups"),
    (["--pv", "f32", "--fragment-model", "gfx942"], dict(pv="f32", fragment_model="gfx942"),
     "--fragment-model gfx942 does not apply with --pv f32: the fragment model's MMAC token "
     "sets are the W scale groups"),
    (["--pv", "f32", "--contraction", "mmt4d"], dict(pv="f32", contraction="mmt4d"),
     "--contraction mmt4d does not apply with --pv f32: it chooses how lower-mmac-tiles "
     "contracts the MMAC tiles"),
    (["--q-terms", "1", "--q-second", "scaled"], dict(q_terms=1, q_second="scaled"),
     "--q-second scaled does not apply with --q-terms 1: it chooses how the second q term is "
     "made, and one q term has none"),
    (["--w-terms", "1", "--w-second", "scaled"], dict(w_terms=1, w_second="scaled"),
     "--w-second scaled does not apply with --w-terms 1"),
    (["--target", "cuda", "--pv", "bf16", "--w-quant", "s8"],
     dict(target="cuda", pv="bf16", w_quant="s8"), "--w-quant s8 does not apply with --pv bf16"),
    (["--target", "cuda", "--pv", "bf16", "--pv-atom", "mma.sync.m16n8k32.s8"],
     dict(target="cuda", pv="bf16", pv_atom="mma.sync.m16n8k32.s8"),
     "--pv-atom mma.sync.m16n8k32.s8 does not apply with --pv bf16"),
    (["--target", "cuda", "--q-terms", "1", "--q-second", "scaled"],
     dict(target="cuda", q_terms=1, q_second="scaled"),
     "--q-second scaled does not apply with --q-terms 1"),
]


@pytest.mark.parametrize("flags, keywords, message", DOES_NOT_APPLY,
                         ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_an_option_that_does_nothing_is_refused_by_cli_and_api(flags, keywords, message,
                                                                small, tmp_path, capsys):
    out = tmp_path / "out.mlir"
    assert cli.main(["compile", str(small), *flags, "--emit", "graph", "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(OptionRefused, match=message.split(":")[0]):
        TARGETS[keywords.get("target", "cpu")].check(CompileOptions(**keywords))
    with pytest.raises(OptionRefused, match=message.split(":")[0]):
        int8attn.compile(SMALL, cache=False, simulate=keywords.get("target", "cpu") != "cpu",
                         **keywords)


# The CLI knows the flags it was given: at their default value too, one that does
# nothing is refused as a pipeline string refuses it (the API keeps the value rule: it
# cannot tell a default it was passed from one it was not).
DEFAULT_THAT_DOES_NOTHING = [
    (["--pv", "f32", "--scale-groups", "fragment"],
     "--scale-groups fragment does not apply with --pv f32"),
    (["--pv", "f32", "--contraction", "f32"], "--contraction f32 does not apply with --pv f32"),
    (["--target", "cuda", "--pv", "bf16", "--scale-groups", "fragment"],
     "--scale-groups fragment does not apply with --pv bf16"),
    (["--target", "cuda", "--contraction", "f32"],
     "--contraction f32 does not apply to --target cuda"),
    (["--target", "gfx936", "--target-cpu", "host"],
     "--target-cpu host does not apply to --target gfx936"),
]


@pytest.mark.parametrize("flags, message", DEFAULT_THAT_DOES_NOTHING,
                         ids=lambda x: " ".join(x) if isinstance(x, list) else "")
@pytest.mark.parametrize("command", ["compile", "run"])
def test_the_cli_refuses_a_default_that_does_nothing(command, flags, message, small, tmp_path,
                                                     capsys):
    out = tmp_path / "out.mlir"
    tail = ["--emit", "graph", "-o", str(out)] if command == "compile" else ["--seed", "0"]
    assert cli.main([command, str(small), *flags, *tail]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_cli_takes_the_value_a_kernel_target_has_anyway(small, tmp_path):
    # the kernels' own fragment model, groups and verifier: consistent, not inert
    out = tmp_path / "k.mlir"
    assert cli.main(["compile", str(small), "--target", "gfx936", "--fragment-model", "gfx936",
                     "--scale-groups", "fragment", "--emit", "graph", "-o", str(out)]) == 0


PIPELINE_REFUSED = [
    ("pv=f32,w-quant=s8", "w-quant=s8 does not apply with pv=f32"),
    ("pv=bf16 w-terms=1", "w-terms=1 does not apply with pv=bf16"),
    ("pv=f32 verify=false", "verify=false does not apply with pv=f32"),
    ("pv=bf16 scale-groups=contiguous", "scale-groups=contiguous does not apply with pv=bf16"),
    ("pv=f32 fragment-model=gfx942", "fragment-model=gfx942 does not apply with pv=f32"),
    ("pv=f32 contraction=mmt4d", "contraction=mmt4d does not apply with pv=f32"),
    ("vector-isa=avx512", "vector-isa=avx512 does not apply with contraction=f32"),
    ("partition-tokens=4294967296", "option 'partition-tokens' must be at most 65536"),
    ("tile-tokens=99999999999999999999", "option 'tile-tokens' must be at most 65536"),
]


@pytest.mark.parametrize("options, message", PIPELINE_REFUSED)
def test_pipeline_strings_refuse_the_same(options, message, small, capsys):
    with pytest.raises(SystemExit) as exit_info:
        opt.main([str(small), "--pipeline", f"int8attn-to-algorithm{{{options}}}"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("passes, message", [
    ("int8-qk,decode-split-kv{partition-tokens=99999999999999999999}",
     "option 'partition-tokens' must be at most 65536, got 99999999999999999999"),
    ("int8-qk,prefill-online-softmax{tile-tokens=1048576}",
     "option 'tile-tokens' must be at most 65536, got 1048576"),
])
def test_pass_options_are_bounded(passes, message, small, capsys):
    with pytest.raises(SystemExit) as exit_info:
        opt.main([str(small), "-p", passes])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_options_that_apply_are_accepted(small, tmp_path, capsys):
    out = str(tmp_path / "out.mlir")
    for flags in (["--pv", "f32", "--q-terms", "1"], ["--pv", "bf16", "--tile-tokens", "48"],
                  ["--q-terms", "2", "--q-second", "scaled"], ["--w-terms", "2", "--w-second",
                                                               "scaled", "--w-quant", "s8"],
                  ["--scale-groups", "contiguous", "--no-verify", "--emit", "graph"],
                  ["--partition-tokens", "65536"],
                  ["--target", "cuda", "--q-second", "digit", "--emit", "kernel"]):
        emit = [] if "--emit" in flags else ["--emit", "algorithm"]
        assert cli.main(["compile", str(small), *flags, *emit, "-o", out]) == 0, \
            (flags, capsys.readouterr().err)
    assert opt.main([str(small), "--pipeline", "int8attn-to-algorithm{pv=f32 tile-tokens=48}",
                     "-o", out]) == 0


@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("numerics", [ONE_TERM_NUMERICS, Numerics(q_terms=2)])
def test_a_whole_numerics_variant_with_a_float_pv_is_accepted(target, numerics):
    # numerics= (all five fields) names a contract variant a float PV is compared with.
    pv = "bf16"
    TARGETS[target].check(CompileOptions(target=target, pv=pv, **dataclasses.asdict(numerics)))
    int8attn.compile(SMALL, pv=pv, numerics=numerics, target=target, cache=False,
                     simulate=target != "cpu")


def test_checked_options_are_a_fixed_point_and_may_change_pv():
    # report.py recompiles the checked options with pv bf16 / f32 (`with_pv`): the W
    # options the int8 module was built with are dropped there, not refused; set by
    # hand with a float PV they are refused.
    target = TARGETS["cpu"]
    checked = target.check(CompileOptions(w_quant="s8", scale_groups="contiguous",
                                          verify=False))
    assert target.check(checked) == checked
    for pv in ("bf16", "f32"):
        again = CompileOptions(**dataclasses.asdict(checked.with_pv(pv)))
        assert target.check(again).pv == pv
        assert again.w_quant is None and again.scale_groups == "fragment" and again.verify
        with pytest.raises(OptionRefused, match="does not apply with --pv"):
            target.check(dataclasses.replace(checked, pv=pv))


def test_the_no_verify_help_says_it_skips_the_verifier(capsys):
    with pytest.raises(SystemExit):
        cli.main(["compile", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--no-verify pv=int8: skip verify-scale-groups" in help_text
    assert "run verify-scale-groups" not in help_text
    assert "(1 to 65536)" in help_text[help_text.index("--partition-tokens"):]


def test_stage_summaries_are_whole_sentences():
    for target in TARGETS.values():
        for stage in target.stages + target.with_object:
            assert stage.summary.endswith("."), (target.name, stage.name, stage.summary)


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
def test_print_ir_after_all_is_refused_where_no_stage_prints(target, small, tmp_path, capsys):
    out = tmp_path / "k.mlir"
    assert cli.main(["compile", str(small), "--target", target, "--emit", "kernel",
                     "--print-ir-after-all", "-o", str(out)]) == 2
    assert f"--print-ir-after-all does not apply to --target {target}" in \
        capsys.readouterr().err
    assert not out.exists()
    from int8attn.driver.compile import compile
    with pytest.raises(OptionRefused, match="--print-ir-after-all"):
        compile(SMALL, CompileOptions(target=target), until="kernel", print_ir_after_all=True)


def test_print_ir_after_all_still_prints_on_cpu(small, tmp_path, capfd):
    assert cli.main(["compile", str(small), "--emit", "algorithm", "--print-ir-after-all",
                     "-o", str(tmp_path / "a.mlir")]) == 0
    assert "IR Dump After" in capfd.readouterr().err   # MLIR's, on the stderr descriptor


@pytest.mark.parametrize("target, emit", [("gfx942", "kernel"), ("gfx942", "llvm"),
                                          ("gfx936", "kernel"), ("gfx936", "llvm")])
def test_kernel_object_is_refused_where_no_stage_packages_it(target, emit, small, tmp_path,
                                                             capsys):
    code_object = tmp_path / "K.co"
    code_object.write_bytes(b"\x7fELF")
    assert cli.main(["compile", str(small), "--target", target, "--kernel-object",
                     str(code_object), "--emit", emit, "-o", str(tmp_path / "o")]) == 2
    assert f"--kernel-object does not apply to --emit {emit}" in capsys.readouterr().err
    with pytest.raises(OptionRefused, match="only the vmfb stage packages the code object"):
        TARGETS[target].chain(emit, kernel_object=True)
    assert TARGETS[target].chain("vmfb", kernel_object=True)[-1].packages_object


@pytest.mark.parametrize("flags", [["--partition-tokens", "4294967296"],
                                   ["--partition-tokens", "1048576"],
                                   ["--tile-tokens", "65537"]])
def test_huge_token_options_are_usage_errors(flags, small, tmp_path, capsys):
    assert cli.main(["compile", str(small), *flags, "-o", str(tmp_path / "o")]) == 2
    assert "must be at most 65536" in capsys.readouterr().err


def test_the_fragment_model_bounds_its_block():
    from int8attn.fragments import fragment_model

    with pytest.raises(ValueError, match="outside 1..65536"):
        fragment_model("gfx936").token_groups(2 ** 32)


BAD_GRAPHS = [
    (dict(attrs='mode = "decode", softmax_scale = 1.0e300 : f64'),
     "requires an f32 attribute 'softmax_scale' (e.g. softmax_scale = 0.088 : f32), got "
     "1.000000e+300 : f64"),
    (dict(attrs='mode = "decode", softmax_scale = 0.5 : f16'), "requires an f32 attribute"),
    (dict(attrs=GOOD_ATTRS + ", causal = true"),
     "has unknown attribute 'causal' (its attributes: 'mode', 'softmax_scale')"),
    (dict(region=" ({\n  ^bb0:\n  })"), "has 1 region(s); int8attn ops have none"),
    (dict(S=2 ** 63 - 1), "k has a dimension of 9223372036854775807; int8attn supports "
     "static dimensions below 2^31"),
    (dict(S=2 ** 31), "k has a dimension of 2147483648"),
]


@pytest.mark.parametrize("emit", ["graph", "algorithm"])
@pytest.mark.parametrize("kwargs, message", BAD_GRAPHS)
def test_the_verifier_refuses_at_the_op(kwargs, message, emit, tmp_path, capsys):
    path = tmp_path / "g.mlir"
    path.write_text(graph(**kwargs))
    assert cli.main(["compile", str(path), "--emit", emit, "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2:8: error: 'int8attn.attention' op {message}" in err, err


def test_pv_chain_ops_refuse_unknown_attributes():
    from iree.compiler import ir

    from int8attn.dialects.int8attn import verify
    from int8attn.support.diagnostics import DiagnosticError
    from int8attn.support.ir import parse_module

    text = ('func.func @f(%v: tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32> {\n'
            '  %s = "int8attn.column_sums"(%v) {groups = [array<i64: ' +
            ", ".join(map(str, range(32))) + '>, array<i64: ' +
            ", ".join(map(str, range(32, 64))) + '>], extra = 1 : i64} : '
            '(tensor<1x1x1x64x16xi8>) -> tensor<1x1x1x2x16xi32>\n'
            '  return %s : tensor<1x1x1x2x16xi32>\n}\n')
    from int8attn.support.ir import new_context
    with new_context():
        module = parse_module(text, "c.mlir")
        with pytest.raises(DiagnosticError, match="has unknown attribute 'extra' "
                           r"\(its attributes: 'groups'\)"):
            verify(module)
        module = parse_module(text.replace(", extra = 1 : i64", ""), "c.mlir")
        verify(module)


def test_a_missing_gpu_says_so_and_names_the_simulator():
    from int8attn.runtime.module import LoadedModule

    module = LoadedModule(b"", {}, driver="cuda")
    with pytest.raises(StageError) as error:
        with module._stage("loading the module", "decode", []):
            raise RuntimeError("Could not create device. Exception for last tried follows.")
    text = str(error.value)
    assert "no IREE cuda device is present here" in text
    assert "--simulate" in text and "lane simulator" in text
    # the module is not at fault: no reproducer, and no folder of files left behind
    assert "reproduce with" not in text and error.value.reproducer is None


def test_run_with_a_kernel_object_gets_past_the_memory_check(small, tmp_path, capsys,
                                                            monkeypatch):
    # run's up-front memory check compiles only the graph stage, which a code object does
    # not belong to: it must not refuse --kernel-object as "not for --emit graph"
    from int8attn.driver import devices

    monkeypatch.setattr(devices, "missing_device", lambda driver: None)   # a GPU host
    bad = tmp_path / "k.co"
    bad.write_bytes(b"junk")
    assert cli.main(["run", str(small), "--target", "gfx942", "--kernel-object", str(bad),
                     "--seed", "0"]) == 1
    err = capsys.readouterr().err
    assert "is not an ELF file" in err and "--emit graph" not in err


def test_an_onnx_model_on_a_kernel_target_is_refused_alike_by_api_and_cli(tmp_path, capsys):
    # the API fell through to "returns no attention" (cuda, gfx942) or "no IREE runtime
    # here" (gfx936); one rule now (Target.check_source) for the API, the driver, the CLI
    onnx = pytest.importorskip("onnx")
    from int8attn.reference.onnx_attention import attention_model

    model = tmp_path / "decode.onnx"
    onnx.save(attention_model("decode_gqa"), str(model))
    for target in ("cuda", "gfx942", "gfx936"):
        with pytest.raises(OptionRefused, match="an ONNX model .* compiles with --target cpu"):
            int8attn.compile_file(str(model), target=target)
        assert cli.main(["compile", str(model), "--target", target, "-o",
                         str(tmp_path / "x")]) == 2
        assert "compiles with --target cpu" in capsys.readouterr().err


def test_a_stage_missing_with_a_kernel_object_names_the_object(small, capsys):
    assert cli.main(["compile", str(small), "--target", "gfx942", "--emit", "isa",
                     "--kernel-object", "k.co", "-o", "x.s"]) == 2
    err = capsys.readouterr().err
    assert "--target gfx942 with --kernel-object has the stages graph, kernel, llvm, vmfb" in err


def test_the_api_names_what_its_arguments_must_be():
    # a source that is no text, flags given as one string (it would be split into its
    # characters), a numpy integer (taken as the int it holds, as decode_graph takes it)
    for source in (None, 5, ["func.func @f()"]):
        with pytest.raises(TypeError, match="takes the graph's MLIR text .str. or an ONNX "
                                            "model's bytes, got"):
            int8attn.compile(source)
    for flags in ("--iree-opt-level=O2", ["--a", 3], 5):
        with pytest.raises(OptionError, match="option 'iree-flags' must be a list or tuple "
                                              "of strings"):
            CompileOptions(iree_flags=flags)
    assert CompileOptions(iree_flags=["--a"]).iree_flags == ("--a",)
    options = CompileOptions(partition_tokens=np.int64(128), tile_tokens=np.int32(64))
    assert (type(options.partition_tokens), options.partition_tokens) == (int, 128)
    assert repr(options) == repr(CompileOptions(partition_tokens=128, tile_tokens=64))
    for bad in (np.bool_(True), np.float64(64.0), True, 64.0):
        with pytest.raises(OptionError, match="option 'partition-tokens' must be an integer"):
            CompileOptions(partition_tokens=bad)
