"""Typed options, declared once as dataclass fields.

A pass, a named pipeline and the driver each declare their options as the
fields of a frozen dataclass: the annotation is the type (`int`, `bool`, a
`Literal[...]` of choices, optionally `| None`), `field(metadata=...)` holds
the help text and bounds. A `Literal` of ints (`Literal[1, 2]`) parses from
its text ("2") like a `Literal` of str. Everything else derives from that declaration:

    check_fields(obj)          validation (in `TypedOptions.__post_init__`)
    parse_option_items(cls, …) `name{key=value …}` in pass and pipeline strings
    option_string(obj)         the inverse, for printing a pipeline
    add_arguments(parser, cls) argparse flags with choices, types and help

so no consumer keeps its own list of names, choices or defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import numbers
import types
import typing
from typing import Any, Literal

__all__ = ["OptionError", "TypedOptions", "option", "check_fields", "choices_of",
           "parse_value", "parse_option_items", "option_string", "add_arguments",
           "kebab"]


class OptionError(ValueError):
    """An option value of the wrong type or outside its choices."""


def option(default, help: str, *, minimum: int | None = None, maximum: int | None = None,
           flag: str | None = None, metavar: str = "N"):
    """A dataclass field with the metadata the consumers read (a `maximum` is stated in
    its help, "(1 to 65536)")."""
    if maximum is not None:
        help = f"{help} ({minimum if minimum is not None else 'at most'} to {maximum})"
    return dataclasses.field(default=default, metadata={
        "help": help, "minimum": minimum, "maximum": maximum, "flag": flag,
        "metavar": metavar})


def kebab(name: str) -> str:
    return name.replace("_", "-")


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=False)


def _unwrap_optional(annotation) -> tuple[Any, bool]:
    """(inner type, whether None is allowed)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return annotation, False


def choices_of(cls, name: str) -> tuple | None:
    """The values a `Literal` field admits (None if it is not a choice)."""
    inner, _ = _unwrap_optional(_hints(cls)[name])
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else None


def _describe(cls, name: str) -> str:
    inner, _ = _unwrap_optional(_hints(cls)[name])
    choices = choices_of(cls, name)
    if choices:
        return "one of " + ", ".join(str(c) for c in choices)
    return {bool: "true or false", int: "an integer"}.get(inner, getattr(inner, "__name__", "?"))


