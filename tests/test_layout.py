"""Where modules live, and that they import each other without cycles.

The rule (README, "Layout"): module `int8attn.X.Y` is `X/Y.py` at the
repository root, every subpackage a top-level folder; `int8attn/` holds only
the entry points (API, CLIs) and what only they use. Module-level imports
between int8attn modules form no cycle (imports inside functions are the
deliberate way for an entry point to load something lazily).
"""

import ast
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
