"""A compiled graph's GPU kernels as a package a launcher can run without IREE.

`KernelPackage.from_graph` takes a graph compiled for `--target cuda`: the PTX
IREE produced (read back from the vmfb, so a module cache hit serves too), each kernel's `KernelABI` (kernels/abi.py) and, from the
executable IREE embedded in the vmfb, each entry point's workgroup size and
dynamic shared memory (IREE's LLVMGPU backend packs a kernel's LDS buffers into
one dynamic allocation and records its size there, nowhere else). The package
saves to a folder (`manifest.json` + `kernels.ptx`), so a machine without the
IREE compiler (a GPU server) runs what this one compiled.

The executable is a FlatBuffer ('CDA1') behind IREE's 64-byte header; of it we
read `exports[i].{kernel_name, block_dims, block_shared_memory_size,
constant_count}` and `modules[0].ptx_image` (iree/schemas/cuda_executable_def.fbs). The reader checks what
it reads against the ABI (workgroup size, push-constant words), so a schema
change is an error, not a wrong launch.
"""

from __future__ import annotations

import json
import struct
import zipfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from ..kernels.abi import KernelABI

EXECUTABLE_HEADER = 64           # IREE's executable file header, before the FlatBuffer
MANIFEST, PTX = "manifest.json", "kernels.ptx"


class PackageError(ValueError):
    """A graph that gives no launchable package, or a package folder that is not one."""


@dataclass(frozen=True)
class PackagedKernel:
    abi: KernelABI
    shared_bytes: int


@dataclass(frozen=True)
class KernelPackage:
    function: str                      # the graph's public function
    kernels: tuple[PackagedKernel, ...]
    ptx: str
    layout: dict                       # the compiled kernel layout (mode, rows_out, ...)
    signature: dict                    # FunctionInfo.to_json() of the function

    @classmethod
    def from_graph(cls, graph, function: str | None = None) -> "KernelPackage":
        """The kernels of the graph's `function` (its only one by default: a module of
        @write and @attend gives one package per function, sharing the PTX)."""
        if graph.options.target != "cuda" or graph.vmfb is None:
            raise PackageError(f"a kernel package needs a graph compiled for --target cuda "
                               f"(not simulated); this one targets {graph.options.target}")
        layout = graph.kernel_layout_of(function) or {}
        abis = [KernelABI.from_json(a) for a in layout.get("abi", ())]
        if not abis:
            raise PackageError("the graph's kernels declare no launch ABI: the serving path "
                               "runs paged_attention (decode or chunked prefill) and "
                               "cache_write graphs")
        exports, ptx = read_executable(graph.vmfb)
        kernels = []
        for abi in abis:
            if abi.kernel not in exports:
                raise PackageError(f"kernel {abi.kernel} is not in the compiled executable "
                                   f"(it has {', '.join(sorted(exports))})")
            threads, shared, words = exports[abi.kernel]
            if threads != abi.threads or words != 2 * len(abi.constants):
                raise PackageError(
                    f"kernel {abi.kernel}: the executable says {threads} threads and "
                    f"{words} push-constant words, its ABI {abi.threads} threads and "
                    f"{len(abi.constants)} index constants (2 words each)")
            kernels.append(PackagedKernel(abi, shared))
        function = layout["function"]
        return cls(function, tuple(kernels), ptx, dict(layout),
                   graph.functions[function].to_json())

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PTX).write_text(self.ptx)
        manifest = {"function": self.function, "layout": self.layout,
                    "signature": self.signature,
                    "kernels": [{"abi": k.abi.to_json(), "shared_bytes": k.shared_bytes}
                                for k in self.kernels]}
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "KernelPackage":
        folder = Path(folder)
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            ptx = (folder / PTX).read_text()
            kernels = tuple(PackagedKernel(KernelABI.from_json(k["abi"]), int(k["shared_bytes"]))
                            for k in manifest["kernels"])
            return cls(manifest["function"], kernels, ptx, manifest["layout"],
                       manifest["signature"])
        except (OSError, KeyError, ValueError, TypeError) as error:
            raise PackageError(f"{folder} is not a kernel package ({MANIFEST} and {PTX} "
                               f"written by KernelPackage.save): {error}") from None


def read_executable(vmfb: bytes) -> tuple[dict[str, tuple[int, int, int]], str]:
    """(kernel name -> (workgroup size x, dynamic shared bytes, push-constant words),
    the PTX module IREE embedded)."""
    with zipfile.ZipFile(BytesIO(vmfb)) as archive:
        names = [n for n in archive.namelist() if n.endswith("_fb.fb") or "cuda" in n]
        if not names:
            raise PackageError("the vmfb holds no CUDA executable")
        data = archive.read(names[0])
    if data[:4] != b"CDA1" or data[EXECUTABLE_HEADER + 4:EXECUTABLE_HEADER + 8] != b"CDA1":
        raise PackageError("the vmfb's CUDA executable is not the format this reader knows "
                           "(IREE 3.13's 'CDA1' FlatBuffer)")
    flat = _Flat(data[EXECUTABLE_HEADER:])
    return flat.exports(), flat.ptx()


class _Flat:
    """Just enough of the FlatBuffer wire format for ExecutableDef.exports."""

    def __init__(self, buf: bytes):
        self.buf = buf

    def u32(self, at: int) -> int:
        return struct.unpack_from("<I", self.buf, at)[0]

    def field(self, table: int, index: int) -> int | None:
        vtable = table - struct.unpack_from("<i", self.buf, table)[0]
        size = struct.unpack_from("<H", self.buf, vtable)[0]
        if 4 + 2 * index >= size:
            return None
        offset = struct.unpack_from("<H", self.buf, vtable + 4 + 2 * index)[0]
        return table + offset if offset else None

    def string(self, at: int) -> str:
        start = self.deref(at)
        return self.buf[start + 4:start + 4 + self.u32(start)].decode()

    def ptx(self) -> str:
        """modules[0].ptx_image: the one PTX module of a linked executable."""
        modules = self.deref(self.field(self.deref(0), 1))
        if self.u32(modules) != 1:
            raise PackageError(f"the CUDA executable holds {self.u32(modules)} PTX modules; "
                               f"a package takes one")
        text = self.string(self.field(self.deref(modules + 4), 0))
        if ".entry" not in text:
            raise PackageError("the CUDA executable's module is not PTX text")
        return text

    def deref(self, at: int) -> int:
        return at + self.u32(at)

    def exports(self) -> dict[str, tuple[int, int, int]]:
        root = self.deref(0)
        vector = self.deref(self.field(root, 0))
        out = {}
        for i in range(self.u32(vector)):
            export = self.deref(vector + 4 + 4 * i)
            name = self.string(self.field(export, 1))
            dims = self.field(export, 2)
            shared, words = self.field(export, 3), self.field(export, 4)
            out[name] = (self.u32(dims) if dims else 1, self.u32(shared) if shared else 0,
                         self.u32(words) if words else 0)
        return out
