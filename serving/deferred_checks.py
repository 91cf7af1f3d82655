"""The paged value rules as a device-side violation record: checks that never wait.

A call in the default mode (`validate=True`) evaluates the rules
`driver/paged_inputs.py` states with torch ops on the tensors' own device and
reads nothing back: the first violation becomes a small int64 record

    [code, six fields, kind, shortest, table width, NB]

(which rule, then sequence or token, table slot or pool slot, value, ...; the
call's kind and sizes last, so the message can be written later). `Violations`
keeps one persistent record per device and folds each call's into it (the first
violation since the last `check` stays). The same ops give what makes a bad call
harmless before its kernel runs: block ids outside the pool replaced by block 0
and bad lengths by the shortest legal one (the kernels read only the pool), the
bad sequences (their output rows become NaN after the kernel), and for a write
the slot mapping turned to all -1 when any rule fails (the kernel writes nothing).
On the host the record is turned into the error the synchronous check raises,
word for word (`problem`).

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

CHUNK, LENGTH, BLOCK, SCALE, BIAS, SLOT, DUPLICATE, ROW = range(1, 9)
FIELDS = 6
RECORD = 1 + FIELDS + 4
WRITE_KIND, TORCH_WRITE_KIND = -1, -2          # kinds of writes; 0 decode, Sq prefill
ROW_NAMES = ("k_new", "v_new")
SCALE_NAMES = ("k_scale", "v_scale")


def _cat(torch, parts, device):
    """One int64 vector of 1-element tensors and ints, padded with zeros to a record's
    code and fields."""
    vectors = [p.reshape(1).long() if isinstance(p, torch.Tensor) else
               torch.full((1,), p, dtype=torch.int64, device=device) for p in parts]
    joined = torch.cat(vectors)
    return torch.nn.functional.pad(joined, (0, 1 + FIELDS - len(parts)))


def _first(torch, mask, device):
    """The index of mask's first True in flat order, as a 1-element tensor (mask.numel()
    where there is none)."""
    flat = mask.reshape(-1)
    return torch.where(flat, torch.arange(flat.numel(), device=device),
                       flat.numel()).amin().reshape(1)


def _pick(torch, index, values):
    """values.flatten()[index] for a 1-element index, clamped into range."""
    flat = values.reshape(-1)
    return flat.index_select(0, index.clamp(0, max(flat.numel() - 1, 0)))


def attend_record(ops: dict, shortest: int, prefill: bool):
    """(record code and fields [7], tables and lengths safe to launch with, bad
    sequences [B] bool, launch: False where no sequence can be read at all) of a call
    of B >= 1 sequences."""
    torch = torch_module()
    tables, lens = ops["block_tables"], ops["context_lens"].long()
    device = tables.device
    batch, width = tables.shape
    blocks, block_size = ops["k_cache"].shape[0], ops["k_cache"].shape[2]
    rules = CacheLayout.paged(block_size).rules()
    capacity = rules.capacity(width)
    if shortest > capacity:         # no length fits the table: no sequence can be read
        first = _pick(torch, torch.zeros(1, dtype=torch.long, device=device), lens)
        record = _cat(torch, [CHUNK, 0, first] if prefill else [LENGTH, 0, 0, first], device)
        return record, tables, lens, torch.ones(batch, dtype=torch.bool, device=device), False
    columns = torch.arange(width, device=device)
    length_bad = (lens < shortest) | (lens > capacity)
    used = columns < rules.blocks_needed(lens)[:, None]
    in_pool = (tables >= 0) & (tables < blocks)
    first_column = torch.where(used & ~in_pool, columns, width).amin(1)       # [B]
    rank = torch.where(length_bad, 0, torch.where(first_column < width, 1, 2))
    sequence = _first(torch, rank < 2, device)
    column = _pick(torch, sequence, first_column).clamp(max=width - 1)
    record = _cat(torch, [
        torch.where(sequence < batch, torch.where(_pick(torch, sequence, rank) == 0,
                                                  LENGTH, BLOCK), 0),
        sequence, column, _pick(torch, sequence, lens),
        _pick(torch, sequence * width + column, tables)], device)
    bad = rank < 2
    safe_lens = torch.where(length_bad, shortest, ops["context_lens"])
    safe_tables = torch.where(in_pool, tables, 0)
    if blocks == 0:                  # every sequence needs a block of an empty pool
        return record, safe_tables, safe_lens, bad, False
    scale_record, scale_bad = _scale_record(torch, ops, safe_tables, lens, capacity, device)
    record = torch.where(record[:1] != 0, record, scale_record)
    return record, safe_tables, safe_lens, bad | scale_bad, True


def _scale_record(torch, ops, tables, lens, capacity, device):
    """The first scale a sequence reads that is NaN, Inf or negative, in the order the
    host check looks for them (k before v, NaN before Inf before negative, then
    sequence, token, head), and the sequences reading any."""
    width = tables.shape[1]
    block_size = ops["k_cache"].shape[2]
    read = torch.arange(capacity, device=device).view(1, width, block_size, 1) < \
        lens.view(-1, 1, 1, 1)                                          # [B, MB, BS, 1]
    ranks = []
    gather = tables.long()
    for n, name in enumerate(SCALE_NAMES):
        scales = ops[name][gather].transpose(2, 3)                      # [B, MB, BS, Hkv]
        ranks.append(torch.where(~read, 6, torch.where(
            scales.isnan(), 3 * n, torch.where(scales.isinf(), 3 * n + 1,
                                               torch.where(scales < 0, 3 * n + 2, 6)))))
    rank = torch.stack(ranks)                                           # [2, B, MB, BS, H]
    per_name = rank[0].numel()
    key = (rank.reshape(2, -1) * per_name
           + torch.arange(per_name, device=device)).amin().reshape(1)
    problem, flat = key // per_name, key % per_name
    heads = ops["k_scale"].shape[1]
    token = flat // heads
    sequence, position = token // capacity, token % capacity
    block = _pick(torch, sequence * width + position // block_size, tables)
    record = _cat(torch, [torch.where(problem < 6, SCALE, 0), problem // 3, problem % 3,
                          block, flat % heads, position % block_size], device)
    return record, rank.amin(dim=(0, 2, 3, 4)) < 6


def write_record(ops: dict):
    """(record code and fields [7], whether this call breaks a rule: 1-element bool)."""
    torch = torch_module()
    slots = ops["slot_mapping"].long()
    device, tokens = slots.device, slots.shape[0]
    blocks, block_size = ops["k_cache"].shape[0], ops["k_cache"].shape[2]
    rules = CacheLayout.paged(block_size).rules()
    live = rules.kept(slots)
    candidates = []                               # in the order the host check runs
    if "k_bias" in ops:
        bias = ops["k_bias"]
        at = _first(torch, ~torch.isfinite(bias), device)
        candidates.append(_cat(torch, [torch.where(at < bias.numel(), BIAS, 0),
                                       at // bias.shape[1], at % bias.shape[1]], device))
    token = _first(torch, live & (slots >= rules.capacity(blocks)), device)
    candidates.append(_cat(torch, [torch.where(token < tokens, SLOT, 0), token,
                                   _pick(torch, token, slots)], device))
    if tokens > 1:
        values, order = torch.sort(torch.where(live, slots, -1), stable=True)
        at = _first(torch, (values[1:] == values[:-1]) & (values[1:] >= 0), device)
        candidates.append(_cat(torch, [torch.where(at < tokens - 1, DUPLICATE, 0),
                                       _pick(torch, at, order), _pick(torch, at + 1, order),
                                       _pick(torch, at + 1, values)], device))
    for n, name in enumerate(ROW_NAMES):
        new = ops[name]
        rows = new.float() - ops["k_bias"] if name == "k_new" and "k_bias" in ops else new
        at = _first(torch, ~torch.isfinite(rows) & live[:, None, None], device)
        per_token, channels = new.shape[1] * new.shape[2], new.shape[2]
        value = _pick(torch, at, new).float().view(torch.int32)
        candidates.append(_cat(torch, [torch.where(at < new.numel(), ROW, 0), n,
                                       at // per_token, (at % per_token) // channels,
                                       at % channels, _pick(torch, at // per_token, slots),
                                       value], device))
    record = candidates[-1]
    for candidate in reversed(candidates[:-1]):
        record = torch.where(candidate[:1] != 0, candidate, record)
    return record, record[:1] != 0


class Violations:
    """The persistent violation record of each device one PagedAttention's calls ran on
    (module docstring)."""

    def __init__(self):
        self.records: dict = {}      # device -> int64 [RECORD]
        self.mirrors: dict = {}      # device -> (host tensor, its numpy view)
        self.sizes: dict = {}        # (device, kind, shortest, width, NB) -> int64 [4]

    def _state(self, device):
        torch = torch_module()
        if device not in self.records:
            if _capturing(torch, device):
                raise InputError("the value checks' record is made by the first call on a "
                                 "device: make one call with validate=True before capturing "
                                 "a CUDA graph (the warm-up call that loads the kernels does)")
            record = torch.zeros(RECORD, dtype=torch.int64, device=device)
            host = record if device.type == "cpu" else torch.zeros(
                RECORD, dtype=torch.int64, pin_memory=True)
            self.records[device] = record
            self.mirrors[device] = (host, host.numpy())
        return self.records[device]

    def _sizes(self, device, key):
        """The call's kind and sizes as a device tensor, made once per set (without a
        copy from the host: fills, which a capture may hold)."""
        torch = torch_module()
        sizes = self.sizes.get((device, *key))
        if sizes is None:
            sizes = torch.empty(len(key), dtype=torch.int64, device=device)
            for i, value in enumerate(key):
                sizes[i:i + 1].fill_(value)
            if not _capturing(torch, device):
                self.sizes[(device, *key)] = sizes
        return sizes

    def add(self, record, device, kind: int, shortest: int, width: int, blocks: int) -> None:
        """Fold a call's record (code and fields) into the device's, first violation kept,
        and start its copy to the host."""
        torch = torch_module()
        state = self._state(device)
        full = torch.cat([record, self._sizes(device, (kind, shortest, width, blocks))])
        state.copy_(torch.where(state[:1] != 0, state, full))
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
    from ..driver import paged_inputs as rules

    code, fields, (kind, shortest, width, blocks) = values[0], values[1:1 + FIELDS], \
        values[1 + FIELDS:]
    f = fields
    if kind == TORCH_WRITE_KIND:
        return (f"layer {shortest}: a new key or value row holds NaN or Inf (token {f[1]}, "
                f"KV head {f[2]}, channel {f[3]} of {ROW_NAMES[f[0]]}); a cached row must be "
                f"finite")
    info = info_of(kind)
    block_size = info.arguments[info.attention.argument("k_cache")].shape[2]
    if code == CHUNK:
        return rules.chunk_too_long(info, f[0], f[1], shortest, width, block_size)
    if code == LENGTH:
        return rules.length_problem(info, f[0], f[2], shortest, width, block_size)
    if code == BLOCK:
        return rules.block_id_problem(info, f[0], f[1], f[2], f[3], blocks, block_size)
    if code == SCALE:
        return rules.read_scale_problem(info, SCALE_NAMES[f[0]], rules.SCALE_PROBLEMS[f[1]],
                                        f[2], f[3], f[4])
    if code == BIAS:
        return rules.bias_problem(info, f[:2])
    if code == SLOT:
        return rules.slot_problem(info, f[0], f[1], blocks, block_size)
    if code == DUPLICATE:
        return rules.duplicate_problem(info, f[0], f[1], f[2], block_size)
    if code == ROW:
        value = float(np.array([f[5]], np.int64).astype(np.int32).view(np.float32)[0])
        return rules.row_problem(info, ROW_NAMES[f[0]], f[1], f[4], f[2], f[3], value)
    return f"@{info.name}: an unknown violation record {values}; please report it"
