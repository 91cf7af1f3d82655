"""Where modules live, and that they import each other without cycles.

The rule (README, "Layout"): module `int8attn.X.Y` is `X/Y.py` at the
repository root, every subpackage a top-level folder; `int8attn/` holds only
the entry points (API, CLIs) and what only they use. Module-level imports
between int8attn modules form no cycle (imports inside functions are the
deliberate way for an entry point to load something lazily).

Section references lead into the repository: every section sign in the code,
README, tests, lit files and benchmark notes is part of a reference
`docs/design.md <sign><number>` whose section is a heading of docs/design.md.
"""

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _package_dirs() -> dict[str, Path]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: REPO / folder for name, folder in config["package-dir"].items()}


def _modules() -> dict[str, Path]:
    modules = {}
    for package, folder in _package_dirs().items():
        for path in folder.glob("*.py"):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            modules[name] = path
    return modules


def _module_level_imports(path: Path, modules) -> set[str]:
    """int8attn modules `path` imports at module level (not inside functions)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if submodule in modules:
                    found.add(submodule)
                elif node.module in modules:
                    found.add(node.module)
    return found


def test_every_subpackage_is_a_top_level_folder():
    for package, folder in _package_dirs().items():
        assert folder.parent == REPO, (package, folder)
        expected = "int8attn" if package == "int8attn" else package.split(".", 1)[1]
        assert folder.name == expected and package.count(".") <= 1, (package, folder)
    nested = [p for p in (REPO / "int8attn").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert not nested, f"int8attn/ holds only entry-point modules, found folders {nested}"


def test_every_module_folder_is_a_declared_package():
    declared = set(_package_dirs().values())
    for init in REPO.glob("*/__init__.py"):
        assert init.parent in declared, f"{init.parent.name}/ is not in pyproject's package-dir"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the directed graph as [a, b, ..., a], or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for dep in sorted(graph.get(name, ())):
            if state.get(dep) == "open":
                return stack[stack.index(dep):] + [dep]
            if dep not in state:
                cycle = visit(dep)
                if cycle:
                    return cycle
        stack.pop()
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state:
            cycle = visit(name)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    modules = _modules()
    graph = {name: _module_level_imports(path, modules) - {name}
             for name, path in modules.items()}
    assert len(graph) > 40 and sum(map(len, graph.values())) > 80  # the walk sees the project
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_can_fail(tmp_path):
    modules = {"int8attn.a": tmp_path / "a.py", "int8attn.b": tmp_path / "b.py",
               "int8attn.c": tmp_path / "c.py"}
    modules["int8attn.a"].write_text("from int8attn.b import x\n")
    modules["int8attn.b"].write_text("import int8attn.c\n\ndef f():\n    import int8attn.a\n")
    modules["int8attn.c"].write_text("from int8attn import a\n")
    graph = {n: _module_level_imports(p, modules) for n, p in modules.items()}
    assert graph == {"int8attn.a": {"int8attn.b"}, "int8attn.b": {"int8attn.c"},
                     "int8attn.c": {"int8attn.a"}}
    assert find_cycle(graph) == ["int8attn.a", "int8attn.b", "int8attn.c", "int8attn.a"]
    graph["int8attn.c"] = set()
    assert find_cycle(graph) is None


# ----------------------------------------------------------------------------
# Section references point into docs/design.md
# ----------------------------------------------------------------------------

SECTION_SIGN = "\u00a7"
DESIGN = REPO / "docs" / "design.md"
DESIGN_REFERENCE = re.compile(r"docs/design\.md \u00a7(\d+[a-z]?)(?![\w])")
DESIGN_HEADING = re.compile(r"^#{2,6} \u00a7(\d+[a-z]?)(?![\w])", re.MULTILINE)
CITING_SUFFIXES = (".py", ".md", ".mlir", ".cfg", ".toml", ".txt")
# The design brief's file name: the brief lives outside the repository, so no file
# may cite it (spelled in two pieces so that this file does not cite it either).
BRIEF = "DESIGN" + ".md"


def design_sections(text: str) -> list[str]:
    """The section numbers of docs/design.md's headings (`## <sign>2b Title`), in order."""
    return DESIGN_HEADING.findall(text)


def dangling_references(text: str, sections, name: str) -> list[str]:
    """`name:line: ...` for each section sign that is not a reference
    `docs/design.md <sign>N` to one of `sections`, and for each mention of the
    brief outside the repository (`BRIEF`). Headings of the design document
    itself are not references."""
    cited = {m.start(1) - 1: m.group(1) for m in DESIGN_REFERENCE.finditer(text)}
    headings = {m.start(1) - 1 for m in DESIGN_HEADING.finditer(text)}
    problems = []

    def line(position):
        return text.count("\n", 0, position) + 1

    for match in re.finditer(SECTION_SIGN, text):
        at = match.start()
        if at in headings:
            continue
        if at not in cited:
            snippet = text[max(0, at - 20):at + 4].replace("\n", " ")
            problems.append(f"{name}:{line(at)}: a section sign that names no "
                            f"docs/design.md section: ...{snippet}...")
        elif cited[at] not in sections:
            problems.append(f"{name}:{line(at)}: docs/design.md has no section "
                            f"{SECTION_SIGN}{cited[at]}")
    for match in re.finditer(re.escape(BRIEF), text):
        problems.append(f"{name}:{line(match.start())}: {BRIEF} is not in the repository; "
                        f"cite docs/design.md")
    return problems


