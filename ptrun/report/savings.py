"""What freezing saved: a run's training time against an estimate of the same run without freezing, from the
run's own records. `ptrun train` prints `Savings.line()` at its end and writes the `savings` event;
`ptrun report` shows the same line, computed here from the same events, so the two always agree.

The estimate is measured, not modelled. Each epoch's training loop (`epoch_time_s`) is cut at the layout
changes inside it (the `plan` events' time stamps; one piece per epoch with whole-epoch freeze intervals),
and each piece's samples follow from its steps. The stretches before the first unit froze ran exactly as the
run would without freezing: they count as measured. The frozen stretches' samples are priced at the steady
seconds per sample of the stretches with every unit training, which leaves their warm-up out: the first step
a worker process trained (the epoch event's `first_step_end_time`: on a GPU the CUDA context and libraries
start there, on a CPU the allocator and the kernels' first calls), paid once by a run with or without
freezing; and, where the run trained every unit for an epoch or more after its first, the whole first epoch
(its next steps run slower too: steps 2 to 7 up to twice the steady step, measured on two CPU cores). Pricing
every sample at the first stretch's rate, warm-up included, over-claimed: by 55% and more with steps of tens
of milliseconds, where the first steps weigh most.

How far to trust it. The rate is this machine's while the run trained every unit; the frozen stretches came
later. Measured on two idle CPU cores, a run with freezing off trained its epochs after the warm-up within the
machine's noise of each other (no later speed-up), and the estimate came within a few percent of such a run
(docs/results.md); where it missed by more, the machine had run the two runs at different speeds (other jobs
on shared cores). So the line also gives the estimate at the slowest and at the fastest rate its steady
stretches ran (an epoch, or the part of one between layout changes, of `SPREAD_STEPS` steps or more; two or
more of them), which shows how much the machine's speed moved while the rate was measured.

Per-unit costs from a profile would also price the frozen layouts, but they leave out what freezing does not
shrink (the optimizer's other work, data loading, communication, per-step overheads), which on a small model
is most of a step: a model's price would promise savings the run never had. A run whose frozen stretches
took longer than the estimate says that freezing cost time, not that it saved it.

What is counted. Training time is the epochs' training loops plus the layout changes between epochs (those
inside an epoch are part of its loop): the run paid for every change freezing caused, and for filling the
cache. The estimate without freezing has no layout changes. Both leave out evaluation, checkpoints at epoch
boundaries, the start-up and the export. A run that never froze a unit saved nothing; its line says so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptrun.report.runs import ReportError, Run, load_run

MIN_STEADY_STEPS = 10
"""The fewest steps with every unit training, warm-up left out, that the estimate prices the frozen stretches
on. Fewer tell too little: on two shared CPU cores single steps of the same layout ranged 0.5x-2x the median,
and the steps just after the first ran up to 2x slower."""


SPREAD_STEPS = 20
"""The fewest steps a steady stretch (an epoch, or the part of one between layout changes) needs for its own
rate to count in the estimate's range (`Savings.unfrozen_range_s`); shorter ones swing with single steps."""


