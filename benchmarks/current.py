"""The results folders' headers and `results/CURRENT.md`, generated from each folder's meta.json.

    python benchmarks/current.py            # rewrite CURRENT.md and every folder's header
    python benchmarks/current.py --check    # exit 1 naming what is out of date (the tests run this)
    python benchmarks/current.py new DATE-MACHINE-TOPIC --device "NVIDIA H200" \\
        --measures "what it measures" --command "the command" [--rows bench.json] [--table bench.md]

A measurement is one folder `results/<YYYY-MM-DD>-<machine>-<topic...>/` holding:

- `meta.json`: date, machine, device, topic, measures, command (a list of lines), rows (the
  rows files, `rows.json` first), landed (when it first landed in git, the tie-break between
  measurements of one date), moved_from (the flat file names it had before folders, if any),
  headlines (the tables CURRENT.md shows from it; often none);
- `rows.json` (and `rows-<part>.json`): the raw rows the bench wrote;
- `README.md`: the table and what was learned, below a header this script writes from meta.json.

A headline is `{"topic", "title", "rows", "path", "columns", ["where"], ["rank"]}`: `path` is the
keys (or list indices) from the rows file's top to a list of row objects (an object of objects
becomes rows keyed "key"), `where` keeps rows whose field is one of the values listed, and each
column is `{"label", "value", ["format"], ["suffix"]}` where a value is a field name (dotted for
nested fields), a number, or `{"div": [A, B]}` / `{"mul": [A, B]}` of values. CURRENT.md shows,
for each headline topic, the newest measurement (date, then landed) that has one.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CURRENT = "CURRENT.md"
HEADER_END = "<!-- end of the header written by benchmarks/current.py from meta.json -->"
META_KEYS = ("date", "machine", "device", "topic", "measures", "command", "rows", "landed",
             "headlines")
HEADLINE_KEYS = ("topic", "title", "rows", "path", "columns")
FOLDER_NAME = re.compile(r"^(\d{4}-\d{2}-\d{2})-([a-z0-9]+(?:-zen\d+)?)-([a-z0-9][a-z0-9-]*)$")


class ResultsError(Exception):
    """A results folder that cannot be read as one measurement: what, and where."""


# ---- reading -----------------------------------------------------------------------------

def load_meta(folder: Path) -> dict:
    path = folder / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: missing; every results folder has a meta.json "
                           f"(`python benchmarks/current.py new` writes one)") from None
    except ValueError as e:
        raise ResultsError(f"{path}: not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise ResultsError(f"{path}: holds no JSON object")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise ResultsError(f"{path}: lacks {', '.join(missing)} (keys: {', '.join(META_KEYS)})")
    found = FOLDER_NAME.match(folder.name)
    if not found or found.group(1) != meta["date"] or found.group(2) != meta["machine"]:
        raise ResultsError(f"{folder}: a results folder is named <date>-<machine>-<topic>, "
                           f"here {meta['date']}-{meta['machine']}-..., from its meta.json")
    if not (isinstance(meta["command"], list) and meta["command"]
            and all(isinstance(line, str) and line.strip() for line in meta["command"])):
        raise ResultsError(f"{path}: 'command' is the list of command lines that made the rows")
    if not meta["rows"] or meta["rows"][0] != "rows.json":
        raise ResultsError(f"{path}: 'rows' lists the rows files, rows.json first")
    for name in meta["rows"]:
        load_rows(folder, name)
    for index, headline in enumerate(meta["headlines"]):
        missing = [key for key in HEADLINE_KEYS if key not in headline]
        if missing:
            raise ResultsError(f"{path}: headlines[{index}] lacks {', '.join(missing)}")
    return meta


def load_rows(folder: Path, name: str):
    path = folder / name
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{folder / 'meta.json'}: names rows file {name}, which is "
                           f"not in the folder") from None
    except ValueError as e:
        raise ResultsError(f"{path}: not JSON: {e}") from None


def measurements(results: Path = RESULTS) -> list[tuple[Path, dict]]:
    """Every results folder with its meta, oldest first."""
    found = [(folder, load_meta(folder)) for folder in sorted(results.iterdir())
             if folder.is_dir()]
    return sorted(found, key=lambda item: (item[1]["date"], item[1]["landed"], item[0].name))


# ---- the header ----------------------------------------------------------------------------

def header(meta: dict) -> str:
    rows = ", ".join(f"[`{name}`]({name})" for name in meta["rows"])
    commands = "\n".join(f"    {line}" for line in meta["command"])
    return (f"> **{meta['date']} · {meta['device']} (`{meta['machine']}`) · topic "
            f"`{meta['topic']}`**  \n"
            f"> {meta['measures']}.  \n"
            f"> Raw rows: {rows}; [`meta.json`](meta.json). Current numbers: "
            f"[`../CURRENT.md`](../CURRENT.md); the story: [`HISTORY.md`](../../HISTORY.md).\n"
            f"\nMade with:\n\n{commands}\n\n{HEADER_END}\n")


def with_header(readme: str, meta: dict) -> str:
    """README.md with its header rewritten from meta (added above the text if it has none)."""
    body = readme.split(HEADER_END + "\n", 1)[1] if HEADER_END in readme else readme
    return header(meta) + "\n" + body.lstrip("\n")


# ---- headline tables -------------------------------------------------------------------------

def _field(row: dict, name: str, where: str):
    if name in row:                                   # a table's column name may hold a dot
        return row[name]
    value = row
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ResultsError(f"{where}: a row has no field {name!r} "
                               f"(fields: {', '.join(sorted(row))})")
        value = value[part]
    return value


def _value(row: dict, spec, where: str):
    if isinstance(spec, str):
        return _field(row, spec, where)
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        return spec
    if isinstance(spec, dict) and len(spec) == 1 and next(iter(spec)) in ("div", "mul"):
        op, operands = next(iter(spec.items()))
        if isinstance(operands, list) and len(operands) == 2:
            a, b = (_value(row, operand, where) for operand in operands)
            if a is None or b is None:
                return None
            return a / b if op == "div" else a * b
    raise ResultsError(f"{where}: a column's value is a field name, a number, or "
                       f"{{\"div\"|\"mul\": [A, B]}}; got {spec!r}")


def _cell(row: dict, column: dict, where: str) -> str:
    value = _value(row, column["value"], where)
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    text = format(value, column["format"]) if "format" in column else str(value)
    return text + column.get("suffix", "")


def headline_rows(folder: Path, headline: dict, where: str) -> list[dict]:
    found = load_rows(folder, headline["rows"])
    for key in headline["path"]:
        try:
            found = found[key]
        except (KeyError, IndexError, TypeError):
            raise ResultsError(f"{where}: path {headline['path']!r} does not lead into "
                               f"{headline['rows']} (stops at {key!r})") from None
    if isinstance(found, dict):
        found = [{"key": key, **value} for key, value in found.items()]
    if not (isinstance(found, list) and found and all(isinstance(r, dict) for r in found)):
        raise ResultsError(f"{where}: path {headline['path']!r} of {headline['rows']} "
                           f"holds no list of rows")
    for field, allowed in headline.get("where", {}).items():
        found = [row for row in found if _field(row, field, where) in allowed]
    if not found:
        raise ResultsError(f"{where}: 'where' {headline['where']!r} keeps no row")
    return found


def headline_table(folder: Path, headline: dict, where: str) -> str:
    columns = headline["columns"]
    lines = ["| " + " | ".join(column["label"] for column in columns) + " |",
             "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(columns))) + "|"]
    for row in headline_rows(folder, headline, where):
        lines.append("| " + " | ".join(_cell(row, column, where) for column in columns) + " |")
    return "\n".join(lines)


# ---- CURRENT.md ----------------------------------------------------------------------------

def current(results: Path = RESULTS) -> str:
    found = measurements(results)
    newest: dict[str, tuple[Path, dict, dict]] = {}
    for folder, meta in found:                        # oldest first: the newest stays
        for headline in meta["headlines"]:
            newest[headline["topic"]] = (folder, meta, headline)
    out = ["# Current numbers", "",
           "Generated by `python benchmarks/current.py` from the newest measurement of each "
           "topic (`benchmarks/results/*/meta.json` and the rows beside it); do not edit by hand. "
           "How the numbers got here: [`../HISTORY.md`](../HISTORY.md). Compare numbers of one "
           "device only.", ""]
    for topic, (folder, meta, headline) in sorted(
            newest.items(), key=lambda item: (item[1][2].get("rank", 100), item[0])):
        where = f"{folder / 'meta.json'}: headline {topic!r}"
        out += [f"## {topic}: {headline['title']}", "",
                f"{meta['date']}, {meta['device']}: [`{folder.name}`]({folder.name}/README.md) "
                f"(rows: `{headline['rows']}`). Made with:", ""]
        out += [f"    {line}" for line in meta["command"]]
        out += ["", headline_table(folder, headline, where), ""]
        if headline.get("note"):
            out += [headline["note"], ""]
    out += ["## Every measurement, newest first", "",
            "| date | machine | topic | what it measures |", "|:--|:--|:--|:--|"]
    for folder, meta in reversed(found):
        out.append(f"| {meta['date']} | {meta['machine']} | [`{meta['topic']}`]"
                   f"({folder.name}/README.md) | {meta['measures']} |")
    return "\n".join(out) + "\n"


def expected_files(results: Path = RESULTS) -> dict[Path, str]:
    """Every generated file and the text it should hold."""
    files = {results / CURRENT: current(results)}
    for folder, meta in measurements(results):
        readme = folder / "README.md"
        if not readme.is_file():
            raise ResultsError(f"{readme}: missing; a results folder's README.md holds its "
                               f"table and what it found")
        files[readme] = with_header(readme.read_text(), meta)
    return files


# ---- a new measurement ----------------------------------------------------------------------

def new_measurement(results: Path, name: str, device: str, measures: str, commands: list[str],
                    rows: Path | None, table: Path | None, topic: str | None) -> Path:
    found = FOLDER_NAME.match(name)
    if not found:
        raise ResultsError(f"{name!r}: a results folder is named <YYYY-MM-DD>-<machine>-<topic> "
                           f"(e.g. {datetime.date.today()}-h200-paged-decode)")
    folder = results / name
    if folder.exists():
        raise ResultsError(f"{folder}: exists; name the new measurement another way")
    for given, flag in ((rows, "--rows"), (table, "--table")):
        if given is not None and not given.is_file():
            raise ResultsError(f"{flag} {given}: no such file")
    if rows is not None:
        try:
            json.loads(rows.read_text())
        except ValueError as e:
            raise ResultsError(f"--rows {rows}: not JSON: {e}") from None
    folder.mkdir(parents=True)
    if rows is not None:
        shutil.copyfile(rows, folder / "rows.json")
    else:
        (folder / "rows.json").write_text("[]\n")
    meta = dict(date=found.group(1), machine=found.group(2), device=device,
                topic=topic or found.group(3), measures=measures, command=commands,
                rows=["rows.json"], landed=datetime.datetime.now().astimezone().isoformat(
                    timespec="seconds"), moved_from=[], headlines=[])
    (folder / "meta.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    body = table.read_text() if table is not None else "(the table and what it found)\n"
    (folder / "README.md").write_text(with_header(body, meta))
    return folder


# ---- the command ----------------------------------------------------------------------------

def main(argv: list[str] | None = None, results: Path = RESULTS) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["new"]:
        parser = argparse.ArgumentParser(prog="python benchmarks/current.py new")
        parser.add_argument("name", help="<YYYY-MM-DD>-<machine>-<topic>, e.g. "
                                         "2026-12-06-h200-paged-decode")
        parser.add_argument("--device", required=True, help="the machine in words")
        parser.add_argument("--measures", required=True, help="what it measures, one sentence")
        parser.add_argument("--command", action="append", required=True,
                            help="a command line that made the rows (repeat for several)")
        parser.add_argument("--rows", type=Path, help="the rows a bench wrote (PREFIX.json)")
        parser.add_argument("--table", type=Path, help="the table a bench wrote (PREFIX.md)")
        parser.add_argument("--topic", help="the topic when it is not the name's last part")
        args = parser.parse_args(argv[1:])
        try:
            folder = new_measurement(results, args.name, args.device, args.measures,
                                     args.command, args.rows, args.table, args.topic)
        except ResultsError as e:
            parser.error(str(e))
        print(f"wrote {folder}; add a headline to its meta.json to show it in "
              f"{results / CURRENT}, then run python benchmarks/current.py")
        return 0
    parser = argparse.ArgumentParser(prog="python benchmarks/current.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the files that are out of date")
    args = parser.parse_args(argv)
    try:
        files = expected_files(results)
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = [path for path, text in files.items()
             if not path.is_file() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"out of date: {path} (run python benchmarks/current.py)", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(files[path])
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
