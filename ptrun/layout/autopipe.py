"""AutoPipe and AutoDP as pure functions: after a freeze, the next Plan (pipeline length K, stage
boundaries, data-parallel width and micro-batch count).

The paper's compression rule: let `start_max` be the largest stage of the starting layout
(nothing frozen, K0 pipeline ranks). After a freeze, try K/2: partition the units into K/2 x
stages_per_rank stages, charging frozen units `FROZEN_COST` of their cost; if the largest stage is at most
`start_max`, the shorter pipeline fits wherever the starting one did, so halve K and try again, down to K = 1
(pure data parallelism). Every freed device becomes another pipeline replica: DP = world_size / K (AutoDP).

Stage sizes are always measured in parameter costs (the paper's proxy for memory and compute), whatever
`partition_method` places the boundaries; `start_max` must be computed with the same method
(`starting_max`) so the comparison is like for like. Nothing here touches torch or process groups: every
rank computes the same Plan from the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ptrun.config import ConfigError
from ptrun.layout.microbatches import batch_sizes, pick_microbatches, schedule_accepts
from ptrun.layout.partition import partition, stage_sums, weighted_costs
from ptrun.layout.plan import Plan

_TOL = 1e-9
"""Relative slack when comparing a stage sum with `start_max`: both are float sums, and a layout exactly as
large as the start must count as fitting."""


def _layout(
    method: str,
    pp: int,
    stages_per_rank: int,
    param_costs: Sequence[float],
    frozen_units: int,
    partition_kwargs: dict[str, Any],
    cached_units: int = 0,
) -> tuple[tuple[int, int], ...]:
    """Stage bounds over all units. A cached prefix runs in no stage, so only units [cached, n) are
    partitioned; stage 0's range is then widened down to unit 0 (it owns the cached weights)."""
    c = cached_units
    n = len(param_costs)
    if n - c < pp * stages_per_rank:
        raise ConfigError(f"{n - c} uncached units cannot fill {pp * stages_per_rank} stages")
    sliced = {
        k: (list(v)[c:] if k in ("time_costs", "activation") and v is not None else v)
        for k, v in partition_kwargs.items()
    }
    bounds = partition(
        method,
        pp * stages_per_rank,
        num_units=n - c,
        param_costs=list(param_costs)[c:],
        frozen_units=frozen_units - c,
        **sliced,
    )
    out = [(lo + c, hi + c) for lo, hi in bounds]
    out[0] = (0, out[0][1])
    return tuple(out)


def unfrozen_plan(
    first: Plan,
    pp: int,
    microbatches: int,
    *,
    method: str,
    param_costs: Sequence[float],
    partition_kwargs: dict[str, Any],
) -> Plan:
    """The layout of `first`'s world at length `pp` with `microbatches`, nothing frozen nor cached: `first`'s own
    stages at its length, else every unit placed over `pp` x stages_per_rank stages by `method` (the
    controller's, with its `param_costs` and `partition_kwargs`), as AutoPipe would place them at the start of
    a full fine-tune. Micro-batch tuning times these (`ptrun.layout.microtune.measure`'s `plan_at`)."""
    if pp == first.pp:
        bounds = first.stage_bounds
    else:
        bounds = _layout(method, pp, first.stages_per_rank, param_costs, 0, partition_kwargs)
    return replace(
        first,
        pp=pp,
        dp=first.world_size // pp,
        microbatches=microbatches,
        stage_bounds=tuple(tuple(b) for b in bounds),
        frozen_units=0,
        cached_units=0,
    ).check()


def starting_max(
    param_costs: Sequence[float],
    pp: int,
    stages_per_rank: int = 1,
    partition_method: str = "pipetransformer",
    **partition_kwargs: Any,
) -> float:
    """The paper's M0: the largest stage's parameter cost in the starting layout (nothing frozen,
    pp x stages_per_rank stages placed by `partition_method`). `partition_kwargs` (time_costs, activation,
    bandwidth, stages) go to `partition` for the methods that need them."""
    bounds = _layout(partition_method, pp, stages_per_rank, param_costs, 0, partition_kwargs)
    return max(stage_sums(bounds, [float(c) for c in param_costs]))


