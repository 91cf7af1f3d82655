"""Every fenced example of README.md and docs/*.md runs.

A ```python block runs in a fresh interpreter (the venv's); a ```sh block runs with
`bash -e` and the venv's bin first on PATH; a ```console block runs its `$ ` lines and
every other line it shows must appear in the output, numbers aside. They run in a scratch
folder that links the repository's examples/, lit/, benchmarks/ and .venv, so a command
may write files beside them. ```text, ```mlir and other blocks are not run.

An HTML comment on the line right before a fence marks the block (docs/architecture.md):
`<!-- example: slow -->` (slow tier), `<!-- example: gpu -->` (skipped without an NVIDIA
GPU), `<!-- example: exit N -->` (must exit with N), `<!-- example: skip REASON -->`.
The README's Quick start block is .ci/run's; its first command's run (after the install)
runs here in the slow tier, and must print the lines the README shows after it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGUAGES = ("python", "sh", "console")
LINKED = ("examples", "lit", "benchmarks", ".venv")
TIMEOUT_S = 600

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*example:\s*(slow|gpu|skip|exit)\b\s*(.*?)\s*-->\s*$")
_NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Example:
    path: Path
    line: int              # the line of the opening fence, 1-based
    language: str
    text: str
    marker: str = ""       # slow / gpu / skip / exit / ""
    argument: str = ""     # the skip reason, the exit status

    @property
    def where(self) -> str:
        return f"{_name(self.path)}:{self.line}"


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def examples_of(path: Path) -> list[Example]:
    """The fenced blocks of a Markdown file with the marker before each; a fence left
    open is an error naming its line."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match.group(1)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"{_name(path)}:{start + 1}: fence never closed")
        marker = _MARKER.match(lines[start - 1]) if start else None
        found.append(Example(path, start + 1, language, "\n".join(lines[start + 1:end]) + "\n",
                             marker.group(1) if marker else "", marker.group(2) if marker else ""))
        i = end + 1
    return found


def _is_quick_start(example: Example) -> bool:
    return example.path.name == "README.md" and example.language == "sh" and \
        "pip install -q -e '.[test]'" in example.text


def runnable_examples() -> list[Example]:
    return [e for page in PAGES for e in examples_of(page)
            if e.language in RUN_LANGUAGES and not _is_quick_start(e)]


def _has_gpu() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _params():
    params = []
    for example in runnable_examples():
        marks = []
        if example.marker == "slow":
            marks.append(pytest.mark.slow)
        if example.marker == "skip":
            marks.append(pytest.mark.skip(reason=f"{example.where}: {example.argument}"))
        params.append(pytest.param(example, id=example.where, marks=marks))
    return params