@dataclass(frozen=True)
class Savings:
    train_s: float
    """Seconds the run trained: the epochs' training loops plus the layout changes between epochs."""
    unfrozen_s: float | None
    """Estimated seconds of the same training without freezing (equal to `train_s` when nothing froze); None
    when too few steps trained every unit after the warm-up to price the frozen ones (`MIN_STEADY_STEPS`)."""
    froze: bool
    """Whether any unit froze."""
    steady_steps: int | None = field(default=None, compare=False)
    """The steps with every unit training, warm-up left out, the estimate was priced on (None: nothing froze)."""
    unfrozen_range_s: tuple[float, float] | None = field(default=None, compare=False)
    """The estimate at the slowest and at the fastest rate its steady stretches ran (`SPREAD_STEPS` steps or
    more each): how much the machine's speed moved while the rate was measured. None with fewer than two."""

    @property
    def saved_s(self) -> float | None:
        return None if self.unfrozen_s is None else self.unfrozen_s - self.train_s

    @property
    def speedup(self) -> float | None:
        if self.unfrozen_s is None:
            return None
        return self.unfrozen_s / self.train_s if self.train_s > 0 else 1.0

    def line(self) -> str:
        """The one line the run ends with and the report shows."""
        if not self.froze:
            return f"no layer froze: training took {_seconds(self.train_s)}, as it would without freezing"
        if self.unfrozen_s is None:
            return (
                f"freezing: training took {_seconds(self.train_s)}; too few steps trained every layer before "
                f"the first froze ({self.steady_steps} after the warm-up, fewer than {MIN_STEADY_STEPS}) to "
                f"estimate the time without freezing"
            )
        if self.saved_s < 0:  # the frozen stretches ran slower than the run's own steps without freezing
            return (
                f"freezing cost ~{_seconds(-self.saved_s)}: training took {_seconds(self.train_s)}, longer "
                f"than the ~{_seconds(self.unfrozen_s)} it would take without freezing ({self.speedup:.2f}x)"
            )
        return (
            f"freezing saved ~{_seconds(self.saved_s)}: training took {_seconds(self.train_s)}; "
            f"without freezing it would take ~{_seconds(self.unfrozen_s)}{self._range()} ({self.speedup:.2f}x)"
        )

    def _range(self) -> str:
        """The estimate's range, where the steady stretches' rates tell one."""
        if self.unfrozen_range_s is None:
            return ""
        low, high = (_seconds(s) for s in self.unfrozen_range_s)
        if low == high:  # they ran alike, as far as the line shows
            return ""
        return f" ({low.removesuffix(' s')}-{high} at its steady stretches' slowest and fastest)"

    def event_fields(self) -> dict[str, Any]:
        """The `savings` event's fields (`unfrozen_time_s`, `saved_s` and `speedup` null without an estimate)."""
        return {
            "train_time_s": self.train_s,
            "unfrozen_time_s": self.unfrozen_s,
            "saved_s": self.saved_s,
            "speedup": self.speedup,
            "froze": self.froze,
            "steady_steps": self.steady_steps,
            "unfrozen_range_s": None if self.unfrozen_range_s is None else list(self.unfrozen_range_s),
            "line": self.line(),
        }


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


Piece = tuple[dict[str, Any], float, float]
"""(the plan event a stretch of training ran in, its seconds, its samples)."""


def epoch_pieces(run: Run, epoch: dict[str, Any]) -> list[Piece] | None:
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
    for p, following in zip(plans, plans[1:], strict=False):
        # a change's plan event is written once the change is done: its time stamp less the change's seconds
        seconds = max(0.0, following["time"] - following.get("transition_s", 0.0) - p["time"])
        pieces.append((p, seconds, per_step * (following.get("step", 0) - p.get("step", 0))))
        spent += seconds
    # the last piece runs to the loop's end: what the epoch's own clock has left, so the pieces add up to it
    pieces.append(
        (plans[-1], max(0.0, epoch["epoch_time_s"] - changes - spent), per_step * (steps - plans[-1].get("step", 0)))
    )
    return pieces


def warm_up(epoch: dict[str, Any], pieces: list[Piece]) -> list[Piece]:
    """`pieces` of `epoch` with its warm-up cut off as pieces of their own, marked by `WARM_UP` on their event:
    the first steps a worker process trained, in an epoch where a process started (the run's first, or the
    first after a resume), from the loop's start (the batches' first fetch included) to the end of their
    update: the epoch event's `warm_up_end_time` after its first `warm_up_steps` where it records them, else
    `first_step_end_time` after its first. Those steps pay for what every later step reuses (the allocator's
    first blocks, the kernels' first calls; on a GPU the CUDA context's and libraries' start-up), once per
    run: a run without freezing pays them too, once. Where the warm-up outlasts a piece, the whole piece is
    warm-up (and the next one's time is not split: the end is known, not where inside it the steps fell)."""
    if "warm_up_end_time" in epoch:
        end, warm_steps = epoch["warm_up_end_time"], epoch.get("warm_up_steps", 1)
    elif "first_step_end_time" in epoch:
        end, warm_steps = epoch["first_step_end_time"], 1
    else:
        return pieces
    steps = epoch.get("steps") or 0
    per_step = epoch.get("samples", 0) / steps if steps else 0.0
    out, left = [], warm_steps * per_step  # warm-up samples not yet cut off
    for event, seconds, samples in pieces:
        if left <= 0:
            out.append((event, seconds, samples))
        elif samples <= left:  # all of it warm-up
            out.append(({**event, WARM_UP: True}, seconds, samples))
            left -= samples
        else:
            warm = min(seconds, max(0.0, end - event["time"]))
            out += [({**event, WARM_UP: True}, warm, left), (event, seconds - warm, samples - left)]
            left = 0
    return out


WARM_UP = "_warm_up"
"""The key `warm_up` sets on the (copied) plan event of a warm-up piece."""


