"""The paged value rules evaluated on the device, and the host copies that name a failure.

`passes_value_rules` computes, with a few torch reductions on the tensors' own
device, whether a call satisfies the rules `driver/paged_inputs.py` states
(lengths, block ids of used slots, scales of every token read; cache_write's
slots, duplicates and finite rows), and syncs once on the verdict. It reads no
pool byte on the host. When the verdict is no, `host_arrays` copies what the
numpy checks read (tables, lengths, scales, new rows; the int8 pools become
zero-stride stand-ins of their shape, never copied) so the shared checks name
the argument, sequence and slot exactly as every other executor does.
"""

from __future__ import annotations

import numpy as np

from ..fragments.cache_layout import CacheLayout
from .tensors import torch_module

POOLS = ("k_cache", "v_cache")


def passes_value_rules(info, tensors) -> bool:
    ops = dict(zip(info.attention.operands, tensors))
    if info.attention.mode == "cache_write":
        return _write_ok(ops)
    return _attend_ok(ops)


def _attend_ok(ops) -> bool:
    torch = torch_module()
    q, tables, lens = ops["q"], ops["block_tables"], ops["context_lens"]
    if not q.shape[0] == tables.shape[0] == lens.shape[0]:
        return False
    if len({ops[n].shape[0] for n in ("k_cache", "k_scale", "v_cache", "v_scale")}) != 1:
        return False
    batch, width = tables.shape
    if batch == 0:
        return True
    blocks, block_size = ops["k_cache"].shape[0], ops["k_cache"].shape[2]
    rules = CacheLayout.paged(block_size).rules()      # its operators work on torch tensors
    shortest = q.shape[2] if q.dim() == 4 else 1
    device = tables.device
    lens = lens.long()
    ok = ((lens >= shortest) & (lens <= rules.capacity(width))).all()
    used = torch.arange(width, device=device)[None, :] < rules.blocks_needed(lens)[:, None]
    ids_ok = ((tables >= 0) & (tables < blocks)) | ~used
    ok = ok & ids_ok.all()
    safe = torch.where(used & ids_ok, tables, torch.zeros_like(tables)).long()
    tokens = torch.arange(rules.capacity(width), device=device).view(1, width, block_size)
    read = (tokens < lens[:, None, None])[:, :, None, :]          # [B, MB, 1, BS]
    for name in ("k_scale", "v_scale"):
        scales = ops[name][safe]                                   # [B, MB, Hkv, BS]
        ok = ok & ((torch.isfinite(scales) & (scales >= 0)) | ~read).all()
    return bool(ok)


def _write_ok(ops) -> bool:
    torch = torch_module()
    k_new, v_new, slots = ops["k_new"], ops["v_new"], ops["slot_mapping"]
    if not k_new.shape[0] == v_new.shape[0] == slots.shape[0]:
        return False
    if len({ops[n].shape[0] for n in ("k_cache", "k_scale", "v_cache", "v_scale")}) != 1:
        return False
    if slots.shape[0] == 0:
        return True
    rules = CacheLayout.paged(ops["k_cache"].shape[2]).rules()
    slots = slots.long()
    live = rules.kept(slots)
    ok = (slots < rules.capacity(ops["k_cache"].shape[0])).all()
    kept = torch.sort(torch.where(live, slots, torch.full_like(slots, -1))).values
    ok = ok & ~((kept[1:] == kept[:-1]) & (kept[1:] >= 0)).any()
    keys = k_new.float() - ops["k_bias"] if "k_bias" in ops else k_new.float()
    for rows in (keys, v_new.float()):
        ok = ok & (torch.isfinite(rows).flatten(1).all(dim=1) | ~live).all()
    if "k_bias" in ops:
        ok = ok & torch.isfinite(ops["k_bias"]).all()
    return bool(ok)


def host_arrays(info, tensors) -> list[np.ndarray]:
    """numpy arrays for the shared checks: every small argument copied, each pool a
    zero-stride stand-in of its shape and dtype."""
    arrays = []
    for name, t in zip(info.attention.operands, tensors):
        if name in POOLS:
            arrays.append(np.lib.stride_tricks.as_strided(
                np.zeros(1, np.int8), shape=tuple(t.shape), strides=(0,) * t.dim()))
        else:
            arrays.append(t.detach().cpu().numpy())
    return arrays
