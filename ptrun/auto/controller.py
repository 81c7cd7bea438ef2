"""The PipeTransformer controller: at the end of an interval (an epoch boundary in the paper, any step with
`freeze.every` < 1), Freeze -> AutoPipe -> AutoDP as one decision.

It reads like the paper: the freeze policy looks at the last interval's per-block measure (the gradient norms
of the paper's rule; `FreezePolicy.measure` says which, and the trainer measures that) and says how many
bottom blocks to freeze; AutoPipe packs the units into stages again (frozen units charged at 1/6) and
halves the pipeline while the largest stage fits in the starting one; AutoDP turns the freed workers into
more replicas (DP = world / K). With AutoCache on, a frozen prefix past the threshold is cached: it leaves
the pipeline and costs nothing in the partition (`cached_units`). The result is the next Plan; applying it
(moving weights and optimizer state, rebuilding groups and stages, resharding the samples) is the trainer's
job. Every input here is identical on every rank, so every rank computes the same Plan; rank 0's is broadcast
anyway, so a disagreement could never deadlock the pipeline. When a decision falls, and when the cache stops,
is `Decisions`'.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from ptrun.auto.autocache import default_min_units
from ptrun.auto.intervals import Positions, interval_epochs
from ptrun.config import ADAPTER_SPECS, ConfigError, PtrunConfig
from ptrun.config.adapter_layers import adapted_blocks, adapted_count_below, fixed_blocks, frozen_blocks_for
from ptrun.freezing.counts import blocks_of_units, frozen_units_for_blocks
from ptrun.freezing.policies import make_policy
from ptrun.freezing.policy import FreezePolicy
from ptrun.layout.autopipe import next_plan, starting_max
from ptrun.layout.first import first_plan, param_costs, starting_microbatches
from ptrun.layout.partition import REPARTITION
from ptrun.layout.plan import Plan
from ptrun.parallel.profile import UnitProfile

Decide = Callable[[int, Plan, Sequence[float] | None], Plan]
"""A decision made in place of the controller's (a benchmark's or a test's), with `Controller.decide`'s
arguments: the freeze interval about to start, the plan in force and what the policy's measure measured over
the interval that ended (None: nothing) -> the plan to train the interval in (the same on every rank)."""

AllSum = Callable[[torch.Tensor], torch.Tensor]
"""The sum over every rank of the job."""


class Controller:
    def __init__(
        self,
        cfg: PtrunConfig,
        num_blocks: int,
        param_costs: Sequence[float],
        first: Plan,
        partition_kwargs: dict[str, Any] | None = None,
        microbatch_table: Mapping[int, int] | None = None,
        steps_per_epoch: int | None = None,
        max_cached_units: int | None = None,
    ):
        self.cfg = cfg
        fr = cfg.freeze
        name = fr.policy if cfg.auto.freeze else "none"
        self.num_blocks = num_blocks
        self.adapted = trained_blocks(cfg, num_blocks)
        """The blocks that train (every block, or those `adapter.layers` gives adapters), lowest first: the
        blocks the policy counts. Below the lowest, the blocks are frozen from the start (`start`)."""
        self.interval_epochs: Fraction = interval_epochs(fr.every, fr.every_steps, steps_per_epoch)
        """The interval between decisions in epochs, exact (`freeze.every`, or `freeze.every_steps` over an
        epoch's steps): the same fraction the trainer and the simulator place decisions with."""
        self.policy: FreezePolicy = make_policy(
            name,
            len(self.adapted),
            alpha=fr.alpha,
            every=self.interval_epochs,
            max_fraction=fr.max_fraction,
            start=fr.start,
            total_epochs=cfg.train.epochs,
            blocks=fr.blocks,
            percentile=fr.percentile,
            threshold=fr.threshold,
        )
        self.param_costs = list(param_costs)
        self.method = REPARTITION.get(cfg.pipe.partition, cfg.pipe.partition)
        self.partition_kwargs = partition_kwargs or {}
        self.start_max = starting_max(
            self.param_costs, first.pp, first.stages_per_rank, self.method, **self.partition_kwargs
        )
        self.per_pipeline_batch = cfg.train.global_batch_size // first.dp
        self.min_cache_units = cfg.cache.min_frozen_units or default_min_units(num_blocks)
        self.max_cached_units = first.num_units if max_cached_units is None else max_cached_units
        """The deepest prefix an entry can hold: `LayeredModel.sequence_units` (None given: every unit)."""
        self.caching = cfg.auto.cache
        """Whether plans cache the frozen prefix: `auto.cache`, until the run measures the cache slower than
        recomputing the prefix (`stop_caching`)."""
        self.first = first
        """The layout the run starts in (`start`)."""
        self.microbatch_table: dict[int, int] = dict(microbatch_table or cfg.auto.microbatch_table)
        """M per pipeline length for AutoPipe's picks: `auto.microbatch_table`, or with `pipe.microbatches=auto`
        the measured table (with the explicit entries laid over it)."""

    @property
    def measure(self) -> str | None:
        """What the trainer measures for the policy over each interval (`FreezePolicy.measure`): `grad_norms`,
        `weight_change`, or None."""
        return self.policy.measure

    def global_batch(self, plan: Plan) -> int:
        """The global batch under `plan`'s DP width (it grows with DP under `fixed_per_pipeline`)."""
        if self.cfg.auto.batch == "fixed_per_pipeline":
            return self.per_pipeline_batch * plan.dp
        return self.cfg.train.global_batch_size

    def cached_units_for(self, frozen_units: int) -> int:
        """AutoCache's depth for a frozen prefix: all of it once it reaches the threshold (at most the units
        whose outputs hold every token), else none."""
        depth = min(frozen_units, self.max_cached_units)
        if not self.caching or depth < self.min_cache_units:
            return 0
        return depth

    def plan_for(self, current: Plan, frozen_blocks: int, world_size: int) -> Plan:
        """The layout for `frozen_blocks` frozen blocks, starting from `current` (pure)."""
        frozen_units = frozen_units_for_blocks(frozen_blocks)
        if frozen_units == current.frozen_units and world_size == current.world_size:
            return current
        cached = self.cached_units_for(frozen_units)
        if not self.cfg.auto.pipe:
            # the stages stay; the cache may serve at most what leaves the first stage a unit to run
            cached = min(cached, current.stage_bounds[0][1] - 1)
            return replace(current, frozen_units=frozen_units, cached_units=cached).check()
        plan = partial(
            next_plan,
            current,
            frozen_units,
            self.param_costs,
            world_size=world_size,
            start_max=self.start_max,
            global_batch=self.cfg.train.global_batch_size,
            batch_policy=self.cfg.auto.batch,
            per_pipeline_batch=self.per_pipeline_batch,
            partition_method=self.method,
            compress=self.cfg.auto.dp,
            table=self.microbatch_table,
            **self.partition_kwargs,
        )
        # Too few uncached units for the pipeline: cache a shorter prefix (one unit left per stage), or none.
        shorter = min(cached, current.num_units - current.num_stages)
        for depth in dict.fromkeys(d for d in (cached, shorter) if d >= self.min_cache_units):
            try:
                return plan(cached_units=depth)
            except ConfigError:
                pass
        return plan(cached_units=0)

    def decide(self, interval: int, current: Plan, measured: Sequence[float] | None) -> Plan:
        """Before `interval` (at the end of the one before it): the freeze decision on the finished interval's
        `measure` (None: not measured), then the next Plan; agreed by broadcast. The policy counts the blocks
        that train (`adapted`) and reads their measure alone; a block without adapters freezes with the
        trained block below it."""
        below = adapted_count_below(self.adapted, blocks_of_units(current.frozen_units))
        ours = None if measured is None else [measured[b] for b in self.adapted]
        count = self.policy.decide(interval, below, ours)
        frozen_blocks = frozen_blocks_for(self.adapted, count, self.num_blocks)
        plan = self.plan_for(current, frozen_blocks, current.world_size)
        if dist.is_initialized() and dist.get_world_size() > 1:
            box = [plan.to_dict()]
            dist.broadcast_object_list(box, src=0)
            plan = Plan.from_dict(box[0])
        return plan

    def stop_caching(self, current: Plan) -> Plan:
        """From now on no plan caches; returns `current` without its cached prefix (the same layout)."""
        self.caching = False
        return replace(current, cached_units=0).check()

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "caching": self.caching}

    def load_state_dict(self, state: dict) -> None:
        if state.get("policy"):
            self.policy.load_state_dict(state["policy"])
        self.caching = self.caching and state.get("caching", True)


