"""The reference tables of the docs restate declarations; these tests keep them true.

- docs/cli.md: each table marked `<!-- flags: CMD ... -->` lists flags of those commands;
  for every command, the flags of its tables are exactly its parser's (`int8attn`'s
  subcommands from int8attn/cli_parser.py, `int8attn-opt`'s from int8attn/opt.py), each
  with the default the declaration gives (`expected_default`).
- docs/targets.md: the table after `<!-- targets -->` gives each target's stages as
  driver/targets.py declares them (which stage reads which, with and without a code object).
- docs/passes.md: the table after `<!-- passes -->` names every registered pass with every
  option and its declared default; the table after `<!-- pipeline options -->` names every
  field of the named pipelines' options with its default.
- README.md stays short (the line and width limits below) and links every docs page.
- A reference from code, tests, scripts or pages into the docs (`docs/PAGE.md, *Heading*`,
  `README, *Heading*`) names a page and a heading that exist, and a repository path in
  their text (`benchmarks/...`, `tests/...`) exists, so neither rots when pages move.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README_MAX_LINES = 250
MAX_LINE_CHARS = 200
KERNEL_TARGETS = ("gfx936", "gfx942", "cuda")



def tables_after(text: str, marker: re.Pattern) -> list[tuple[re.Match, list[list[str]], int]]:
    """(the marker's match, the rows of the table right after it as cells, the line of the
    table's first row) for every marker line."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        match = marker.match(line)
        if not match:
            continue
        rows, j = [], i + 1
        while j < len(lines) and lines[j].startswith("|"):
            rows.append(_cells(lines[j]))
            j += 1
        assert len(rows) > 2, f"line {i + 1}: no table after the marker"
        found.append((match, rows[2:], i + 4))      # the header and its rule left out
    return found


def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [c.strip().replace("\\|", "|") for c in cells]


def _code_spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


# ----------------------------------------------------------------------------
# docs/cli.md against the parsers
# ----------------------------------------------------------------------------

def parsers() -> dict[str, argparse.ArgumentParser]:
    from int8attn import opt
    from int8attn.cli_parser import build_parser

    main = build_parser()
    commands = next(a for a in main._actions if isinstance(a, argparse._SubParsersAction))
    return {**commands.choices, "int8attn-opt": opt.build_parser()}


def _resolved_by_target(name: str) -> str:
    """A CompileOptions field's default as each target resolves it, stated as the docs
    do: one value, or the cpu value and the kernel targets' (their own name where each
    kernel target resolves to itself)."""
    from int8attn.driver.options import CompileOptions

    values = {t: getattr(CompileOptions(target=t).resolved(), name)
              for t in ("cpu",) + KERNEL_TARGETS}
    text = {t: "—" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
            for t, v in values.items()}
    if len(set(text.values())) == 1:
        return text["cpu"]
    if all(values[t] == t for t in KERNEL_TARGETS):
        kernel = "the target's own"
    else:
        assert len({text[t] for t in KERNEL_TARGETS}) == 1, (name, values)
        kernel = text["cuda"]
    return f"{text['cpu']} on cpu; {kernel} on kernel targets"


def expected_default(action: argparse.Action) -> str:
    """What the Default column says for a flag: `off` for a switch; for a compile option
    (argparse default None: not given) the declared default as each target resolves it;
    a non-None argparse default as it is; else the `(default X)` of its help, or `—`."""
    from int8attn.driver.options import CompileOptions

    if action.nargs == 0:                     # store_true / store_const switches
        return "off"
    fields = {f.name: f for f in dataclasses.fields(CompileOptions)}
    if action.default is None and action.dest in fields:
        declared = fields[action.dest].default
        return _resolved_by_target(action.dest) if declared is None else _option_text(declared)
    if action.default is not None:
        return str(action.default)
    match = re.search(r"\(default ([^)]*)\)", action.help or "")
    return match.group(1) if match else "—"


def documented_flags(text: str) -> dict[str, dict[str, tuple[str, int]]]:
    """command -> {flag spelling: (default cell, line)} from the marked tables."""
    documented: dict[str, dict[str, tuple[str, int]]] = {}
    for match, rows, first_line in tables_after(text, re.compile(r"^<!-- flags: (.*) -->$")):
        for offset, row in enumerate(rows):
            flags = [f for span in _code_spans(row[0]) for f in [span.split(" ")[0]]
                     if f.startswith("-")]
            for command in match.group(1).split():
                for flag in flags:
                    documented.setdefault(command, {})[flag] = (row[1], first_line + offset)
    return documented


def _declared(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not
            isinstance(a, argparse._HelpAction)]


def test_the_cli_tables_list_every_flag_with_its_default():
    text = (DOCS / "cli.md").read_text()
    documented = documented_flags(text)
    problems = []
    for command, parser in parsers().items():
        table = documented.get(command, {})
        declared = _declared(parser)
        spellings = {s for a in declared for s in a.option_strings}
        for flag in sorted(set(table) - spellings):
            problems.append(f"docs/cli.md:{table[flag][1]}: {command} has no flag {flag}")
        for action in declared:
            rows = [table[s] for s in action.option_strings if s in table]
            name = "/".join(action.option_strings)
            if len(rows) != len(action.option_strings):
                problems.append(f"docs/cli.md: {command}'s {name} is not in its table "
                                f"(every spelling in one row)")
                continue
            want = expected_default(action)
            for cell, line in rows:
                if not (cell == want or cell.startswith(f"{want} (")):
                    problems.append(f"docs/cli.md:{line}: {command} {name}: the table says "
                                    f"default {cell!r}, the declaration {want!r}")
    assert not problems, "\n".join(problems)


def test_the_flag_check_can_fail():
    text = ("<!-- flags: int8attn-opt -->\n| flag | default | meaning |\n|---|---|---|\n"
            "| `--list-passes` | on | x |\n| `--no-such-flag` | — | x |\n")
    documented = documented_flags(text)["int8attn-opt"]
    assert documented["--list-passes"] == ("on", 4) and "--no-such-flag" in documented
    action = next(a for a in _declared(parsers()["int8attn-opt"])
                  if "--list-passes" in a.option_strings)
    assert expected_default(action) == "off"


# ----------------------------------------------------------------------------
# docs/passes.md against the pass registry and the pipeline options
# ----------------------------------------------------------------------------

def _option_text(value) -> str:
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def test_the_pass_table_lists_every_pass_and_option_with_its_default():
    from int8attn.passes import PASSES
    from int8attn.support.options import kebab

    text = (DOCS / "passes.md").read_text()
    [(_, rows, first_line)] = tables_after(text, re.compile(r"^<!-- passes -->$"))
    table = {}
    for offset, row in enumerate(rows):
        [name] = _code_spans(row[0])
        options = dict(span.split("=", 1) for span in _code_spans(row[1]))
        table[name] = (options, first_line + offset)
    problems = [f"docs/passes.md:{line}: no pass {name} is registered"
                for name, (_, line) in table.items() if name not in PASSES]
    for name, cls in PASSES.items():
        if name not in table:
            problems.append(f"docs/passes.md: pass {name} is not in the table")
            continue
        options, line = table[name]
        declared = {kebab(f.name): _option_text(f.default) for f in dataclasses.fields(cls)}
        if options != declared:
            problems.append(f"docs/passes.md:{line}: {name}: the table says {options}, "
                            f"the pass declares {declared}")
    assert not problems, "\n".join(problems)


def test_the_pipeline_table_lists_every_option_with_its_default():
    from int8attn.pipelines import PipelineOptions
    from int8attn.support.options import kebab

    text = (DOCS / "passes.md").read_text()
    [(_, rows, _)] = tables_after(text, re.compile(r"^<!-- pipeline options -->$"))
    table = {_code_spans(row[0])[0]: row[1] for row in rows}
    declared = {kebab(f.name): _option_text(f.default) for f in dataclasses.fields(PipelineOptions)}
    assert table == declared


# ----------------------------------------------------------------------------
# docs/targets.md's stage table against driver/targets.py
# ----------------------------------------------------------------------------

def documented_stage_edges(cell: str) -> tuple[set, set]:
    """(stage edges, edges with `--kernel-object`) of a stages cell: `a → b → c` chains
    split by `;`; a chain after `with `--kernel-object`:` is the code object's, and one
    that starts with an arrow goes on from the previous chain's last stage."""
    edges, object_edges, last = set(), set(), None
    for part in cell.split(";"):
        part = part.strip()
        kind = edges
        if part.startswith("with `--kernel-object`:"):
            kind, part = object_edges, part.split(":", 1)[1].strip()
        names = [n.strip() for n in part.split("→")]
        if names[0] == "":
            names[0] = last
        kind.update(zip(names, names[1:]))
        last = names[-1]
    return edges, object_edges


def declared_stage_edges(target) -> tuple[set, set]:
    edges = {(s.reads or target.stages[i - 1].name, s.name)
             for i, s in enumerate(target.stages) if i}
    return edges, {(s.reads, s.name) for s in target.with_object}


def test_the_targets_table_gives_every_targets_stages():
    from int8attn.driver.targets import TARGETS

    text = (DOCS / "targets.md").read_text()
    [(_, rows, first_line)] = tables_after(text, re.compile(r"^<!-- targets -->$"))
    table = {row[0]: (row[1], first_line + offset) for offset, row in enumerate(rows)}
    assert sorted(table) == sorted(TARGETS), f"docs/targets.md lists {sorted(table)}"
    problems = [f"docs/targets.md:{line}: {name}'s stages are {declared_stage_edges(TARGETS[name])}"
                f" (edges; with --kernel-object), the table says {documented_stage_edges(cell)}"
                for name, (cell, line) in table.items()
                if documented_stage_edges(cell) != declared_stage_edges(TARGETS[name])]
    assert not problems, "\n".join(problems)


def test_the_stage_table_check_can_fail():
    cell = "graph → kernel → vmfb → isa; kernel → llvm; with `--kernel-object`: llvm → vmfb"
    assert documented_stage_edges(cell) == (
        {("graph", "kernel"), ("kernel", "vmfb"), ("vmfb", "isa"), ("kernel", "llvm")},
        {("llvm", "vmfb")})
    assert documented_stage_edges("graph → kernel → llvm; with `--kernel-object`: → vmfb")[1] \
        == {("llvm", "vmfb")}
    from int8attn.driver.targets import TARGETS

    assert documented_stage_edges("graph → kernel → vmfb") != declared_stage_edges(TARGETS["cuda"])


# ----------------------------------------------------------------------------
# The README's size and the docs index
# ----------------------------------------------------------------------------

def test_the_readme_is_short_and_links_every_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    long = [n for n, line in enumerate(lines, 1) if len(line) > MAX_LINE_CHARS]
    assert not long, f"README.md lines over {MAX_LINE_CHARS} characters: {long}"
    text = "\n".join(lines)
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert pages and all(f"(docs/{page})" in text for page in pages), pages


def test_links_between_pages_lead_to_files():
    problems = []
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", line):
                if "://" in target or not ("." in target or "/" in target):
                    continue              # a URL, or math that looks like a link
                if not (page.parent / target).exists():
                    problems.append(f"{page.relative_to(REPO)}:{number}: {target} does not exist")
    assert not problems, "\n".join(problems)


def test_docs_pages_keep_lines_readable():
    long = [f"{p.relative_to(REPO)}:{n}" for p in DOCS.glob("*.md")
            for n, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) > 400 and not line.startswith("|")]
    assert not long, long


