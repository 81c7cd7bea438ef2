"""Which ranks hold each unit under a Plan, and which parameters change hands between two plans: AutoDP's rank
assignment, as plain values (the sends themselves are `ptrun.auto.autodp`'s).

A unit is held by every replica's rank of the stage it belongs to; its owner is the replica-0 holder (all
replicas hold identical values after each step). At a transition only the parameters whose units change hands
move, from their old owner to each rank that will hold them and does not yet."""

from __future__ import annotations

from dataclasses import replace

from ptrun.layout.plan import Plan

Routes = dict[tuple[int, int], list[str]]
"""(sender, receiver) -> the parameters that go from one to the other, in the order they go."""


def unit_holders(plan: Plan, unit: int) -> list[int]:
    """The ranks holding `unit`'s weights under `plan`: every replica's rank of its stage (stage 0 also holds
    the prefix AutoCache serves: its ranks compute and key the cache entries); the first is the owner
    (replica 0)."""
    stage = plan.stage_of_unit(unit)
    return list(dict.fromkeys(plan.rank_of_stage(r, stage) for r in range(plan.dp)))


def keeps_owners(old: Plan, new: Plan) -> bool:
    """Whether `new` only freezes more (or caches a longer prefix) on `old`'s layout: the same pipeline
    length, width, stage bounds, schedule and micro-batches, so no unit changes hands and no process group
    changes. PipeDream's asynchronous runtime drains and rebuilds as for any change."""
    return (
        old.flushing
        and new.frozen_units >= old.frozen_units
        and replace(new, frozen_units=old.frozen_units, cached_units=old.cached_units) == old
    )


def _holders(plan: Plan, units: list[int]) -> set[int]:
    return {r for u in units for r in unit_holders(plan, u)}


def routes(units_of: dict[str, list[int]], old: Plan, new: Plan) -> Routes:
    """Each parameter (`units_of`: name -> the units using it, its owning unit first) from its owner under
    `old` to every rank that holds it under `new` and not under `old`."""
    out: Routes = {}
    for n, units in units_of.items():
        for dst in sorted(_holders(new, units) - _holders(old, units)):
            out.setdefault((unit_holders(old, units[0])[0], dst), []).append(n)
    return out


def gathering(units_of: dict[str, list[int]], plan: Plan, dst: int) -> Routes:
    """Each parameter `dst` does not hold under `plan`, from its owner to `dst`."""
    out: Routes = {}
    for n, units in units_of.items():
        if dst not in _holders(plan, units):
            out.setdefault((unit_holders(plan, units[0])[0], dst), []).append(n)
    return out