def _citing_files() -> list[Path]:
    """Code, README, tests, lit files, benchmark notes: every text file of the
    repository's own folders (not hidden ones, build outputs or caches)."""
    def skipped(path: Path) -> bool:
        return any(part.startswith(".") or part in ("__pycache__", "build")
                   or part.endswith(".egg-info") for part in path.relative_to(REPO).parts)

    return sorted(p for p in REPO.rglob("*")
                  if p.is_file() and p.suffix in CITING_SUFFIXES and not skipped(p))


def test_every_section_reference_points_into_the_design_document():
    design = DESIGN.read_text()
    sections = design_sections(design)
    assert len(sections) == len(set(sections)), f"duplicate section headings: {sections}"
    assert {"2", "2b", "2c"} <= set(sections)      # the contract, the paged cache, the variants
    files = _citing_files()
    assert DESIGN in files and (REPO / "README.md") in files
    problems, references = [], 0
    for path in files:
        text = path.read_text(errors="replace")
        problems += dangling_references(text, sections, str(path.relative_to(REPO)))
        if path != DESIGN:
            references += len(DESIGN_REFERENCE.findall(text))
    assert references > 50          # the walk sees the code, the README and the tests
    assert not problems, "\n".join(problems)


def test_the_reference_check_can_fail():
    sign = SECTION_SIGN
    sections = design_sections(f"# title\n\n## {sign}2 Contract\n\n## {sign}2b Paged\n")
    assert sections == ["2", "2b"]
    good = f"see docs/design.md {sign}2b and docs/design.md {sign}2.\n"
    assert dangling_references(good, sections, "f.py") == []
    text = (f"a (docs/design.md {sign}2c)\nb {sign}2\nc {BRIEF}\n"
            f"d docs/design.md {sign}2bx\n")
    problems = dangling_references(text, sections, "f.py")
    assert [p.split(":")[1] for p in problems] == ["1", "2", "4", "3"], problems
    assert "no section" in problems[0] and "names no" in problems[1]


# Which top-level folders each folder may import (module level or inside functions).
# The layers, bottom up: support; contract (the numerics rules); fragments; reference
# (numpy) and dialects (the ops); passes and kernels (the two code generators, which do
# not import each other); pipelines; runtime; simulator; driver; serving; the entry
# points in int8attn/.
ALLOWED_IMPORTS = {
    "support": set(),
    "contract": {"support"},
    "fragments": {"support", "contract"},
    "reference": {"support", "contract", "fragments",
                  # onnx_decoder's check reads the cpu pipeline's default numerics
                  # (a Numerics value per target, issue 23 item 5, moves them below)
                  "pipelines"},
    "dialects": {"support", "contract", "fragments"},
    "passes": {"support", "contract", "fragments", "dialects"},
    "kernels": {"support", "contract", "fragments", "dialects"},
    "pipelines": {"support", "contract", "fragments", "dialects", "passes"},
    "runtime": {"support"},
    "simulator": {"support", "contract", "fragments", "reference", "kernels"},
}


def _folder_imports() -> dict[tuple[str, str], set[str]]:
    """(importing folder, imported folder) -> the importing files, every import."""
    folders = {folder.name for folder in _package_dirs().values()}
    edges: dict[tuple[str, str], set[str]] = {}
    for package, folder in _package_dirs().items():
        for path in folder.glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.ImportFrom) and node.module
                        and node.module.split(".")[0] == "int8attn" and node.level == 0):
                    continue
                parts = node.module.split(".")
                targets = ({parts[1]} if len(parts) > 1 else
                           {a.name if a.name in folders else "int8attn" for a in node.names})
                for target in targets:
                    target = target if target in folders else "int8attn"
                    if target != folder.name:
                        edges.setdefault((folder.name, target), set()).add(path.name)
    return edges


def test_layers_import_only_downwards():
    wrong = {f"{source} -> {target} ({', '.join(sorted(files))})"
             for (source, target), files in _folder_imports().items()
             if source in ALLOWED_IMPORTS and target not in ALLOWED_IMPORTS[source]}
    assert not wrong, "imports against the layers: " + "; ".join(sorted(wrong))


def test_only_entry_points_import_the_cli():
    """int8attn.cli is an entry point: library code (every package folder but int8attn/)
    never imports it (report.py did, for UsageError: a cycle)."""
    for package, folder in _package_dirs().items():
        if package == "int8attn":
            continue
        for path in folder.glob("*.py"):
            assert "int8attn.cli" not in path.read_text(), path


def test_simulator_hosts_do_not_import_each_other():
    """decode and prefill hosts share `run`; only kernel_ir (the dispatcher) and the
    package's __init__ import both."""
    for name in ("decode", "prefill", "run", "interpreter", "isa"):
        text = (REPO / "simulator" / f"{name}.py").read_text()
        others = {"decode", "prefill", "kernel_ir"} - {name}
        assert not any(f"int8attn.simulator.{o} " in text or f"int8attn.simulator.{o}\n" in text
                       for o in others), name
