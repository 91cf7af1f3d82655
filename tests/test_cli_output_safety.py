"""Outputs never replace what they should write through, never land on an input, and
flags that would be ignored or fail late are refused before any work (QA pass on the
CLIs' outputs).

The commands run in-process (`cli.main`, `opt.main`); where a refusal must come before
any work, the driver's compile is replaced by a function that fails the test. Nothing
here writes the real /dev/null except through the path that never renames (with the
rename and the temp file made impossible), so a regression cannot replace it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from int8attn import cli, opt
from int8attn.support.files import OutputError, write_atomic

GRAPH = """func.func @decode(%q: tensor<1x4x32xf32>, %k: tensor<1x2x40x32xi8>, %ks: tensor<1x2x40xf32>, %v: tensor<1x2x40x32xi8>, %vs: tensor<1x2x40xf32>) -> tensor<1x4x32xf32> {
  %o = "int8attn.attention"(%q, %k, %ks, %v, %vs) {mode = "decode", softmax_scale = 0.25 : f32} : (tensor<1x4x32xf32>, tensor<1x2x40x32xi8>, tensor<1x2x40xf32>, tensor<1x2x40x32xi8>, tensor<1x2x40xf32>) -> tensor<1x4x32xf32>
  return %o : tensor<1x4x32xf32>
}
"""


def _forbidden(*args, **kwargs):
    raise AssertionError("the command started work before its arguments were checked")


@pytest.fixture
def no_work(monkeypatch):
    """Compiling (the driver, and the API's name for it) fails the test."""
    import int8attn.api as api
    import int8attn.driver.compile as driver

    monkeypatch.setattr(driver, "compile", _forbidden)
    monkeypatch.setattr(api, "compile_stages", _forbidden)


@pytest.fixture
def graph(tmp_path) -> Path:
    path = tmp_path / "decode.mlir"
    path.write_text(GRAPH)
    return path


def _printed(graph: Path) -> str:
    """What int8attn-opt writes for the graph with no passes (parsed and printed)."""
    return _opt_to(graph, None)


def _opt_to(graph: Path, output) -> str:
    import io
    import sys

    saved, sys.stdout = sys.stdout, io.StringIO()
    try:
        assert opt.main([str(graph)] + (["-o", str(output)] if output else [])) == 0
        return sys.stdout.getvalue()
    finally:
        sys.stdout = saved


# ---- 1. what is at the output path: links, FIFOs, devices, modes ------------------------

def test_a_symlink_output_writes_its_target_and_stays_a_link(graph, tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.mlir"
    target.write_text("old")
    link = tmp_path / "out.mlir"
    link.symlink_to(target)
    _opt_to(graph, link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == _printed(graph)


def test_a_dangling_symlink_creates_the_file_it_names(graph, tmp_path):
    link = tmp_path / "out.mlir"
    link.symlink_to("made.mlir")
    _opt_to(graph, link)
    assert link.is_symlink() and (tmp_path / "made.mlir").read_text() == _printed(graph)


def test_an_existing_file_keeps_its_mode_and_a_new_one_gets_the_umasks(graph, tmp_path):
    private = tmp_path / "private.mlir"
    private.write_text("old")
    private.chmod(0o600)
    mask = os.umask(0o027)
    try:
        _opt_to(graph, private)
        _opt_to(graph, tmp_path / "new.mlir")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert private.read_text() == _printed(graph)
    assert stat.S_IMODE((tmp_path / "new.mlir").stat().st_mode) == 0o640


def test_a_fifo_output_is_written_through(graph, tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    # A reader first (non-blocking open), so that the write's open does not wait;
    # the output is far below the pipe's buffer.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        _opt_to(graph, fifo)
        written = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a file"
    assert written.decode() == _printed(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decode.mlir", "out.fifo"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_pipe_in_a_folder_that_takes_no_files_is_written_through(graph):
    """/proc/self/fd/N names a pipe in a folder where no file can be made (like a user's
    /dev/null in /dev): the check must not ask for the folder, as a plain write does not."""
    read_end, write_end = os.pipe()
    try:
        _opt_to(graph, f"/proc/self/fd/{write_end}")
        os.close(write_end)
        write_end = None
        written = os.read(read_end, 1 << 16)
    finally:
        os.close(read_end)
        if write_end is not None:
            os.close(write_end)
    assert written.decode() == _printed(graph)


def test_a_character_device_is_written_in_place(monkeypatch):
    """/dev/null stays a character device: written with a plain write, no temp file and
    no rename (both made to fail here, so that no regression can replace it)."""
    import tempfile

    monkeypatch.setattr(os, "replace", _forbidden)
    monkeypatch.setattr(os, "rename", _forbidden)
    monkeypatch.setattr(tempfile, "mkstemp", _forbidden)
    write_atomic("/dev/null", "discarded\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ---- 2. inputs other than the graph: external data, the kernel object --------------------

def _external_data_model(folder: Path) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((32, 32), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="projection")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [weight])
    folder.mkdir()
    (folder / "data").mkdir()
    onnx.save(helper.make_model(graph), str(folder / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="data/weights.bin", size_threshold=0)
    return folder / "m.onnx"


@pytest.mark.parametrize("command", ["compile", "run"])
def test_an_output_over_an_onnx_models_external_data_is_refused(command, tmp_path, capsys,
                                                                monkeypatch, no_work):
    model = _external_data_model(tmp_path / "model")
    weights = tmp_path / "model" / "data" / "weights.bin"
    before = weights.read_bytes()
    monkeypatch.chdir(tmp_path)   # the location is relative to the model's folder
    flag = "-o" if command == "compile" else "--output"
    assert cli.main([command, str(model), flag, str(weights)]) == 1
    err = capsys.readouterr().err
    assert f"output '{weights}' is the input file '{weights}'" in err, err
    assert weights.read_bytes() == before


@pytest.mark.parametrize("command", ["compile", "run"])
def test_an_output_over_the_kernel_object_is_refused(command, graph, tmp_path, capsys, no_work):
    code_object = tmp_path / "K.co"
    code_object.write_bytes(b"\x7fELF code object")
    flag = "-o" if command == "compile" else "--output"
    assert cli.main([command, str(graph), "--target", "gfx936", "--kernel-object",
                     str(code_object), flag, str(code_object)]) == 1
    err = capsys.readouterr().err
    assert f"output '{code_object}' is the input file '{code_object}'" in err, err
    assert code_object.read_bytes() == b"\x7fELF code object"


# ---- 3. --save-stages DIR ---------------------------------------------------------------

SAVE_STAGES = {
    "empty": ("", "--save-stages '' names no folder; give the folder to save the stages in "
                  "('.' for the current one)"),
    "a_file": ("{tmp}/decode.mlir", "--save-stages '{tmp}/decode.mlir' is a file, not a "
                                    "folder; give a folder to save the stages in"),
    "under_a_file": ("{tmp}/decode.mlir/stages", "--save-stages '{tmp}/decode.mlir/stages': "
                                                 "'{tmp}/decode.mlir' is a file, so the folder "
                                                 "cannot be made"),
    "uncreatable": ("/proc/int8attn-stages", "--save-stages '/proc/int8attn-stages': the "
                                             "folder cannot be made: '/proc' is not writable"),
    "over_the_input": ("{tmp}", "--save-stages '{tmp}' would write the graph stage's "
                                "'00-graph.mlir' over the input '{tmp}/00-graph.mlir'; save the "
                                "stages to another folder"),
}


@pytest.mark.parametrize("command", ["compile", "run"])
@pytest.mark.parametrize("name", sorted(SAVE_STAGES))
def test_a_save_stages_folder_that_cannot_be_one_is_refused_first(command, name, tmp_path,
                                                                  capsys, no_work):
    folder, message = SAVE_STAGES[name]
    if folder.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("needs /proc")
    graph = tmp_path / ("00-graph.mlir" if name == "over_the_input" else "decode.mlir")
    graph.write_text(GRAPH)
    fill = lambda text: text.format(tmp=tmp_path)
    output = ["-o", str(tmp_path / "out.vmfb")] if command == "compile" else ["--seed", "0"]
    before = sorted(tmp_path.rglob("*"))
    assert cli.main([command, str(graph), "--save-stages", fill(folder), *output]) == 1
    err = capsys.readouterr().err
    assert fill(message) in err, err
    assert sorted(tmp_path.rglob("*")) == before and graph.read_text() == GRAPH


SAVE_STAGES_OUTPUTS = {
    "the_folder": ("compile", ["-o", "{tmp}/stages"],
                   "output '{tmp}/stages' is the --save-stages folder; give the output "
                   "another path"),
    "a_stage_file": ("compile", ["-o", "{tmp}/stages/01-algorithm.mlir"],
                     "output '{tmp}/stages/01-algorithm.mlir' takes a name of the algorithm "
                     "stage's files (01-algorithm.*), which --save-stages '{tmp}/stages' "
                     "writes"),
    "an_llvm_output_and_its_manifest": (
        "compile", ["--target", "gfx942", "--emit", "llvm", "-o", "{tmp}/stages/02-llvm.ll"],
        "output '{tmp}/stages/02-llvm.ll' takes a name of the llvm stage's files (02-llvm.*)"),
    "run_results": ("run", ["--seed", "0", "--output", "{tmp}/stages/00-graph.npz"],
                    "takes a name of the graph stage's files (00-graph.*)"),
}


@pytest.mark.parametrize("name", sorted(SAVE_STAGES_OUTPUTS))
def test_an_output_among_the_saved_stages_is_refused_first(name, tmp_path, capsys, no_work):
    # the output is written after the stages: it would replace a saved stage, or be
    # refused only once the stages' folder exists and the compile is done
    command, flags, message = SAVE_STAGES_OUTPUTS[name]
    graph = tmp_path / "decode.mlir"
    graph.write_text(GRAPH)
    stages = tmp_path / "stages"
    if name != "the_folder":
        stages.mkdir()          # else the output's missing folder is refused first
    fill = lambda text: text.format(tmp=tmp_path)
    before = sorted(tmp_path.rglob("*"))
    assert cli.main([command, str(graph), "--save-stages", str(stages),
                     *map(fill, flags)]) == 1
    assert fill(message) in capsys.readouterr().err
    assert sorted(tmp_path.rglob("*")) == before


def test_the_driver_refuses_stages_over_its_input_too(tmp_path):
    """The Python API's save_stages: the same check, before any stage runs (gfx936:
    checking its options needs no CPU probe, so nothing compiles)."""
    from int8attn.driver.compile import compile
    from int8attn.driver.options import CompileOptions

    graph = tmp_path / "00-graph.mlir"
    graph.write_text(GRAPH)
    with pytest.raises(OutputError, match="would write the graph stage's '00-graph.mlir' "
                                          "over the input"):
        compile(GRAPH, CompileOptions(target="gfx936"), filename=str(graph),
                save_stages=tmp_path)
    assert graph.read_text() == GRAPH


# ---- 4. --emit llvm: its manifest beside the output ----------------------------------------

def test_an_llvm_output_named_like_its_manifest_is_refused_first(graph, tmp_path, capsys,
                                                                 no_work):
    output = tmp_path / "K.json"
    assert cli.main(["compile", str(graph), "--target", "gfx936", "--emit", "llvm", "-o",
                     str(output)]) == 1
    err = capsys.readouterr().err
    assert (f"--emit llvm writes its manifest beside the output, as '{output}', which is "
            f"the output '{output}' itself; give the output another suffix (-o "
            f"{tmp_path / 'K.ll'})") in err, err
    assert "wrote" not in err and not output.exists()


@pytest.fixture
def fake_llvm(monkeypatch):
    """The llvm stage's artifact and manifest, without compiling."""
    import int8attn.api  # noqa: F401  (binds the real driver before the patch)
    import int8attn.driver.compile as driver

    def fake(source, options, *, until=None, **kwargs):
        assert until == "llvm"
        return driver.Compiled(options, {"llvm": "; the kernels' IR\n"}, {}, {"llvm": 0.0},
                               {}, (), {"llvm": {".json": '{"kernels": []}\n'}})

    monkeypatch.setattr(driver, "compile", fake)


def test_llvm_to_stdout_keeps_stdout_the_ir_and_the_manifest_on_stderr(graph, capsys,
                                                                      fake_llvm):
    assert cli.main(["compile", str(graph), "--target", "gfx936", "--emit", "llvm",
                     "-o", "-"]) == 0
    out, err = capsys.readouterr()
    assert out == "; the kernels' IR\n"
    assert "the llvm stage's manifest (-o OUT writes it as OUT.json; saved as KERNELS.json, " \
           "--kernel-object KERNELS.co checks it):\n" '{"kernels": []}' in err, err
    assert "save the IR as KERNELS.ll and build the code object with:" in err, err


def test_llvm_to_a_file_writes_the_manifest_beside_it(graph, tmp_path, capsys, fake_llvm):
    assert cli.main(["compile", str(graph), "--target", "gfx936", "--emit", "llvm", "-o",
                     str(tmp_path / "K.ll")]) == 0
    assert (tmp_path / "K.ll").read_text() == "; the kernels' IR\n"
    assert (tmp_path / "K.json").read_text() == '{"kernels": []}\n'
    assert f"wrote {tmp_path / 'K.json'} (the llvm stage's manifest)" in capsys.readouterr().err


# ---- 5. int8attn-opt: -o -, and an option given twice ------------------------------------

def test_opt_output_dash_is_stdout(graph, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert opt.main([str(graph), "-o", "-"]) == 0
    assert "int8attn.attention" in capsys.readouterr().out
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("flag, pipeline, message", [
    ("-p", "int8-qk{q-terms=1 q-terms=2}",
     "option 'q-terms' of pass 'int8-qk' is given twice ('q-terms=1' and 'q-terms=2'); "
     "give it once"),
    ("--pipeline", "int8attn-to-linalg{pv=int8,w-terms=1,pv=f32}",
     "option 'pv' of pipeline 'int8attn-to-linalg' is given twice ('pv=int8' and 'pv=f32'); "
     "give it once"),
])
def test_an_option_given_twice_is_refused(graph, flag, pipeline, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        opt.main([str(graph), flag, pipeline])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err


# ---- 6. int8attn run: flags that would be ignored or refused late --------------------------

RUN_MISUSE = {
    "seed_with_inputs": (["--inputs", "{tmp}/in.npz", "--seed", "3"],
                         "--seed 3 draws random inputs, but --inputs gives them, so the seed "
                         "would be unused; drop --seed (or --inputs)"),
    "seed_zero_with_inputs": (["--inputs", "{tmp}/in.npz", "--seed", "0"],
                              "--seed 0 draws random inputs"),
    "report_on_a_kernel_target": (["--report", "--target", "gfx936", "--simulate"],
                                  "--report splits the error of the cpu pipeline's module; "
                                  "--target gfx936 compiles lane-level kernels"),
    "report_with_f32_pv": (["--report", "--pv", "f32"],
                           "--report splits the error of INT8 PV (its W-quantization term is "
                           "the error of W's INT8 levels); --pv f32 does not quantize W"),
    "report_with_bf16_pv": (["--report", "--pv", "bf16"], "--pv bf16 does not quantize W"),
}


@pytest.mark.parametrize("name", sorted(RUN_MISUSE))
def test_run_misuse_is_refused_before_any_work(name, graph, tmp_path, capsys, no_work):
    flags, message = RUN_MISUSE[name]
    np.savez(tmp_path / "in.npz", arg0=np.zeros(1))
    assert cli.main(["run", str(graph), *[f.format(tmp=tmp_path) for f in flags]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("int8attn run: error: --") and message in err, err


def test_the_report_itself_refuses_a_float_pv():
    """print_report (reached by the Python path too) splits INT8 PV only."""
    from int8attn.driver.options import CompileOptions
    from int8attn.report import print_report
    from int8attn.support.diagnostics import UsageError

    with pytest.raises(UsageError, match="--pv bf16 does not quantize W to INT8"):
        print_report(None, None, None, None, None, None, None, CompileOptions(pv="bf16"))
