"""Bad graphs and CLI misuse, tried as a new user would, through every command and target.

The commands run in-process through their `main(argv)`: an exception escaping
`main` (what a user would see as a traceback) fails the test. Each bad graph
must give the same `FILE:LINE:COL: error: ...` and exit status 1 from
`int8attn-opt`, from `int8attn compile` for every target and from
`int8attn run` (the CPU runtime and the lane simulator of every kernel
target); misuse must give a usage message and 2.
"""

import pytest

from int8attn import cli, opt

GRAPH = """func.func @decode(%q: tensor<{q}>, %k: tensor<{k}>, %ks: tensor<{ks}>, %v: tensor<{v}>, %vs: tensor<{vs}>) -> tensor<{q}> {{
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {{{attrs}}} : (tensor<{q}>, tensor<{k}>, tensor<{ks}>, tensor<{v}>, tensor<{vs}>) -> tensor<{q}>
  return %o : tensor<{q}>
}}
"""
GOOD = dict(q="1x4x32xf32", k="1x2x40x32xi8", ks="1x2x40xf32", v="1x2x40x32xi8", vs="1x2x40xf32",
            attrs='mode = "decode", softmax_scale = 0.25 : f32')
OP = "2:8: error: 'int8attn.attention' op "


def graph(**changes) -> str:
    return GRAPH.format(**{**GOOD, **changes})


BAD_GRAPHS = {
    "malformed": ("func.func @f( {\n", "1:14: error: expected non-function type"),
    "foreign_op": ('func.func @f() {\n  %0 = "foo.bar"() : () -> f32\n  return\n}\n',
                   "2:8: error: unknown op 'foo.bar': neither an int8attn op nor an op of a "
                   "dialect IREE's compiler registers"),
    "unknown_int8attn_op": ('func.func @f() {\n  %0 = "int8attn.flash"() : () -> f32\n  return\n}\n',
                            "2:8: error: unknown op 'int8attn.flash'; the int8attn dialect has"),
    "k_element": (graph(k="1x2x40x32xf16"), OP + "k must have element type i8"),
    "q_element": (graph(q="1x4x32xi8"), OP + "q must have element type f32 or f16 or bf16"),
    "q_rank": (graph(q="4x32xf32"), OP + "q must have rank 3, got tensor<4x32xf32>"),
    "prefill_q_rank": (graph(attrs='mode = "prefill", softmax_scale = 0.25 : f32'),
                       OP + "q must have rank 4, got tensor<1x4x32xf32>"),
    "k_rank": (graph(k="2x40x32xi8"), OP + "k must have rank 4"),
    "unranked": (graph(k="*xi8"), OP + "k must be a ranked tensor, got tensor<*xi8>"),
    "dynamic": (graph(k="?x2x40x32xi8"), OP + "k must have a static shape"),
    "empty_dim": (graph(k="1x2x0x32xi8", ks="1x2x0xf32", v="1x2x0x32xi8", vs="1x2x0xf32"),
                  OP + "k has an empty dimension"),
    "s_of_v": (graph(v="1x2x41x32xi8", vs="1x2x41xf32"),
               OP + "v has shape [1, 2, 41, 32], expected [1, 2, 40, 32]"),
    "s_of_scales": (graph(ks="1x2x39xf32"), OP + "k_scale has shape [1, 2, 39], expected [1, 2, 40]"),
    "d_of_q": (graph(q="1x4x64xf32"), OP + "q has head dim 64 but k has head dim 32"),
    "batch": (graph(q="2x4x32xf32"), OP + "q has batch 2 but k has batch 1"),
    "gqa": (graph(q="1x3x32xf32"), OP + "query heads (3) must be a multiple of KV heads (2)"),
    "mode": (graph(attrs='mode = "encode", softmax_scale = 0.25 : f32'),
             OP + "attribute 'mode' is \"encode\"; expected one of 'decode', 'prefill'"),
    "no_mode": (graph(attrs="softmax_scale = 0.25 : f32"), OP + "requires a string attribute 'mode'"),
    "no_scale": (graph(attrs='mode = "decode"'), OP + "requires an f32 attribute 'softmax_scale'"),
    "int_scale": (graph(attrs='mode = "decode", softmax_scale = 1 : i32'),
                  OP + "requires an f32 attribute 'softmax_scale'"),
    "zero_scale": (graph(attrs='mode = "decode", softmax_scale = 0.0 : f32'),
                   OP + "attribute 'softmax_scale' must be positive and finite, got 0.0"),
    "negative_scale": (graph(attrs='mode = "decode", softmax_scale = -1.0 : f32'),
                       OP + "attribute 'softmax_scale' must be positive and finite, got -1.0"),
    "inf_scale": (graph(attrs='mode = "decode", softmax_scale = 0x7F800000 : f32'),
                  OP + "attribute 'softmax_scale' must be positive and finite, got inf"),
    "nan_scale": (graph(attrs='mode = "decode", softmax_scale = 0x7FC00000 : f32'),
                  OP + "attribute 'softmax_scale' must be positive and finite, got nan"),
    "d_of_v": (graph(v="1x2x40x64xi8"), OP + "v has shape [1, 2, 40, 64], expected [1, 2, 40, 32]"),
    "i4_cache": (graph(k="1x2x40x32xi4"), OP + "k must have element type i8, got tensor<1x2x40x32xi4>"),
    "kv_heads_above_q_heads": (graph(q="1x2x32xf32", k="1x4x40x32xi8", ks="1x4x40xf32",
                                     v="1x4x40x32xi8", vs="1x4x40xf32"),
                               OP + "query heads (2) must be a multiple of KV heads (4)"),
    "misspelt_mode": (graph(attrs='mode = "decod", softmax_scale = 0.25 : f32'),
                      OP + "attribute 'mode' is \"decod\"; expected one of 'decode', 'prefill'"),
    "result_shape": (GRAPH.replace("tensor<{vs}>) -> tensor<{q}>", "tensor<{vs}>) -> tensor<1x4x16xf32>")
                     .replace("return %o : tensor<{q}>", "return %o : tensor<1x4x16xf32>")
                     .format(**GOOD),
                     OP + "result has shape [1, 4, 16], expected [1, 4, 32]"),
    "unused_argument": (
        'func.func @decode(%q: tensor<1x4x32xf32>, %k: tensor<1x2x40x32xi8>, '
        '%ks: tensor<1x2x40xf32>, %v: tensor<1x2x40x32xi8>, %vs: tensor<1x2x40xf32>, '
        '%extra: tensor<4xf32>) -> tensor<1x4x32xf32> {\n'
        '  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = '
        '0.25 : f32} : (tensor<1x4x32xf32>, tensor<1x2x40x32xi8>, tensor<1x2x40xf32>, '
        'tensor<1x2x40x32xi8>, tensor<1x2x40xf32>) -> tensor<1x4x32xf32>\n'
        '  return %o : tensor<1x4x32xf32>\n}\n',
        "1:1: error: argument 5 of @decode (tensor<4xf32>) is not used; remove it from the "
        "signature"),
    "head_dim_24": (graph(q="1x4x24xf32", k="1x2x40x24xi8", v="1x2x40x24xi8"),
                    "2:8: error: head dim 24 is not a multiple of N=16 of gfx936's "
                    "v_mmac_i32_16x16x32_i8, which computes 16 head-dim columns at a time; pad D "
                    "to 32 with zero columns, or use a float PV (--pv bf16 or --pv f32)"),
}


