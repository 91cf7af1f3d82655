"""One driver for every target: the stage table, options that do not apply,
--emit and --save-stages, the input checks in front of every executor, and the
module cache key.

Commands run in-process through `cli.main(argv)` (an exception escaping it is
what a user would see as a traceback, and fails the test).
"""

import re
import shutil
import stat
import subprocess
import sys
from dataclasses import astuple, replace
from pathlib import Path

import numpy as np
import pytest

from int8attn.driver.targets import OptionRefused

import int8attn
from conftest import REPO, seeded_rng
from int8attn import cli
from int8attn.contract.numerics import Numerics
from int8attn.driver.graph import decode_graph, random_inputs
from int8attn.driver.options import KERNEL_TARGET_NUMERICS, CompileOptions
from int8attn.driver.targets import TARGETS
from int8attn.pipelines import PipelineOptions
from int8attn.runtime.cache import project_source_roots, source_fingerprint
from int8attn.runtime.module import InputError

KERNEL_TARGETS = ("gfx936", "gfx942", "cuda")
SMALL = decode_graph(1, 4, 2, 40, 32)


@pytest.fixture()
def small(tmp_path):
    path = tmp_path / "small.mlir"
    path.write_text(SMALL)
    return path


def test_the_table_has_every_target_and_each_chain_starts_at_the_graph():
    assert set(TARGETS) == {"cpu", "gfx936", "gfx942", "cuda"}
    for target in TARGETS.values():
        assert target.stage_names()[0] == "graph"
        assert target.default_emit in target.stage_names()
    assert TARGETS["cpu"].stage_names() == ["graph", "algorithm", "linalg", "vmfb"]
    assert TARGETS["gfx936"].stage_names() == ["graph", "kernel", "llvm"]
    assert TARGETS["cuda"].stage_names() == ["graph", "kernel", "vmfb", "ptx"]


def test_a_chain_is_what_its_stage_reads_and_a_kernel_object_swaps_the_vmfb():
    names = lambda chain: [s.name for s in chain]
    gfx942, gfx936 = TARGETS["gfx942"], TARGETS["gfx936"]
    assert names(gfx942.chain("llvm")) == ["graph", "kernel", "llvm"]
    assert names(gfx942.chain("isa")) == ["graph", "kernel", "vmfb", "isa"]
    assert names(gfx942.chain(None, kernel_object=True)) == ["graph", "kernel", "llvm", "vmfb"]
    assert gfx942.chain(None, kernel_object=True)[-1].make.__name__ == "make_packaged_vmfb"
    assert names(gfx936.chain("vmfb", kernel_object=True)) == ["graph", "kernel", "llvm",
                                                               "vmfb"]
    with pytest.raises(OptionRefused, match="no 'isa' to emit"):
        gfx942.chain("isa", kernel_object=True)   # IREE built no ISA of the object
    with pytest.raises(OptionRefused, match="without --kernel-object"):
        gfx936.chain("vmfb")


def test_targets_command_prints_the_table(capsys):
    assert cli.main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "cpu     graph -> algorithm -> linalg -> vmfb" in out
    assert "gfx942  graph -> kernel -> vmfb -> isa" in out


REFUSED = [
    (["--target", "gfx936", "--fragment-model", "gfx942"],
     "--fragment-model gfx942 does not apply to --target gfx936: --target gfx936 generates its "
     "kernels from its own fragment model"),
    (["--target", "gfx942", "--scale-groups", "contiguous"],
     "--scale-groups contiguous does not apply to --target gfx942: the lane kernels compute each "
     "W scale in the lanes that feed its MMAC"),
    (["--target", "cuda", "--no-verify"], "--no-verify does not apply to --target cuda"),
    (["--target", "gfx942", "--pv", "bf16"],
     "--pv bf16 does not apply to --target gfx942: it has int8 PV"),
    (["--target", "cuda", "--pv", "f32"], "--pv f32 does not apply to --target cuda"),
    (["--target", "gfx936", "--partition-tokens", "512"],
     "--partition-tokens 512 does not apply to --target gfx936: the decode kernels' partition "
     "is fixed by the fragment model: 4 waves of 64 tokens = 256"),
    (["--target", "cuda", "--tile-tokens", "128"], "--tile-tokens 128 does not apply"),
    (["--target", "cpu", "--w-second", "digit"],
     "--w-second digit does not apply to --target cpu: the tensor-level pipeline scales the "
     "second w term by its residual's own absmax"),
    (["--target", "cpu", "--q-second", "digit"],
     "--q-second digit does not apply to --target cpu: the tensor-level pipeline scales the "
     "second q term"),
    (["--target", "cuda", "--q-terms", "1", "--q-second", "digit"],
     "q-second digit splits Q into two INT8 terms: it needs q-terms 2 (got 1)"),
    (["--target", "gfx936", "--emit", "vmfb"],
     "--target gfx936 has the stages graph, kernel, llvm; there is no 'vmfb' to emit without --kernel-object"),
    (["--target", "cpu", "--emit", "kernel"], "there is no 'kernel' to emit"),
]


