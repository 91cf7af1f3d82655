"""Where modules live, and that they import each other without cycles.

The rule (docs/architecture.md, *Where modules live*): module `int8attn.X.Y` is
`X/Y.py` at the repository root, every subpackage a top-level folder; `int8attn/` holds
only the entry points (API, CLIs) and what only they use. Module-level imports
between int8attn modules form no cycle (imports inside functions are the
deliberate way for an entry point to load something lazily). Package modules
import each other relatively (`from ..fragments import ...`), so an import names
the sibling folder it resolves to. No module is longer than 400 lines but those
named in `LONG_MODULES`, each with its reason.

The layers (docs/design.md §5, its *Layers* paragraph): every import, lazy or not,
absolute or relative, goes from a folder to one below it (`ALLOWED_IMPORTS`); the
folders form no cycle; the contract imports only numpy, iree and support; only the console
scripts import the CLI; the simulator's modules form no cycle and its decode and
prefill hosts do not import each other.

Section references lead into the repository: every section sign in the code,
README, tests, lit files and benchmark notes is part of a reference
`docs/design.md <sign><number>` whose section is a heading of docs/design.md.
"""

import ast
import re
import sys
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


def _imports(path: Path, module: str, modules) -> set[tuple[str, bool]]:
    """(int8attn module imported, at module level?) for every import in `path`, the
    file of module `module`: `import int8attn.x.y`, `from int8attn.x import y` (y a
    submodule, or a name of int8attn.x) and relative imports (`from ..x import y`),
    resolved against the file's own package. An import inside a function is not at
    module level (the deliberate way to load something lazily); one in a class body
    or an `if`/`try` at module level is."""
    package = module if path.stem == "__init__" else module.rpartition(".")[0]
    found: set[tuple[str, bool]] = set()

    def add(name: str, base: str, top: bool):
        if name.split(".")[0] == "int8attn":
            found.add((name if name in modules else base, top))

    def visit(node, top: bool):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                # `import a.b.c` imports a, a.b and a.b.c: the deepest one that is a module
                names = [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
                add(next((n for n in names if n in modules), alias.name), alias.name, top)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                add(f"{base}.{alias.name}", base, top)
        top = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text()), True)
    return found


def _module_level_imports(path: Path, modules, module: str = "int8attn.m") -> set[str]:
    """int8attn modules `path` (module `module`) imports at module level."""
    return {name for name, top in _imports(path, module, modules) if top and name in modules}


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


# No package module is longer than this: a longer one is split along its seams (issue 23).
# LONG_MODULES names the exceptions, each with the reason; one that is no longer long must
# leave the list, so that the list cannot go stale.
MAX_MODULE_LINES = 400
LONG_MODULES: dict[str, str] = {}


def module_length_problems(lengths: dict[str, int], long_modules: dict[str, str]) -> list[str]:
    """A line per module (file path -> line count) over MAX_MODULE_LINES that is not in
    `long_modules`, and per entry of `long_modules` that is no longer over it."""
    problems = [f"{path} has {count} lines, more than {MAX_MODULE_LINES}: split it along its "
                f"seams (or name it in LONG_MODULES, with the reason)"
                for path, count in sorted(lengths.items())
                if count > MAX_MODULE_LINES and path not in long_modules]
    problems += [f"{path} is in LONG_MODULES ({reason}) but has "
                 + (f"{lengths[path]} lines, at most {MAX_MODULE_LINES}" if path in lengths
                    else "no module file")
                 + ": take it off the list"
                 for path, reason in sorted(long_modules.items())
                 if lengths.get(path, 0) <= MAX_MODULE_LINES]
    return problems


def test_no_module_is_longer_than_400_lines():
    lengths = {path.relative_to(REPO).as_posix(): len(path.read_text().splitlines())
               for path in _modules().values()}
    assert len(lengths) > 40 and "int8attn/cli.py" in lengths  # the walk sees the project
    problems = module_length_problems(lengths, LONG_MODULES)
    assert not problems, "\n".join(problems)


