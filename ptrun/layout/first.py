"""The starting layout of a run: `pipe.*` plus the model's unit costs -> the first Plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ptrun.config import ConfigError, PipeConfig, data_parallel_width
from ptrun.layout.microbatches import pick_microbatches
from ptrun.layout.partition import partition
from ptrun.layout.plan import Plan
from ptrun.models.layered import LayeredModel

if TYPE_CHECKING:  # the profile is measured with the runtimes' tools, above the layout
    from ptrun.parallel.profile import UnitProfile


def param_costs(layered: LayeredModel) -> list[float]:
    """Parameter elements per unit (a tied weight counts on every unit holding a copy: each copy costs
    memory and optimizer work where it lives), from the shapes: a worker keeps only its own units' tensors."""
    shapes = getattr(layered, "param_shapes", None)  # the planner's stand-in units hold meta tensors instead
    if shapes is None:
        return [float(sum(p.numel() for p in unit.parameters())) for unit in layered.units]
    return [
        float(sum(shapes[n].numel() for n in layered.unit_param_names(u) + layered.unit_shared_param_names(u)))
        for u in range(len(layered.units))
    ]


def start_replica_batch(pipe: PipeConfig, world_size: int, global_batch: int) -> int:
    """One replica's batch in the starting layout: the global batch over DP = world / K, or over the replicas
    of PipeDream's replicated first stage (`pipe.first_stage_replicas`)."""
    return global_batch // data_parallel_width(pipe, world_size)


def starting_microbatches(pipe: PipeConfig, world_size: int, global_batch: int, table=None) -> int:
    """The first plan's M before anything is measured: `pipe.microbatches` when it is a number; unset or `auto`,
    what AutoPipe would pick at the starting length from `table` (`auto.microbatch_table`, else the paper's).
    The trainer then replaces it with the measured choice (`ptrun.layout.microtune`); `ptrun plan`, which
    measures nothing, keeps it."""
    if isinstance(pipe.microbatches, int):
        return pipe.microbatches
    per_replica = start_replica_batch(pipe, world_size, global_batch)
    return pick_microbatches(pipe.length, per_replica, pipe.schedule, table, stages_per_rank=pipe.stages_per_rank)


def starting_micro_batch(pipe: PipeConfig, world_size: int, global_batch: int, table=None) -> int:
    """Samples in one micro-batch of the starting layout (at least 1): a replica's batch over
    `starting_microbatches`. The time-based partitioners profile the units on one of these."""
    m = starting_microbatches(pipe, world_size, global_batch, table)
    return max(1, start_replica_batch(pipe, world_size, global_batch) // m)


def first_plan(
    pipe: PipeConfig,
    layered: LayeredModel,
    world_size: int,
    *,
    profile: UnitProfile | None = None,
    bandwidth: float | None = None,
    microbatches: int | None = None,
) -> Plan:
    """Everything trainable, `pipe.length x pipe.stages_per_rank` stages split by `pipe.partition`, with
    `microbatches` (None = `pipe.microbatches`, which must then be a number: see `starting_microbatches`).
    `pipe` obeys the layout rules at `world_size` already: checked by the config's validation, or where the
    launch filled it or the start learnt the world size (`ptrun.layout.fill.resolve`, from `ptrun.compose`'s
    steps)."""
    microbatches = pipe.microbatches if microbatches is None else microbatches
    if not isinstance(microbatches, int):
        raise ValueError(f"first_plan needs a micro-batch count, not pipe.microbatches={microbatches!r}")
    num_units = len(layered.units)
    num_stages = pipe.length * pipe.stages_per_rank
    if num_stages > num_units:
        raise ConfigError(
            f"pipe.length={pipe.length} is not allowed: {num_stages} stages (x stages_per_rank) "
            f"exceed the model's {num_units} units"
        )
    bounds = partition(
        pipe.partition,
        num_stages,
        num_units=num_units,
        param_costs=param_costs(layered),
        time_costs=profile.time_s if profile else None,
        activation=profile.activation_bytes if profile else None,
        bandwidth=bandwidth,
        stages=[list(r) for r in pipe.stages] if pipe.stages is not None else None,
    )
    return Plan(
        num_units=num_units,
        frozen_units=0,
        pp=pipe.length,
        dp=data_parallel_width(pipe, world_size),
        stage_bounds=tuple(tuple(b) for b in bounds),
        microbatches=microbatches,
        schedule=pipe.schedule,
        stages_per_rank=pipe.stages_per_rank,
        replicate_first_only=pipe.first_stage_replicas > 1,
    ).check()
