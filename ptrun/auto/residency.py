"""Which parameters a worker keeps in memory: those of the units it holds under the current Plan, nothing
else.

A worker builds the model without storage (`ptrun.models.lazy`) and fills only its stages' units, each with
its own per-unit initial values (or the pretrained file's, or a checkpoint's). A layout change fills the
parameters it receives (`allocate`, then the sender's values) and empties those it no longer holds.
"""

from __future__ import annotations

from ptrun.layout.owners import unit_holders
from ptrun.layout.plan import Plan
from ptrun.models.lazy import is_empty, release, unit_names


def held_units(layered, plan: Plan, rank: int) -> list[int]:
    """The units `rank` holds under `plan`."""
    return [u for u in range(len(layered.units)) if rank in unit_holders(plan, u)]


def held_names(layered, plan: Plan, rank: int) -> set[str]:
    """The parameters `rank` holds under `plan`: its units' own and the tied ones they share."""
    return unit_names(layered, held_units(layered, plan, rank))


def release_unheld(layered, plan: Plan, rank: int) -> None:
    """Empty every parameter `rank` does not hold under `plan` (its memory goes back)."""
    keep = held_names(layered, plan, rank)
    release(layered, [n for n in layered.param_shapes if n not in keep])


def unheld_bytes(layered, plan: Plan, rank: int) -> int:
    """Bytes of storage that parameters `rank` does not hold under `plan` still have: 0 in a worker that
    keeps only its stages (the run's `plan` events record the sum over the workers)."""
    keep = held_names(layered, plan, rank)
    return sum(
        p.numel() * p.element_size()
        for n, p in layered.model.named_parameters()
        if n not in keep and not is_empty(layered, n, p)
    )
