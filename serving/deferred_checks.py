"""The paged value rules as a device-side violation record: checks that never wait.

A call in the default mode (`validate=True`) evaluates the rules
`driver/paged_inputs.py` states with a few fused torch ops on the tensors' own
device and reads nothing back. Each rule becomes a priority per element (an
attention: one gather of the read slots' K and V scales, their bit patterns put in
classes by one `bucketize`, the classes, the unread tokens and the bad lengths and
block ids turned into priorities by one table lookup), and one `max` over the
elements, laid out in the order the host check looks, gives the first violation and
its flat index. The record keeps that index and the raw values the message needs
(block id, length, slot, element); the host turns the index back into sequence,
slot, head, ... when it writes the message, word for word the synchronous check's
(`problem`). `Violations` keeps one persistent record per device and folds each
call's into it (the first violation since the last `check` stays).

The same ops give what makes a bad call harmless before its kernel runs: block ids
clamped into the pool and lengths into their legal range (the kernels read only the
pool), the bad sequences (their output rows become NaN after the kernel), and for a
write the slot mapping turned to all -1 when any rule fails (the kernel writes
nothing).

Where the record is read: `Violations.check` (one host sync); a copy kept in
pinned host memory (copied without blocking after each eager CUDA call; on CPU
tensors the record itself) lets every later call raise a violation that has
reached the host, at no cost. Under CUDA graph capture the captured ops update the
persistent record; nothing is copied, and the caller checks after replay.
"""

from __future__ import annotations

import numpy as np

from ..fragments.cache_layout import CacheLayout
from ..runtime.module import InputError
from .tensors import torch_module

FIELDS = 16                     # a record: [verdict, fields...], then the call's sizes
SIZES = 4                       # kind, shortest, table width, NB
RECORD = 1 + FIELDS + SIZES
WRITE_KIND, TORCH_WRITE_KIND = -1, -2          # kinds of writes; 0 decode, Sq prefill
ROW_NAMES = ("k_new", "v_new")
SCALE_NAMES = ("k_scale", "v_scale")

# A scale's f32 bit pattern (as int32) in 7 classes: -0.0, negative finite, -Inf,
# NaN with the sign set, +0.0 to the largest finite, +Inf, NaN; `bucketize(right=True)`
# over these bounds gives the class.
_BOUNDS = (-2**31 + 1, -0x800000, -0x7fffff, 0, 0x7f800000, 0x7f800001)
_CLASS_PROBLEM = (None, 2, 1, 0, None, 1, 0)   # index into paged_inputs.SCALE_PROBLEMS
_CLASSES = len(_CLASS_PROBLEM)
# Priorities, the highest found first: a bad length or block id (the host checks those
# per sequence before any scale), then k's NaN, Inf, negative, then v's; 0: no problem.
_TABLE_PRIORITY = 7


def _scale_priority(name: int, problem) -> int:
    return 0 if problem is None else _TABLE_PRIORITY - 1 - 3 * name - problem


# priority -> (scale name, problem), the inverse of _scale_priority
_SCALE_RULE_OF = {_scale_priority(name, problem): (name, problem)
                  for name in range(len(SCALE_NAMES)) for problem in range(3)}


_CONSTANTS: dict = {}


def _constants(torch, device, block_size: int, width: int):
    """(class bounds, priority table [2, 4 * classes], [0, 1, 2], token positions [width,
    BS]) on `device`: made once (the positions grow with the widest table)."""
    key = (device, block_size)
    cached = _CONSTANTS.get(key)
    if cached is None or cached[3].shape[0] < width:
        if cached is None and _capturing(torch, device):
            raise InputError(_CAPTURE_FIRST)
        if cached is None:
            # off = 0: the class's priority; 1: an unread token; 2: its slot or length is bad
            table = [[_scale_priority(n, p) for p in _CLASS_PROBLEM] + [0] * _CLASSES
                     + [_TABLE_PRIORITY] * 2 * _CLASSES for n in range(2)]
            bounds = torch.tensor(_BOUNDS, dtype=torch.int32).to(device)
            cached = (bounds, torch.tensor(table, dtype=torch.int64).to(device),
                      torch.arange(3, device=device), None)
        positions = torch.arange(max(width, 1) * block_size, dtype=torch.int32,
                                 device=device).view(-1, block_size)
        cached = (*cached[:3], positions)
        if not _capturing(torch, device):
            _CONSTANTS[key] = cached
    return cached


_CAPTURE_FIRST = ("the value checks' record is made by the first call on a device: make "
                  "one call with validate=True before capturing a CUDA graph (the warm-up "
                  "call that loads the kernels does)")


