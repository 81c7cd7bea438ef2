"""Write docs/results.md, and the README's one measured number, from the benchmark JSON in docs/results/.

docs/results.md is generated whole: for every result in `TABLES` (its entry in benchmarks/results_contents.py), what
it measures, the command that wrote its JSON, the date it was measured, the machine, the benchmark's caption
and table (formatted by the benchmark module's own `caption()` and `table()`, the text the script printed
when it ran) and the prose that explains it. Results measured on older code come last, under a heading that
says so. The prose, the page's own and each result's, lies in text templates (`TEMPLATES`). Every JSON file
in docs/results/ must appear on the page (a new one without an entry there is an error).

In the README, the text between `<!-- results:NAME -->` and `<!-- /results:NAME -->` is replaced by the
block NAME of `README_BLOCKS`; nothing outside the markers is touched. Running the generator again changes
nothing.

    python -m benchmarks.results_page [--check] [--readme README.md] [--page docs/results.md]
                                     [--results docs/results]

`--check` writes nothing and exits 1 when a file differs from what the JSON gives (a table edited by hand,
or JSON updated without regenerating). A missing or invalid JSON file or template, a result without a date, or
a README without a block's markers exits 2 with one line naming it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from string import Template

from benchmarks.results_contents import MACHINE, MACHINES, MEASURED, OTHER, README_BLOCKS, TABLES, Table

REPO = Path(__file__).resolve().parents[1]

TEMPLATES = REPO / "docs" / "results" / "templates"
"""The page's prose, read with `string.Template` (`$field`; a literal dollar is `$$`): `page.md` the page around
the results, `result.md` what each result shows from its JSON, `readme_headline.md` the README's block, and for
each result its own (`Table.template`). They lie in the clone beside the JSON, which only a clone has: the page
is generated there, not from an installed package."""


class ResultsError(Exception):
    """A one-line reason a file cannot be generated (a missing or bad file, no date, missing markers)."""


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the current directory when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def filled(name: str, **fields: str) -> str:
    """The template `name` with its fields filled in, less the file's final newline."""
    path = TEMPLATES / name
    if not path.is_file():
        raise ResultsError(f"{shown(path)}: missing (docs/results.md is generated from it)")
    try:
        return Template(path.read_text().removesuffix("\n")).substitute(fields)
    except (KeyError, ValueError) as e:
        raise ResultsError(f"{shown(path)}: invalid template ({type(e).__name__}: {e})") from None


def load(results: Path, filename: str) -> dict:
    path = results / filename
    if not path.is_file():
        raise ResultsError(f"{shown(path)}: missing (docs/results.md is generated from it)")
    try:
        result = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{shown(path)}: invalid JSON ({e})") from None
    command = result.get("command") if isinstance(result, dict) else None
    if not isinstance(command, str) or not command:
        raise ResultsError(f"{shown(path)}: invalid result (no 'command' line)")
    return result


def measured_on(results: Path, filename: str, result: dict) -> str:
    """The date the result was measured: its JSON's `date`, else `MEASURED`."""
    date = result.get("date") or MEASURED.get(filename)
    if not date:
        raise ResultsError(
            f"{shown(results / filename)}: no date (add 'date' to the JSON or record it in "
            f"MEASURED in benchmarks/results_contents.py)"
        )
    return str(date)[:10]


def machine_of(filename: str, result: dict) -> str:
    return str(result.get("machine") or MACHINES.get(filename, MACHINE))


def formatted(results: Path, entry: Table, result: dict) -> tuple[str, str]:
    """The benchmark's own caption and table of `result`."""
    module = importlib.import_module(entry.module)
    try:
        return module.caption(result), module.table(result)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        name = entry.module.rpartition(".")[2]
        raise ResultsError(f"{shown(results / entry.file)}: invalid {name} result ({type(e).__name__}: {e})") from None


