"""Where the test suite's time goes, from the `--durations=0` table pytest prints at the end of a run.

    bash scripts/test.sh --durations=0 -p no:cacheprovider | tee /tmp/suite.log
    python scripts/suite_durations.py /tmp/suite.log

prints three Markdown tables: the slowest tests (setup, call and teardown added up: a module- or session-scoped
fixture's cost lands on the first test that uses it), the time per file, and the time per kind of test."""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+?\.py)(::\S.*)?$")
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in ([0-9.]+)s")

KINDS = (
    ("process launches (`tests/*_dist.py`: real workers through elastic)", lambda f: f.endswith("_dist.py")),
    ("torch.compile (`test_compile*`)", lambda f: "test_compile" in f),
    ("benchmarks' own tests (`test_bench_*`)", lambda f: "test_bench_" in f),
    ("the rest (in-process, and `ptrun` subprocesses)", lambda f: True),
)


def read(log: Path) -> dict[str, float]:
    """Seconds per test id, its phases added up."""
    per_test: dict[str, float] = defaultdict(float)
    for line in log.read_text(errors="replace").splitlines():
        if m := LINE.match(line):
            seconds, _, path, rest = m.groups()
            per_test[path + (rest or "")] += float(seconds)
    return per_test


def kind(path: str) -> str:
    return next(name for name, fits in KINDS if fits(path))


def table(header: tuple[str, ...], rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log", type=Path, help="a pytest run's output with its --durations=0 table")
    parser.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list")
    args = parser.parse_args(argv)
    per_test = read(args.log)
    if not per_test:
        sys.exit(f"{args.log}: no --durations table in it (run pytest with --durations=0)")
    total = sum(per_test.values())
    per_file: dict[str, list[float]] = defaultdict(list)
    per_kind: dict[str, list[float]] = defaultdict(list)
    for test, seconds in per_test.items():
        path = test.split("::")[0]
        per_file[path].append(seconds)
        per_kind[kind(path)].append(seconds)
    slowest = sorted(per_test.items(), key=lambda t: -t[1])[: args.top]
    summaries = [m for line in args.log.read_text(errors="replace").splitlines() if (m := SUMMARY.match(line))]
    # with pytest-xdist the tests' seconds add up over its workers, each sharing the machine with the others
    ended = f"; the session: {summaries[-1][1]}, {float(summaries[-1][2]):.0f} s wall" if summaries else ""
    print(f"{len(per_test)} tests timed, {total:.0f} s of test time in all{ended}\n")
    print(table(("test", "s"), ((f"`{t}`", f"{s:.1f}") for t, s in slowest)) + "\n")
    files = sorted(per_file.items(), key=lambda f: -sum(f[1]))
    print(
        table(
            ("file", "tests", "s", "share"),
            ((f"`{f}`", len(v), f"{sum(v):.0f}", f"{sum(v) / total:.0%}") for f, v in files),
        )
        + "\n"
    )
    kinds = sorted(per_kind.items(), key=lambda k: -sum(k[1]))
    print(
        table(
            ("kind", "tests", "s", "share"), ((k, len(v), f"{sum(v):.0f}", f"{sum(v) / total:.0%}") for k, v in kinds)
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