def start(
    cfg: PtrunConfig,
    layered,
    world_size: int,
    *,
    profile: UnitProfile | None = None,
    bandwidth: float | None = None,
    microbatch_table: Mapping[int, int] | None = None,
    first_microbatches: int | None = None,
    steps_per_epoch: int | None = None,
) -> Controller:
    """The one start, for the trainer and `ptrun plan` alike: the first Plan (`Controller.first`) from the
    config, the model's units and, for the time-based partitioners, their profile on one micro-batch and the
    stage link's bandwidth; and the Controller that re-plans from it the same way. `microbatch_table` is the
    M per pipeline length for AutoPipe's picks (`pipe.microbatches=auto`: the measured M, with the entries of
    `auto.microbatch_table` laid over it, which apply after a change) and `first_microbatches` the first plan's
    M where it was measured; `steps_per_epoch` turns `freeze.every_steps` into the policy's interval in epochs."""
    table = microbatch_table or cfg.auto.microbatch_table
    m = first_microbatches or starting_microbatches(cfg.pipe, world_size, cfg.train.global_batch_size, table)
    first = first_plan(cfg.pipe, layered, world_size, profile=profile, bandwidth=bandwidth, microbatches=m)
    partition_kwargs = (
        {}
        if profile is None
        else dict(time_costs=profile.time_s, activation=profile.activation_bytes, bandwidth=bandwidth)
    )
    controller = Controller(
        cfg,
        layered.num_blocks,
        param_costs(layered),
        first,
        partition_kwargs,
        microbatch_table,
        steps_per_epoch,
        max_cached_units=layered.sequence_units,
    )
    fixed = fixed_blocks(controller.adapted)
    if fixed:  # nothing below the lowest adapter trains: frozen (and cached where it pays) from the first step
        controller.first = controller.plan_for(first, fixed, world_size)
    return controller


