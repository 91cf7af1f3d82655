"""Summaries read off docstrings (pass lists, stage tables, help)."""

from __future__ import annotations


def first_sentence(doc: str | None) -> str:
    """A docstring's summary: its first sentence, however many lines it spans (up to
    the first blank line)."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[:end + 1]
