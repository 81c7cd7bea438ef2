"""What freezing saved: a run's training time against an estimate of the same run without freezing, from the
run's own records. `ptrun train` prints `Savings.line()` at its end and writes the `savings` event;
`ptrun report` shows the same line, computed here from the same events, so the two always agree.

The estimate is measured, not modelled. Each epoch's training loop (`epoch_time_s`) is cut at the layout
changes inside it (the `plan` events' time stamps; one piece per epoch with whole-epoch freeze intervals),
and each piece's samples follow from its steps. The stretches before the first unit froze ran exactly as the
run would without freezing, so their seconds per sample, times every sample the run trained, is the run
without freezing. Per-unit costs from a profile would also price the frozen layouts, but they leave out what
freezing does not shrink (the optimizer's other work, data loading, communication, per-step overheads),
which on a small model is most of a step: a model's price would promise savings the run never had.

What is counted. Training time is the epochs' training loops plus the layout changes between epochs (those
inside an epoch are part of its loop): the run paid for every change freezing caused, and for filling the
cache. The estimate without freezing has no layout changes. Both leave out evaluation, checkpoints at epoch
boundaries, the start-up and the export. A run that never froze a unit saved nothing; its line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ptrun.report.runs import Run


@dataclass(frozen=True)
class Savings:
    train_s: float
    """Seconds the run trained: the epochs' training loops plus the layout changes between epochs."""
    unfrozen_s: float
    """Estimated seconds of the same training without freezing (equal to `train_s` when nothing froze)."""
    froze: bool
    """Whether any unit froze."""

    @property
    def saved_s(self) -> float:
        return self.unfrozen_s - self.train_s

    @property
    def speedup(self) -> float:
        return self.unfrozen_s / self.train_s if self.train_s > 0 else 1.0

    def line(self) -> str:
        """The one line the run ends with and the report shows."""
        if not self.froze:
            return f"no layer froze: training took {_seconds(self.train_s)}, as it would without freezing"
        verb = "saved" if self.saved_s >= 0 else "cost"
        return (f"freezing {verb} ~{_seconds(abs(self.saved_s))}: training took {_seconds(self.train_s)}; "
                f"without freezing it would take ~{_seconds(self.unfrozen_s)} ({self.speedup:.2f}x)")

    def event_fields(self) -> dict[str, Any]:
        """The `savings` event's fields."""
        return {"train_time_s": self.train_s, "unfrozen_time_s": self.unfrozen_s, "saved_s": self.saved_s,
                "speedup": self.speedup, "froze": self.froze, "line": self.line()}


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


Piece = tuple[dict[str, Any], float, float]
"""(the plan event a stretch of training ran in, its seconds, its samples)."""


def epoch_pieces(run: Run, epoch: dict[str, Any]) -> Optional[list[Piece]]:
    """The layouts epoch `epoch` trained in, with the seconds of its loop (layout changes inside the epoch
    left out) and the samples each took, from the plan events' time stamps and steps. An epoch without a plan
    event at its start (a file that recorded only changes) ran in the layout before it, unless it changed
    inside: then None (nothing marks where its loop started). A resumed epoch counts from the step it resumed
    at, as its `epoch_time_s` does."""
    first = epoch.get("resumed_at_step", 0)
    steps = epoch.get("steps") or 0
    per_step = epoch.get("samples", 0) / steps if steps else 0.0  # the global batch, the last one's padding out
    plans = [p for p in run.plans if p["epoch"] == epoch["epoch"] and p.get("step", 0) >= first]
    if not plans or plans[0].get("step", 0) != first:
        before = [p for p in run.plans if (p["epoch"], p.get("step", 0)) < (epoch["epoch"], first)]
        return [(before[-1], epoch["epoch_time_s"], per_step * (steps - first))] if before and not plans else None
    changes = math.fsum(p.get("transition_s", 0.0) for p in plans[1:])
    pieces, spent = [], 0.0
    for p, following in zip(plans, plans[1:]):
        # a change's plan event is written once the change is done: its time stamp less the change's seconds
        seconds = max(0.0, following["time"] - following.get("transition_s", 0.0) - p["time"])
        pieces.append((p, seconds, per_step * (following.get("step", 0) - p.get("step", 0))))
        spent += seconds
    # the last piece runs to the loop's end: what the epoch's own clock has left, so the pieces add up to it
    pieces.append((plans[-1], max(0.0, epoch["epoch_time_s"] - changes - spent),
                   per_step * (steps - plans[-1].get("step", 0))))
    return pieces