def run_pieces(run: Run) -> tuple[float, list[tuple[int, dict[str, Any], float, float, float]]] | None:
    """The run's training seconds (`Savings.train_s`) and its pieces in order, each as (its epoch, its plan
    event, seconds, samples, samples a step), warm-up cut off (`warm_up`); None when an epoch has no plan event
    to cut it by."""
    train_s, pieces = 0.0, []
    for epoch in run.epochs:
        mine = epoch_pieces(run, epoch)
        if mine is None:
            return None
        opening = mine[0][0]
        train_s += epoch["epoch_time_s"]
        if (opening["epoch"], opening.get("step", 0)) == (epoch["epoch"], epoch.get("resumed_at_step", 0)):
            train_s += opening.get("transition_s", 0.0)  # the change into this epoch, made before its loop
            mine = warm_up(epoch, mine)  # only a loop that opened with its plan event has a known start
        per_step = epoch.get("samples", 0) / epoch["steps"] if epoch.get("steps") else 0.0
        pieces += [(epoch["epoch"], event, seconds, samples, per_step) for event, seconds, samples in mine]
    return train_s, pieces


def steady_pieces(run: Run, pieces: list) -> list:
    """The `run_pieces` that give the steady rate with every unit training: those with no unit frozen, warm-up
    left out, and only those after the first epoch where they hold an epoch's samples or more (the first
    epoch's steps after its first can run slower too: measured on two CPU cores, steps 2 to 7 up to 2x the
    steady step)."""
    steady = [p for p in pieces if not p[1].get("frozen_units") and not p[1].get(WARM_UP)]
    after_first = [p for p in steady if p[0] > run.epochs[0]["epoch"]]
    if math.fsum(p[3] for p in after_first) >= run.epochs[0].get("samples", math.inf):
        return after_first
    return steady


def freezing_savings(run: Run) -> Savings | None:
    """What freezing saved in `run` (see the module docstring); None when it cannot be told: no epoch yet, an
    epoch without its plan event, or a run that froze before any stretch with every unit training was
    measured. Too few steady steps with every unit training give a `Savings` without an estimate."""
    if not run.epochs or not run.plans or (cut := run_pieces(run)) is None:
        return None
    train_s, pieces = cut
    if not any(p[1].get("frozen_units") for p in pieces):
        return Savings(train_s, train_s, froze=False)
    unfrozen = [p for p in pieces if not p[1].get("frozen_units")]
    if not unfrozen:  # frozen from the start (a schedule that opens frozen): nothing to price the rest on
        return Savings(train_s, None, froze=True, steady_steps=0)
    steady = steady_pieces(run, pieces)
    steps = round(math.fsum(p[3] / p[4] for p in steady if p[4]))
    rate_s, rate_samples = math.fsum(p[2] for p in steady), math.fsum(p[3] for p in steady)
    if steps < MIN_STEADY_STEPS or rate_samples <= 0:
        return Savings(train_s, None, froze=True, steady_steps=steps)
    frozen_samples = math.fsum(p[3] for p in pieces if p[1].get("frozen_units"))
    # the stretches that trained every unit ran as they would without freezing, warm-up and all: counted as
    # measured; the frozen stretches' samples at the steady seconds per sample of those stretches
    measured_s = math.fsum(p[2] for p in unfrozen)
    # each steady stretch long enough to tell its own rate: the estimate at the slowest and the fastest of them
    rates = [p[2] / p[3] for p in steady if p[3] > 0 and p[4] and p[3] / p[4] >= SPREAD_STEPS]
    spread = None
    if len(rates) > 1:
        spread = (measured_s + min(rates) * frozen_samples, measured_s + max(rates) * frozen_samples)
    return Savings(
        train_s,
        measured_s + rate_s / rate_samples * frozen_samples,
        froze=True,
        steady_steps=steps,
        unfrozen_range_s=spread,
    )


def run_savings(run_dir: str | Path) -> Savings | None:
    """What freezing saved in the run in `run_dir`, from its own metrics.jsonl (the trainer's last line); None
    when it cannot be told, or when the file cannot be read (said in a warning: training is done by then)."""
    try:
        return freezing_savings(load_run(Path(run_dir)))
    except ReportError as e:
        logging.getLogger(__name__).warning("no estimate of what freezing saved: %s", e)
        return None


def savings_lines(runs: Sequence[Run]) -> list[str]:
    """`label: line` per run that can be estimated (what `ptrun report` prints)."""
    return [f"{run.label}: {s.line()}" for run in runs if (s := freezing_savings(run)) is not None]
