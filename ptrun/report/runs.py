"""Reading runs back from their `metrics.jsonl` (the event format is documented in `ptrun/train/run_output.py`).

A path given to the report is either a run directory (it holds `metrics.jsonl`) or a Hydra sweep directory
(`ptrun train -m ...`) whose numbered sub-directories are runs. A run that was resumed appends a second
`start` event and repeats the epochs after its last checkpoint; the later record of an epoch wins.

Wall time is measured from the events' `time` stamps: an epoch's `wall_s` is the time since its segment's
`start` event (written just before the training loop starts) plus the full length of every earlier segment,
so it counts evaluation, layout changes, checkpoints and the work lost to a restart, as a user waits for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Eval keys in the order a report prefers them; all in percent, higher is better. Else it uses "loss".
HIGHER_IS_BETTER = ("top1", "score", "accuracy", "f1", "exact_match")


# The fields the report reads, per event; a file without them is not one `ptrun train` wrote.
REQUIRED = {
    "plan": ("epoch", "frozen_units", "pp", "dp", "microbatches", "stage_bounds"),
    "epoch": ("epoch", "train_loss", "samples_per_s", "epoch_time_s"),
}


class ReportError(Exception):
    """Bad input to the report: a missing directory, no metrics, or a malformed metrics file."""


@dataclass
class Run:
    path: Path  # the run directory
    label: str  # how tables and legends name it
    start: dict[str, Any]  # the first `start` event
    plans: list[dict[str, Any]]  # `plan` events, the latest record of each (epoch, step), in order
    epochs: list[dict[str, Any]]  # `epoch` events, the latest record of each epoch, by epoch, with `wall_s`
    end: dict[str, Any] | None  # the `end` event; None while the run is unfinished (or it died)
    total_wall_s: float = 0.0  # wall time from the first `start` to the last event, over all segments
    segments: int = 1  # 1 + the number of resumes

    def plan_for(self, epoch: int) -> dict[str, Any] | None:
        """The layout epoch `epoch` started in: the latest plan event at or before its first step."""
        current = None
        for p in self.plans:
            if (p["epoch"], p.get("step", 0)) <= (epoch, 0):
                current = p
        return current

    @property
    def metric(self) -> tuple[str, bool] | None:
        """The eval metric to compare on and whether higher is better: the first of HIGHER_IS_BETTER the run
        logs (top-1 for classification, the GLUE score, ...), else the eval loss."""
        keys = {k for e in self.epochs for k in e.get("eval") or {}}
        for key in HIGHER_IS_BETTER:
            if key in keys:
                return key, True
        return ("loss", False) if "loss" in keys else None

    def evals(self, key: str) -> list[tuple[int, float, float]]:
        """(epoch, wall_s, value) of every evaluated epoch that logged `key`."""
        return [(e["epoch"], e["wall_s"], e["eval"][key]) for e in self.epochs if key in (e.get("eval") or {})]


def _read_events(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ReportError(f"cannot read {path}: {e}") from None
    lines = text.splitlines()
    events = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            # A run killed mid-write leaves a torn last line without its newline; skip only that one.
            if i == len(lines) and not text.endswith("\n"):
                break
            raise ReportError(f"{path}:{i}: not a JSON object") from None
        if not isinstance(event, dict) or "event" not in event or "time" not in event:
            raise ReportError(f"{path}:{i}: not a metrics event (needs 'event' and 'time')")
        missing = [k for k in REQUIRED.get(event["event"], ()) if k not in event]
        if missing:
            raise ReportError(f"{path}:{i}: a '{event['event']}' event without {', '.join(missing)}")
        events.append(event)
    return events


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of `run_dir/metrics.jsonl` in the order written, each checked as the report checks it (a
    torn last line, from a run killed or still writing, is left out); ReportError if unreadable."""
    return _read_events(Path(run_dir) / "metrics.jsonl")


def load_run(run_dir: Path, label: str | None = None) -> Run:
    """Parse `run_dir/metrics.jsonl` into a Run."""
    path = run_dir / "metrics.jsonl"
    events = _read_events(path)
    first_start = None
    seg_start: float | None = None
    offset = 0.0  # wall time of the finished segments before the current one
    last_time = None
    segments = 0
    plans: dict[int, dict] = {}
    epochs: dict[int, dict] = {}
    end = None
    for e in events:
        kind = e["event"]
        if kind == "start":
            if seg_start is not None:
                offset += last_time - seg_start
            seg_start = last_time = e["time"]
            segments += 1
            first_start = first_start or e
            end = None  # a resumed run is unfinished again until its new end event
            continue
        if seg_start is None:
            raise ReportError(f"{path}: a '{kind}' event before any 'start' event")
        last_time = e["time"]
        if kind == "plan":
            plans[(e["epoch"], e.get("step", 0))] = e  # a change inside an epoch has its own record
        elif kind == "epoch":
            # A resumed run repeats the epochs after its checkpoint: the later record replaces the lost one.
            epochs[e["epoch"]] = {**e, "wall_s": offset + e["time"] - seg_start}
        elif kind == "end":
            end = e
    if first_start is None:
        raise ReportError(f"{path}: no 'start' event")
    return Run(
        path=run_dir,
        label=label or run_dir.name,
        start=first_start,
        plans=[plans[k] for k in sorted(plans)],
        epochs=sorted(epochs.values(), key=lambda r: r["epoch"]),
        end=end,
        total_wall_s=offset + (last_time - seg_start),
        segments=segments,
    )


def _child_key(p: Path) -> tuple:
    # Hydra numbers sweep jobs 0, 1, ..., 10: sort them as numbers, not as text.
    return (0, int(p.name), "") if p.name.isdigit() else (1, 0, p.name)


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Expand run and sweep directories into Runs, in the order given (the first is the baseline)."""
    found: list[tuple[Path, str]] = []
    for given in paths:
        p = Path(given)
        if not p.is_dir():
            raise ReportError(f"no such run directory: {given}")
        if (p / "metrics.jsonl").is_file():
            found.append((p, p.resolve().name))
            continue
        children = sorted((c for c in p.iterdir() if (c / "metrics.jsonl").is_file()), key=_child_key)
        if not children:
            raise ReportError(f"no metrics.jsonl in {given} (nor in a sweep job directory under it)")
        found.extend((c, f"{p.resolve().name}/{c.name}") for c in children)
    labels = [label for _, label in found]
    runs = []
    for path, label in found:
        # Two runs from different places may share a name; then only the full path tells them apart.
        runs.append(load_run(path, label if labels.count(label) == 1 else str(path)))
    return runs