def anchor(title: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


def section(results: Path, entry: Table) -> str:
    """A result's heading, its prose and what its JSON shows."""
    result = load(results, entry.file)
    caption, table = formatted(results, entry, result)
    shows = filled(
        "result.md",
        command=result["command"],
        measured=measured_on(results, entry.file, result),
        machine=machine_of(entry.file, result),
        file=entry.file,
        caption=caption,
        table=table,
    )
    return f"### {entry.title}\n\n" + filled(entry.template, result=shows)


def listed(results: Path, tables: list[Table]) -> str:
    """The tables' index, then their sections."""
    index = "\n".join(f"- [{t.title}](#{anchor(t.title)})" for t in tables)
    return "\n\n".join([index, *(section(results, t) for t in tables)])


def page(results: Path) -> str:
    """The whole text of docs/results.md."""
    known = {t.file for t in TABLES} | set(OTHER)
    for path in sorted(results.glob("*.json")):
        if path.name not in known:
            raise ResultsError(
                f"{shown(path)}: not on the results page (add it to TABLES or OTHER in benchmarks/results_contents.py)"
            )
    shown_tables = [t for t in TABLES if not t.optional or (results / t.file).is_file()]
    current = listed(results, [t for t in shown_tables if not t.older])
    older = listed(results, [t for t in shown_tables if t.older])
    rows = []
    for filename, what in OTHER.items():
        result = load(results, filename)
        rows.append(
            f"| [{filename}](results/{filename}) | {what} | `{result['command']}` | "
            f"{measured_on(results, filename, result)} |"
        )
    return filled("page.md", current=current, older=older, other="\n".join(rows)) + "\n"


def headline(results: Path, readme: Path) -> str:
    """The README's one number: ptrun's default against the faster plain peer on bbc_news_bert."""
    filename = README_BLOCKS["headline"]
    result = load(results, filename)
    try:
        rows = {r["label"]: r for r in result["rows"]}
        mine = rows["ptrun default"]
        peer = max((r for r in result["rows"] if r["kind"] == "plain"), key=lambda r: r["speedup_wall"])
        # seeded rounds: the accuracy is the mean over the seeds; else the median of the rounds
        top1 = "mean_top1" if result.get("seeds") else "final_top1"
        numbers = {
            "speedup": f"{mine['speedup_wall']:.2f}",
            "wall": f"{mine['wall_s']:.0f}",
            "peer_wall": f"{peer['wall_s']:.0f}",
            "top1": f"{mine[top1]:.2f}",
            "peer_top1": f"{peer[top1]:.2f}",
            "over": f" (means over {result['repeats']} seeds)" if result.get("seeds") else "",
        }
    except (KeyError, TypeError, ValueError) as e:
        raise ResultsError(f"{shown(results / filename)}: invalid peers result ({type(e).__name__}: {e})") from None
    text = filled(
        "readme_headline.md",
        file=filename,
        measured=measured_on(results, filename, result),
        machine=machine_of(filename, result),
        command=result["command"],
        **numbers,
    )
    return text + "\n"


def readme_text(text: str, results: Path, readme: Path) -> str:
    """The README text with every block rewritten from its JSON."""
    for name in README_BLOCKS:
        pattern = re.compile(
            rf"(<!-- results:{re.escape(name)} -->\n)(.*?)(<!-- /results:{re.escape(name)} -->)", re.DOTALL
        )
        if not pattern.search(text):
            raise ResultsError(
                f"{shown(readme)}: no '<!-- results:{name} -->' ... '<!-- /results:{name} -->' "
                f"markers (each on its own line)"
            )
        body = headline(results, readme)
        # A function, not a template: the command line might hold backslashes.
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(3), text, count=1)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a file is not what the JSON gives")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--page", type=Path, default=REPO / "docs" / "results.md")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    args = parser.parse_args(argv)
    try:
        if not args.readme.is_file():
            raise ResultsError(f"{shown(args.readme)}: missing")
        outputs = [
            (args.readme, args.readme.read_text(), readme_text(args.readme.read_text(), args.results, args.readme)),
            (args.page, args.page.read_text() if args.page.is_file() else None, page(args.results)),
        ]
    except ResultsError as e:
        print(f"results_page: {e}", file=sys.stderr)
        return 2
    stale = [path for path, old, new in outputs if old != new]
    if args.check:
        for path in stale:
            print(
                f"results_page: {shown(path)} differs from {shown(args.results)}; run "
                f"`python -m benchmarks.results_page`",
                file=sys.stderr,
            )
        if stale:
            return 1
        print(f"{shown(args.readme)}, {shown(args.page)}: up to date")
        return 0
    for path, old, new in outputs:
        if old != new:
            path.write_text(new)
            print(f"{shown(path)}: rewritten")
        else:
            print(f"{shown(path)}: unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
