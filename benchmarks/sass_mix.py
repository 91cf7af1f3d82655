"""What the cuda kernels become in SASS: registers, spills and instructions per MMA.

    python benchmarks/sass_mix.py [--kernels prefill,paged-prefill,decode,paged-decode]
                                  [--numerics one-term,digits] [--pv int8] [--arch sm_90]
                                  [--spec FIELD=VALUE ...] [--out FILE.md]

The PTX of `ptx_mix.py` (the same kernels and shapes) is assembled by NVIDIA's `ptxas`
for `--arch` (sm_90: the H200), with the register cap the kernel asks for
(`.minnctapersm`), as the driver's JIT does with the PTX IREE embeds. Reported per
kernel: ptxas's registers and spill bytes; with `nvdisasm`, the SASS of each tile loop
(the backward branches whose body holds an MMA; a decode partition, which has none, is
counted whole) by class. `--spec` changes a bool or int field of the cuda target or of
its decode tuning (kernels/target_spec.py), as `prefill_variants.py` builds a choice to
time. No GPU is needed. The tools are found on PATH or under a pip
install of NVIDIA's wheels (`pip install nvidia-cuda-nvcc-cu12 nvidia-cuda-nvdisasm`:
site-packages/nvidia/*/bin).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import ptx_mix
from int8attn.kernels import spec_fields
from int8attn.kernels import target_spec as specs

# (class, SASS opcode stems), first match wins; the rest is "other".
CLASSES = (
    ("mma", ("IMMA", "HMMA")),
    ("global loads", ("LDG",)),
    ("async copies", ("LDGSTS", "LDGDEPBAR", "DEPBAR")),
    ("LDS", ("LDS", "STS", "LDSM")),
    ("spills", ("LDL", "STL")),
    ("shuffles", ("SHFL",)),
    ("barriers", ("BAR",)),
    ("MUFU", ("MUFU",)),
    ("f32 mul/add/fma", ("FMUL", "FADD", "FFMA")),
    ("f32 max/min", ("FMNMX",)),
    ("conversions", ("F2I", "I2F", "F2F", "I2I", "F2FP", "I2FP", "F2IP")),
    ("selects, compares", ("FSEL", "SEL", "FSETP", "ISETP", "PLOP3")),
    ("integer, bits", ("IADD3", "IMAD", "LOP3", "SHF", "LEA", "PRMT", "IABS", "IMNMX",
                       "BMSK", "SGXT")),
    ("division checks", ("FCHK",)),
)
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+`\((\.L_x_\d+)\)")
_USAGE = re.compile(r"Function properties for (\w+)\n\s*(\d+) bytes stack frame, (\d+) bytes "
                    r"spill stores, (\d+) bytes spill loads\n.*?Used (\d+) registers")


def tool(name: str) -> str | None:
    """`name` on PATH, else in a pip install of NVIDIA's wheels (nvidia/*/bin)."""
    found = shutil.which(name)
    if found:
        return found
    for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "*", "bin", name))):
            if os.access(path, os.X_OK):
                return path
    return None


def assemble(ptx: str, arch: str, workdir: str) -> tuple[dict, str]:
    """ptxas over `ptx`: ({entry: (registers, spill store bytes, spill load bytes)}, the
    cubin's path)."""
    source, cubin = os.path.join(workdir, "kernel.ptx"), os.path.join(workdir, "kernel.cubin")
    with open(source, "w") as f:
        f.write(ptx)
    done = subprocess.run([tool("ptxas"), f"-arch={arch}", "-v", "-o", cubin, source],
                          capture_output=True, text=True, check=True)
    usage = {m.group(1): (int(m.group(5)), int(m.group(3)), int(m.group(4)))
             for m in _USAGE.finditer(done.stderr)}
    return usage, cubin


def instructions(sass: str, entry: str) -> tuple[list[str], dict[str, int]]:
    """The instructions of `entry` in an nvdisasm listing, and its labels' positions."""
    start = sass.index(f".text.{entry}:")
    end = sass.find("\n//---", start)
    found, labels = [], {}
    for line in sass[start:end if end > 0 else len(sass)].splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(found)
        elif m := _INSTRUCTION.match(line):
            found.append(m.group(1))
    return found, labels


def opcode(instruction: str) -> str:
    words = instruction.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def classify(ops) -> dict[str, int]:
    counts = collections.Counter()
    for op in ops:
        name = next((c for c, stems in CLASSES if op in stems), "other")
        counts[name] += 1
    return {c: counts[c] for c, _ in CLASSES + (("other", ()),) if counts[c]}