def attend_record(ops: dict, shortest: int, prefill: bool):
    """(record parts, tables and lengths safe to launch with, bad sequences [B] bool,
    launch: False where no sequence can be read at all) of a call of B >= 1 sequences.
    The parts: [priority, flat index, block id there, its sequence's length], the flat
    index over [B, MB, BS, Hkv, 2 (k, v)], the host check's order."""
    torch = torch_module()
    tables, lens = ops["block_tables"], ops["context_lens"]
    device = tables.device
    batch, width = tables.shape
    blocks, block_size = ops["k_cache"].shape[0], ops["k_cache"].shape[2]
    capacity = CacheLayout.paged(block_size).rules().capacity(width)
    bounds, table, counts, positions = _constants(torch, device, block_size, width)
    if shortest > capacity or blocks == 0:       # no sequence can be read
        first = torch.zeros(1, dtype=torch.int64, device=device)
        block = tables.view(-1)[:1] if width else first
        none = torch.full((batch,), True, device=device)
        return ([table[0, -1:], first, block, lens[:1]], tables, lens, none, False)
    safe_tables = tables.clamp(0, blocks - 1)
    safe_lens = lens.clamp(shortest, capacity)
    unread = positions[:width] >= safe_lens.view(-1, 1, 1)               # [B, MB, BS]
    slot_bad = ((safe_tables != tables) > unread[:, :, 0]) | (safe_lens != lens).view(-1, 1)
    off = torch.where(slot_bad.unsqueeze(2), counts[2], unread)       # 0, 1 or 2
    scales = torch.stack([ops[name].view(torch.int32).transpose(1, 2)[safe_tables]
                          for name in SCALE_NAMES], -1)                  # [B, MB, BS, H, 2]
    index = torch.add(torch.bucketize(scales, bounds, out_int32=True, right=True),
                      off.unsqueeze(-1).unsqueeze(-1), alpha=_CLASSES)
    priority = table[counts[:2], index]
    best, flat = priority.view(-1).max(0, keepdim=True)
    cell = flat // (block_size * scales.shape[3] * 2)
    parts = [best, flat, tables.take(cell), lens.take(cell // width)]
    return parts, safe_tables, safe_lens, priority.view(batch, -1).any(1), True


def write_record(ops: dict):
    """(record parts, whether this call breaks a rule: 1-element bool). The parts: per
    rule in the host check's order, whether it fails and where: k_bias [found, flat
    index]; a slot past the pool [found, token, slot]; two tokens on one slot [found,
    first, second, slot]; a non-finite row written [found, flat index over [2, T, Hkv,
    D], its token's slot, the element's bits]; then T, Hkv, D."""
    torch = torch_module()
    slots = ops["slot_mapping"]
    tokens = slots.shape[0]
    blocks, block_size = ops["k_cache"].shape[0], ops["k_cache"].shape[2]
    zero = _filled(torch, slots.device, (0,))
    past, token = (slots >= CacheLayout.paged(block_size).rules().capacity(blocks)).max(
        0, keepdim=True)
    parts = [past, token, slots.take(token)]
    if tokens > 1:
        values, order = torch.sort(slots, stable=True)
        twice, at = ((values[1:] == values[:-1]) & (values[1:] >= 0)).max(0, keepdim=True)
        pair = torch.stack((order[:-1], order[1:], values[1:]))[:, at].view(-1)
        parts += [twice, pair]
        past = past | twice
    else:
        parts += [zero, zero, zero, zero]
    rows = torch.stack((ops["k_new"], ops["v_new"]))                    # [2, T, H, D]
    given = rows
    if "k_bias" in ops:
        bias = ops["k_bias"]
        rows = torch.stack((ops["k_new"].float() - bias, ops["v_new"]))
        bias_bad, bias_at = bias.mul(0).ne(0).view(-1).max(0, keepdim=True)   # NaN, Inf
        parts = [bias_bad, bias_at] + parts
        past = past | bias_bad
    else:
        parts = [zero, zero] + parts
    # x * 0 is NaN where x is NaN or Inf
    row_bad, at = ((slots >= 0).view(1, -1, 1, 1) & rows.mul(0).ne(0)).view(-1).max(
        0, keepdim=True)
    per_token = rows.shape[2] * rows.shape[3]
    parts += [row_bad, at, slots.take(at // per_token % tokens),
              given.view(-1).take(at).float().view(torch.int32),
              _filled(torch, slots.device, (tokens, *rows.shape[2:]))]
    bad = past | row_bad
    return [bad] + parts, bad


_FILLED: dict = {}


def _filled(torch, device, values: tuple):
    """`values` as an int64 device tensor, made once per device and values (by fills,
    which a capture may hold, not by a copy from the host)."""
    filled = _FILLED.get((device, values))
    if filled is None:
        filled = torch.empty(len(values), dtype=torch.int64, device=device)
        for i, value in enumerate(values):
            filled[i:i + 1].fill_(value)
        if not _capturing(torch, device):
            _FILLED[(device, values)] = filled
    return filled


class Violations:
    """The persistent violation record of each device one PagedAttention's calls ran on
    (module docstring)."""

    def __init__(self):
        self.records: dict = {}      # device -> int64 [RECORD]
        self.mirrors: dict = {}      # device -> (host tensor, its numpy view)

    def _state(self, device):
        torch = torch_module()
        if device not in self.records:
            if _capturing(torch, device):
                raise InputError(_CAPTURE_FIRST)
            record = torch.zeros(RECORD, dtype=torch.int64, device=device)
            host = record if device.type == "cpu" else torch.zeros(
                RECORD, dtype=torch.int64, pin_memory=True)
            self.records[device] = record
            self.mirrors[device] = (host, host.numpy())
        return self.records[device]

    def add(self, record, device, kind: int, shortest: int, width: int, blocks: int) -> None:
        """Fold a call's record (its parts: `attend_record`, `write_record`) into the
        device's, first violation kept, and start its copy to the host."""
        torch = torch_module()
        state = self._state(device)
        padding = (0,) * (1 + FIELDS - sum(part.numel() for part in record))
        full = torch.cat([*record, _filled(torch, device,
                                           padding + (kind, shortest, width, blocks))])
        torch.where(state[:1] != 0, state, full, out=state)
        if device.type != "cpu" and not _capturing(torch, device):
            self.mirrors[device][0].copy_(state, non_blocking=True)

    def seen(self, device) -> bool:
        """Whether a violation has reached the host copy (no sync: may lag the stream)."""
        mirror = self.mirrors.get(device)
        return mirror is not None and mirror[1][0] != 0

    def take(self):
        """(device, record as ints) of the first device holding a violation, cleared;
        None when every record is clean. Syncs with each device's current stream."""
        torch = torch_module()
        for device, state in self.records.items():
            if _capturing(torch, device):
                raise InputError("check() reads the value checks' record, which cannot be "
                                 "done while a CUDA graph is being captured: check after "
                                 "replaying it")
            values = (state.cpu() if device.type != "cpu" else state).numpy().tolist()
            if values[0]:
                state.zero_()
                self.mirrors[device][1][:] = 0
                return device, values
        return None


def _capturing(torch, device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def problem(info_of, values: list[int]) -> str:
    """The message of a record (`info_of(kind)`: the FunctionInfo of the call's kind),
    worded as the synchronous check words it."""
    fields, (kind, shortest, width, blocks) = values[:1 + FIELDS], values[1 + FIELDS:]
    if kind in (WRITE_KIND, TORCH_WRITE_KIND):
        return _write_problem(info_of, kind, shortest, blocks, fields)
    from ..driver import paged_inputs as rules

    info = info_of(kind)
    block_size, heads = _block_size_and_heads(info)
    priority, flat, block, length = fields[:4]
    per_cell = block_size * heads * 2
    sequence, slot = flat // (per_cell * max(width, 1)), flat // per_cell % max(width, 1)
    if priority == _TABLE_PRIORITY:
        capacity = CacheLayout.paged(block_size).rules().capacity(width)
        if kind and shortest > capacity:
            return rules.chunk_too_long(info, sequence, length, shortest, width, block_size)
        if not shortest <= length <= capacity:
            return rules.length_problem(info, sequence, length, shortest, width, block_size)
        return rules.block_id_problem(info, sequence, slot, length, block, blocks,
                                      block_size)
    name, problem_index = _SCALE_RULE_OF[priority]
    head, offset = flat // 2 % heads, flat // (2 * heads) % block_size
    return rules.read_scale_problem(info, SCALE_NAMES[name],
                                    rules.SCALE_PROBLEMS[problem_index], block, head, offset)


def _block_size_and_heads(info) -> tuple[int, int]:
    shape = info.arguments[info.attention.argument("k_cache")].shape
    return shape[2], shape[1]


def _write_problem(info_of, kind, layer, blocks, fields) -> str:
    from ..driver import paged_inputs as rules

    (_, bias_bad, bias_at, past, token, slot, twice, first, second, same_slot,
     row_bad, at, row_slot, bits, tokens, heads, channels) = fields
    per_token = heads * channels
    name, token_of_row = at // (per_token * tokens), at // per_token % tokens
    head, channel = at % per_token // channels, at % channels
    if kind == TORCH_WRITE_KIND:
        return (f"layer {layer}: a new key or value row holds NaN or Inf (token "
                f"{token_of_row}, KV head {head}, channel {channel} of {ROW_NAMES[name]}); "
                f"a cached row must be finite")
    info = info_of(kind)
    block_size = _block_size_and_heads(info)[0]
    if bias_bad:
        width = info.arguments[info.attention.argument("k_bias")].shape[1]
        return rules.bias_problem(info, [bias_at // width, bias_at % width])
    if past:
        return rules.slot_problem(info, token, slot, blocks, block_size)
    if twice:
        return rules.duplicate_problem(info, first, second, same_slot, block_size)
    if row_bad:
        value = float(np.array([bits], np.int64).astype(np.int32).view(np.float32)[0])
        return rules.row_problem(info, ROW_NAMES[name], token_of_row, row_slot, head,
                                 channel, value)
    return f"@{info.name}: an unknown violation record {fields}; please report it"
