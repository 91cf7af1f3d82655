"""`--emit llvm` and `--kernel-object`: the kernels as LLVM IR another LLVM builds, and
the code object packaged back into a vmfb (docs/targets.md,
*gfx936: the hand-off to Hygon's DTK*).

Upstream LLVM 19 (Debian's llvm-19 / lld-19, which .ci/run installs) stands in for
Hygon's DTK: every kernel's IR, gfx936 and gfx942, must pass `opt -passes=verify`;
the gfx942 twin is built into a code object with llc and ld.lld, packaged with
--kernel-object and compared with IREE's own gfx942 build of the same graph
(kernel symbols, explicit kernel arguments, LDS, the number of
v_mfma_i32_16x16x32_i8); the package loads in IREE's runtime as a VM module (no AMD
GPU here to create the HIP executable on). Every bad object is refused by name.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from test_cli import run
from int8attn.driver.code_object import read_code_object
from int8attn.driver.graph import decode_graph, prefill_graph
from int8attn.driver.paged_decode import cache_write_graph, paged_attention_graph

LLVM_BIN = Path("/usr/lib/llvm-19/bin")
needs_llvm = pytest.mark.skipif(not (LLVM_BIN / "opt").is_file(),
                                reason="upstream LLVM 19 is not installed (apt-get install "
                                       "llvm-19 lld-19; .ci/run does)")

GRAPHS = {
    "decode": decode_graph(1, 8, 2, 300, 64),             # partition + merge
    "prefill": prefill_graph(1, 8, 2, 200, 16, 64),
    "paged-decode": paged_attention_graph(8, 2, 64, 16),  # paged partition + merge
    "paged-prefill": paged_attention_graph(8, 2, 64, 16, query_tokens=16),
    "cache-write": cache_write_graph(2, 64, 16),          # the per-token quantize, in place
}


def _emit(tmp_path, name, target, source=None):
    graph = tmp_path / f"{name}.mlir"
    graph.write_text(source or GRAPHS[name])
    ll = tmp_path / f"{name}-{target}.ll"
    run("int8attn", "compile", graph, "--target", target, "--emit", "llvm", "-o", ll,
        check_rc=0)
    return graph, ll, json.loads(ll.with_suffix(".json").read_text())


def _build(ll: Path, cpu: str = "gfx942") -> Path:
    """The manifest's build command with Debian's LLVM 19 (for another processor if
    `cpu` is given)."""
    co = ll.with_suffix(".co")
    subprocess.run([LLVM_BIN / "llc", "-O3", "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={cpu}",
                    "-filetype=obj", ll, "-o", ll.with_suffix(".o")], check=True)
    subprocess.run([LLVM_BIN / "ld.lld", "-shared", ll.with_suffix(".o"), "-o", co],
                   check=True)
    return co


@needs_llvm
@pytest.mark.parametrize("target", ["gfx936", "gfx942"])
def test_every_kernel_emits_ir_that_upstream_llvm_verifies(tmp_path, target):
    for name in GRAPHS:
        _, ll, manifest = _emit(tmp_path, name, target)
        subprocess.run([LLVM_BIN / "opt", "-passes=verify", "-disable-output", ll], check=True)
        text = ll.read_text()
        for kernel in manifest["kernels"]:
            assert re.search(rf"define amdgpu_kernel void @{kernel['kernel']}\(", text)
            assert kernel["abi"]["kernel"] == kernel["kernel"]
            # one binding per ABI input and output
            assert kernel["bindings"] == len(kernel["abi"]["inputs"]) + len(
                kernel["abi"]["outputs"])
        assert f'"target-cpu"="{target}"' in text
        assert 'target triple = "amdgcn-amd-amdhsa"' in text
        intrinsics = set(re.findall(r"@(llvm\.amdgcn\.m(?:mac|fma)[\w.]*)\(", text))
        if name == "cache-write":   # the quantize-and-store kernel has no matrix instruction
            assert not intrinsics
        elif target == "gfx936":    # the MMAC is the only non-upstream piece
            assert intrinsics == {"llvm.amdgcn.mmac.i32.16x16x32i8"}
            assert "declare <4 x i32> @llvm.amdgcn.mmac.i32.16x16x32i8(i64, i64, <4 x i32>)" \
                in text
        else:
            assert intrinsics == {"llvm.amdgcn.mfma.i32.16x16x32.i8"}
        assert "--emit" not in manifest["build"] and f"-mcpu={target}" in manifest["build"]
    assert ("/opt/dtk}/llvm/bin/llc" in manifest["build"]) == (target == "gfx936")


def _kernel_args(metadata: str) -> dict[str, tuple]:
    """kernel -> (explicit arguments (offset, size, kind), LDS bytes) from the AMDHSA
    metadata (assembly or `llvm-readelf --notes`)."""
    kernels, args, lds = {}, [], None
    for line in metadata.splitlines():
        field = re.match(r"\s*-?\s*\.(\w+):\s+(\S+)", line)
        if not field:
            continue
        key, value = field.groups()
        if key == "offset":
            args.append([int(value)])
        elif key in ("size", "value_kind") and args and len(args[-1]) < 3:
            args[-1].append(value)
        elif key == "group_segment_fixed_size":
            lds = int(value)
        elif key == "symbol":
            explicit = tuple(tuple(a) for a in args if not a[2].startswith("hidden"))
            kernels[value.removesuffix(".kd")] = (explicit, lds)
            args, lds = [], None
    return kernels


@needs_llvm
def test_gfx942_twin_builds_packages_and_matches_irees_own_build(tmp_path):
    graph, ll, manifest = _emit(tmp_path, "decode", "gfx942")
    co = _build(ll)
    code = read_code_object(co.read_bytes(), co.name)
    assert code.processor == "gfx942"
    notes = subprocess.run([LLVM_BIN / "llvm-readelf", "--notes", co], check=True,
                           capture_output=True, text=True).stdout
    ours = _kernel_args(notes)
    isa = tmp_path / "iree.s"
    run("int8attn", "compile", graph, "--target", "gfx942", "--emit", "isa", "-o", isa,
        check_rc=0)
    iree = _kernel_args(isa.read_text())
    assert set(ours) == set(iree) == code.kernels == {
        k["kernel"] for k in manifest["kernels"] + manifest["iree_dispatches"]}
    assert ours == iree     # explicit arguments and LDS, kernel by kernel
    for kernel in manifest["kernels"]:
        assert ours[kernel["kernel"]][1] == kernel["lds_bytes"]
    disassembly = subprocess.run([LLVM_BIN / "llvm-objdump", "-d", co], check=True,
                                 capture_output=True, text=True).stdout
    mfmas = disassembly.count("v_mfma_i32_16x16x32_i8")
    assert mfmas > 0 and mfmas == isa.read_text().count("v_mfma_i32_16x16x32_i8")

    vmfb = tmp_path / "packaged.vmfb"
    run("int8attn", "compile", graph, "--target", "gfx942", "--kernel-object", co, "-o", vmfb,
        check_rc=0)
    packaged = vmfb.read_bytes()
    assert co.read_bytes() in packaged     # the object itself, not IREE's build
    import iree.runtime as rt

    module = rt.VmModule.copy_buffer(rt.VmInstance(), packaged)
    assert "decode" in module.function_names     # the host function, as IREE built it


@needs_llvm
def test_bad_kernel_objects_are_refused_by_name_before_anything_runs(tmp_path):
    graph, ll, manifest = _emit(tmp_path, "decode", "gfx942")
    co = _build(ll)

    def refused(*args, graph=graph, target="gfx942"):
        proc = run("int8attn", "compile", graph, "--target", target, *args, "-o",
                   tmp_path / "x.vmfb", check_rc=1)
        assert not (tmp_path / "x.vmfb").exists()
        return proc.stderr

    other_arch = tmp_path / "other" / "decode-gfx942.ll"
    other_arch.parent.mkdir()
    shutil.copy(ll, other_arch)
    assert "is built for gfx90a, not gfx942" in refused(
        "--kernel-object", _build(other_arch, "gfx90a"))
    assert "built for gfx942, not gfx936" in refused("--kernel-object", co, target="gfx936")
    prefill, _, _ = _emit(tmp_path, "prefill", "gfx942")
    assert "lacks the kernel(s) prefill_attention" in refused("--kernel-object", co,
                                                              graph=prefill)
    changed = tmp_path / "changed.mlir"     # same kernels, another softmax scale
    changed.write_text(decode_graph(1, 8, 2, 300, 64, softmax_scale=0.5))
    assert "is stale: it was built from IR" in refused("--kernel-object", co, graph=changed)
    not_elf = tmp_path / "text.co"
    not_elf.write_text("not a code object")
    assert "is not an ELF file" in refused("--kernel-object", not_elf)
    assert "does not exist" in refused("--kernel-object", tmp_path / "missing.co")
    written = json.loads(ll.with_suffix(".json").read_text())
    written["kernels"][0]["abi"]["threads"] = 64
    ll.with_suffix(".json").write_text(json.dumps(written))
    assert "manifest" in refused("--kernel-object", co) and "does not match the graph" in \
        refused("--kernel-object", co)


def test_kernel_object_and_llvm_are_refused_where_they_do_not_apply(tmp_path):
    graph = tmp_path / "g.mlir"
    graph.write_text(GRAPHS["decode"])
    out = tmp_path / "x"
    for target in ("cpu", "cuda"):
        proc = run("int8attn", "compile", graph, "--target", target, "--kernel-object",
                   tmp_path / "k.co", "-o", out, check_rc=2)
        assert "--kernel-object" in proc.stderr and "does not apply" in proc.stderr
    proc = run("int8attn", "compile", graph, "--target", "gfx936", "--emit", "vmfb", "-o", out,
               check_rc=2)
    assert "without --kernel-object" in proc.stderr
    proc = run("int8attn", "compile", graph, "--target", "cuda", "--emit", "llvm", "-o", out,
               check_rc=2)
    assert "no 'llvm' to emit" in proc.stderr