def loops(found: list[str], labels: dict[str, int]) -> list[tuple[int, int]]:
    """(first, last) instruction of each loop, in program order (`ptx_mix.back_edges`)."""
    return ptx_mix.back_edges((labels.get(m.group(1)), n) for n, instruction in enumerate(found)
                              if (m := _BRANCH.search(instruction)))


def measure(kernel: str, numerics: str, pv: str, arch: str) -> list[dict]:
    """One row per counted region of the kernel's SASS (without nvdisasm: one row of
    registers and spills only)."""
    ptx, entry = ptx_mix.compile_ptx(kernel, numerics, pv)
    with tempfile.TemporaryDirectory() as workdir:
        usage, cubin = assemble(ptx, arch, workdir)
        sass = None
        if tool("nvdisasm"):
            sass = subprocess.run([tool("nvdisasm"), "-c", cubin], capture_output=True,
                                  text=True, check=True).stdout
    registers, stores, loads = usage[entry]
    row = dict(kernel=kernel, numerics=numerics, pv=pv, registers=registers,
               spill_stores=stores, spill_loads=loads)
    if sass is None:
        return [dict(row, region="kernel", instructions=None, mma=0, classes={})]
    found, labels = instructions(sass, entry)
    regions = [(f"tile loop {i + 1}", found[a:b + 1]) for i, (a, b)
               in enumerate(s for s in loops(found, labels)
                            if classify(map(opcode, found[s[0]:s[1] + 1])).get("mma"))]
    rows = []
    for name, body in regions or [("whole kernel", found)]:
        counts = classify(map(opcode, body))
        rows.append(dict(row, region=name, instructions=len(body), mma=counts.get("mma", 0),
                         classes=counts))
    return rows


def markdown(rows: list[dict]) -> str:
    classes = [c for c, _ in CLASSES] + ["other"]
    head = (["kernel", "numerics", "registers", "spill bytes (st/ld)", "region",
             "instructions", "per mma"] + classes)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "--:|" * 2 + "---|"
           + "--:|" * (len(head) - 5)]
    for r in rows:
        per = f"{r['instructions'] / r['mma']:.1f}" if r["mma"] else ""
        cells = [r["kernel"], r["numerics"], str(r["registers"]),
                 f"{r['spill_stores']} / {r['spill_loads']}", r["region"],
                 str(r["instructions"] or ""), per] + [str(r["classes"].get(c, 0))
                                                       for c in classes]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def spec_changes(parser: argparse.ArgumentParser, pairs: list[str]) -> dict:
    """`--spec FIELD=VALUE` pairs as cuda `TargetSpec` changes (bool and int fields, its
    decode tuning's too)."""
    choices = sorted(f.name for f in dataclasses.fields(specs.TargetSpec)
                     + dataclasses.fields(specs.DecodeTuning) if f.type in ("bool", "int"))
    try:
        return spec_fields.field_changes(pairs, choices, "a bool or int field of the target")
    except ValueError as error:
        parser.error(f"--spec: {error}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(ptx_mix.KERNELS),
                        help=f"comma-separated, of {', '.join(ptx_mix.KERNELS)}")
    parser.add_argument("--numerics", default=",".join(ptx_mix.NUMERICS),
                        help="comma-separated: one-term (one INT8 term each), digits "
                             "(two-term digits, the kernel targets' default)")
    parser.add_argument("--pv", default="int8", choices=("int8", "bf16"))
    parser.add_argument("--arch", default="sm_90", help="ptxas's -arch (sm_90: the H200)")
    parser.add_argument("--spec", action="append", default=[], metavar="FIELD=VALUE",
                        help="a bool or int field of the cuda target or its decode "
                             "tuning, changed")
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    kernels, numerics = ptx_mix.check_selection(parser, args.kernels, args.numerics)
    changes = spec_changes(parser, args.spec)
    if changes:
        try:
            specs.TARGET_SPECS["cuda"] = spec_fields.with_changes(specs.TARGET_SPECS["cuda"],
                                                                  changes)
        except ValueError as error:           # a tuning the schedule refuses
            parser.error(f"--spec: {error}")
    if tool("ptxas") is None:
        parser.error("ptxas not found: put CUDA's bin on PATH, or "
                     "pip install nvidia-cuda-nvcc-cu12")
    if tool("nvdisasm") is None:
        print("nvdisasm not found (pip install nvidia-cuda-nvdisasm): registers and "
              "spills only", file=sys.stderr)
    rows = []
    for kernel in kernels:
        for n in numerics:
            print(f"compiling {kernel} ({n} numerics, {args.pv} PV) to PTX and {args.arch}",
                  file=sys.stderr, flush=True)
            rows += measure(kernel, n, args.pv, args.arch)
    ptx_mix.write_table(markdown(rows), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
