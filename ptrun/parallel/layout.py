"""The starting layout of a run: `pipe.*` plus the model's unit costs -> the first Plan."""

from __future__ import annotations

from ptrun.config import ConfigError, PipeConfig
from ptrun.models.layered import LayeredModel
from ptrun.parallel.partition import partition
from ptrun.parallel.plan import Plan
from ptrun.parallel.profile import UnitProfile

NEEDS_PROFILE = ("time", "pipedream")
"""Partitioners that balance measured time rather than parameter size."""


def param_costs(layered: LayeredModel) -> list[float]:
    """Parameter elements per unit (a tied weight counts on every unit holding a copy: each copy costs
    memory and optimizer work where it lives)."""
    return [float(sum(p.numel() for p in unit.parameters())) for unit in layered.units]


def first_plan(pipe: PipeConfig, layered: LayeredModel, world_size: int, *, profile: UnitProfile | None = None,
               bandwidth: float | None = None) -> Plan:
    """Everything trainable, `pipe.length x pipe.stages_per_rank` stages split by `pipe.partition`."""
    if world_size % pipe.length:
        raise ConfigError(f"pipe.length={pipe.length} is not allowed: a divisor of the world size {world_size}")
    num_units = len(layered.units)
    num_stages = pipe.length * pipe.stages_per_rank
    if num_stages > num_units:
        raise ConfigError(f"pipe.length={pipe.length} is not allowed: {num_stages} stages (x stages_per_rank) "
                          f"exceed the model's {num_units} units")
    bounds = partition(pipe.partition, num_stages, num_units=num_units, param_costs=param_costs(layered),
                       time_costs=profile.time_s if profile else None,
                       activation=profile.activation_bytes if profile else None, bandwidth=bandwidth,
                       stages=[list(r) for r in pipe.stages] if pipe.stages is not None else None)
    return Plan(num_units=num_units, frozen_units=0, pp=pipe.length, dp=world_size // pipe.length,
                stage_bounds=tuple(tuple(b) for b in bounds), microbatches=pipe.microbatches,
                schedule=pipe.schedule, stages_per_rank=pipe.stages_per_rank).check()
