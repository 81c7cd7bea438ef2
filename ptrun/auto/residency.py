"""Which parameters a worker keeps in memory: those of the units it holds under the current Plan, nothing
else.

Every worker builds the whole model (from the same seed, so identical), and once its first layout is built
it empties every parameter no stage of it runs (the tensor becomes a 0-element one of the same dtype and
device; the Parameter object, and so every reference to it, stays). A layout change fills the parameters it
receives (`materialize`) and empties those it no longer holds. So after the start a worker holds its own
stages' weights and optimizer state, not the model's; the peak at the start (the whole model once) is
what building only the held units would remove (issue 20, not yet done).
"""

from __future__ import annotations

import torch

from ptrun.parallel.plan import Plan


def unit_holders(plan: Plan, unit: int) -> list[int]:
    """The ranks holding `unit`'s weights under `plan`: every replica's rank of its stage (stage 0 also holds
    the prefix AutoCache serves: its ranks compute and key the cache entries); the first is the owner
    (replica 0)."""
    stage = plan.stage_of_unit(unit)
    return list(dict.fromkeys(plan.rank_of_stage(r, stage) for r in range(plan.dp)))


def held_names(layered, plan: Plan, rank: int) -> set[str]:
    """The parameters `rank` holds under `plan`: its units' own and the tied ones they share."""
    units = [u for u in range(len(layered.units)) if rank in unit_holders(plan, u)]
    return {n for u in units for n in layered.unit_param_names(u) + layered.unit_shared_param_names(u)}


def is_empty(layered, name: str, p: torch.Tensor) -> bool:
    return p.numel() == 0 and layered.param_shapes[name].numel() > 0


def release_unheld(layered, plan: Plan, rank: int) -> None:
    """Empty every parameter `rank` does not hold under `plan` (its memory goes back)."""
    keep = held_names(layered, plan, rank)
    for name, p in layered.model.named_parameters():
        if name not in keep and not is_empty(layered, name, p):
            p.data = p.data.new_empty(0)


def materialize(layered, names) -> None:
    """Give each emptied parameter among `names` storage of its shape again (its values are then written)."""
    params = dict(layered.model.named_parameters())
    for name in names:
        p = params[name]
        if is_empty(layered, name, p):
            p.data = p.data.new_empty(layered.param_shapes[name])
