"""What an adapter trains, for the planner (`adapter=lora`): the parameter elements of each unit that take a
gradient and optimizer state, from the units' linear modules (`ModelCosts.linears`).

Under LoRA the base weights stay fixed. A targeted linear module of fan-in I and fan-out O trains r x (I + O)
elements (peft's A: r x I, B: O x r), the task head's new layer trains whole, and nothing else trains. The
planner prices the rest from that: optimizer state and gradients for those elements only
(`ptrun.layout.fill.fit_memory`), their gradients' all-reduce, and a backward pass that computes the input
gradient through every unit above the lowest that trains and the weight gradient of the trained share of each
unit's weights only (`ptrun.sim.pricing.step_time`). The adapters' own forward work, r / min(I, O) of their
module's, is left out as the FLOP model leaves out the layer norms."""

from __future__ import annotations

from ptrun.config import PtrunConfig
from ptrun.config.adapter import ADAPTER_SPECS, BLOCK_LINEARS, HEAD_MODULES, adapter_family, wraps
from ptrun.config.adapter_layers import adapted_blocks
from ptrun.costs.units import ModelCosts


def _lora(costs: ModelCosts, cfg: PtrunConfig) -> bool:
    """Whether `cfg` trains adapters the planner can count on `costs`' units."""
    return not ADAPTER_SPECS[cfg.adapter.name].trains_base and costs.linears is not None


def adapter_params(costs: ModelCosts, cfg: PtrunConfig) -> list[float]:
    """Per unit, the parameter elements the adapters add beside `costs.params` (0 without adapters): r x
    (fan-in + fan-out) for each linear module of a block that `adapter.targets` picks (every one, for a family
    the table does not know) in the blocks `adapter.layers` names, plus fan-out with DoRA (its magnitude
    vector)."""
    if not _lora(costs, cfg):
        return [0.0] * costs.num_units
    a = cfg.adapter
    picked = wrapped_linears(costs, cfg)
    return [
        float(sum(a.r * (i + o) + (o if a.dora else 0) for (_, i, o), yes in zip(unit, flags, strict=True) if yes))
        for unit, flags in zip(costs.linears, picked, strict=True)
    ]


def wrapped_linears(costs: ModelCosts, cfg: PtrunConfig) -> list[list[bool]]:
    """Per unit, which of its linear modules (`costs.linears`) get an adapter: in the blocks (units 1 ..
    n - 2, two halves a block), those whose full name the family table gives (`PREFIX.BLOCK.PATH`, the
    block's linears in order) `adapter.targets` and `adapter.exclude` pick, as the model builder does; every
    block linear where the family or the order is not the table's; none in the embedding and the head, nor
    in a block `adapter.layers` leaves out."""
    family = adapter_family(cfg.model)
    adapted = set(adapted_blocks(cfg.adapter.layers, costs.num_blocks))
    table = BLOCK_LINEARS.get(family)
    head = costs.num_units - 1
    out = [[False] * len(unit) for unit in costs.linears]
    for first in range(1, head, 2):
        block = (first - 1) // 2
        halves = [u for u in (first, first + 1) if u < head]
        linears = [lin for u in halves for lin in costs.linears[u]]
        known = table is not None and [p.rsplit(".", 1)[-1] for p in table.block] == [n for n, _, _ in linears]
        flags = (
            [wraps(cfg.adapter, f"{table.prefix}.{block}.{p}") for p in table.block] if known else [True] * len(linears)
        )
        if block not in adapted:
            flags = [False] * len(linears)
        for u in halves:
            out[u], flags = flags[: len(costs.linears[u])], flags[len(costs.linears[u]) :]
    return out


def trained_params(costs: ModelCosts, cfg: PtrunConfig) -> list[float]:
    """Per unit, the parameter elements that train: all of `costs.params` without adapters (or where the units'
    linear modules are not known); under LoRA the adapters (`adapter_params`) and the task head's new layer,
    weights and bias."""
    if not _lora(costs, cfg):
        return list(costs.params)
    head = sum(i * o + o for name, i, o in costs.linears[-1] if name in HEAD_MODULES)
    return [*adapter_params(costs, cfg)[:-1], float(head)]


def trained_share(costs: ModelCosts, cfg: PtrunConfig) -> list[float]:
    """Per unit, the share of its weights that takes a weight gradient: 1 without adapters; under LoRA the
    trained elements over the unit's, adapters included (0 for a unit with nothing to train)."""
    if not _lora(costs, cfg):
        return [1.0] * costs.num_units
    every = [p + a for p, a in zip(costs.params, adapter_params(costs, cfg), strict=True)]
    return [t / p if p else 0.0 for t, p in zip(trained_params(costs, cfg), every, strict=True)]


__all__ = ["adapter_params", "trained_params", "trained_share"]