# ----------------------------------------------------------------------------
# References into the docs from code, tests, scripts and pages
# ----------------------------------------------------------------------------

# A reference names a page (README, docs/ or benchmarks/), then optionally its heading:
# `docs/PAGE.md, *Heading*` (the form the code uses; "Heading" or 'Heading' and a colon for
# the comma are read too). A heading may wrap onto the next line of a comment or docstring.
DOC_REFERENCE = re.compile(
    r"(?<![\w./-])(README(?:\.md)?|(?:docs|benchmarks)/[\w.-]+\.md)"
    r"(?:[ \t]*[,:][ \t]*(?:\*([^*]{1,160}?)\*|\"([^\"\n]{1,160})\"|'([^'\n]{1,160})'))?")
# `README: words`: a section named without its page or quotes (how the README's
# sections were cited before the docs split; each has a page now).
UNNAMED_SECTION = re.compile(r"(?<![\w./*-])README(?:\.md)?:[ \t]+[A-Za-z]")
# A repository path in prose or a message: it must exist (a results file that moved, a
# renamed script). Paths with placeholders (`<date>`, `*`) are not matched.
REPO_PATH = re.compile(r"(?<![\w./<>*-])(?:docs|benchmarks|examples|tests|lit)/[\w./-]*[\w-]"
                       r"\.(?:md|json|py|mlir|onnx|cfg)(?![\w*])")
