"""Torch tensors at the serving boundary: metadata checks without touching the data.

Every call checks, from the tensors' metadata alone (no copy, no device sync):
that each argument is a torch tensor (anything with `__dlpack__`, an IREE device
array or a CuPy array, is taken through `torch.from_dlpack` without a copy), its
dtype and shape against the compiled function's signature, that it is
contiguous, and that all of them live on one device of the kind the module runs
on. The messages name the argument as the numpy path does.
"""

from __future__ import annotations

from ..runtime.module import InputError, argument_label, quantize_hint


def torch_module():
    try:
        import torch
    except ImportError:
        raise InputError("the torch serving path needs PyTorch: pip install 'int8attn[torch]'") \
            from None
    return torch


_DTYPES: dict = {}


def torch_dtypes() -> dict:
    if not _DTYPES:
        torch = torch_module()
        _DTYPES.update({"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16,
                        "i8": torch.int8, "i32": torch.int32, "i64": torch.int64})
    return _DTYPES


def as_tensor(value, label: str):
    """A torch tensor for `value` (DLPack producers converted without a copy)."""
    torch = torch_module()
    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "__dlpack__"):
        return torch.from_dlpack(value)
    raise InputError(f"{label} must be a torch tensor (or a DLPack producer), got "
                     f"{type(value).__name__}")


def check_tensors(function: str, specs, names, tensors, device_type: str,
                  accepted_q=("f32",), info=None) -> list:
    """Tensors matching the signature `specs` (TensorSpec per argument), all
    contiguous and on one `device_type` device; q (argument 0) may also be any of
    `accepted_q` element types (converted by the caller). With the function's `info`
    (a paged attention or cache write), a token-major value cache is named as such
    first, as the numpy path names it (`driver.paged_inputs.check_value_layout`)."""
    dtypes = torch_dtypes()
    label = lambda i: f"{argument_label(i, names[i])} of @{function}"
    if len(tensors) != len(specs):
        raise InputError(f"@{function} takes {len(specs)} arguments "
                         f"({', '.join(names)}), got {len(tensors)}")
    if info is not None and info.attention is not None and \
            info.attention.mode in ("paged", "cache_write"):
        from ..driver.paged_inputs import TORCH_TRANSPOSE, check_value_layout

        check_value_layout(info, list(tensors), TORCH_TRANSPOSE)
    checked, device = [], None
    for i, (value, spec) in enumerate(zip(tensors, specs)):
        t = as_tensor(value, label(i))
        allowed = {spec.element} | (set(accepted_q) if i == 0 else set())
        if t.dtype not in {dtypes[e] for e in allowed if e in dtypes}:
            want = " or ".join(str(dtypes[e]) for e in sorted(allowed) if e in dtypes)
            fix = (quantize_hint(names[i], dict(enumerate(names))) if spec.element == "i8"
                   else f"convert it: tensor.to({dtypes[spec.element]})")
            raise InputError(f"{label(i)} must be {want} for {spec.describe()}, got {t.dtype} "
                             f"({fix})")
        if not spec.accepts(tuple(t.shape)):
            expected = "[" + ", ".join("?" if d is None else str(d) for d in spec.shape) + "]"
            raise InputError(f"{label(i)} must have shape {expected} for {spec.describe()}, "
                             f"got {list(t.shape)}")
        if not t.is_contiguous():
            raise InputError(f"{label(i)} is not contiguous (strides {list(t.stride())}); the "
                             f"kernels read it in place: pass tensor.contiguous() (a copy) or "
                             f"keep the cache contiguous")
        where = t.device
        if where.type != device_type:
            raise InputError(f"{label(i)} is on {where}, but this module runs on "
                             f"{device_type}: move it (tensor.to('{device_type}')) or compile "
                             f"for {'cpu' if device_type == 'cuda' else 'cuda'}")
        if device is None:
            device = where
        elif where != device:
            raise InputError(f"{label(i)} is on {where} and argument 0 on {device}: every "
                             f"tensor of a call must be on one device")
        checked.append(t)
    return checked


class SignatureCheck:
    """`check_tensors` for one signature, with a fast verdict: the per-argument
    expectations are computed once, a call compares each tensor's dtype, rank, static
    dims, contiguity and device index against them, and only a call that fails runs
    `check_tensors` for the message (the eager serving path's host time is mostly
    these checks)."""

    def __init__(self, function: str, specs, names, device_type: str, accepted_q=("f32",),
                 info=None):
        dtypes = torch_dtypes()
        self.args = (function, specs, names, device_type, accepted_q)
        self.info = info
        self.expect = []
        for i, spec in enumerate(specs):
            allowed = {spec.element} | (set(accepted_q) if i == 0 else set())
            self.expect.append((frozenset(dtypes[e] for e in allowed if e in dtypes),
                                len(spec.shape),
                                tuple((a, n) for a, n in enumerate(spec.shape) if n is not None)))
        self.cpu = device_type == "cpu"
        self.tensor = torch_module().Tensor

    def __call__(self, tensors) -> list:
        function, specs, names, device_type, accepted_q = self.args
        if len(tensors) == len(self.expect):
            device = None
            for t, (dtypes, rank, static) in zip(tensors, self.expect):
                if type(t) is not self.tensor and not isinstance(t, self.tensor):
                    break
                index = t.get_device()
                if (t.dtype not in dtypes or t.dim() != rank or not t.is_contiguous()
                        or (index == -1) != self.cpu or (device is not None and index != device)
                        or any(t.shape[a] != n for a, n in static)):
                    break
                device = index
            else:
                return list(tensors)
        return check_tensors(function, specs, names, tensors, device_type, accepted_q,
                             info=self.info)


def aligned(tensors, alignment: int = 16) -> None:
    """The kernels load 16-byte vectors from each binding's base."""
    for name, t in tensors:
        if t.numel() and t.data_ptr() % alignment:
            raise InputError(f"{name} starts at an address that is not {alignment}-byte "
                             f"aligned (a view into another tensor?); the kernels load "
                             f"{alignment}-byte vectors: pass tensor.clone()")
