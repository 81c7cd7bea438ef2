"""Reports on finished (or running) runs: `ptrun report RUN_DIR [RUN_DIR ...] [--out DIR]`.

Reads each run's `metrics.jsonl` and writes PNG figures and a markdown summary (`report.md`) into one
directory. With several runs, the first is the baseline that time-to-accuracy speedups are measured against.

    from ptrun.report import write_report
    write_report(["runs/a", "runs/b"], "runs/a/report")   # -> {"report": Path(...), "Training throughput": ...}

Modules: `runs` (reading metrics files), `summary` (numbers and markdown), `savings` (what freezing saved,
the line `ptrun train` ends with), `figures` (matplotlib, including `timeline_figure` for a pipeline step's
Gantt chart) and `tensorboard` (`TensorBoardLog`, a live writer).
"""

from __future__ import annotations

import json
from pathlib import Path

from ptrun.report.runs import ReportError, Run, find_runs, load_run
from ptrun.report.summary import markdown

__all__ = ["ReportError", "Run", "find_runs", "load_run", "write_report"]


def write_report(paths: list[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Write the figures and `report.md` for the runs under `paths` into `out_dir`; title -> file written.

    Raises ReportError (naming the path) for a missing directory or one without metrics.
    """
    from ptrun.report.figures import run_figures  # inner import: optional library (matplotlib, to draw)

    runs = find_runs(paths)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = run_figures(runs, out)
    figures.update(timelines(runs, out))
    report = out / "report.md"
    report.write_text(markdown(runs, figures, out))
    return {"report": report, **figures}


def timelines(runs, out: Path) -> dict[str, Path]:
    """A Gantt chart of the profiled step of each run that recorded one (`train.timeline_step`)."""
    from ptrun.report.figures import timeline_figure  # inner import: optional library (matplotlib)

    drawn = {}
    for run in runs:
        source = Path(run.path) / "timeline.json"
        if source.is_file():
            record = json.loads(source.read_text())
            plan = record["plan"]
            path = out / (f"timeline_{run.label.replace('/', '_')}.png" if len(runs) > 1 else "timeline.png")
            timeline_figure(
                record["events"],
                path,
                title=f"{run.label}: step {record['step']}, K={plan['pp']} M={plan['microbatches']} {plan['schedule']}",
            )
            drawn[f"Pipeline timeline ({run.label})"] = path
    return drawn