# File names that stand for any file in a usage line (`docs/PAGE.md`, `tests/test_x.py`).
PLACEHOLDER_STEMS = {"PAGE", "FILE", "NAME", "X", "x", "test_x"}
CITING_ROOTS = ("int8attn", "contract", "dialects", "driver", "fragments", "kernels",
                "passes", "pipelines", "reference", "runtime", "serving", "simulator",
                "support", "tests", "benchmarks", "lit", "examples", "docs")
CITING_SUFFIXES = (".py", ".mlir", ".cfg", ".toml", ".txt", ".md", ".sh")
# Records of the past, which cite the README and the result files as they were then.
NOT_CITING = ("benchmarks/HISTORY.md", "benchmarks/results")


def headings(text: str) -> set[str]:
    """A markdown page's headings (outside code fences), as `_heading_key` gives them."""
    found, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(_heading_key(line.lstrip("#")))
    return found


def _heading_key(text: str) -> str:
    """A heading or a cited one, compared without case, backticks, comment marks or line
    breaks."""
    text = re.sub(r"\n[ \t]*(?:#[ \t]*)?", " ", text)
    return " ".join(text.replace("`", "").split()).lower()


def doc_reference_problems(text: str, name: str, pages: dict[str, set[str] | None],
                           exists) -> list[str]:
    """`name:line: ...` for each reference of `text` to a page that `pages` (page ->
    its headings, None where the file is missing) does not have, to a heading its page
    lacks, for a README section named without its page, and for a repository path
    that `exists` (path -> bool) says is gone."""
    problems = []

    def line(position):
        return text.count("\n", 0, position) + 1

    for match in DOC_REFERENCE.finditer(text):
        if _placeholder(match.group(1)):
            continue
        page = "README.md" if match.group(1).startswith("README") else match.group(1)
        section = next((g for g in match.groups()[1:] if g), None)
        where = f"{name}:{line(match.start())}"
        if pages.get(page) is None:
            problems.append(f"{where}: {page} does not exist")
        elif section and _heading_key(section) not in pages[page]:
            problems.append(f"{where}: {page} has no heading {section!r}")
    for match in UNNAMED_SECTION.finditer(text):
        problems.append(f"{name}:{line(match.start())}: a README section cited without its "
                        f"page: name it as docs/PAGE.md, *Heading*")
    for match in REPO_PATH.finditer(text):
        if re.fullmatch(r"(?:docs|benchmarks)/[\w.-]+\.md", match.group(0)):
            continue                  # a page: checked above
        if not _placeholder(match.group(0)) and not exists(match.group(0)):
            problems.append(f"{name}:{line(match.start())}: {match.group(0)} does not exist")
    return problems


