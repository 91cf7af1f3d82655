"""The Python API: compile a graph, call it on numpy arrays.

    graph = int8attn.compile(open("decode.mlir").read(), filename="decode.mlir", pv="int8")
    out = graph(q, k, k_scale, v, v_scale)

Compiled modules are cached by content and options (`int8attn.runtime.ModuleCache`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from int8attn.driver.graph import FunctionInfo, check_cache_scales
from int8attn.pipelines.compile import CompileOptions, compile_graph
from int8attn.runtime import LoadedModule, ModuleCache
from int8attn.runtime.module import InputError

__all__ = ["compile", "compile_file", "CompiledGraph", "CompileOptions"]


class CompiledGraph:
    """A compiled graph, loaded lazily into the IREE runtime on first call."""

    def __init__(self, vmfb: bytes, functions: dict[str, FunctionInfo], options: CompileOptions,
                 *, linalg_ir: str | None = None, timings: dict | None = None,
                 cache_hit: bool = False):
        self.vmfb = vmfb
        self.functions = functions
        self.options = options
        self.linalg_ir = linalg_ir
        self.timings = dict(timings or {})
        self.cache_hit = cache_hit
        self._module: LoadedModule | None = None

    def entry(self, function: str | None = None) -> FunctionInfo:
        """The named public function, or the only one."""
        if function is not None:
            if function not in self.functions:
                raise InputError(f"no public function @{function}; the module has "
                                 f"{', '.join('@' + f for f in self.functions) or 'none'}")
            return self.functions[function]
        if len(self.functions) != 1:
            raise InputError(f"the module has {len(self.functions)} public functions "
                             f"({', '.join('@' + f for f in self.functions) or 'none'}); "
                             f"choose one with --function")
        return next(iter(self.functions.values()))

    @property
    def module(self) -> LoadedModule:
        if self._module is None:
            signatures = {name: list(info.arguments) for name, info in self.functions.items()}
            self._module = LoadedModule(self.vmfb, signatures)
        return self._module

    def run(self, arrays, function: str | None = None) -> list[np.ndarray]:
        info = self.entry(function)
        check_cache_scales(info, arrays)
        start = time.perf_counter()
        results = self.module.call(info.name, *arrays)
        self.timings["run"] = time.perf_counter() - start
        return results

    def __call__(self, *arrays, function: str | None = None):
        results = self.run(arrays, function)
        return results[0] if len(results) == 1 else tuple(results)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.vmfb)


def compile(source: str, *, filename: str = "<string>", cache: bool | ModuleCache = True,
            **options) -> CompiledGraph:
    """Compile MLIR text holding int8attn graphs (options: see CompileOptions)."""
    compile_options = CompileOptions(**options)
    store = (ModuleCache() if cache is True else cache) or None
    key = store.key(source, compile_options) if store else None
    if store:
        hit = store.load(key)
        if hit is not None:
            vmfb, meta = hit
            functions = {f["name"]: FunctionInfo.from_json(f) for f in meta["functions"]}
            return CompiledGraph(vmfb, functions, compile_options, cache_hit=True)
    compiled = compile_graph(source, filename, compile_options)
    if store:
        store.store(key, compiled.vmfb,
                    {"functions": [f.to_json() for f in compiled.functions.values()]})
    return CompiledGraph(compiled.vmfb, compiled.functions, compile_options,
                         linalg_ir=compiled.linalg_ir, timings=compiled.timings)


def compile_file(path: str | Path, **options) -> CompiledGraph:
    path = Path(path)
    return compile(path.read_text(), filename=str(path), **options)
