"""Instructions per MMA of the cuda kernels, read off their PTX (no GPU needed).

    python benchmarks/ptx_mix.py [--kernels prefill,paged-prefill,decode,paged-decode]
                                 [--numerics one-term,digits] [--pv int8] [--out FILE.md]

Each kernel is compiled for the cuda target up to PTX (`compile(..., until="ptx")`) at
the bench's shape (32 query heads over 8 KV heads, D 128, BS 16). For a prefill, the
tile loops (the PTX's backward branches: the tiles seen whole, then the masked ones)
are counted; for a decode partition, which runs one partition and no loop, the whole
kernel. Instructions are classed by what they do (`CLASSES`, first match wins) and
reported per loop and per MMA. PTX is what ptxas schedules from: it is not SASS, but
the per-element work of the contract shows in it one instruction for one.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys

from int8attn.bench_numerics import numerics_name
from int8attn.contract.numerics import DIGIT_NUMERICS, ONE_TERM_NUMERICS

# one INT8 term each; two-term digits (the kernel targets' default). The old names
# `seed` and `kernel` are read as these, with a note (int8attn.bench_numerics).
NUMERICS = {"one-term": ONE_TERM_NUMERICS, "digits": DIGIT_NUMERICS}
KERNELS = ("prefill", "paged-prefill", "decode", "paged-decode")
# (class, opcode prefixes), first match wins; the rest is "other".
CLASSES = (
    ("mma", ("mma.",)),
    ("global loads", ("ld.global",)),
    ("async copies", ("cp.async",)),
    ("LDS", ("ld.shared", "st.shared")),
    ("shuffles", ("shfl.",)),
    ("barriers", ("bar.",)),
    ("exp2", ("ex2.",)),
    ("f32 mul/add/fma", ("mul.rn.f32", "add.rn.f32", "sub.rn.f32", "fma.rn.f32", "mul.f32",
                         "add.f32", "sub.f32", "fma.f32", "neg.f32", "div.")),
    ("f32 max/min/abs", ("max.", "min.", "abs.")),
    ("conversions", ("cvt.",)),
    ("selects, compares", ("selp.", "setp.")),
    ("integer, bits", ("add.s", "add.u", "sub.s", "mul.", "mad.", "shl.", "shr.", "and.",
                       "or.", "xor.", "prmt.", "bfe.", "bfi.")),
)
_LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);")


def opcodes(lines) -> list[str]:
    """The opcode of each instruction line (predicates and operands dropped)."""
    ops = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith(("$", "//", "{", "}", ".", ")")) or line.endswith(","):
            continue
        words = line.split()
        op = words[1] if words[0].startswith("@") else words[0]
        ops.append(op.rstrip(";"))
    return ops


def classify(ops) -> dict[str, int]:
    counts = collections.Counter()
    for op in ops:
        name = next((c for c, prefixes in CLASSES if op.startswith(prefixes)), "other")
        counts[name] += 1
    return {c: counts[c] for c, _ in CLASSES + (("other", ()),) if counts[c]}


def entry_lines(ptx: str, kernel: str) -> list[str]:
    start = ptx.index(f".entry {kernel}")
    end = ptx.find(".entry ", start + 1)
    return ptx[start:end if end > 0 else len(ptx)].splitlines()


def loops(lines) -> list[tuple[int, int]]:
    """(first, last) line of each loop, in program order: from a label that a branch
    below jumps back to, to the last such branch (a body with a branch in it can
    jump back from more than one place)."""
    labels = {m.group(1): n for n, l in enumerate(lines) if (m := _LABEL.match(l.strip()))}
    return back_edges((labels.get(m.group(1)), n) for n, line in enumerate(lines)
                      if (m := _BRANCH.search(line)))


def back_edges(branches) -> list[tuple[int, int]]:
    """(header, last latch) per loop from (target, position) of every branch
    (target None: not a label of the code): the branches that go back, the latest
    one of each header."""
    last = {}
    for target, n in branches:
        if target is not None and target <= n:
            last[target] = max(n, last.get(target, n))
    return sorted(last.items())


def _graph(kernel: str):
    from int8attn.driver.graph import decode_graph, prefill_graph
    from int8attn.driver.paged_decode import paged_attention_graph

    if kernel == "prefill":
        return prefill_graph(1, 32, 8, 4096, 4096, 128), "prefill_attention"
    if kernel == "paged-prefill":
        return (paged_attention_graph(32, 8, 128, 16, query_tokens=4096, name="prefill"),
                "prefill_attention")
    if kernel == "decode":
        return decode_graph(16, 32, 8, 4096, 128), "decode_partition"
    return paged_attention_graph(32, 8, 128, 16), "decode_partition"


def compile_ptx(kernel: str, numerics: str, pv: str) -> tuple[str, str]:
    """(the PTX of `kernel`'s module at the bench's shape, its kernel's entry name)."""
    from int8attn.driver.compile import compile
    from int8attn.driver.options import CompileOptions

    source, entry = _graph(kernel)
    options = CompileOptions(target="cuda", pv=pv, **dataclasses.asdict(NUMERICS[numerics]))
    return compile(source, options, filename=f"{kernel}.mlir",
                   until="ptx").artifacts["ptx"], entry


def measure(kernel: str, numerics: str, pv: str, compiled: tuple[str, str] | None = None
            ) -> list[dict]:
    """One row per counted region of the kernel's PTX: the tile loops, or the kernel
    (`compiled`: its `compile_ptx`, where the caller has it already)."""
    ptx, entry = compiled or compile_ptx(kernel, numerics, pv)
    lines = entry_lines(ptx, entry)
    regions = [(f"tile loop {i + 1}", lines[a:b + 1]) for i, (a, b) in enumerate(loops(lines))
               if classify(opcodes(lines[a:b + 1])).get("mma")]
    if not regions:
        regions = [("whole kernel", lines)]
    rows = []
    for name, body in regions:
        counts = classify(opcodes(body))
        rows.append(dict(kernel=kernel, numerics=numerics, pv=pv, region=name,
                         instructions=sum(counts.values()), mma=counts.get("mma", 0),
                         classes=counts))
    return rows


def markdown(rows: list[dict]) -> str:
    classes = [c for c, _ in CLASSES] + ["other"]
    head = ["kernel", "numerics", "region", "instructions", "mma", "per mma"] + classes
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "--:|" * (len(head) - 3)]
    for r in rows:
        per = r["instructions"] / r["mma"] if r["mma"] else float("nan")
        cells = [r["kernel"], r["numerics"], r["region"], str(r["instructions"]),
                 str(r["mma"]), f"{per:.1f}"] + [str(r["classes"].get(c, 0)) for c in classes]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def check_selection(parser, kernels: str, numerics: str) -> tuple[list[str], list[str]]:
    """The comma-separated `--kernels` and `--numerics`, each name known (else a usage
    error naming the choices)."""
    kernels = kernels.split(",")
    numerics = [numerics_name(n) for n in numerics.split(",")]
    unknown = [k for k in kernels if k not in KERNELS] + [n for n in numerics
                                                          if n not in NUMERICS]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: kernels are {', '.join(KERNELS)}, "
                     f"numerics {', '.join(NUMERICS)}")
    return kernels, numerics


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help=f"comma-separated, of {', '.join(KERNELS)}")
    parser.add_argument("--numerics", default=",".join(NUMERICS),
                        help="comma-separated: one-term (one INT8 term each), digits "
                             "(two-term digits, the kernel targets' default)")
    parser.add_argument("--pv", default="int8", choices=("int8", "bf16"))
    parser.add_argument("--out", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    kernels, numerics = check_selection(parser, args.kernels, args.numerics)
    rows = []
    for kernel in kernels:
        for n in numerics:
            print(f"compiling {kernel} ({n} numerics, {args.pv} PV) to PTX", file=sys.stderr,
                  flush=True)
            rows += measure(kernel, n, args.pv)
    write_table(markdown(rows), args.out)
    return 0


def write_table(table: str, out: str | None) -> None:
    """Print the markdown table, and write it to `out` if given."""
    print(table)
    if out:
        with open(out, "w") as f:
            f.write(table)


if __name__ == "__main__":
    sys.exit(main())
