"""No index arithmetic of its own outside fragments/ (issue 23).

Which lane, token, block or LDS index a value is, is the business of the layouts
(fragments/mma_layouts.py, fragments/kernel_layout.py), the cache layouts
(fragments/cache_layout.py) and the index rules (fragments/index_rules.py); the
kernels, their host functions, the passes, the simulator's host side and the
serving code call them. This test reads every module of those folders and fails on
an integer division or remainder of IR index values (`arith.divui`, `remui`,
`divsi`, `remsi`, `floordivsi`, `ceildivui`, `ceildivsi`), a `divmod(` and the
`-(-a // b)` rounding-up idiom, but for the named exceptions below.

Python `//` and `%` on plain ints (a count of K steps, a shape check) are not index
values and are not flagged.
"""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("kernels", "passes", "simulator", "driver", "serving", "reference", "dialects",
           "runtime", "int8attn")
FORBIDDEN = re.compile(r"arith\.(divui|remui|divsi|remsi|floordivsi|ceildivui|ceildivsi)\b"
                       r"|\bdivmod\(|-\(-[^()]*//")
# (file, the forbidden text it holds) -> why it may.
ALLOWED = {
    ("simulator/isa.py", "divmod("): "the simulator's ISA tables are written from the ISA "
    "text, deliberately apart from fragments/ (they check it)",
    ("simulator/wgmma.py", "divmod("): "the warpgroup MMA's PTX tables, apart from fragments/ "
    "for the same reason",
}


def forbidden_uses(text: str) -> list[tuple[int, str]]:
    """(line number, the forbidden text) of every use in a module's source, comments
    and docstring lines aside."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for match in FORBIDDEN.finditer(code):
            found.append((number, match.group(0).rstrip("(") + "(" if match.group(0).startswith(
                "divmod") else match.group(0)))
    return found


def _uses() -> dict[tuple[str, str], list[int]]:
    uses: dict[tuple[str, str], list[int]] = {}
    for folder in FOLDERS:
        for path in sorted((REPO / folder).glob("*.py")):
            name = path.relative_to(REPO).as_posix()
            for number, text in forbidden_uses(path.read_text()):
                key = (name, "divmod(" if text.startswith("divmod") else text)
                uses.setdefault(key, []).append(number)
    return uses


def test_no_index_arithmetic_outside_fragments():
    uses = _uses()
    problems = [f"{name}:{','.join(map(str, lines))}: {text} -- write the rule once in "
                f"fragments/ (index_rules, cache_layout, the layouts) and call it"
                for (name, text), lines in sorted(uses.items()) if (name, text) not in ALLOWED]
    assert not problems, "\n".join(problems)


def test_every_allowed_exception_is_still_used():
    uses = _uses()
    stale = [f"{name}: {text} ({why})" for (name, text), why in ALLOWED.items()
             if (name, text) not in uses]
    assert not stale, "take these off ALLOWED: " + "; ".join(stale)


def test_the_scan_finds_what_it_forbids():
    source = "\n".join([
        "x = arith.divui(a, b)",
        "y = arith.remsi(a, b)  # a comment",
        "n, r = divmod(e, slots)",
        "blocks = -(-tokens // block_size)",
        "# arith.divui(a, b) in a comment is fine",
        "steps = head_dim // k",
    ])
    assert [n for n, _ in forbidden_uses(source)] == [1, 2, 3, 4]
