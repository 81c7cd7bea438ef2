"""What freezing saved: a run's training time against an estimate of the same run without freezing, from the
run's own records. `ptrun train` prints `Savings.line()` at its end and writes the `savings` event;
`ptrun report` shows the same line, computed here from the same events, so the two always agree.

The estimate. Each epoch's training loop (`epoch_time_s`) is cut at the layout changes inside it (the
`plan` events' time stamps; one piece per epoch with whole-epoch freeze intervals). Each piece is scaled by

    (seconds per sample with every unit training, in the run's starting layout)
    / (seconds per sample in the layout the piece ran in),

both priced by the simulator's pipeline model (`ptrun.sim.pricing.unit_work` and `pipeline_seconds`) from
the per-unit costs the run profiled at its start (the start event's `unit_costs`: forward + backward,
forward alone, and forward + input gradient with frozen weights, on one micro-batch). A layout's price
counts what freezing changes in compute: frozen units lose their weight gradients (forward alone on the
first stage), cached units leave the pipeline, AutoCache's fill runs the newly cached units forward once,
and K, DP and M reshape the pipeline (its fill and drain, the slowest stage). It leaves out what the
profile does not measure: stage-boundary transfers, the gradient all-reduce (which frozen units shrink too),
loading, per-step overheads and `pipe.recompute`; the scaling assumes those change in proportion.

What is counted. Training time is the epochs' training loops plus the layout changes between epochs (those
inside an epoch are part of its loop): the run paid for every change freezing caused. The estimate without
freezing has no layout changes. Both leave out evaluation, checkpoints at epoch boundaries, the start-up
(building the model, profiling, micro-batch tuning) and the export. A run that never froze a unit saved
nothing; its line says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Sequence

from ptrun.parallel.partition import stage_sums
from ptrun.parallel.plan import Plan
from ptrun.report.runs import Run
from ptrun.sim.pricing import pipeline_seconds, unit_work

COST_KEYS = ("time_s", "forward_s", "frozen_s")
"""The start event's `unit_costs` vectors: forward + backward, forward alone (no_grad), frozen forward +
input gradient; one number per unit (see `ptrun.parallel.profile`)."""


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


@dataclass(frozen=True)
class UnitCosts:
    """Per-unit seconds on the profiled micro-batch (only their ratios matter here)."""
    train: tuple[float, ...]
    forward: tuple[float, ...]
    frozen: tuple[float, ...]


def unit_costs(start: dict[str, Any], num_units: int) -> Optional[UnitCosts]:
    """The start event's profiled costs, or None when it has none for `num_units` units."""
    recorded = start.get("unit_costs")
    if not isinstance(recorded, dict):
        return None
    vectors = [recorded.get(k) for k in COST_KEYS]
    if not all(isinstance(v, list) and len(v) == num_units for v in vectors):
        return None
    return UnitCosts(*(tuple(map(float, v)) for v in vectors))


def plan_of(event: dict[str, Any]) -> Optional[Plan]:
    """The Plan a `plan` event records (its other fields left out); None when it lacks one of the Plan's
    fields (a file from before they were all recorded)."""
    try:
        return Plan.from_dict({f.name: event[f.name] for f in fields(Plan) if f.name in event})
    except TypeError:
        return None


def seconds_per_sample(plan: Plan, costs: UnitCosts, filled: int = 0) -> float:
    """Compute seconds per training sample under `plan`, by the simulator's model: a step of a replica's b
    samples takes (b / M) x the pipeline's makespan on one-sample micro-batches, plus b x the forward of the
    units AutoCache newly caches (`filled`: the depth the cache already holds), and a step trains b x DP
    samples."""
    work = unit_work(plan, costs.train, costs.forward, frozen_grad=costs.frozen)
    pipeline = pipeline_seconds(plan, stage_sums(plan.stage_bounds, work))
    c = plan.cached_units
    fill = math.fsum(costs.forward[filled if filled <= c else 0:c]) if filled < c else 0.0
    return (pipeline / plan.microbatches + fill) / plan.dp


def epoch_pieces(run: Run, epoch: dict[str, Any]) -> Optional[list[tuple[dict[str, Any], float]]]:
    """The layouts epoch `epoch` trained in and the seconds of its loop each took (layout changes inside the
    epoch left out), from the plan events' time stamps. An epoch without a plan event at its start (a file
    that recorded only changes) ran in the layout before it, unless it changed inside: then None (nothing
    marks where its loop started). A resumed epoch counts from the step it resumed at, as its
    `epoch_time_s` does."""
    first = epoch.get("resumed_at_step", 0)
    plans = [p for p in run.plans if p["epoch"] == epoch["epoch"] and p.get("step", 0) >= first]
    if not plans or plans[0].get("step", 0) != first:
        before = [p for p in run.plans if (p["epoch"], p.get("step", 0)) < (epoch["epoch"], first)]
        return [(before[-1], epoch["epoch_time_s"])] if before and not plans else None
    changes = math.fsum(p.get("transition_s", 0.0) for p in plans[1:])
    pieces, spent = [], 0.0
    for p, following in zip(plans, plans[1:]):
        # a change's plan event is written once the change is done: its time stamp less the change's seconds
        seconds = max(0.0, following["time"] - following.get("transition_s", 0.0) - p["time"])
        pieces.append((p, seconds))
        spent += seconds
    # the last piece runs to the loop's end: what the epoch's own clock has left, so the pieces add up to it
    pieces.append((plans[-1], max(0.0, epoch["epoch_time_s"] - changes - spent)))
    return pieces


def freezing_savings(run: Run) -> Optional[Savings]:
    """What freezing saved in `run` (see the module docstring); None when it cannot be told: no epoch yet, an
    epoch without its plan event, or a run that froze but recorded no unit costs (one from before they were
    recorded)."""
    if not run.epochs or not run.plans:
        return None
    train_s = unfrozen_s = 0.0
    froze, filled = False, 0
    costs: Optional[UnitCosts] = None
    for epoch in run.epochs:
        pieces = epoch_pieces(run, epoch)
        if pieces is None:
            return None
        opening = pieces[0][0]
        train_s += epoch["epoch_time_s"]
        if (opening["epoch"], opening.get("step", 0)) == (epoch["epoch"], epoch.get("resumed_at_step", 0)):
            train_s += opening.get("transition_s", 0.0)  # the change into this epoch, made before its loop
        for event, seconds in pieces:
            if not event.get("frozen_units"):  # all of it trained: the same without freezing
                unfrozen_s += seconds
                continue
            plan, start = plan_of(event), plan_of(run.plans[0])
            costs = costs or (unit_costs(run.start, start.num_units) if start else None)
            if plan is None or costs is None:
                return None
            baseline = seconds_per_sample(replace(start, frozen_units=0, cached_units=0), costs)
            price = seconds_per_sample(plan, costs, filled)
            unfrozen_s += (seconds * baseline / price) if price > 0 else seconds
            froze, filled = True, plan.cached_units or filled
    return Savings(train_s, unfrozen_s if froze else train_s, froze)


def savings_lines(runs: Sequence[Run]) -> list[str]:
    """`label: line` per run that can be estimated (what `ptrun report` prints)."""
    return [f"{run.label}: {s.line()}" for run in runs if (s := freezing_savings(run)) is not None]
