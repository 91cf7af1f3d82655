"""Run one compiled paged function on torch tensors: on a CUDA stream or on the CPU.

`CudaExecutor` launches a `KernelPackage`'s kernels directly on torch's current
stream through the driver API (serving/cuda_driver.py): nothing is copied, the
caches are read (and, for cache_write, written) in place, partial buffers come
from torch's caching allocator on that stream, and nothing waits on the host.
The launch sequence is the package's ABI list in order; each kernel's buffers
are found by name among the call's tensors and the earlier kernels' outputs.
A kernel's counters (`KernelABI.counters`: zero on entry, left zero) are one
zeroed buffer per (device, stream, name), kept across calls: no clear per call.

`HostExecutor` runs a graph compiled for the cpu target through IREE's CPU
runtime on zero-copy numpy views of CPU tensors: every argument is read (and a
cache written) in place where it is contiguous and 64-byte aligned, which torch's
CPU allocator gives every tensor it allocates; a view that starts elsewhere is
copied once (`runtime.module`, `LoadedModule.copies`).
"""

from __future__ import annotations

import math

from ..driver.signature import FunctionInfo
from ..kernels.abi import paged_sizes
from .cuda_driver import Launch, PtxModule
from .kernel_package import KernelPackage
from .tensors import torch_dtypes, torch_module


class CudaExecutor:
    """A kernel package, loaded lazily on each device it is called on."""

    device_type = "cuda"

    def __init__(self, package: KernelPackage):
        self.package = package
        self.info = FunctionInfo.from_json(package.signature)
        self._loaded: dict[int, tuple[PtxModule, list[Launch]]] = {}
        self._plans: dict[tuple, list] = {}
        self._counters: dict[tuple, object] = {}

    def _launches(self, device: int) -> list[Launch]:
        if device not in self._loaded:
            module = PtxModule(self.package.ptx, device)
            launches = [Launch(module.kernel(k.abi.kernel, k.abi.threads, k.shared_bytes),
                               len(k.abi.inputs) + len(k.abi.outputs), len(k.abi.constants))
                        for k in self.package.kernels]
            self._loaded[device] = (module, launches)
        return self._loaded[device][1]

    def sizes(self, tensors: dict) -> dict[str, int]:
        """The run-time sizes the ABI names, read off the tensors' shapes."""
        layout = self.package.layout
        if "k_new" in tensors:
            return {"T": tensors["k_new"].shape[0], "NB": tensors["k_cache"].shape[0]}
        batch, width = tensors["block_tables"].shape
        block_size = tensors["k_cache"].shape[2]
        tokens = layout.get("partition_tokens", layout.get("tile_tokens", 1))
        return paged_sizes(batch, tensors["k_cache"].shape[0], width, block_size, tokens)

    def plan(self, sizes: dict[str, int]) -> list:
        """Per kernel: (grid, constants, [(output name, dims, dtype)], binding names,
        [(counter name, dims, dtype)]), evaluated once per distinct set of sizes."""
        key = tuple(sorted(sizes.items()))
        if key not in self._plans:
            dtypes = torch_dtypes()
            self._plans[key] = [
                (k.abi.grid_of(sizes), k.abi.constant_values(sizes),
                 [(b.name, b.dims(sizes), dtypes[b.element]) for b in k.abi.outputs],
                 list(k.abi.inputs) + [b.name for b in k.abi.outputs],
                 [(b.name, b.dims(sizes), dtypes[b.element]) for b in k.abi.counters])
                for k in self.package.kernels]
        return self._plans[key]

    def run(self, tensors: dict, provided: dict | None = None) -> dict:
        """Launch every kernel in order on the current stream of the tensors' device;
        `provided` maps output buffer names to caller-owned tensors (e.g. `out`).
        Returns every buffer the kernels wrote, by name."""
        torch = torch_module()
        device = next(iter(tensors.values())).device
        launches = self._launches(device.index)
        stream = current_stream(torch, device)
        buffers = dict(tensors)
        if provided:
            buffers.update(provided)
        for (grid, constants, outputs, names, counters), launch in zip(
                self.plan(self.sizes(tensors)), launches):
            buffers.update(_allocate([o for o in outputs if o[0] not in buffers], device))
            buffers.update({name: self._counter(device, stream, name, dims, dtype)
                            for name, dims, dtype in counters})
            launch(grid, [buffers[n].data_ptr() for n in names], constants, stream)
        return buffers

    def _counter(self, device, stream: int, name: str, dims, dtype):
        """The zeroed counter `name` of this stream, grown (zeroed) as sizes need: the
        kernel leaves it zero, so calls in stream order may share it."""
        torch = torch_module()
        key = (device.index, stream, name)
        held = self._counters.get(key)
        if held is None or held.numel() < math.prod(dims):
            held = torch.zeros(max(1, math.prod(dims)), dtype=dtype, device=device)
            self._counters[key] = held
        return held[:math.prod(dims)].view(dims)


def _allocate(outputs, device) -> dict:
    """Output buffers by name: one allocation from torch's caching allocator (on the
    current stream) cut into 16-byte aligned views where they share a dtype."""
    torch = torch_module()
    if len(outputs) < 2 or len({dtype for _, _, dtype in outputs}) != 1:
        return {name: torch.empty(dims, dtype=dtype, device=device)
                for name, dims, dtype in outputs}
    dtype = outputs[0][2]
    align = max(1, 16 // dtype.itemsize)
    sizes = [-(-math.prod(dims) // align) * align for _, dims, _ in outputs]
    flat = torch.empty(sum(sizes), dtype=dtype, device=device)
    views, start = {}, 0
    for (name, dims, _), size in zip(outputs, sizes):
        views[name] = flat[start:start + math.prod(dims)].view(dims)
        start += size
    return views


def current_stream(torch, device) -> int:
    """The raw handle of torch's current stream on `device` (the cheap accessor where
    this torch build has it)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class HostExecutor:
    """A graph compiled for the cpu target, called on CPU tensors without copies."""

    device_type = "cpu"

    def __init__(self, graph):
        self.graph = graph
        self.info = graph.entry()

    def run_positional(self, tensors: list, checked: bool = True):
        """The results as tensors; `checked=False` leaves out the value checks (the
        caller checked, or made the values safe: serving/deferred_checks.py), not the
        signature's."""
        torch = torch_module()
        arrays = [t.detach().numpy() for t in tensors]
        if checked:
            results = self.graph.run(arrays)
        else:
            results = self.graph.executor.call(self.info.name, *arrays,
                                               tied=self.info.attention.tied)
        return [torch.from_numpy(r) for r in results]