KERNEL_TARGETS = ("gfx936", "gfx942", "cuda")
# Checks that belong to the tensor-level pipeline (pv-to-mmac), not to the graph:
# the kernels have their own, located, limits on D (tests/test_targets.py).
PIPELINE_ONLY = {"head_dim_24"}
# Checks of the driver's graph stage: int8attn-opt runs passes on any IR, as mlir-opt does.
DRIVER_ONLY = {"unused_argument"}


def _commands(path, tmp_path, name):
    commands = {
        "compile": (cli.main, ["compile", str(path), "-o", str(tmp_path / "out.vmfb")]),
        "run": (cli.main, ["run", str(path), "--seed", "0", "--output", str(tmp_path / "out.npz")]),
        "opt": (opt.main, [str(path), "--pipeline", "int8attn-to-linalg", "-o",
                           str(tmp_path / "out.mlir")]),
    }
    if name in DRIVER_ONLY:
        del commands["opt"]
    if name in PIPELINE_ONLY:
        return commands
    for target in KERNEL_TARGETS:
        commands[f"compile --target {target}"] = (cli.main, [
            "compile", str(path), "--target", target, "-o", str(tmp_path / "out.bin")])
        commands[f"run --target {target} --simulate"] = (cli.main, [
            "run", str(path), "--target", target, "--simulate", "--seed", "0",
            "--output", str(tmp_path / "out.npz")])
    return commands


