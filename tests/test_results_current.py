"""benchmarks/results/: every measurement folder is complete (meta.json, rows, a README.md
whose header is meta.json's, with the command that made it), CURRENT.md is what
`python benchmarks/current.py` generates from the newest rows of each topic, and the
README's headline numbers are CURRENT.md's."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
import current  # noqa: E402  (benchmarks/current.py)

FOLDERS = sorted(p for p in current.RESULTS.iterdir() if p.is_dir())


def test_current_md_is_generated_from_the_newest_rows():
    committed = (current.RESULTS / current.CURRENT).read_text()
    assert committed == current.current(), (
        "benchmarks/results/CURRENT.md is out of date with the rows: run "
        "python benchmarks/current.py")


@pytest.mark.parametrize("folder", FOLDERS, ids=[p.name for p in FOLDERS])
def test_every_folder_has_meta_rows_and_a_readme_with_its_command(folder):
    meta = current.load_meta(folder)              # checks the keys, the name and the rows files
    readme = (folder / "README.md").read_text()
    assert readme == current.with_header(readme, meta), (
        f"{folder}/README.md's header is not meta.json's: run python benchmarks/current.py")
    for line in meta["command"]:
        assert f"    {line}\n" in readme
    for name in meta["rows"]:
        assert json.loads((folder / name).read_text()) not in ([], {}), f"{folder}/{name} is empty"
    for headline in meta["headlines"]:
        current.headline_table(folder, headline, str(folder))


def test_the_newest_measurement_of_a_topic_wins(tmp_path):
    # Two measurements of one topic: CURRENT.md shows the later date's rows, and lists both.
    for date, us in (("2026-01-01", 5e-5), ("2026-01-02", 4e-5)):
        folder = tmp_path / f"{date}-h200-paged-decode"
        folder.mkdir()
        (folder / "rows.json").write_text(json.dumps([{"case": "uniform 4096", "int8_s": us}]))
        (folder / "README.md").write_text("table\n")
        (folder / "meta.json").write_text(json.dumps(dict(
            date=date, machine="h200", device="NVIDIA H200", topic="paged-decode",
            measures="paged decode", command=["int8attn bench --mode paged"], rows=["rows.json"],
            landed=f"{date}T00:00:00+00:00", headlines=[dict(
                topic="paged-decode", title="t", rows="rows.json", path=[],
                columns=[{"label": "case", "value": "case"},
                         {"label": "INT8 PV (us)", "value": {"mul": ["int8_s", 1e6]},
                          "format": ".1f"}])])))
    text = current.current(tmp_path)
    assert "| uniform 4096 | 40.0 |" in text and "| uniform 4096 | 50.0 |" not in text
    assert text.count("](2026-01-0") >= 3        # the headline's folder, then both listed
    assert current.main(["--check"], results=tmp_path) == 1    # nothing written yet
    assert current.main([], results=tmp_path) == 0
    assert current.main(["--check"], results=tmp_path) == 0
    assert (tmp_path / "2026-01-01-h200-paged-decode" / "README.md").read_text().startswith(
        "> **2026-01-01 · NVIDIA H200 (`h200`)")


def _copy(tmp_path, name="2026-12-05-h100-rcp-approx-ulps"):
    folder = tmp_path / name
    shutil.copytree(current.RESULTS / name, folder)
    return folder


@pytest.mark.parametrize("damage, message", [
    (lambda m: m.pop("command"), "lacks command"),
    (lambda m: m.update(command=[]), "'command' is the list of command lines"),
    (lambda m: m.update(date="2026-12-06"), "named <date>-<machine>-<topic>"),
    (lambda m: m.update(rows=["rows.json", "rows-gone.json"]), "names rows file rows-gone.json"),
    (lambda m: m["headlines"][0].update(path=["nowhere"]), "does not lead into rows.json"),
    (lambda m: m["headlines"][0]["columns"][0].update(value="no_such_field"),
     "a row has no field 'no_such_field'"),
    (lambda m: m["headlines"][0]["columns"][0].update(value={"pow": [1, 2]}),
     "a column's value is a field name"),
])
def test_a_damaged_meta_is_named_with_the_fix(tmp_path, capsys, damage, message):
    folder = _copy(tmp_path)
    meta = json.loads((folder / "meta.json").read_text())
    damage(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    assert current.main(["--check"], results=tmp_path) == 2
    err = capsys.readouterr().err
    assert message in err and str(folder) in err


def test_new_makes_a_folder_the_check_accepts(tmp_path):
    rows = tmp_path / "bench-cuda.json"
    rows.write_text(json.dumps([{"case": "uniform 4096", "int8_s": 4.86e-05}]))
    table = tmp_path / "bench-cuda.md"
    table.write_text("| case | INT8 PV |\n|---|--:|\n| uniform 4096 | 48.6 us |\n")
    results = tmp_path / "results"
    results.mkdir()
    command = "int8attn bench --target cuda --mode paged --out bench-cuda"
    assert current.main(["new", "2026-12-06-h200-paged-decode", "--device", "NVIDIA H200",
                         "--measures", "paged decode", "--command", command,
                         "--rows", str(rows), "--table", str(table)], results=results) == 0
    folder = results / "2026-12-06-h200-paged-decode"
    assert json.loads((folder / "rows.json").read_text()) == json.loads(rows.read_text())
    assert f"    {command}\n" in (folder / "README.md").read_text()
    assert "| uniform 4096 | 48.6 us |" in (folder / "README.md").read_text()
    assert current.main([], results=results) == 0       # writes CURRENT.md
    assert current.main(["--check"], results=results) == 0
    with pytest.raises(SystemExit):                     # the same name again, or a bad one
        current.main(["new", "2026-12-06-h200-paged-decode", "--device", "d", "--measures",
                      "m", "--command", "c"], results=results)
    with pytest.raises(SystemExit):
        current.main(["new", "h200-paged-decode", "--device", "d", "--measures", "m",
                      "--command", "c"], results=results)


def headline_drift(readme: str, current_md: str) -> list[str]:
    """What the README's *Current numbers* table says that CURRENT.md does not: its
    `GPU, date` line must head CURRENT.md sections, and every number of its table but the
    case column must be one of those sections' table cells at the README's precision
    (7.02 quotes 7.023; 0.525 does not quote 0.524)."""
    section = readme.split("## Current numbers\n", 1)[1].split("\n## ", 1)[0]
    device, date = re.match(r"\s*(NVIDIA \w+), (\d{4}-\d\d-\d\d)", section).groups()
    quoted = [part for part in re.split(r"\n(?=## )", current_md)
              if f"\n{date}, {device}:" in part]
    if not quoted:
        return [f"the README's numbers are from {device}, {date}: no CURRENT.md section is"]
    cells = {float(n) for part in quoted for row in part.splitlines() if row.startswith("| ")
             for cell in row.strip("|").split("|")[1:] for n in re.findall(r"\d+(?:\.\d+)?", cell)}
    problems = []
    for row in section.splitlines():
        if not row.startswith("| ") or row.startswith("| case"):
            continue
        for cell in row.strip("|").split("|")[1:]:
            for number in re.findall(r"\d+(?:\.\d+)?", cell):
                places = len(number.split(".")[1]) if "." in number else 0
                if not any(f"{c:.{places}f}" == number for c in cells):
                    problems.append(f"the README's {number} ({row.split('|')[1].strip()}) is "
                                    f"not in CURRENT.md's {device}, {date} tables")
    return problems


def test_the_readmes_headline_numbers_are_current_mds():
    readme = (REPO / "README.md").read_text()
    problems = headline_drift(readme, (current.RESULTS / current.CURRENT).read_text())
    assert not problems, "\n".join(problems)


def test_the_headline_check_can_fail():
    current_md = ("# Current numbers\n\n## prefill: x\n\n2026-12-05, NVIDIA H200: [`f`](f)\n\n"
                  "| case | INT8 (ms) | BF16 (ms) |\n|:--|--:|--:|\n| 8192+512 | 0.274 | 0.524 |\n")
    readme = ("## Current numbers\n\nNVIDIA H200, 2026-12-05 (x).\n\n| case | INT8 | BF16 |\n"
              "|---|--:|--:|\n| prefill, 8K cached + 512 new | 0.27 ms | {} ms |\n\n## Docs\n")
    assert headline_drift(readme.format("0.524"), current_md) == []
    [problem] = headline_drift(readme.format("0.525"), current_md)
    assert "0.525 (prefill, 8K cached + 512 new)" in problem
    assert "no CURRENT.md section is" in headline_drift(
        readme.replace("2026-12-05", "2026-12-06"), current_md)[0]
