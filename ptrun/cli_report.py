"""`ptrun report RUN_DIR [RUN_DIR ...] [--out DIR]`: figures and report.md for runs or sweep directories
(ptrun/report), then what freezing saved and a paper recipe's published numbers beside each run's."""

from __future__ import annotations

from pathlib import Path

from ptrun.cli_args import arguments, fail


def run_report(args: list[str]) -> None:
    """`ptrun report RUN_DIR [RUN_DIR ...] [--out DIR]`: figures and report.md (see ptrun/report)."""
    # inner import: start-up
    from ptrun.report import ReportError, find_runs, write_report
    from ptrun.report.paper import paper_lines
    from ptrun.report.savings import savings_lines

    paths, out = [], None
    for option, arg in arguments(args, "report", {"--out": "a directory"}, "--out DIR"):
        if option == "--out":
            out = arg
        else:
            paths.append(arg)
    if not paths:
        fail("report needs at least one RUN_DIR")
    out = Path(out) if out else Path(paths[0]) / "report"
    try:
        written = write_report(paths, out)
    except ReportError as e:
        fail(str(e))
    except OSError as e:  # e.g. --out names a file, or a directory we may not write
        fail(f"cannot write the report to {out}: {e.strerror or e}")
    for path in written.values():
        print(path)
    runs = find_runs(paths)
    for line in savings_lines(runs):  # what freezing saved, as each run's last line said
        print(line)
    for line in paper_lines(runs):  # a paper recipe's published numbers beside the run's
        print(line)