def warm_up(run: Run, epoch: dict[str, Any], pieces: list[Piece]) -> list[Piece]:
    """`pieces` of `epoch` with its warm-up cut off as a piece of its own, marked by `WARM_UP` on its event: the
    first step a worker process trained (from the loop's start, the batches' first fetch included, to the end
    of its update: the epoch event's `first_step_end_time`), in an epoch where a process started (the run's
    first, or the first after a resume). That step pays for what every later step reuses (the allocator's
    first blocks, the kernels' first calls; on a GPU the CUDA context's and libraries' start-up), once per
    run: a run without freezing pays it too, once, and never again."""
    end = epoch.get("first_step_end_time")
    if end is None or not pieces:
        return pieces
    first, seconds, samples = pieces[0]
    steps = epoch.get("steps") or 0
    per_step = epoch.get("samples", 0) / steps if steps else 0.0
    warm = min(seconds, max(0.0, end - first["time"]))
    if samples <= per_step:  # a stretch of one step: all of it is warm-up
        return [({**first, WARM_UP: True}, seconds, samples), *pieces[1:]]
    return [({**first, WARM_UP: True}, warm, per_step), (first, seconds - warm, samples - per_step), *pieces[1:]]


WARM_UP = "_warm_up"
"""The key `warm_up` sets on the (copied) plan event of a warm-up piece."""


def freezing_savings(run: Run) -> Optional[Savings]:
    """What freezing saved in `run` (see the module docstring); None when it cannot be told: no epoch yet, an
    epoch without its plan event, or a run that froze before any stretch with every unit training was
    measured."""
    if not run.epochs or not run.plans:
        return None
    train_s = 0.0
    pieces: list[Piece] = []
    epoch_of: list[int] = []  # each piece's epoch
    for epoch in run.epochs:
        mine = epoch_pieces(run, epoch)
        if mine is None:
            return None
        opening = mine[0][0]
        train_s += epoch["epoch_time_s"]
        if (opening["epoch"], opening.get("step", 0)) == (epoch["epoch"], epoch.get("resumed_at_step", 0)):
            train_s += opening.get("transition_s", 0.0)  # the change into this epoch, made before its loop
            mine = warm_up(run, epoch, mine)  # only a loop that opened with its plan event has a known start
        pieces += mine
        epoch_of += [epoch["epoch"]] * len(mine)
    if not any(event.get("frozen_units") for event, _, _ in pieces):
        return Savings(train_s, train_s, froze=False)
    unfrozen = [(event, s, n) for event, s, n in pieces if not event.get("frozen_units")]
    steady = [(s, n) for event, s, n in unfrozen if not event.get(WARM_UP)]
    # the first epoch's later steps run slower too (measured on two CPU cores: steps 2 to 7 up to 2x the
    # steady step): where the stretches after it trained every unit for an epoch or more, they alone tell
    later = [(s, n) for (event, s, n), e in zip(pieces, epoch_of)
             if e > run.epochs[0]["epoch"] and not event.get("frozen_units") and not event.get(WARM_UP)]
    if math.fsum(n for _, n in later) >= run.epochs[0].get("samples", math.inf):
        steady = later
    if math.fsum(n for _, n in steady) <= 0:  # a single step trained every unit: its warm-up is all there is
        steady = [(s, n) for _, s, n in unfrozen]
    rate_s, rate_samples = math.fsum(s for s, _ in steady), math.fsum(n for _, n in steady)
    if rate_samples <= 0:
        return None
    frozen_samples = math.fsum(n for event, _, n in pieces if event.get("frozen_units"))
    # the stretches that trained every unit ran as they would without freezing, warm-up and all: counted as
    # measured; the frozen stretches' samples at the steady seconds per sample of those stretches
    measured_s = math.fsum(s for _, s, _ in unfrozen)
    return Savings(train_s, measured_s + rate_s / rate_samples * frozen_samples, froze=True)


def savings_lines(runs: Sequence[Run]) -> list[str]:
    """`label: line` per run that can be estimated (what `ptrun report` prints)."""
    return [f"{run.label}: {s.line()}" for run in runs if (s := freezing_savings(run)) is not None]