def next_plan(
    current: Plan,
    frozen_units: int,
    param_costs: Sequence[float],
    *,
    world_size: int,
    start_max: float,
    global_batch: int | None = None,
    batch_policy: str = "fixed_global",
    per_pipeline_batch: int | None = None,
    partition_method: str = "pipetransformer",
    compress: bool = True,
    table: Mapping[Any, int] | None = None,
    cached_units: int = 0,
    **partition_kwargs: Any,
) -> Plan:
    """The layout after the frozen prefix grew to `frozen_units` units.

    With `compress` (AutoPipe on), K starts at `current.pp` and halves while it is even and the layout
    at K/2 (same stages_per_rank, frozen prefix charged `FROZEN_COST`) has no stage above `start_max`
    and the batch can still be split at the doubled DP width (a K whose batch does not divide stops the
    halving). Without `compress`, K stays and only the boundaries move. Then DP = world_size / K.

    The batch: `fixed_global` splits `global_batch` over the DP replicas; `fixed_per_pipeline` gives every
    replica `per_pipeline_batch` (the global batch grows with DP; see `batch_sizes`). M is re-picked with
    `pick_microbatches` when K or DP changed, or when the current M no longer fits; otherwise the current M
    (perhaps the user's own choice) is kept. The schedule and stages_per_rank carry over. `world_size` may
    differ from the current plan's (an elastic restart) but must be a multiple of `current.pp`.
    `partition_kwargs` go to `partition`. With `cached_units` (AutoCache), that prefix runs in no stage
    and costs nothing: only the units after it are partitioned and weighed against `start_max`.
    Returns a checked Plan; raises ConfigError when no valid layout exists.
    """
    n = current.num_units
    if len(param_costs) != n:
        raise ConfigError(f"{len(param_costs)} parameter costs for a model of {n} units")
    if not 0 <= frozen_units < n:
        raise ConfigError(f"frozen units {frozen_units} must leave the head trainable (0 <= f < {n})")
    shared = current.replicate_first_only
    if shared and world_size != current.world_size:
        raise ConfigError(
            f"pipe.first_stage_replicas={current.dp} at pipe.length={current.pp} needs "
            f"{current.world_size} workers, not {world_size}"
        )
    if not shared and (world_size < 1 or world_size % current.pp):
        raise ConfigError(f"pipe.length={current.pp} is not allowed: a divisor of the world size {world_size}")
    compress = compress and not shared  # a replicated layout keeps its stages where they were placed
    spr, schedule = current.stages_per_rank, current.schedule
    batch = dict(batch_policy=batch_policy, global_batch=global_batch, per_pipeline_batch=per_pipeline_batch)
    if not 0 <= cached_units <= frozen_units:
        raise ConfigError(f"cached units {cached_units} must be a frozen prefix (0 <= c <= {frozen_units})")
    costs = weighted_costs(param_costs, frozen_units)
    costs = [0.0] * cached_units + costs[cached_units:]  # a cached unit is never run
    limit = start_max * (1 + _TOL)

    pp, bounds = current.pp, None
    while compress and pp > 1 and pp % 2 == 0:
        half = pp // 2
        trial = _layout(partition_method, half, spr, param_costs, frozen_units, partition_kwargs, cached_units)
        if max(stage_sums(trial, costs)) > limit:
            break
        try:  # a length whose batch cannot be split is no option (a longer one will not split either)
            per_replica, _ = batch_sizes(world_size // half, **batch)
            pick_microbatches(half, per_replica, schedule, table, stages_per_rank=spr)
        except ConfigError:
            break
        pp, bounds = half, trial
    if bounds is None:
        bounds = _layout(partition_method, pp, spr, param_costs, frozen_units, partition_kwargs, cached_units)

    dp = current.dp if shared else world_size // pp
    per_replica, _ = batch_sizes(dp, **batch)
    m = current.microbatches
    if (pp, dp) != (current.pp, current.dp) or per_replica % m or not schedule_accepts(schedule, pp, spr, m):
        m = pick_microbatches(pp, per_replica, schedule, table, stages_per_rank=spr)
    return Plan(
        num_units=n,
        frozen_units=frozen_units,
        pp=pp,
        dp=dp,
        stage_bounds=bounds,
        microbatches=m,
        schedule=schedule,
        stages_per_rank=spr,
        cached_units=cached_units,
        replicate_first_only=shared,
    ).check()


__all__ = ["next_plan", "starting_max"]
