"""IREE's AMDGPU LLVM IR rewritten for another LLVM: the `llvm` stage's text.

IREE 3.13 bundles a recent LLVM, whose textual IR an older LLVM cannot read
(hex float literals `f0x…`, attribute keywords such as `nocreateundeforpoison`
or `range(…)`, `nuw` on a getelementptr, an `amdgpu9.42` triple). A vendor
toolchain (Hygon's DTK) and Debian's LLVM are older, so the module is rewritten
into the conservative subset they share, with the meaning kept:

- triple `amdgcn-amd-amdhsa`, no datalayout (the reader's AMDGPU default);
- intrinsic declarations without attributes (LLVM gives an intrinsic its
  attributes from its own table), optionally one intrinsic renamed (the
  target's matrix instruction, carried through IREE as a stand-in);
- kernel attributes reduced to the ones that set the launch contract
  (`amdgpu-flat-work-group-size`, `uniform-work-group-size`) plus `target-cpu`;
- instruction flags that only newer LLVMs parse dropped (they only license
  optimizations), float constants in the classic double-hex form;
- kernel parameters without `inreg` (kernarg preloading, gfx940+ only).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

TRIPLE = "amdgcn-amd-amdhsa"
# Function attributes a kernel keeps: the workgroup size it was built for (the
# HAL launches it with exactly that size) and that the grid covers whole groups.
KEPT_FUNCTION_ATTRIBUTES = ("amdgpu-flat-work-group-size", "uniform-work-group-size")
# Flags newer than the LLVMs the module is written for; each only licenses
# optimizations, so dropping one keeps the program's meaning.
_NEW_FLAGS = (
    (re.compile(r"\bgetelementptr (inbounds )?(?:(?:nuw|nusw) )+"), r"getelementptr \1"),
    (re.compile(r"\btrunc (?:(?:nuw|nsw) )+"), "trunc "),
    (re.compile(r"\bzext nneg "), "zext "),
    (re.compile(r"\buitofp nneg "), "uitofp "),
    (re.compile(r"\bor disjoint "), "or "),
    (re.compile(r"\bicmp samesign "), "icmp "),
    (re.compile(r"\brange\([^()]*\) "), ""),
)
_HEX_FLOAT = re.compile(r"\bf0x([0-9A-Fa-f]{8})\b")
# Infinities and the default quiet NaN by name (newer LLVMs): f32 / f64 constants
# are written as a double's bits whatever their type, so a line without other
# float types takes the classic spelling.
_NAMED_FLOAT = re.compile(r"(?<![\w.])([+-])(inf|qnan)\b")
_OTHER_FLOAT_TYPES = re.compile(r"\b(?:half|bfloat|fp128|x86_fp80|ppc_fp128)\b")
_NAMED_FLOAT_BITS = {"inf": 0x7FF0000000000000, "qnan": 0x7FF8000000000000}
_OTHER_NAMED_FLOAT = re.compile(r"(?<![\w.])[+-](?:inf|qnan|nan|snan)\b")
_DECLARE = re.compile(r"^declare (?P<head>.*?)@(?P<name>[\w.$-]+)\((?P<params>.*)\)(?P<tail>.*)$")
_DEFINE = re.compile(r"^define (?P<head>.*?)@(?P<name>[\w.$-]+)\((?P<params>.*)\)"
                     r"(?P<tail>[^{]*)\{$")
_GROUP = re.compile(r"^attributes #(?P<id>\d+) = \{ (?P<body>.*) \}$")
_STRING_ATTRIBUTE = re.compile(r'"([^"]+)"(?:="([^"]*)")?')
# Parameter / return attributes an older reader may not know, in declarations and
# definitions (their meaning is an optimization hint or, for intrinsics, implied).
_PARAMETER_NOISE = re.compile(r"\b(?:noundef|inreg|nonnull|immarg|readnone|readonly|"
                              r"writeonly|captures\([^()]*\)|nocapture|range\([^()]*\)|"
                              r"dereferenceable\(\d+\)) ")


class PortableIRError(ValueError):
    """The IR holds something the rewrite does not know how to carry."""


@dataclass(frozen=True)
class Rename:
    """Calls of `stand_in` become calls of `intrinsic`, its last `immediates`
    operands (constants the stand-in needs and the real one lacks) dropped."""

    stand_in: str
    intrinsic: str
    immediates: int
    result: str            # e.g. "<4 x i32>"
    parameters: str        # e.g. "i64, i64, <4 x i32>"


def portable_module(text: str, cpu: str, kernels: tuple[str, ...],
                    rename: Rename | None = None) -> tuple[str, int]:
    """(the rewritten module, how many calls `rename` renamed). `kernels`: the
    `amdgpu_kernel` functions to keep; any other definition is refused."""
    groups: dict[str, str] = {}
    out, renamed, kernel_groups = [], 0, set()
    for line in text.splitlines():
        if line.startswith(("target datalayout", "source_filename", "; ModuleID")):
            continue
        if line.startswith("target triple"):
            out.append(f'target triple = "{TRIPLE}"')
            continue
        if line.startswith("!llvm.module.flags") or re.match(r"^!\d+ = !\{i32 \d, !\"", line):
            continue   # the reader's defaults (code object version, buffer OOB mode)
        group = _GROUP.match(line)
        if group:
            groups[group["id"]] = group["body"]
            continue
        declared = _DECLARE.match(line)
        if declared:
            if rename is not None and declared["name"] == rename.stand_in:
                out.append(f"declare {rename.result} @{rename.intrinsic}({rename.parameters})")
                continue
            if not declared["name"].startswith("llvm."):
                raise PortableIRError(f"the kernels call an external function "
                                      f"@{declared['name']}, which a code object cannot hold")
            out.append(_plain_declaration(declared))
            continue
        defined = _DEFINE.match(line)
        if defined:
            if defined["name"] not in kernels or "amdgpu_kernel" not in defined["head"]:
                raise PortableIRError(f"@{defined['name']} is not one of the kernels "
                                      f"({', '.join(kernels)})")
            kernel_groups.update(re.findall(r"#(\d+)", defined["tail"]))
            params = _PARAMETER_NOISE.sub("", defined["params"] + " ").strip()
            head = _PARAMETER_NOISE.sub("", defined["head"])
            out.append(f"define {head}@{defined['name']}({params}){defined['tail']}{{")
            continue
        if rename is not None and f"@{rename.stand_in}(" in line:
            line = _renamed_call(line, rename)
            renamed += 1
        out.append(_portable_instruction(line))
    for id_ in sorted(kernel_groups, key=int):
        out.append(f"attributes #{id_} = {{ {_kernel_group(groups.get(id_, ''), cpu)} }}")
    module = "\n".join(out) + "\n"
    module = re.sub(r"\s#(\d+)\b(?=\s*(?:$|,|!))",
                    lambda m: m.group(0) if m.group(1) in kernel_groups else "", module,
                    flags=re.M)
    return module, renamed


def _plain_declaration(declared: re.Match) -> str:
    params = _PARAMETER_NOISE.sub("", declared["params"] + " ").strip()
    head = _PARAMETER_NOISE.sub("", declared["head"])
    return f"declare {head}@{declared['name']}({params})"


def _kernel_group(body: str, cpu: str) -> str:
    kept = [f'"{key}"' + (f'="{value}"' if value else "")
            for key, value in _STRING_ATTRIBUTE.findall(body)
            if key in KEPT_FUNCTION_ATTRIBUTES]
    return " ".join(kept + [f'"target-cpu"="{cpu}"'])


def _renamed_call(line: str, rename: Rename) -> str:
    head, args = line.split(f"@{rename.stand_in}(", 1)
    args, tail = args.rsplit(")", 1)
    operands = [a.strip() for a in args.split(",")]
    kept, dropped = operands[:-rename.immediates], operands[-rename.immediates:]
    if any(not re.fullmatch(r"i32 0", d) for d in dropped):
        raise PortableIRError(f"a call of the stand-in @{rename.stand_in} has immediates "
                              f"{', '.join(dropped)}, not the zeros it was built with")
    head = re.sub(r"\b(?:tail |notail |musttail )?call\b.*$", f"call {rename.result} ", head)
    tail = re.sub(r"\s*#\d+", "", tail)
    return f"{head}@{rename.intrinsic}({', '.join(kept)}){tail}"


def _portable_instruction(line: str) -> str:
    for pattern, replacement in _NEW_FLAGS:
        line = pattern.sub(replacement, line)
    line = _HEX_FLOAT.sub(_classic_float, line)
    if not _OTHER_FLOAT_TYPES.search(line):
        line = _NAMED_FLOAT.sub(_classic_named_float, line)
    other = _OTHER_NAMED_FLOAT.search(line)
    if other:
        raise PortableIRError(f"the float constant {other.group(0)} has no classic spelling "
                              f"here (only f32 / f64 infinities and the default NaN do): "
                              f"{line.strip()}")
    return line


def _classic_named_float(match: re.Match) -> str:
    sign = (1 << 63) if match.group(1) == "-" else 0
    return f"0x{sign | _NAMED_FLOAT_BITS[match.group(2)]:016X}"


def _classic_float(match: re.Match) -> str:
    """`f0xHHHHHHHH` (a float's bits) as LLVM's classic `0x` + the double's bits."""
    (value,) = struct.unpack("<f", bytes.fromhex(match.group(1))[::-1])
    return "0x%016X" % struct.unpack("<Q", struct.pack("<d", value))[0]