@pytest.mark.parametrize("flags, message", REFUSED, ids=lambda x: " ".join(x) if isinstance(x, list) else "")
def test_an_option_that_does_not_apply_is_refused_with_the_reason(flags, message, small, tmp_path,
                                                                capsys):
    out = tmp_path / "out"
    assert cli.main(["compile", str(small), *flags, "-o", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    if "--emit" not in flags:
        assert cli.main(["run", str(small), *flags, "--simulate", "--seed", "0"]) == 2
        assert message in capsys.readouterr().err


def test_defaults_that_equal_the_kernels_own_are_accepted(small, tmp_path):
    # Saying what the kernel does anyway is not a conflict.
    assert cli.main(["compile", str(small), "--target", "gfx936", "--fragment-model", "gfx936",
                     "--partition-tokens", "256", "--scale-groups", "fragment",
                     "-o", str(tmp_path / "k.mlir")]) == 0


def test_simulate_needs_a_kernel_target_and_gfx936_needs_the_simulator(small, capsys):
    assert cli.main(["run", str(small), "--simulate", "--seed", "0"]) == 2
    assert "--simulate runs lane-level kernels; --target cpu has none" in capsys.readouterr().err
    assert cli.main(["run", str(small), "--target", "gfx936", "--seed", "0"]) == 2
    assert "run them in the lane simulator with --simulate" in capsys.readouterr().err


@pytest.mark.parametrize("target", ["cpu", "gfx936", "gfx942"])
def test_save_stages_writes_every_stage_and_emit_stops_at_each(target, small, tmp_path, capsys):
    row = TARGETS[target]   # the longest chain of the row (gfx942: to isa, not llvm)
    stages = max(([s.name for s in row.chain(name)] for name in row.stage_names()), key=len)
    saved = tmp_path / "stages"
    out = tmp_path / "out"
    assert cli.main(["compile", str(small), "--target", target, "--emit", stages[-1],
                     "--save-stages", str(saved), "-o", str(out)]) == 0
    files = sorted(p.name for p in saved.iterdir() if p.suffix != ".json")
    assert [f.split("-", 1)[1].rsplit(".", 1)[0] for f in files] == stages
    # the llvm stage's manifest is saved beside its IR
    assert ("llvm" in stages) == (saved / f"{stages.index('llvm') if 'llvm' in stages else 0:02d}"
                                           f"-llvm.json").is_file()
    assert files[0] == "00-graph.mlir" and "int8attn.attention" in (saved / files[0]).read_text()
    assert out.read_bytes() == (saved / files[-1]).read_bytes()
    for stage in stages[:2]:  # IR stages to stdout
        assert cli.main(["compile", str(small), "--target", target, "--emit", stage,
                         "-o", "-"]) == 0
        text = capsys.readouterr().out
        assert text == (saved / next(f for f in files if f"-{stage}." in f)).read_text()


def test_a_failing_stage_can_be_reproduced_from_the_saved_input_of_that_stage(tmp_path):
    from int8attn.support.diagnostics import StageError

    with pytest.raises(StageError) as failure:
        int8attn.compile(SMALL, cache=False, save_stages=tmp_path, iree_flags=("--no-such",))
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["00-graph.mlir", "01-algorithm.mlir", "02-linalg.mlir"]
    command = failure.value.reproducer
    assert command.startswith("iree-compile ") and "--no-such" in command
    reproduced = Path(command.split()[1]).read_text()
    assert reproduced == (tmp_path / "02-linalg.mlir").read_text()


def test_vmfb_to_stdout_is_the_module_file(small, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "int8attn.cli", "compile", str(small), "-o", "-"],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr
    assert cli.main(["compile", str(small), "-o", str(tmp_path / "m.vmfb")]) == 0
    assert proc.stdout == (tmp_path / "m.vmfb").read_bytes() and b"module.fb" in proc.stdout[:64]


def test_a_closed_pipe_ends_run_quietly(small):
    command = f"{shutil.which('int8attn', path=str(Path(sys.executable).parent))} run {small} " \
              f"--seed 0 | head -1"
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout == "random inputs, seed 0 (repeat with --seed 0)\n"
    assert proc.stderr == "" and proc.returncode == 0


def test_written_files_get_the_mode_a_plain_write_gives(small, tmp_path):
    out = tmp_path / "k.mlir"
    assert cli.main(["compile", str(small), "--target", "gfx936", "-o", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~_umask()


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


# The input checks: one table, every executor -------------------------------

def _bad_inputs():
    rng = seeded_rng(11)
    from int8attn.driver.graph import describe_functions
    from int8attn.support.ir import new_context, parse_module

    with new_context():
        info = describe_functions(parse_module(SMALL, "small.mlir"))["decode"]
    good = random_inputs(info, 11)
    q, k, ks, v, vs = good
    nan_scale = ks.copy()
    nan_scale[0, 1, 7] = np.nan
    negative = vs.copy()
    negative[0, 0, 3] = -rng.random(dtype=np.float32) - 0.1
    return {
        "f64 q": ([q.astype(np.float64), k, ks, v, vs],
                  "argument 0 (q, arg0) of @decode must be float32 for tensor<1x4x32xf32>, got float64"),
        "uint8 k": ([q, k.astype(np.uint8), ks, v, vs],
                    "argument 1 (k, arg1) of @decode must be int8"),
        "int32 scales": ([q, k, ks.astype(np.int32), v, vs],
                         "argument 2 (k_scale, arg2) of @decode must be float32"),
        "NaN scale": ([q, k, nan_scale, v, vs],
                      "argument 2 (k_scale, arg2) of @decode holds NaN at [0, 1, 7]"),
        "negative scale": ([q, k, ks, v, negative],
                           "argument 4 (v_scale, arg4) of @decode holds a negative value at [0, 0, 3]"),
        "q shape": ([q[:, :2], k, ks, v, vs],
                    "argument 0 (q, arg0) of @decode must have shape [1, 4, 32] for "
                    "tensor<1x4x32xf32>, got [1, 2, 32]"),
        "too few": ([q, k, ks],
                    "@decode takes 5 arguments, got 3: missing argument 3 (v, arg3): "
                    "tensor<1x2x40x32xi8>, argument 4 (v_scale, arg4): tensor<1x2x40xf32>"),
    }


EXECUTORS = [("cpu", False)] + [(t, True) for t in KERNEL_TARGETS]


@pytest.mark.parametrize("case", sorted(_bad_inputs()))
def test_bad_inputs_are_refused_the_same_way_by_every_executor(case, small, tmp_path, capsys):
    arrays, message = _bad_inputs()[case]
    for target, simulate in EXECUTORS:
        graph = int8attn.compile(SMALL, target=target, simulate=simulate)
        with pytest.raises(InputError) as error:
            graph(*arrays)
        assert message in str(error.value), (target, str(error.value))
        if case == "too few":
            continue
        npz = tmp_path / "in.npz"
        np.savez(npz, **{f"arg{i}": a for i, a in enumerate(arrays)})
        out = tmp_path / "out.npz"
        argv = ["run", str(small), "--target", target, "--inputs", str(npz), "--output", str(out)]
        assert cli.main(argv + (["--simulate"] if simulate else [])) == 1
        assert message in capsys.readouterr().err, target
        assert not out.exists()


def test_a_truncated_npz_is_named_as_not_an_npz(small, tmp_path, capsys):
    full = tmp_path / "full.npz"
    np.savez(full, arg0=np.zeros(1000, np.float32))
    broken = tmp_path / "broken.npz"
    broken.write_bytes(full.read_bytes()[:300])
    assert cli.main(["run", str(small), "--inputs", str(broken)]) == 1
    assert f"inputs file '{broken}' is not an .npz archive (or is damaged)" in capsys.readouterr().err


# Kernel limits are located errors, for compile and simulate alike -----------

@pytest.mark.parametrize("shape, message", [
    ((1, 4, 1, 64, 80), "head dim 80 must be a multiple of 32 (the MMAC K) for the "
                        "lane-level kernel; --target cpu takes any"),
    ((1, 32, 1, 64, 32), "32 query heads per KV head do not fit one 16-row MMAC tile; "
                         "--target cpu takes any group"),
])
def test_kernel_limits_are_located_errors(shape, message, tmp_path, capsys):
    path = tmp_path / "limit.mlir"
    path.write_text(decode_graph(*shape))
    for target in KERNEL_TARGETS:
        assert cli.main(["compile", str(path), "--target", target, "-o", str(tmp_path / "o")]) == 1
        err = capsys.readouterr().err
        assert f"{path}:3:" in err and message in err, err
        assert cli.main(["run", str(path), "--target", target, "--simulate", "--seed", "0"]) == 1
        err = capsys.readouterr().err
        assert f"{path}:3:" in err and message in err, err


# Results agree across executors ---------------------------------------------

def test_numerics_defaults_follow_the_target():
    # cpu: the pipeline's defaults (two-term Q, u8 W); a kernel target: what its
    # kernels implement, so it compiles without flags.
    cpu = int8attn.compile(SMALL).options
    assert cpu.numerics == PipelineOptions().numerics == Numerics()
    assert (cpu.q_terms, cpu.w_quant, cpu.w_terms, cpu.w_second, cpu.q_second) == \
        astuple(Numerics())
    for target in KERNEL_TARGETS:
        options = TARGETS[target].check(CompileOptions(target=target))
        assert options.numerics == KERNEL_TARGET_NUMERICS
        assert (options.q_terms, options.w_quant, options.w_terms, options.w_second,
                options.q_second) == astuple(KERNEL_TARGET_NUMERICS)
    assert cli.main(["run", "--target", "gfx936", "--simulate", "--seed", "1",
                     str(REPO / "examples" / "decode.mlir")]) == 0


def test_cpu_and_every_simulated_kernel_agree_on_the_same_inputs():
    # The kernels' numerics with the second terms the cpu pipeline implements (scaled).
    numerics = replace(KERNEL_TARGET_NUMERICS, q_second="scaled", w_second="scaled")
    graph = int8attn.compile(SMALL, numerics=numerics)
    arrays = random_inputs(graph.entry(), seed=12)
    cpu = graph(*arrays)
    for target in KERNEL_TARGETS:
        sim = int8attn.compile(SMALL, target=target, simulate=True, numerics=numerics)(*arrays)
        # Different fragment models group W differently: agree to the W rounding.
        assert np.abs(sim - cpu).max() < 2e-2, target
        same_groups = int8attn.compile(SMALL, fragment_model=target,
                                       numerics=numerics)(*arrays)
        assert np.abs(sim - same_groups).max() <= 5e-5, target


# The module cache key --------------------------------------------------------

def test_the_cache_key_covers_every_source_file_recursively(tmp_path):
    roots = project_source_roots()
    fragments = next(r for r in roots if r.name == "fragments")
    copies = []
    for root in roots:
        copy = tmp_path / root.name
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns("__pycache__"))
        copies.append(copy)
    before = source_fingerprint(copies)
    assert before == source_fingerprint(roots)
    nested = tmp_path / "fragments" / "more" / "deep.py"
    nested.parent.mkdir()
    nested.write_text("X = 1\n")
    with_nested = source_fingerprint(copies)
    assert with_nested != before
    nested.unlink()
    model = tmp_path / "fragments" / "model.py"
    model.write_text(model.read_text().replace("VLoadScheme(16)", "VLoadScheme(8)", 1))
    assert source_fingerprint(copies) != before
    contract = tmp_path / "contract" / "constants.py"
    model.write_text((fragments / "model.py").read_text())
    assert source_fingerprint(copies) == before
    contract.write_text(contract.read_text().replace("2.0 ** -118", "2.0 ** -100"))
    assert source_fingerprint(copies) != before


def test_the_cache_key_covers_every_option(tmp_path):
    from int8attn.driver.options import CompileOptions
    from int8attn.runtime import ModuleCache

    cache = ModuleCache(tmp_path)
    keys = {cache.key(SMALL, CompileOptions(**kw)) for kw in (
        {}, {"pv": "bf16"}, {"fragment_model": "gfx942"}, {"partition_tokens": 512},
        {"tile_tokens": 128}, {"verify": False}, {"scale_groups": "contiguous", "verify": False},
        {"iree_flags": ("--iree-opt-level=O1",)})}
    assert len(keys) == 8


@pytest.mark.parametrize("target", ["gfx936", "gfx942", "cuda"])
def test_kernel_targets_run_every_numerics_variant(target, capsys):
    # --q-terms 2 --w-quant u8 on a lane-kernel target, simulated, against the
    # references of the same variant (the printed fragment-level error is tight).

    graph = Path(__file__).resolve().parent.parent / "examples" / "decode.mlir"
    assert cli.main(["run", str(graph), "--target", target, "--simulate", "--q-terms", "2",
                     "--w-quant", "u8", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "q-terms 2, w-quant u8" in out
    fragment = float(re.search(r"vs fragment-level reference\s+max abs (\S+)", out).group(1))
    exact = float(re.search(r"vs exact f32 reference\s+max abs (\S+)", out).group(1))
    assert fragment <= 5e-5 and exact <= 1e-3, out
