"""Value types of the command lines' flags (argparse `type=`), shared by `int8attn`
and the bench runners (`python -m int8attn.bench_paged` / `bench_prefill`), which run
on a GPU machine with only IREE's runtime: this module imports nothing of the
compiler."""

from __future__ import annotations

import argparse


def path(text: str) -> str:
    """A file or folder name: not empty (an empty value would otherwise read as the flag
    not given, or as the current folder)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file; give a file name")
    return text


def path_object(text: str):
    """`path` as a pathlib.Path."""
    from pathlib import Path

    return Path(path(text))


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: '{text}'") from None


def positive(text: str) -> int:
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def count(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def seed(text: str) -> int:
    value = integer(text)
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer below 2**63, got {value}")
    return value


def token_counts(text: str) -> tuple[int, ...]:
    """`4096,8192`: positive token counts, comma-separated."""
    items = text.split(",")
    for item in items:
        if not item.strip():
            raise argparse.ArgumentTypeError(
                f"'{text}' has an empty item; give token counts separated by single commas, "
                f"e.g. 4096,8192")
        if not item.strip().isdigit() or int(item) < 1:
            where = f"'{item}' in '{text}'" if len(items) > 1 else f"'{item}'"
            raise argparse.ArgumentTypeError(
                f"{where} is not a positive token count; give whole numbers of tokens "
                f"separated by commas, e.g. 4096,8192 (no suffixes such as 4k)")
    return tuple(int(item) for item in items)


_GIVEN = "_flags_given"     # dest -> the first flag and value, while one parse runs


class _Once:
    """A single-valued flag's action that refuses a second occurrence: one of the two
    is a mistake, and which one is unknown (the last one would silently win)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, _GIVEN, None)
        if given is None:
            given = {}
            setattr(namespace, _GIVEN, given)
        shown = option_string if self.nargs == 0 else f"{option_string} {_text(values)}"
        if option_string is not None and self.dest in given:
            raise argparse.ArgumentError(self, f"given twice ({given[self.dest]} and {shown}); "
                                               f"give it once")
        given[self.dest] = shown
        super().__call__(parser, namespace, values, option_string)


def _text(values) -> str:
    if isinstance(values, (tuple, list)):
        return ",".join(str(v) for v in values)
    return str(values)


class _StoreOnce(_Once, argparse._StoreAction):
    pass


class _StoreConstOnce(_Once, argparse._StoreConstAction):
    pass


class _StoreTrueOnce(_Once, argparse._StoreTrueAction):
    pass


class _StoreFalseOnce(_Once, argparse._StoreFalseAction):
    pass


class FlagParser(argparse.ArgumentParser):
    """An ArgumentParser (and its subcommands' parsers) whose single-valued flags, every
    one declared with a store action, refuse to be given twice (exit status 2, both
    values named), as pass options refuse a repeated key."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, action in ((None, _StoreOnce), ("store", _StoreOnce),
                             ("store_const", _StoreConstOnce), ("store_true", _StoreTrueOnce),
                             ("store_false", _StoreFalseOnce)):
            self.register("action", name, action)

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        if hasattr(parsed, _GIVEN):
            delattr(parsed, _GIVEN)
        return parsed, extra
