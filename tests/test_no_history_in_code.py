"""Package modules' comments and docstrings say why, not history: no measured times, no
"was N% slower", no issue or session numbers, no dates, no GPU a number was taken on.
Those belong to the results (benchmarks/results/), which a comment may point to.

Only comments and docstrings are read: option help that names a flag's unit, a
`--iterations` flag, the word "measured" in "so the damage can be measured" are not
history, and the patterns are narrow enough to leave them alone (the planted example
below checks both ways)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from conftest import REPO

# The folders of the installed package (pyproject's [tool.setuptools] packages: module
# int8attn.X lives in X/) and the examples a user runs.
PACKAGE_DIRS = ("int8attn", "contract", "dialects", "driver", "fragments", "kernels",
                "passes", "pipelines", "reference", "runtime", "serving", "simulator",
                "support", "examples")

_NUMBER = r"\d+(?:\.\d+)?"
_RANGE = rf"{_NUMBER}(?:\s*(?:-|–|to|->|→|against)\s*{_NUMBER})?"
# name -> pattern; each hit names the file:line and the pattern's name.
PATTERNS = {
    "a measured time": re.compile(rf"(?<![\w.^-]){_RANGE}\s?(?:ns|us|µs|ms)\b"
                                  rf"|(?<![\w.^-]){_NUMBER}\.\d*\s?s\b(?!\w)"
                                  rf"|\b{_NUMBER}\s?(?:TFLOP/s|GFLOP/s|GB/s|TB/s)"),
    "a speed-up or slow-down": re.compile(
        rf"{_RANGE}\s?%[^.;:)]{{0,40}}\b(?:slower|faster)\b"
        rf"|\b(?:slower|faster)\b[^.;:(]{{0,30}}\b{_RANGE}\s?%"
        rf"|\b{_NUMBER}\s?x\s(?:slower|faster)\b", re.IGNORECASE),
    "an issue number": re.compile(r"\bissues?[\s#-]*\d+|issue\d+", re.IGNORECASE),
    "a session": re.compile(r"\bsessions?\s?#?\d+\b|\b(?:this|that|last|previous|earlier|"
                            r"later|next|another) sessions?\b", re.IGNORECASE),
    "a run number": re.compile(r"\brun\s?#?\d+\b", re.IGNORECASE),
    # (a results folder's name, benchmarks/results/<date>-<gpu>-<topic>/, is a pointer)
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!-[a-z])"),
    "a GPU a number was taken on": re.compile(r"\b[HA]100\b|\bH200\b|\bMI\d{3}X?\b"),
}


def comments_and_docstrings(source: str):
    """(line, text) of every comment and every module/class/function docstring."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                for offset, line in enumerate(first.value.value.splitlines()):
                    yield first.lineno + offset, line


def history_hits(path: Path, root: Path = REPO) -> list[str]:
    """`file:line: <what> in "<text>"` for each comment or docstring line with history."""
    hits = []
    for line, text in comments_and_docstrings(path.read_text(encoding="utf-8")):
        for what, pattern in PATTERNS.items():
            found = pattern.search(text)
            if found:
                hits.append(f"{path.relative_to(root)}:{line}: {what} "
                            f"({found.group(0)!r}) in {text.strip()!r}")
    return hits


def package_modules() -> list[Path]:
    return sorted(p for d in PACKAGE_DIRS for p in (REPO / d).rglob("*.py")
                  if "__pycache__" not in p.parts)


def test_the_package_modules_are_found():
    modules = package_modules()
    assert len(modules) > 100 and REPO / "kernels" / "target_spec.py" in modules


def test_no_package_module_carries_history_in_its_comments():
    hits = [hit for path in package_modules() for hit in history_hits(path)]
    assert not hits, ("history or measured times in package comments/docstrings (keep the "
                      "why; the numbers go to benchmarks/results/):\n" + "\n".join(hits))


PLANTED = '''"""A module. Measured 14.5 us on an H100 (2026-12-05), run36."""

X = 1  # was 5% slower before issue 25; results-h200-prefill-issue25.md


def f():
    """The prefill 11-12% faster (16K 10.68 -> 9.46 ms), in session 12."""
    # cost a file-system search (~20 us; 3.8 s of a run)
    # 1.3x faster, 250 TFLOP/s
    return X
'''

LEGITIMATE = '''"""Timed calls per case: `--iterations N` (default 50); the timeout is in ms.

A scale over tokens 0-31 / 32-63 (the verifier rejects it); without the verifier it
compiles, so the damage can be measured (benchmarks/results/). u8's W term is ~2x
smaller; 2^-118 and 1.5*2^23; see s.4 and `sessions.run`; an onnxruntime.InferenceSession.
"""

HELP = "wall-clock limit in seconds: 3.5 s, 20 us"   # a string, not a comment


SEE = "benchmarks/results/2026-12-05-h100-prefill-reciprocal/"  # the numbers: see
# benchmarks/results/2026-12-05-h100-prefill-reciprocal/ (a folder's name holds its date)


def f(session):
    """Runs `session` (an onnxruntime session object) for each of 16 sequences."""
    # 16 x 16 tiles, 4 waves of 64 lanes, head dim 128, 2 terms; 0.5 ulp; 1e-6
    return session
'''


def test_a_planted_example_is_named_by_file_and_line(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    hits = history_hits(planted, tmp_path)
    found = {(int(hit.split(":")[1]), hit.split(": ")[1].split(" (")[0]) for hit in hits}
    assert found >= {
        (1, "a measured time"), (1, "a GPU a number was taken on"), (1, "a date"),
        (1, "a run number"), (3, "a speed-up or slow-down"), (3, "an issue number"),
        (7, "a speed-up or slow-down"), (7, "a measured time"), (7, "a session"),
        (8, "a measured time"), (9, "a speed-up or slow-down"), (9, "a measured time")}, hits
    assert all(hit.startswith("planted.py:") for hit in hits)
    (tmp_path / "ok.py").write_text(LEGITIMATE)
    assert history_hits(tmp_path / "ok.py", tmp_path) == []
    with pytest.raises(AssertionError, match=r"planted\.py:3: "):
        assert not hits, "\n".join(hits)