@pytest.mark.parametrize("name", sorted(BAD_GRAPHS))
def test_bad_graph_is_a_located_error_in_every_command(name, tmp_path, capsys):
    text, message = BAD_GRAPHS[name]
    path = tmp_path / f"{name}.mlir"
    path.write_text(text)
    for command, (main, argv) in _commands(path, tmp_path, name).items():
        assert main(argv) == 1, command
        err = capsys.readouterr().err
        assert f"{path}:{message}" in err, (command, err)
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("out")], command


def test_unsupported_head_dim_runs_with_a_float_pv(tmp_path, capsys):
    path = tmp_path / "d24.mlir"
    path.write_text(graph(q="1x4x24xf32", k="1x2x40x24xi8", v="1x2x40x24xi8"))
    assert cli.main(["run", str(path), "--seed", "0", "--pv", "f32"]) == 0
    assert "vs fragment-level reference" in capsys.readouterr().out


def test_graph_files_that_are_not_mlir_text(tmp_path, capsys):
    binary, empty = tmp_path / "binary.mlir", tmp_path / "empty.mlir"
    binary.write_bytes(b"\xff\xfe\x00binary")
    empty.write_text("")
    assert opt.main([str(binary), "-p", "int8-qk"]) == 1
    assert "'" + str(binary) + "' is not MLIR text (not UTF-8)" in capsys.readouterr().err
    assert cli.main(["compile", str(binary), "-o", str(tmp_path / "x.vmfb")]) == 1
    assert f"graph file '{binary}' is not MLIR text (not UTF-8)" in capsys.readouterr().err
    assert cli.main(["compile", str(empty), "-o", str(tmp_path / "x.vmfb")]) == 1
    assert f"{empty}:1:1: error: the graph has no public func.func" in capsys.readouterr().err


MISUSE = [
    (cli.main, ["frobnicate"], "invalid choice: 'frobnicate'"),
    (cli.main, ["run", "g.mlir", "--bogus"], "unrecognized arguments: --bogus"),
    (cli.main, ["run", "g.mlir", "--seed", "abc"], "argument --seed: invalid int value: 'abc'"),
    (cli.main, ["run", "g.mlir", "--seed", "-1"], "argument --seed: must be a non-negative integer"),
    (cli.main, ["run", "g.mlir", "--pv", "int4"], "argument --pv: invalid choice: 'int4'"),
    (cli.main, ["compile", "g.mlir"], "the following arguments are required: -o/--output"),
    (cli.main, ["run", "g.mlir", "--partition-tokens", "x"], "expects an integer, got 'x'"),
    (cli.main, ["compile", "g.mlir", "--emit", "object", "-o", "x"], "invalid choice: 'object'"),
    (opt.main, [], "the input file is required"),
    (opt.main, ["g.mlir", "-p", "no-such-pass"], "unknown pass 'no-such-pass'"),
    (opt.main, ["g.mlir", "-p", "int8-qk{bogus=1}"], "pass 'int8-qk' has no option 'bogus'"),
    (opt.main, ["g.mlir", "-p", "canonicalize{bogus=1}"],
     "IREE pass 'canonicalize': no such option bogus"),
    (opt.main, ["g.mlir", "-p", "decode-split-kv{partition-tokens=abc}"], "expects an integer"),
    (opt.main, ["g.mlir", "--pipeline", "no-such-pipeline"], "unknown pipeline 'no-such-pipeline'"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{partition-tokens=0}"],
     "option 'partition-tokens' must be at least 1, got 0"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{tile-tokens=48}"],
     "tile-tokens=48 with pv=int8: a block of 48 tokens is not a whole number of 64-token waves"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{verify=maybe}"],
     "option 'verify' of pipeline 'int8attn-to-linalg' expects true or false, got 'maybe'"),
    (opt.main, ["g.mlir", "-p", "int8-qk", "--pipeline", "int8attn-to-linalg"],
     "not allowed with argument"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{pv=f32"],
     "pipeline 'int8attn-to-linalg{pv=f32': its options go in one pair of braces"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{pv=f32}}"],
     "its options go in one pair of braces, 'int8attn-to-linalg{key=value ...}'"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{{pv=f32}}"],
     "its options go in one pair of braces"),
    (opt.main, ["g.mlir", "--pipeline", "int8attn-to-linalg{pv=f32}x"],
     "its options go in one pair of braces"),
]


@pytest.mark.parametrize("main, argv, message", MISUSE, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_misuse_is_a_usage_error(main, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert "usage:" in err and message in err, err
