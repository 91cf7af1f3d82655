"""FIELD=VALUE changes of a kernel target (`TargetSpec`, its `DecodeTuning` too), as the
benchmarks' command lines write them (benchmarks/prefill_variants.py, paged_schedules.py,
sass_mix.py): each value parsed by its field's type, each change checked, then applied."""

from __future__ import annotations

from dataclasses import fields, replace

from .target_spec import RECIPROCAL_INTRINSICS, DecodeTuning, TargetSpec


def field_value(name: str, text: str):
    """The value of TargetSpec (or DecodeTuning) field `name` written as `text` (the
    benchmarks' FIELD=VALUE: True or False, an integer, or for `reciprocal_intrinsic`
    None or a known intrinsic); ValueError saying what the field takes."""
    if not isinstance(text, str):
        raise TypeError(f"{name}: the value is written as a string, not {text!r}")
    kind = {f.name: f.type for f in fields(TargetSpec) + fields(DecodeTuning)}.get(name)
    if name == "reciprocal_intrinsic":
        known = tuple(RECIPROCAL_INTRINSICS.values())
        if text != "None" and text not in known:
            raise ValueError(f"{name} takes None (the checked division) or "
                             f"{' or '.join(known)}, not {text!r}")
        return None if text == "None" else text
    if kind == "bool":
        if text not in ("True", "False"):
            raise ValueError(f"{name} takes True or False, not {text!r}")
        return text == "True"
    if kind == "int":
        if not (text.isascii() and text.isdigit()):
            raise ValueError(f"{name} takes a non-negative integer, not {text!r}")
        return int(text)
    raise ValueError(f"{name!r} is not a field of the target that a command line sets")


def field_changes(pairs, allowed, what: str) -> dict:
    """FIELD=VALUE `pairs` as TargetSpec changes (`field_value`; apply them with
    `with_changes`), each FIELD one of `allowed` (else ValueError: `what` they must be,
    e.g. "a prefill choice")."""
    if isinstance(pairs, str) or isinstance(allowed, str):
        raise TypeError("field_changes takes lists of FIELD=VALUE pairs and of field names")
    changes = {}
    for pair in pairs:
        name, _, text = pair.partition("=")
        if name not in allowed:
            raise ValueError(f"{name!r} is not {what} ({', '.join(allowed)})")
        if name in changes:
            raise ValueError(f"{name} is given twice; give each field once")
        changes[name] = field_value(name, text)
    return changes


def with_changes(spec: TargetSpec, changes: dict) -> TargetSpec:
    """`spec` with `changes` (`field_changes`), a DecodeTuning field's in its tuning."""
    tuning_fields = {f.name for f in fields(DecodeTuning)}
    known = tuning_fields | {f.name for f in fields(TargetSpec)} - {"tuning"}
    if unknown := sorted(set(changes) - known):
        raise ValueError(f"{', '.join(unknown)}: no field of TargetSpec or DecodeTuning")
    tuning = {k: v for k, v in changes.items() if k in tuning_fields}
    rest = {k: v for k, v in changes.items() if k not in tuning_fields}
    return replace(spec, tuning=replace(spec.tuning, **tuning), **rest)