def _placeholder(path: str) -> bool:
    return Path(path).stem in PLACEHOLDER_STEMS


def _citing_files() -> list[Path]:
    """The repository's own text files but the records of the past (`NOT_CITING`) and
    this file, which plants bad references for the check that can fail."""
    def skipped(path: Path) -> bool:
        relative = path.relative_to(REPO)
        return (path == Path(__file__).resolve() or any(part.startswith(".") or part in ("__pycache__", "build", "Output")
                    for part in relative.parts)
                or any(str(relative).startswith(prefix) for prefix in NOT_CITING))

    files = [REPO / "README.md", REPO / "pyproject.toml", REPO / ".ci" / "run"]
    for root in CITING_ROOTS:
        files += [p for p in (REPO / root).rglob("*")
                  if p.is_file() and p.suffix in CITING_SUFFIXES and not skipped(p)]
    return sorted(files)


def _pages() -> dict[str, set[str] | None]:
    pages = {str(p.relative_to(REPO)): headings(p.read_text())
             for p in [*DOCS.glob("*.md"), *(REPO / "benchmarks").glob("*.md")]}
    return {**pages, "README.md": headings((REPO / "README.md").read_text())}


def test_every_reference_into_the_docs_names_a_page_and_heading_that_exist():
    pages, problems, references = _pages(), [], 0
    exists = lambda path: (REPO / path).exists()     # noqa: E731
    files = _citing_files()
    assert {REPO / ".ci" / "run", REPO / "driver" / "targets.py", DOCS / "design.md"} <= set(files)
    for path in files:
        text = path.read_text(errors="replace")
        references += sum(1 for m in DOC_REFERENCE.finditer(text) if any(m.groups()[1:]))
        problems += doc_reference_problems(text, str(path.relative_to(REPO)), pages, exists)
    assert references >= 8           # the walk sees the code's and the tests' references
    assert not problems, "\n".join(problems)


def test_the_docs_reference_check_can_fail():
    pages = {"docs/cli.md": {"onnx models"}, "docs/targets.md": {"gfx936: the hand-off to hygon's dtk"},
             "README.md": {"quick start"}}
    exists = lambda path: path in pages              # noqa: E731
    good = ('"""see docs/cli.md, *ONNX models* and README, *Quick start*\n'
            "(docs/targets.md, *gfx936: the hand-off\n    to `Hygon's` DTK*); docs/cli.md.\n"
            '# docs/cli.md: "ONNX models"\n"""\n')
    assert doc_reference_problems(good, "f.py", pages, exists) == []
    bad = ("a (docs/nope.md)\n"
           "b docs/cli.md, *No such heading*\n"
           "c (README: non-finite inputs)\n"
           "d (README, 'On a DCU')\n"
           "e see benchmarks/results-h200-issue24.md\n")
    problems = doc_reference_problems(bad, "f.py", pages, exists)
    assert sorted(p.split(":")[1] for p in problems) == ["1", "2", "3", "4", "5"], problems
    assert any("docs/nope.md does not exist" in p for p in problems)
    assert any("no heading 'No such heading'" in p for p in problems)
    assert any("cited without its page" in p for p in problems)
    assert any("README.md has no heading 'On a DCU'" in p for p in problems)
    assert any("results-h200-issue24.md does not exist" in p for p in problems)