@pytest.fixture
def scratch(tmp_path):
    for name in LINKED:
        if (REPO / name).exists():
            (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


def _environment() -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _run(command: list[str], cwd: Path, example: Example) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(command, cwd=cwd, env=_environment(), capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{example.where}: the {example.language} example ran past {TIMEOUT_S} s")


def console_commands(text: str) -> tuple[list[str], list[str]]:
    """(the `$ ` commands, the lines shown as their output)."""
    commands, shown = [], []
    for line in text.splitlines():
        if line.startswith("$ "):
            commands.append(line[2:])
        elif line.strip() and line.strip() != "...":
            shown.append(line)
    return commands, shown


def shown_line_pattern(line: str) -> re.Pattern:
    """A shown output line as a pattern: its numbers may differ, the rest may not
    (runs of spaces may differ in length)."""
    parts, last = [], 0
    for match in _NUMBER.finditer(line):
        parts.append(re.escape(line[last:match.start()]))
        parts.append(r"[-+]?[\d.]+(?:[eE][-+]?\d+)?")
        last = match.end()
    parts.append(re.escape(line[last:]))
    return re.compile(re.sub(r"(\\ )+", r"\\s+", "".join(parts).strip()))


def missing_lines(shown: list[str], output: str) -> list[str]:
    return [line for line in shown if not shown_line_pattern(line).search(output)]


@pytest.mark.parametrize("example", _params())
def test_example_runs(example: Example, scratch: Path):
    if example.marker == "gpu" and not _has_gpu():
        pytest.skip(f"{example.where}: needs an NVIDIA GPU")
    expected = int(example.argument) if example.marker == "exit" else 0
    shown: list[str] = []
    if example.language == "python":
        script = scratch / "example.py"
        script.write_text(example.text)
        result = _run([sys.executable, str(script)], scratch, example)
    else:
        text = example.text
        if example.language == "console":
            commands, shown = console_commands(text)
            text = "\n".join(commands) + "\n"
        result = _run(["bash", "-e", "-c", text], scratch, example)
    output = result.stdout + result.stderr
    assert result.returncode == expected, (
        f"{example.where}: the {example.language} example exited {result.returncode}, "
        f"expected {expected}:\n{example.text}\n--- output (last 3000 characters) ---\n"
        f"{output[-3000:]}")
    missing = missing_lines(shown, output)
    assert not missing, (f"{example.where}: lines the example shows are not in its output "
                         f"(numbers aside): {missing}\n--- output ---\n{output[-3000:]}")


def quick_start_run(readme: Path) -> tuple[str, list[str]]:
    """The README's first Quick start command after its install (`.venv/bin/int8attn run
    ...`), and the lines of the ```text block after it, which show its output."""
    examples = examples_of(readme)
    at = next(i for i, e in enumerate(examples) if _is_quick_start(e))
    command = examples[at].text.splitlines()[0].rsplit(" && ", 1)[1]
    shown = examples[at + 1]
    assert shown.language == "text", f"{shown.where}: the Quick start's output block"
    return command, [line for line in shown.text.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_quick_start_run_prints_what_the_readme_shows(scratch: Path):
    # The install is .ci/run's; the command after it runs here on the venv this suite
    # runs in, with an empty module cache, as from a fresh clone.
    command, shown = quick_start_run(REPO / "README.md")
    assert command.startswith(".venv/bin/int8attn run "), command
    env = {**_environment(), "INT8ATTN_CACHE_DIR": str(scratch / "cache")}
    bin_dir = Path(sys.executable).parent
    result = subprocess.run([str(bin_dir / "int8attn"), *command.split()[1:]], cwd=scratch,
                            env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    missing = missing_lines(shown, output)
    assert not missing, f"README.md's Quick start output is not what it shows: {missing}\n{output}"


# --- the extraction and the checks themselves --------------------------------------

def test_blocks_and_markers_are_found_with_their_lines(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- example: exit 1 -->\n```console\n$ false\n```\n\n"
                    "```text\nnot run\n```\n<!-- example: skip needs a DCU -->\n```sh\nx\n```\n")
    found = examples_of(page)
    assert [(e.line, e.language, e.marker, e.argument) for e in found] == [
        (3, "console", "exit", "1"), (7, "text", "", ""), (11, "sh", "skip", "needs a DCU")]


def test_a_fence_left_open_is_named(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("a\n```python\nprint(1)\n")
    with pytest.raises(ValueError, match=":2: fence never closed"):
        examples_of(page)


def test_shown_output_matches_numbers_aside_and_nothing_else():
    output = "  vs exact f32 reference        max abs 3.1e-06   rms 7.0e-07\nok\n"
    assert missing_lines(["  vs exact f32 reference        max abs 2.841e-06   rms 7.822e-07"],
                         output) == []
    assert missing_lines(["  vs fragment-level reference  max abs 2.841e-06"], output) != []
    commands, shown = console_commands("$ int8attn run x\nline 1\n...\n$ echo\n")
    assert commands == ["int8attn run x", "echo"] and shown == ["line 1"]


def test_every_page_has_runnable_examples_and_markers_are_known():
    examples = runnable_examples()
    assert {e.path.name for e in examples} >= {"README.md", "python-api.md", "serving.md",
                                               "cli.md", "passes.md"}
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("<!-- example"):
                assert _MARKER.match(line), f"{_name(page)}:{number}: unknown marker"


def test_a_failing_block_is_named_by_file_and_line(tmp_path):
    page = tmp_path / "page.md"
    example = Example(page, 12, "python", "import sys\nsys.exit(3)\n")
    with pytest.raises(AssertionError, match=rf"{re.escape(str(page))}:12: the python example "
                                             r"exited 3, expected 0"):
        test_example_runs(example, tmp_path)
    shown = Example(page, 20, "console", "$ echo max abs 1.0e-06\nmax abs 2.5e-07\nrms 1\n")
    with pytest.raises(AssertionError, match=r":20: lines the example shows .*'rms 1'"):
        test_example_runs(shown, tmp_path)