def test_the_length_check_can_fail():
    lengths = {"a/long.py": 401, "a/short.py": 400, "a/listed.py": 500, "a/shrunk.py": 12}
    listed = {"a/listed.py": "being split", "a/shrunk.py": "was split", "a/gone.py": "removed"}
    problems = module_length_problems(lengths, listed)
    assert [p.split(" ")[0] for p in problems] == ["a/long.py", "a/gone.py", "a/shrunk.py"]
    assert "a/long.py has 401 lines" in problems[0]
    assert "has no module file" in problems[1]
    assert "(was split) but has 12 lines" in problems[2]


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
    graph = {name: _module_level_imports(path, modules, name) - {name}
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
    graph = {n: _module_level_imports(p, modules, n) for n, p in modules.items()}
    assert graph == {"int8attn.a": {"int8attn.b"}, "int8attn.b": {"int8attn.c"},
                     "int8attn.c": {"int8attn.a"}}
    assert find_cycle(graph) == ["int8attn.a", "int8attn.b", "int8attn.c", "int8attn.a"]
    graph["int8attn.c"] = set()
    assert find_cycle(graph) is None
    # relative imports resolve against the file's package; a function's import is lazy
    modules["int8attn.c"].write_text("from . import a\nfrom .b import y\n")
    assert _imports(modules["int8attn.c"], "int8attn.c", modules) == {
        ("int8attn.a", True), ("int8attn.b", True)}
    assert _imports(modules["int8attn.b"], "int8attn.b", modules) == {
        ("int8attn.c", True), ("int8attn.a", False)}


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


# ----------------------------------------------------------------------------
# The layers: which folders import which (every import, lazy ones too)
# ----------------------------------------------------------------------------

# The public Python API (`int8attn.compile`, int8attn/__init__ and api.py) is a layer
# of its own: serving compiles through it, while the other modules of int8attn/ (the
# CLIs, report, benches) are the entry points above everything.
API_MODULES = {"int8attn", "int8attn.api"}


def layer(module: str) -> str:
    """The layer of an int8attn module: its top-level folder, or "api" / "int8attn"
    (the entry points) for the modules of int8attn/."""
    parts = module.split(".")
    if len(parts) > 1 and (REPO / parts[1] / "__init__.py").exists() and parts[1] != "int8attn":
        return parts[1]
    return "api" if module in API_MODULES else "int8attn"


# Which layers each layer may import (module level or inside functions). Bottom up:
# support; contract (the numerics contract: constants, option types, scalar IR rules);
# fragments; reference (numpy) and dialects (the ops); passes and kernels (the two code
# generators, which do not import each other); pipelines; runtime; simulator; driver;
# the API; serving; the entry points in int8attn/.
_BELOW_DRIVER = {"support", "contract", "fragments", "reference", "dialects", "passes",
                 "kernels", "pipelines", "runtime", "simulator"}
ALLOWED_IMPORTS = {
    "support": set(),
    "contract": {"support"},
    "fragments": {"support", "contract"},
    "reference": {"support", "contract", "fragments"},
    "dialects": {"support", "contract", "fragments"},
    "passes": {"support", "contract", "fragments", "dialects"},
    "kernels": {"support", "contract", "fragments", "dialects"},
    "pipelines": {"support", "contract", "fragments", "dialects", "passes"},
    "runtime": {"support"},
    "simulator": {"support", "contract", "fragments", "reference", "kernels"},
    "driver": _BELOW_DRIVER,
    "api": _BELOW_DRIVER | {"driver"},
    "serving": {"support", "contract", "fragments", "kernels", "runtime", "driver", "api"},
    "int8attn": _BELOW_DRIVER | {"driver", "api", "serving"},
}

# Cycles between top-level folders that are allowed, as (folder, folder) edges left out
# of the cycle check. None: the layers above form no cycle, and the literal folders
# neither (serving -> int8attn/ reaches only the API; no entry point imports serving).
# An entry point that needs serving would make serving <-> int8attn/ a folder cycle
# that is no module cycle; it would go here, with that reason.
ALLOWED_FOLDER_CYCLES: set[tuple[str, str]] = set()


def _module_imports() -> dict[str, set[str]]:
    """Module -> the int8attn modules (or names' modules) it imports, every import."""
    modules = _modules()
    return {name: {m for m, _ in _imports(path, name, modules)} - {name}
            for name, path in modules.items()}


def _edges(key) -> dict[tuple[str, str], set[str]]:
    """(importer's key, imported's key) -> the importing modules, for `key` a layer or
    folder function of a module name; imports within one key are left out."""
    edges: dict[tuple[str, str], set[str]] = {}
    for name, imported in _module_imports().items():
        for target in imported:
            if key(target) != key(name):
                edges.setdefault((key(name), key(target)), set()).add(name)
    return edges


def folder(module: str) -> str:
    """The top-level folder of an int8attn module (int8attn/ for the API and entry points)."""
    return "int8attn" if layer(module) == "api" else layer(module)


def test_every_folder_has_a_layer():
    folders = {path.name for path in _package_dirs().values()}
    assert set(ALLOWED_IMPORTS) == folders | {"api"}
    assert find_cycle(ALLOWED_IMPORTS) is None, "the layers themselves must form no cycle"


def test_layers_import_only_downwards():
    edges = _edges(layer)
    assert len(edges) > 30          # the walk sees the project
    wrong = {f"{source} -> {target} ({', '.join(sorted(files))})"
             for (source, target), files in edges.items()
             if target not in ALLOWED_IMPORTS[source]}
    assert not wrong, "imports against the layers: " + "; ".join(sorted(wrong))


def test_the_contract_sits_below_its_users():
    """Issue 23 item 6: the contract is one layer that its users import; kernels import
    no pass, dialects no numpy reference."""
    assert ALLOWED_IMPORTS["contract"] == {"support"}
    assert "passes" not in ALLOWED_IMPORTS["kernels"]
    assert "kernels" not in ALLOWED_IMPORTS["passes"]
    assert "reference" not in ALLOWED_IMPORTS["dialects"]
    edges = _edges(layer)
    for user in ("dialects", "passes", "kernels", "reference", "pipelines", "driver"):
        assert (user, "contract") in edges, f"{user} reads the contract from contract/"
    options = _module_imports()["int8attn.driver.options"]
    assert not {m for m in options if layer(m) == "reference"}, options


def test_contract_imports_only_numpy_iree_and_support():
    allowed = set(sys.stdlib_module_names) | {"numpy", "iree"}
    modules = _modules()
    for path in (REPO / "contract").glob("*.py"):
        name = "int8attn.contract" + ("" if path.stem == "__init__" else f".{path.stem}")
        for module, _ in _imports(path, name, modules):
            assert layer(module) in ("contract", "support"), (path.name, module)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            for imported in names:
                top = imported.split(".")[0]
                assert top == "int8attn" or top in allowed, (path.name, imported)


def test_no_cycle_between_folders():
    graph: dict[str, set[str]] = {}
    for source, target in _edges(folder):
        if (source, target) not in ALLOWED_FOLDER_CYCLES:
            graph.setdefault(source, set()).add(target)
    assert len(graph) > 8
    cycle = find_cycle(graph)
    assert cycle is None, "folder import cycle: " + " -> ".join(cycle)


def test_only_entry_points_import_the_cli():
    """int8attn.cli is an entry point: no module imports it but the console scripts
    (report.py did, for UsageError, now in support/diagnostics: a cycle)."""
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    entry_points = {target.split(":")[0] for target in scripts.values()}
    assert "int8attn.cli" in entry_points
    importers = {name for name, imported in _module_imports().items()
                 if "int8attn.cli" in imported}
    assert importers <= entry_points - {"int8attn.cli"}, importers


def test_simulator_modules_import_each_other_without_cycles():
    """The decode and prefill hosts share `run`; only kernel_ir (the dispatcher) and the
    package's __init__ import either."""
    graph = {name: {m for m in imported if m.startswith("int8attn.simulator")}
             for name, imported in _module_imports().items()
             if name.startswith("int8attn.simulator")}
    assert len(graph) >= 6
    cycle = find_cycle(graph)
    assert cycle is None, "simulator import cycle: " + " -> ".join(cycle)
    hosts = {"int8attn.simulator.decode", "int8attn.simulator.prefill"}
    importers = {name for name, imported in graph.items() if imported & hosts}
    assert importers == {"int8attn.simulator", "int8attn.simulator.kernel_ir"}, importers


def test_the_layer_check_sees_every_import_form(tmp_path):
    (tmp_path / "k.py").write_text(
        "import int8attn.passes.rewrite\n"
        "from ..reference import common\n"
        "def f():\n    from int8attn import cli\n")
    modules = {"int8attn.passes.rewrite": None, "int8attn.reference.common": None,
               "int8attn.cli": None, "int8attn.kernels.k": tmp_path / "k.py"}
    found = _imports(tmp_path / "k.py", "int8attn.kernels.k", modules)
    assert found == {("int8attn.passes.rewrite", True), ("int8attn.reference.common", True),
                     ("int8attn.cli", False)}
    assert [layer(m) for m, _ in sorted(found)] == ["int8attn", "passes", "reference"]
    assert layer("int8attn.api") == layer("int8attn") == "api"
    assert folder("int8attn.api") == "int8attn" and layer("int8attn.report") == "int8attn"


def test_package_modules_import_each_other_relatively():
    # Module int8attn.X.Y lives in X/Y.py at the root: an absolute `int8attn.X` import
    # names a path that does not exist for a reader without the editable install, a
    # relative one (`from ..X import`) names the sibling folder it resolves to.
    absolute = []
    for module, path in sorted(_modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "int8attn" or n.startswith("int8attn.") for n in names):
                absolute.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not absolute, "absolute int8attn imports in package modules (make them relative): " \
        + ", ".join(absolute)
