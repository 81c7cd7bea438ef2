"""The paper beside the run: a paper recipe's published numbers (`paper.*` in the run's resolved config.yaml)
next to the run's own final metric, and next to its speedup over a freezing-off run of the same recipe when
the report is given one (`ptrun report RUN_DIR BASELINE_RUN`, in either order). Where the run's setup differs
from the paper's (its worker count, its epochs, epochs cut short), the lines say so: the numbers are then not
the same experiment.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ptrun.report.runs import Run


@dataclass(frozen=True)
class RunSetup:
    """What the report compares of a run's resolved config: the paper's numbers and the run's own setup."""

    paper: dict[str, Any]
    recipe: str | None
    freezing: bool
    epochs: int | None
    steps_cap: int | None


def run_setup(run: Run) -> RunSetup | None:
    """The setup of `run` from RUN_DIR/config.yaml; None when the run has no readable config."""

    try:
        cfg = yaml.safe_load((Path(run.path) / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    auto, train = cfg.get("auto") or {}, cfg.get("train") or {}
    return RunSetup(
        paper=cfg.get("paper") or {},
        recipe=cfg.get("recipe"),
        freezing=bool(auto.get("freeze", True)),
        epochs=train.get("epochs"),
        steps_cap=train.get("max_steps_per_epoch"),
    )


def final_metric(run: Run, key: str) -> float | None:
    """The run's last evaluation of `key`, or None when it never logged one."""
    values = run.evals(key)
    return values[-1][2] if values else None


def differences(run: Run, setup: RunSetup) -> list[str]:
    """How the run's setup differs from the paper's, in words (empty: the same GPU count and epochs)."""
    paper, out = setup.paper, []
    workers = run.start.get("world_size")
    if paper.get("gpus") and workers != paper["gpus"]:
        out.append(f"{workers} workers (the paper: {paper['gpus']} GPUs)")
    if paper.get("epochs") and len(run.epochs) != paper["epochs"]:
        out.append(f"{len(run.epochs)} epochs (the paper: {paper['epochs']})")
    if setup.steps_cap:
        out.append(f"epochs cut to {setup.steps_cap} steps (train.max_steps_per_epoch)")
    return out


def paper_lines(runs: list[Run]) -> list[str]:
    """For each run of a paper recipe that froze layers: the paper's numbers, the run's own final metric, its
    speedup in wall time over a freezing-off run of the same recipe among `runs` (when there is one), and
    how its setup differs from the paper's."""
    setups = [(run, run_setup(run)) for run in runs]
    lines = []
    for run, setup in setups:
        if setup is None or not setup.paper.get("setup") or not setup.freezing:
            continue
        paper = setup.paper
        key = paper.get("metric") or (run.metric[0] if run.metric else "")
        lines.append(f"paper ({paper['setup']}): {published(paper, key)}")
        own = final_metric(run, key)
        mine = f"{key} {own:.2f}" if own is not None else f"no {key} evaluated"
        lines.append(f"this run ({run.label}): {mine} in {clock(run.total_wall_s)} wall time")
        base = next((b for b, s in setups if s is not None and not s.freezing and s.recipe == setup.recipe), None)
        if base is not None and run.total_wall_s > 0:
            theirs = final_metric(base, key)
            at = f", {key} {theirs:.2f}" if theirs is not None else ""
            lines.append(
                f"speedup over the freezing-off run ({base.label}: {clock(base.total_wall_s)}{at}): "
                f"{base.total_wall_s / run.total_wall_s:.2f}x in wall time"
                + (f" (the paper: {paper['speedup']:.2f}x)" if paper.get("speedup") else "")
            )
        differ = differences(run, setup)
        if differ:
            lines.append("not the paper's setup, so not its experiment: " + "; ".join(differ))
    return lines


def published(paper: dict[str, Any], key: str) -> str:
    """The paper's numbers in one phrase: baseline, PipeTransformer, speedup, where the paper gives them."""
    parts = []
    if paper.get("baseline") is not None:
        took = f" in {paper['baseline_time']}" if paper.get("baseline_time") else ""
        parts.append(f"baseline {key} {paper['baseline']:.2f}{took}")
    if paper.get("result") is not None:
        took = f" in {paper['time']}" if paper.get("time") else ""
        parts.append(f"PipeTransformer {key} {paper['result']:.2f}{took}")
    if paper.get("speedup"):
        parts.append(f"{paper['speedup']:.2f}x")
    return ", ".join(parts) or "no numbers published"


def clock(seconds: float) -> str:
    """`12m23s`, `2h26m`, `41s`: as the paper writes its times (a short run's tenths: `0.4s`)."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