def trained_blocks(cfg: PtrunConfig, num_blocks: int) -> tuple[int, ...]:
    """The blocks whose weights train under `cfg`, lowest first: every block, or under adapters those
    `adapter.layers` names."""
    lora = not ADAPTER_SPECS[cfg.adapter.name].trains_base
    return adapted_blocks(cfg.adapter.layers if lora else None, num_blocks)


class Decisions:
    """When the controller decides, and when the cache stops: the trainer asks before each segment of steps
    (`due`) and at each epoch's end (`cache_stop`); moving to what is decided is the trainer's.

    It holds the freeze policy's measurement (`ptrun.freezing.measures`): taken over each interval, read at
    its decision, begun again once the next interval's layout is in place (`interval_begins`)."""

    def __init__(self, controller: Controller, measurement, all_sum: AllSum, decide: Decide | None = None):
        self.controller, self.measurement, self.all_sum = controller, measurement, all_sum
        self.decide = decide
        """A decision in place of the controller's (None: the controller's)."""

    def due(
        self, positions: Positions, epoch: int, position: int, interval: int, steps: int, current: Plan
    ) -> tuple[int, Plan] | None:
        """Collective, before step `position` of `epoch`, with freeze interval `interval` in force for `steps`
        steps and `current` the plan: if an interval has ended since, the interval now beginning and the plan
        decided for it on what the measurement found (None: no decision falls here)."""
        now = positions.interval_at(epoch, position)
        if now <= interval:
            return None
        measured = self.measurement.measure(self.all_sum, steps)
        decide = self.decide or self.controller.decide
        return now, decide(now, current, measured)

    def interval_begins(self) -> None:
        """The next interval is measured from here, in the layout it trains in."""
        self.measurement.begin()

    def cache_stop(self, cache, plan: Plan) -> tuple[str, Plan] | None:
        """Collective, at an epoch boundary: when the epoch served cached samples more slowly than recomputing
        their frozen prefix would have taken, the line that says so and the same layout without a cached
        prefix (no plan caches from here on); None when the cache paid or cannot be told."""
        costs = serving_costs(cache, plan, self.all_sum)
        if costs is None or costs[0] <= costs[1]:
            return None
        line = (
            f"AutoCache off: serving a cached sample took {costs[0] * 1e3:.3f} ms, recomputing its "
            f"{plan.cached_units} frozen units {costs[1] * 1e3:.3f} ms; the frozen prefix runs in the first "
            f"stage from here on"
        )
        return line, self.controller.stop_caching(plan)


def serving_costs(cache, plan: Plan, all_sum: AllSum) -> tuple[float, float] | None:
    """Collective: (seconds to serve one cached sample, seconds to recompute its frozen prefix), summed over
    the workers, when this epoch read hits from the cache and the run has timed the prefix; else None. A
    hit's cost is the host's reading of an entry (per entry looked up); recomputing is the measured time per
    unit and row of the frozen units the cache ran (on misses), times the units a hit saves."""
    read_s, rows, hits, compute_s, unit_rows = all_sum(cache.costs()).tolist()
    if not (plan.cached_units and hits and unit_rows):
        return None
    return read_s / rows, compute_s / unit_rows * plan.cached_units
