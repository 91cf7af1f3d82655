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