def _check_value(cls, field: dataclasses.Field, value) -> None:
    inner, optional = _unwrap_optional(_hints(cls)[field.name])
    if value is None and optional:
        return
    choices = choices_of(cls, field.name)
    ok = (any(value == c and type(value) is type(c) for c in choices) if choices else
          isinstance(value, bool) if inner is bool else
          isinstance(value, int) and not isinstance(value, bool) if inner is int else True)
    if not ok:
        raise OptionError(f"option '{kebab(field.name)}' must be {_describe(cls, field.name)}, "
                          f"got {value!r}")
    minimum, maximum = field.metadata.get("minimum"), field.metadata.get("maximum")
    if minimum is not None and value < minimum:
        raise OptionError(f"option '{kebab(field.name)}' must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise OptionError(f"option '{kebab(field.name)}' must be at most {maximum}, got {value}")


def check_fields(obj) -> None:
    """Check every field of a frozen options dataclass, after taking a numpy integer of
    an int field as the int it holds and a list of strings of a tuple[str, ...] field as
    a tuple (a string there is refused: it would become its characters)."""
    hints = _hints(type(obj))
    for field in dataclasses.fields(obj):
        value, (inner, _) = getattr(obj, field.name), _unwrap_optional(hints[field.name])
        if inner is int and isinstance(value, numbers.Integral) \
                and not isinstance(value, (bool, int)) and type(value).__name__ != "bool_":
            object.__setattr__(obj, field.name, int(value))
        elif typing.get_origin(inner) is tuple and typing.get_args(inner) == (str, ...) \
                and value is not None:
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
                    or not all(isinstance(item, str) for item in value):
                raise OptionError(f"option '{kebab(field.name)}' must be a list or tuple of "
                                  f"strings, got {value!r}")
            object.__setattr__(obj, field.name, tuple(value))
        _check_value(type(obj), field, getattr(obj, field.name))


class TypedOptions:
    """Mixin for frozen option dataclasses: values are checked on construction."""

    def __post_init__(self):
        check_fields(self)


def parse_value(cls, name: str, text: str, owner: str = ""):
    """A field's value from its textual form (pipeline strings, the CLI); `owner` (e.g.
    "pass 'int8-qk'") is named in the message of a bad value."""
    inner, optional = _unwrap_optional(_hints(cls)[name])
    label = f"option '{kebab(name)}'" + (f" of {owner}" if owner else "")
    if optional and text == "none":
        return None
    if inner is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise OptionError(f"{label} expects true or false, got '{text}'")
        return text.lower() in ("true", "1")
    if inner is int:
        try:
            return int(text)
        except ValueError:
            raise OptionError(f"{label} expects an integer, got '{text}'") from None
    choices = choices_of(cls, name)
    if choices:  # a Literal of str or of int: the choice whose text this is
        for choice in choices:
            if str(choice) == text:
                return choice
        raise OptionError(f"{label} expects {_describe(cls, name)}, got '{text}'")
    return text


def parse_option_items(cls, body: str, owner: str) -> dict:
    """`key=value key2=value2` (commas allowed) -> constructor keywords of `cls`."""
    fields = {kebab(f.name): f for f in dataclasses.fields(cls)}
    options, given_as = {}, {}
    for item in body.replace(",", " ").split():
        key, sep, value = item.partition("=")
        if not sep:
            raise OptionError(f"option '{item}' of {owner} needs a value (key=value)")
        field = fields.get(kebab(key))
        if field is None:
            raise OptionError(f"{owner} has no option '{key}' (options: "
                              f"{', '.join(fields) or 'none'})")
        if field.name in given_as:
            # Not "the last one wins": one of the two is a mistake, and which is unknown.
            raise OptionError(f"option '{kebab(field.name)}' of {owner} is given twice "
                              f"('{given_as[field.name]}' and '{item}'); give it once")
        given_as[field.name] = item
        options[field.name] = parse_value(cls, field.name, value, owner)
    return options


def option_string(obj) -> str:
    """`{key=value ...}` for every field, '' for a class without options."""
    items = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        text = "none" if value is None else str(value).lower() if isinstance(value, bool) else value
        items.append(f"{kebab(f.name)}={text}")
    return "{" + " ".join(items) + "}" if items else ""


def add_arguments(parser: argparse.ArgumentParser, cls, *, only=None) -> None:
    """One flag per field of `cls` (or of `only`): `--kebab-name`, with choices;
    a bool that defaults to True becomes `--no-<name>`."""
    for f in dataclasses.fields(cls):
        if only is not None and f.name not in only:
            continue
        inner, _ = _unwrap_optional(_hints(cls)[f.name])
        help_text = f.metadata.get("help", "")
        if inner is bool:
            flag = f.metadata.get("flag") or (f"--no-{kebab(f.name)}" if f.default
                                             else f"--{kebab(f.name)}")
            parser.add_argument(flag, dest=f.name, action="store_const", const=not f.default,
                                default=None, help=help_text)
            continue
        choices = choices_of(cls, f.name)
        default = f" (default: {f.default})" if f.default is not None else ""
        text_choices = bool(choices) and all(isinstance(c, str) for c in choices)
        parser.add_argument(f"--{kebab(f.name)}", dest=f.name, default=None,
                            choices=choices, metavar=None if choices else f.metadata.get("metavar", "N"),
                            type=None if text_choices else _argparse_type(cls, f.name),
                            help=help_text + default)


def _argparse_type(cls, name: str):
    def convert(text: str):
        try:
            return parse_value(cls, name, text)
        except OptionError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    convert.__name__ = _describe(cls, name)
    return convert


def describe_options(cls, indent: str = "    ") -> list[str]:
    """One line per field: `key=<type or choices> (default ...)  help` (for --list-passes)."""
    lines = []
    for f in dataclasses.fields(cls):
        default = "none" if f.default is None else str(f.default).lower() \
            if isinstance(f.default, bool) else f.default
        lines.append(f"{indent}{kebab(f.name)}=<{_describe(cls, f.name)}> (default {default})  "
                     f"{f.metadata.get('help', '')}")
    return lines


def given(namespace: argparse.Namespace, cls) -> dict:
    """The fields of `cls` the user set on the command line (None = not given)."""
    return {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)
            if getattr(namespace, f.name, None) is not None}
