"""What an AMDGPU code object (.co / HSACO, an ELF shared object) says about itself.

Read without LLVM tools, so that a machine that only packages (a DCU host with
DTK but no upstream LLVM) can check an object before IREE embeds it: the
processor it was built for (the `amdhsa.target` string of its metadata note,
`amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-`) and its exported symbols (each
kernel `K` exports `K` and its descriptor `K.kd`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

_ELF_MAGIC = b"\x7fELF"
_EM_AMDGPU = 0xE0
_SHT_DYNSYM = 11
_TARGET = re.compile(rb"amdgcn-amd-amdhsa--(gfx[0-9a-f]+)")


class CodeObjectError(ValueError):
    """The file is not an AMDGPU code object, or is damaged."""


@dataclass(frozen=True)
class CodeObject:
    processor: str                 # gfx942, gfx936, ...
    symbols: frozenset[str]        # exported (dynamic) symbols

    @property
    def kernels(self) -> frozenset[str]:
        """Kernels: the symbols that have a kernel descriptor `K.kd`."""
        return frozenset(s for s in self.symbols if f"{s}.kd" in self.symbols)


def read_code_object(data: bytes, name: str) -> CodeObject:
    if data[:4] != _ELF_MAGIC or len(data) < 64:
        raise CodeObjectError(f"{name} is not an ELF file (a code object starts with "
                              f"\\x7fELF); give the .co that ld.lld / clang wrote")
    if data[4] != 2 or data[5] != 1:
        raise CodeObjectError(f"{name} is not a 64-bit little-endian ELF file, as an "
                              f"AMDGPU code object is")
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != _EM_AMDGPU:
        raise CodeObjectError(f"{name} is an ELF file for machine {machine:#x}, not an AMDGPU "
                              f"code object ({_EM_AMDGPU:#x})")
    target = _TARGET.search(data)
    if target is None:
        raise CodeObjectError(f"{name} has no amdhsa.target in its metadata note; build it "
                              f"with the command the manifest gives")
    return CodeObject(target.group(1).decode(), frozenset(_dynamic_symbols(data, name)))


def _dynamic_symbols(data: bytes, name: str) -> list[str]:
    try:
        shoff, = struct.unpack_from("<Q", data, 40)
        shentsize, shnum = struct.unpack_from("<HH", data, 58)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        names = []
        for _, kind, _, _, offset, size, link, _, _, entsize in sections:
            if kind != _SHT_DYNSYM:
                continue
            strings = sections[link]
            text = data[strings[4]:strings[4] + strings[5]]
            for at in range(offset + entsize, offset + size, entsize):   # entry 0 is null
                (where,) = struct.unpack_from("<I", data, at)
                names.append(text[where:text.index(b"\0", where)].decode())
        return names
    except (struct.error, IndexError, ValueError, UnicodeDecodeError):
        raise CodeObjectError(f"{name}'s section or symbol tables are damaged "
                              f"(truncated file?); build it again") from None
