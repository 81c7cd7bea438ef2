"""Whether a layout the controller decided fits this worker's device, by the planner's memory model (the
per-unit memory `ptrun.layout.fill.fit_memory` gives the launcher, handed to the worker): a layout change that would
not fit (AutoDP widening, which hands each rank more units) is refused before it runs, and the run freezes in
place instead, in the layout it has."""

from __future__ import annotations

from dataclasses import replace

from ptrun.layout.fit import UnitMemory, stage_bytes
from ptrun.layout.plan import Plan


def largest_stage(memory: UnitMemory, plan: Plan, global_batch: int, copies: int) -> float:
    """The model's largest stage of `plan`: a frozen unit keeps its parameters alone (1 of the `copies` its
    state counts) and no activations; a cached one runs in no stage, its weights with the first."""
    frozen = plan.frozen_units
    held = UnitMemory(
        [s / copies if u < frozen else s for u, s in enumerate(memory.state_bytes)],
        [0.0 if u < frozen else a for u, a in enumerate(memory.activation_bytes)],
    )
    return max(stage_bytes(held, plan, global_batch))


def refusal(memory: UnitMemory, current: Plan, new: Plan, global_batch: int, budget: int, copies: int) -> str | None:
    """The line refusing `new` where its largest stage would not fit `budget` and needs more than `new`'s frozen
    prefix in `current`'s layout (which runs); None where it may go ahead."""
    need = largest_stage(memory, new, global_batch, copies)
    if need <= budget or need <= largest_stage(memory, in_place(current, new), global_batch, copies):
        return None
    gib = 2**30
    return (
        f"layout K={new.pp} DP={new.dp} refused: its largest stage would need ~{need / gib:.2f} GiB by the "
        f"planner's memory model, a device offers {budget / gib:.2f} GiB (device.memory); the {new.frozen_units} "
        f"frozen units freeze in place, in K={current.pp} DP={current.dp}"
    )


def in_place(current: Plan, new: Plan) -> Plan:
    """`new`'s frozen prefix in `current`'s layout (its stages stay; the cache may serve at most what leaves the
    first stage a unit to run)."""
    cached = min(new.cached_units, current.stage_bounds[0][1] - 1)
    return replace(current, frozen_units=new.frozen_units, cached_units=cached).check()
