"""benchmarks/sass_mix.py: the cuda kernels in SASS (ptxas, nvdisasm; no GPU).

The listing's parsing on a small hand-written body always runs; what needs NVIDIA's
assembler skips where it is not installed (benchmarks/sass_mix.py says how to get it).
"""

import re
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import sass_mix  # noqa: E402

SASS = """\
//--------------------- .text.prefill_attention   --------------------------
.text.prefill_attention:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/                   LDG.E.128.CONSTANT R56, desc[UR20][R36.64] ;
        /*0020*/                   IMMA.16832.S8.S8.SAT R60, R28.ROW, R56.COL, R80 ;
        /*0030*/              @!P5 FMUL R57, R57, 0.5 ;
        /*0040*/                   LDL.LU R99, [R1+0x98]                          (*"SpillRefill"*) ;
        /*0050*/                   FCHK P0, R49, R0 ;
        /*0060*/              @P0 BRA `(.L_x_1) ;
        /*0070*/                   EXIT ;
//--------------------- .text.other   --------------------------
"""


def test_the_listing_reads_instructions_loops_and_classes():
    found, labels = sass_mix.instructions(SASS, "prefill_attention")
    assert len(found) == 8 and labels == {".L_x_1": 1}
    assert sass_mix.loops(found, labels) == [(1, 6)]
    ops = [sass_mix.opcode(i) for i in found[1:7]]
    assert ops == ["LDG", "IMMA", "FMUL", "LDL", "FCHK", "BRA"]
    assert sass_mix.classify(ops) == {"mma": 1, "global loads": 1, "spills": 1,
                                      "f32 mul/add/fma": 1, "division checks": 1, "other": 1}


def test_the_command_refuses_unknown_kernels():
    with pytest.raises(SystemExit):
        sass_mix.main(["--kernels", "prefil"])


def test_the_spec_changes_take_bool_and_int_fields_only(capsys):
    parser = sass_mix.argparse.ArgumentParser()
    assert sass_mix.spec_changes(parser, ["digits_join_i32=True", "ring_lds_bytes=1024"]) == {
        "digits_join_i32": True, "ring_lds_bytes": 1024}
    for pair, says in (("digits_join_i32=yes", "takes True or False"),
                       ("ring_lds_bytes=big", "takes a non-negative integer"),
                       ("reciprocal_intrinsic=None", "not a bool or int field"),
                       ("nonsense", "not a bool or int field")):
        with pytest.raises(SystemExit):
            sass_mix.spec_changes(parser, [pair])
        assert says in capsys.readouterr().err


def test_a_decode_tuning_field_changes_the_tuning():
    cuda = sass_mix.specs.target_spec("cuda")
    changed = sass_mix.spec_fields.with_changes(cuda, {"digits_join_i32": True,
                                                 "prefill_digits_join_i32": False})
    assert changed.tuning.digits_join_i32 and not changed.prefill_digits_join_i32
    assert changed.tuning.workgroups_per_sm == cuda.tuning.workgroups_per_sm


needs_ptxas = pytest.mark.skipif(sass_mix.tool("ptxas") is None, reason="no ptxas")
needs_nvdisasm = pytest.mark.skipif(sass_mix.tool("nvdisasm") is None, reason="no nvdisasm")


@needs_ptxas
def test_the_prefill_fits_the_registers_of_its_occupancy_request():
    # cuda's prefill asks for 3 workgroups of 128 threads per SM (.minnctapersm):
    # ptxas must allocate at most 65536 / 384 registers a thread, as the driver's JIT.
    (row, *_) = sass_mix.measure("prefill", "one-term", "int8", "sm_90")
    assert 0 < row["registers"] <= 65536 // (3 * 128)


def _sass(kernel: str, numerics: str) -> tuple[list[str], dict[str, int]]:
    """The SASS instructions of `kernel` and its labels' positions."""
    ptx, entry = sass_mix.ptx_mix.compile_ptx(kernel, numerics, "int8")
    with tempfile.TemporaryDirectory() as workdir:
        _, cubin = sass_mix.assemble(ptx, "sm_90", workdir)
        listing = sass_mix.subprocess.run([sass_mix.tool("nvdisasm"), "-c", cubin],
                                          capture_output=True, text=True, check=True).stdout
    return sass_mix.instructions(listing, entry)


@needs_ptxas
@needs_nvdisasm
def test_the_exp_is_one_mufu_in_the_tile_loop():
    # ex2.approx.ftz: no compare against -126 and no rescaling multiplies around MUFU.EX2
    # (the subnormal-keeping form's three extra instructions per exp).
    found, labels = _sass("prefill", "one-term")
    first, last = sass_mix.loops(found, labels)[0]
    body = found[first:last + 1]
    exps = [i for i in body if i.startswith("MUFU.EX2")]
    assert len(exps) >= 32
    assert not [i for i in body if "-126" in i]


_WRITES = re.compile(r"^(?:@\S+\s+)?(\S+)\s+(R\d+)\b")
_A_OPERAND = re.compile(r"\b(R\d+)(?:\.reuse)?\.ROW\b")


@needs_ptxas
@needs_nvdisasm
@pytest.mark.parametrize("kernel", ["decode", "paged-decode"])
def test_the_decode_mmas_read_q_and_w_as_loaded(kernel):
    # Q and W sit in LDS in the MMA's register order (fragments/operand_staging.py):
    # every IMMA's A quad is the destination of one LDS.128, not assembled by MOVs
    # (row-major, each took four: ~250 of the partition's ~2,000 instructions).
    found, _ = _sass(kernel, "digits")
    writer, sources = {}, []
    for instruction in found:
        if instruction.startswith("IMMA"):
            sources.append(writer.get(_A_OPERAND.search(instruction).group(1)))
        if m := _WRITES.match(instruction):
            writer[m.group(2)] = m.group(1)
    assert len(sources) == 64
    assert sources == ["LDS.128"] * 64


def test_the_field_changes_refuse_misuse():
    fields_ = sass_mix.spec_fields
    cuda = sass_mix.specs.target_spec("cuda")
    for pairs, says in ((["merge_chunks=2", "merge_chunks=4"], "merge_chunks is given twice"),
                        (["merge_chunks=-1"], "takes a non-negative integer, not '-1'"),
                        (["merge_chunks= 4"], "takes a non-negative integer"),
                        (["merge_chunks=4_0"], "takes a non-negative integer")):
        with pytest.raises(ValueError, match=says):
            fields_.field_changes(pairs, ["merge_chunks"], "a field")
    with pytest.raises(TypeError, match="lists of FIELD=VALUE pairs"):
        fields_.field_changes("merge_chunks=4", ["merge_chunks"], "a field")
    with pytest.raises(TypeError, match="written as a string"):
        fields_.field_value("v_early", True)
    with pytest.raises(ValueError, match="nope: no field of TargetSpec or DecodeTuning"):
        fields_.with_changes(cuda, {"nope": 1})
    # a count the schedule cannot run with is refused where the tuning is made
    for name in ("merge_unroll", "merge_splits", "merge_chunks", "fused_splits",
                 "fused_unroll"):
        with pytest.raises(ValueError, match=f"{name}=0: each is a count, at least 1"):
            fields_.with_changes(cuda, {name: 0})
    assert fields_.with_changes(cuda, {"merge_chunks": 8}).tuning.merge_chunks == 8
