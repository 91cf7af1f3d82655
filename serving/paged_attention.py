"""Paged INT8 attention for a serving program: torch tensors in and out, no copies.

    attn = PagedAttention(q_heads=32, kv_heads=8, head_dim=128, block_size=16)  # cuda
    attn.write(k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale)
    out = attn(q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens)

The pool (vLLM's layout, docs/design.md §2b) stays where the caller keeps it: on
cuda the kernels IREE compiled read and write it in place, launched on torch's
current stream (serving/executors.py), so a call is ordered after the work
already queued there, its result is ready for the next op on that stream, and
no call waits on the host unless `validate="sync"` asks it to. On the cpu target
the same calls run through IREE's CPU runtime on the CPU tensors' memory.

Input checks. Shapes, dtypes, contiguity, device and the agreement of batch and
pool sizes are always checked, from the tensors' metadata. The value rules
(lengths in range, block ids of used table slots inside the pool, the scales of
every token read finite and >= 0; for cache_write, slots inside the pool, no slot
twice, finite rows) are checked in one of three modes, `validate=`:

- True (the default): on the device, without a host sync
  (serving/deferred_checks.py). A bad call's first violation is kept in a device
  record and raised as the synchronous check's error by `check()`, or by a later
  call once the record has reached the host. A bad call never writes the cache
  (its slot mapping is turned to all -1), and the output rows of a bad attention
  call's bad sequences are NaN (its block ids and lengths are made safe first, so
  the kernels never read outside the pool).
- "sync": a few reductions on the device and one host sync on their verdict; a
  bad call raises at once and writes nothing (the numpy checks every executor
  shares name the argument, sequence and slot).
- False: no value checks; the inputs are trusted, as a kernel library trusts
  them (on the cpu target the runtime's own checks still run, as with "sync").

Compiled kernels come from `int8attn.compile` (cached by content and options),
or from a folder `save` wrote (`PagedAttention.load`), so a GPU server without
the IREE compiler runs what another machine compiled.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from ..contract.numerics import Numerics
from ..driver.paged_decode import cache_write_graph, paged_attention_graph
from ..driver.paged_inputs import check_cache_write_shapes, check_paged_shapes
from ..runtime.module import InputError, check_writable
from ..support.diagnostics import DiagnosticError
from .deferred_checks import WRITE_KIND, Violations, attend_record, problem, write_record
from .executors import CudaExecutor, HostExecutor
from .kernel_package import KernelPackage
from .tensors import SignatureCheck, aligned, torch_module

DECODE, WRITE = "decode", "write"
SETTINGS = "paged_attention.json"


class PagedAttention:
    """One model's paged attention and cache write, compiled for `target`
    ('cuda' or 'cpu'); `options` are CompileOptions fields (pv, q_terms, w_quant, ...:
    plain values, saved as JSON); `numerics` is the variant they resolve to."""

    def __init__(self, q_heads: int, kv_heads: int, head_dim: int, block_size: int, *,
                 softmax_scale: float | None = None, target: str = "cuda", **options):
        if target not in ("cuda", "cpu"):
            raise InputError(f"PagedAttention runs on target 'cuda' or 'cpu', not {target!r}")
        q_heads, kv_heads, head_dim, block_size = (
            _positive(name, value) for name, value in (
                ("q_heads", q_heads), ("kv_heads", kv_heads), ("head_dim", head_dim),
                ("block_size", block_size)))
        if q_heads % kv_heads:
            raise InputError(f"{q_heads} query heads do not group over {kv_heads} KV heads "
                             f"(q_heads must be a multiple of kv_heads)")
        self.q_heads, self.kv_heads, self.head_dim = q_heads, kv_heads, head_dim
        self.block_size, self.target, self.options = block_size, target, dict(options)
        self._saved_numerics: Numerics | None = None
        self.softmax_scale = (float(np.float32(head_dim ** -0.5)) if softmax_scale is None
                              else _softmax_scale(softmax_scale))
        self._executors: dict = {}
        self.violations = Violations()

    # compiled kernels ------------------------------------------------------
    def _source(self, kind) -> str:
        if kind == WRITE:
            return cache_write_graph(self.kv_heads, self.head_dim, self.block_size)
        query_tokens = None if kind == DECODE else kind[1]
        return paged_attention_graph(self.q_heads, self.kv_heads, self.head_dim,
                                     self.block_size, softmax_scale=self.softmax_scale,
                                     query_tokens=query_tokens)

    def executor(self, kind):
        """The executor of `kind`: DECODE, WRITE or ("prefill", Sq), compiled on first use."""
        if kind not in self._executors:
            from .. import api

            try:
                graph = api.compile(self._source(kind), target=self.target,
                                    filename=f"{_kind_name(kind)}.mlir", **self.options)
            except DiagnosticError as error:    # located in a graph the user never wrote
                raise InputError(f"PagedAttention(q_heads={self.q_heads}, kv_heads="
                                 f"{self.kv_heads}, head_dim={self.head_dim}, block_size="
                                 f"{self.block_size}, target={self.target!r}) cannot build "
                                 f"its {_kind_name(kind)} kernel: {error.message}") from None
            self._executors[kind] = (CudaExecutor(KernelPackage.from_graph(graph))
                                     if self.target == "cuda" else HostExecutor(graph))
        return self._executors[kind]

    def has_kernel(self, kind) -> bool:
        """Whether `kind` (DECODE, WRITE or ("prefill", Sq)) can run: compiled or
        loaded already, or compilable here (the IREE compiler is installed)."""
        if kind in self._executors:
            return True
        try:
            import iree.compiler  # noqa: F401
        except ImportError:
            return False
        return True

    def save(self, folder: str | Path, query_tokens=(), write: bool = True) -> Path:
        """Compile the decode, the cache write (unless `write=False`) and a chunked
        prefill per Sq in `query_tokens` for cuda, and save their packages under
        `folder`."""
        if self.target != "cuda":
            raise InputError("only cuda kernels are saved as packages (the cpu target "
                             "compiles where it runs)")
        folder = Path(folder)
        kinds = [DECODE] + [WRITE] * write + [("prefill", int(n)) for n in query_tokens]
        for kind in kinds:
            self.executor(kind).package.save(folder / _kind_name(kind))
        settings = {"numerics": dataclasses.asdict(self.numerics),
                    "q_heads": self.q_heads, "kv_heads": self.kv_heads,
                    "head_dim": self.head_dim, "block_size": self.block_size,
                    "softmax_scale": self.softmax_scale, "options": self.options,
                    "kinds": [_kind_name(k) for k in kinds]}
        (folder / SETTINGS).write_text(json.dumps(settings, indent=1))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> "PagedAttention":
        """The cuda kernels `save` wrote: no compiler needed."""
        folder = Path(folder)
        try:
            settings = json.loads((folder / SETTINGS).read_text())
        except (OSError, ValueError) as error:
            raise InputError(f"{folder} holds no saved PagedAttention ({SETTINGS}): {error}") \
                from None
        attn = cls(settings["q_heads"], settings["kv_heads"], settings["head_dim"],
                   settings["block_size"], softmax_scale=settings["softmax_scale"],
                   target="cuda", **settings["options"])
        if "numerics" in settings:       # folders saved before w_terms was written: 1
            attn._saved_numerics = Numerics(**{"w_terms": 1, **settings["numerics"]})
        for name in settings["kinds"]:
            attn._executors[_kind_of(name)] = CudaExecutor(KernelPackage.load(folder / name))
        return attn

    @property
    def numerics(self) -> Numerics:
        """The `Numerics` its kernels are built with: as saved (loaded kernels), else
        its options resolved for its target."""
        if self._saved_numerics is not None:
            return self._saved_numerics
        from ..api import compile_options

        return compile_options(target=self.target, **self.options).numerics

    # checks ----------------------------------------------------------------
    def check(self) -> None:
        """Raise the first value-rule violation a call with `validate=True` recorded since
        the last check, as the InputError `validate="sync"` would have raised, and clear
        it. One host sync per device used (none where nothing ran); call it where the
        program syncs anyway (once per step), and after replaying a CUDA graph."""
        taken = self.violations.take()
        if taken is not None:
            raise InputError(problem(self._info_of, taken[1]))

    def _info_of(self, kind: int):
        if kind == WRITE_KIND:
            return self.executor(WRITE).info
        return self.executor(("prefill", kind) if kind else DECODE).info

    def _raise_recorded(self, device) -> None:
        """A violation an earlier call recorded that has reached the host: raised now."""
        if self.violations.seen(device):
            self.check()

    # calls -----------------------------------------------------------------
    def __call__(self, q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens, *,
                 out=None, validate=True):
        """Attention of each sequence over its own cached tokens: q [B, Hq, D] (decode)
        or [B, Hq, Sq, D] (chunked prefill of each sequence's last Sq tokens). The
        result is f32 in q's shape, in `out` when given (caller-owned, contiguous).
        `validate`: True, "sync" or False (module docstring)."""
        torch = torch_module()
        deferred = is_deferred(validate)
        # by the rank, whatever q is (a torch tensor, a numpy array, a DLPack producer)
        kind = ("prefill", int(q.shape[2])) if len(getattr(q, "shape", ())) == 4 else DECODE
        executor = self.executor(kind)
        info = executor.info
        names = info.attention.operands
        tensors = _signature(executor, accepted_q=("f32", "f16", "bf16"))(
            [q, k_cache, k_scale, v_cache, v_scale, block_tables, context_lens])
        tensors[0] = tensors[0].float()
        if out is not None:
            out = self._check_out(out, tensors[0])
        device = tensors[0].device
        self._raise_recorded(device)
        ops = dict(zip(names, tensors))
        check_paged_shapes(info, ops)
        bad, launch = None, True
        if deferred and tensors[0].shape[0]:
            shortest = tensors[0].shape[2] if kind != DECODE else 1
            record, ops["block_tables"], ops["context_lens"], bad, launch = attend_record(
                ops, shortest, kind != DECODE)
            self.violations.add(record, device, 0 if kind == DECODE else kind[1], shortest,
                                tensors[5].shape[1], tensors[1].shape[0])
        if executor.device_type == "cpu":     # the CPU runtime checks what is not deferred
            result = (executor.run_positional([ops[n] for n in names], checked=not deferred)[0]
                      if launch else torch.empty(tensors[0].shape))
            result = _nan_rows(result, bad)
            if out is None:
                return result
            out.copy_(result)
            return out
        if validate == "sync":
            _validate(info, tensors)
        aligned(zip(names, tensors))
        if tensors[0].shape[0] == 0:
            return out if out is not None else torch.empty(tensors[0].shape, device=q.device)
        if not launch:
            return _nan_rows(out if out is not None else torch.empty(tensors[0].shape,
                                                                      device=device), bad)
        return _nan_rows(self._launch_attention(executor, ops, out), bad)

    def _launch_attention(self, executor: CudaExecutor, tensors: dict, out):
        torch = torch_module()
        q = tensors["q"]
        (buffer,) = executor.package.kernels[-1].abi.outputs
        direct = out if out is not None else torch.empty(q.shape, dtype=torch.float32,
                                                         device=q.device)
        # The merged rows are [B, Hkv, rows_out, D]; with rows_out = Hq / Hkv that is
        # q's own layout, so the kernel writes the caller's tensor directly.
        rows_out = executor.package.layout.get("rows_out", self.q_heads // self.kv_heads)
        if q.dim() == 4 or rows_out * self.kv_heads == self.q_heads:
            executor.run(tensors, {buffer.name: direct})
            return direct
        written = executor.run(tensors)[buffer.name]
        group = self.q_heads // self.kv_heads
        direct.copy_(written[:, :, :group].reshape(direct.shape))
        return direct

    def _check_out(self, out, q):
        torch = torch_module()
        if not isinstance(out, torch.Tensor) or out.dtype != torch.float32 or \
                tuple(out.shape) != tuple(q.shape) or not out.is_contiguous() or \
                out.device != q.device:
            raise InputError(f"out must be a contiguous float32 tensor of q's shape "
                             f"{list(q.shape)} on {q.device}, got "
                             f"{_describe(out)}")
        return out

    def write(self, k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale, *,
              validate=True) -> None:
        """Quantize T new tokens per row (docs/design.md §2) and store them in place at
        `slot_mapping` (block * BS + offset; a negative slot skips the token).
        `validate`: True, "sync" or False (module docstring); a call found bad writes
        nothing in every mode."""
        deferred = is_deferred(validate)
        executor = self.executor(WRITE)
        info = executor.info
        names = info.attention.operands
        arguments = [k_new, v_new, slot_mapping, k_cache, k_scale, v_cache, v_scale]
        # a read-only numpy cache: refused as CompiledGraph.run refuses it (the tensor
        # taken of it shares its memory, and the write would land in it regardless)
        check_writable(info.name, info.attention.tied, arguments,
                       dict(zip(info.attention.argument_of, names)))
        tensors = _signature(executor)(arguments)
        device = tensors[0].device
        self._raise_recorded(device)
        ops = dict(zip(names, tensors))
        check_cache_write_shapes(info, ops)
        if deferred and tensors[0].shape[0]:
            record, bad = write_record(ops)
            self.violations.add(record, device, WRITE_KIND, 0, 0, tensors[3].shape[0])
            # a bad call skips every token: the kernel writes nothing
            ops["slot_mapping"] = tensors[2] = tensors[2].masked_fill(bad, -1)
        if executor.device_type == "cpu":     # the CPU runtime checks what is not deferred
            results = executor.run_positional(tensors, checked=not deferred)
            for target, result in zip(tensors[3:], results):
                if result.data_ptr() != target.data_ptr():
                    target.copy_(result)
            return
        if validate == "sync":
            _validate(info, tensors)
        aligned(zip(names, tensors))
        if tensors[0].shape[0]:
            executor.run(ops)


def is_deferred(validate) -> bool:
    """Whether `validate` asks for the checks without a sync (True); "sync" and False
    are the other modes."""
    if validate is True or validate is False or validate == "sync":
        return validate is True
    raise InputError(f"validate must be True (value checks on the device, raised by check() "
                     f"or a later call), 'sync' (checked before the call returns) or False "
                     f"(no value checks), got {validate!r}")


def _nan_rows(result, bad):
    """`result` with the rows of the sequences in `bad` (None: none) set to NaN, in place."""
    if bad is not None:
        result.masked_fill_(bad.view(-1, *(1,) * (result.dim() - 1)), float("nan"))
    return result


def _signature(executor, accepted_q=("f32",)) -> SignatureCheck:
    """The executor's argument check, built on first use."""
    if getattr(executor, "signature_check", None) is None:
        info = executor.info
        executor.signature_check = SignatureCheck(info.name, info.arguments,
                                                  info.attention.operands,
                                                  executor.device_type, accepted_q, info=info)
    return executor.signature_check


def _positive(name: str, value) -> int:
    """`value` as a positive int (a count or size of the kernels' shapes)."""
    import operator

    try:
        number = operator.index(value)
    except TypeError:
        raise InputError(f"PagedAttention's {name} must be a positive integer, got "
                         f"{value!r} ({type(value).__name__})") from None
    if number <= 0:
        raise InputError(f"PagedAttention's {name} must be a positive integer, got {number}")
    return int(number)


def _softmax_scale(value) -> float:
    """`value` as the float the kernels scale scores by (`softmax_scale_problem`: the
    contract's rule)."""
    from ..contract.constants import softmax_scale_problem

    problem = softmax_scale_problem(value)
    if problem is not None:
        raise InputError(f"PagedAttention's softmax_scale {problem} (the usual value: "
                         f"head_dim ** -0.5, the default)")
    return float(value)


def _describe(value) -> str:
    shape = list(getattr(value, "shape", []))
    return f"{type(value).__name__} {getattr(value, 'dtype', '')} {shape}"


def _kind_name(kind) -> str:
    return kind if isinstance(kind, str) else f"prefill_{kind[1]}"


def _kind_of(name: str):
    return ("prefill", int(name.split("_")[1])) if name.startswith("prefill_") else name


def _validate(info, tensors) -> None:
    """The value rules (module docstring): the verdict on the device, the message from
    the numpy checks every executor shares."""
    from ..driver.paged_inputs import check_cache_write_arguments, check_paged_arguments
    from .device_checks import host_arrays, passes_value_rules

    if passes_value_rules(info, tensors):
        return
    arrays = host_arrays(info, tensors)
    if info.attention.mode == "cache_write":
        check_cache_write_arguments(info, arrays)
    else:
        check_paged_arguments(info, arrays)
    raise InputError(f"@{info.name}: the device-side input check failed but the host check "
                     f"found nothing to name; please report this with the inputs")
