"""The plan a worker trains in, with everything made from it: AutoDP's `Engine` (process groups, this rank's
stages and runtime, its optimizer), the samplers of its global batch and its epochs' positions, the feed of
its batches (raw, or from AutoCache at the plan's cached depth), the blocks the freeze measurement reads on this
rank and what its updates are made with. `switch_to(plan)` changes all of them in one call."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch.distributed as dist

from ptrun.auto.autodp import Builder, Engine, build_engine, change_engine
from ptrun.auto.intervals import Positions, epoch_steps
from ptrun.auto.residency import held_units, release_unheld, unheld_bytes
from ptrun.compiling.in_run import Compiling
from ptrun.config import PtrunConfig
from ptrun.data import EpochSampler
from ptrun.data.splits import first_sample
from ptrun.freezing.measures import held_blocks
from ptrun.layout.plan import Plan
from ptrun.models.lazy import init_units
from ptrun.train import fault_injection
from ptrun.train.divergence import DivergenceWatch
from ptrun.train.epoch_stats import WARM_UP_STEPS
from ptrun.train.feed import Feed
from ptrun.train.step import StepParts


class PlanInUse:
    """This rank's plan in use and what follows from it: its engine, samplers, positions, feed and step parts.
    The samplers follow the plan's global batch (which grows with DP under `auto.batch=fixed_per_pipeline`), the
    positions their epoch's steps."""

    def __init__(
        self,
        cfg: PtrunConfig,
        builder: Builder,
        data,
        plain_train,
        cache,
        measurement,
        scaler,
        global_batch: Callable[[Plan], int],
        divergence: DivergenceWatch | None = None,
    ):
        self.cfg, self.builder, self.data, self.plain_train = cfg, builder, data, plain_train
        self.cache, self.measurement, self.scaler, self.global_batch = cache, measurement, scaler, global_batch
        self.divergence = divergence
        """What watches each step's global gradient norm for divergence (None: nothing does)."""
        batch, seed = cfg.train.global_batch_size, cfg.train.seed
        self.train_sampler = EpochSampler(len(data.train), batch, seed)
        self.eval_sampler = EpochSampler(len(data.eval), batch, seed, shuffle=False)
        base_steps = self._epoch_steps()
        self.positions = Positions(base_steps, base_steps, cfg.freeze.every, cfg.freeze.every_steps, cfg.auto.freeze)
        """The positions of this plan's steps (`Positions.base_steps`: the first plan's, the schedule's)."""
        self.total_steps = cfg.train.epochs * base_steps
        self.engine: Engine | None = None
        self.feed: Feed | None = None
        """Where this plan's batches come from on this rank."""
        self.step_parts: StepParts | None = None
        """What this plan's steps are updated with (`ptrun.train.step.train_step`)."""
        self.compiling = Compiling(cfg, builder.layered, data, builder.device, builder.rank, 2 * WARM_UP_STEPS)
        """`train.compile`'s decisions: the builder compiles or not from each on."""

    @property
    def plan(self) -> Plan:
        return self.engine.plan

    @property
    def runtime(self):
        return self.engine.runtime

    def _epoch_steps(self) -> int:
        return epoch_steps(
            len(self.data.train), self.train_sampler.global_batch_size, self.cfg.train.max_steps_per_epoch
        )

    def start(self, plan: Plan, optimizer_states: dict | None = None, steps_left: int = 0, tuning=None) -> None:
        """Collective: build `plan`'s engine on this rank (the first one, or after a resume), compiled or eager as
        `train.compile` decides, priced on the `steps_left` (and the micro-batch `tuning`'s step time of this
        plan, where it measured one); `switch_to` changes it."""
        if tuning is not None:
            self.compiling.tuned_step_s = tuning.costs.get((plan.pp, plan.microbatches))
        self.builder = self.compiling.start(self.builder, plan, steps_left)
        layered, rank = self.builder.layered, self.builder.rank
        init_units(layered, held_units(layered, plan, rank))  # those a resume did not fill
        self._use(build_engine(self.builder, plan, optimizer_states))
        release_unheld(layered, plan, rank)  # from here on a worker holds its own stages' weights

    def switch_to(self, plan: Plan, global_step: int) -> float:
        """Collective: move to `plan` in the running job (at `global_step`, for the fault point midway);
        returns its wall time in seconds."""
        t0 = time.perf_counter()
        self._use(
            change_engine(
                self.builder, self.engine, plan, midway=lambda: fault_injection.reached("transition", global_step)
            )
        )
        dist.barrier()
        return time.perf_counter() - t0

    def close(self) -> None:
        """Destroy the engine's process groups (undestroyed groups leak file descriptors and threads)."""
        self.engine.groups.destroy()

    def unheld_bytes(self) -> int:
        """This rank's bytes of parameter storage outside its stages: 0 (the plan events record the sum)."""
        return unheld_bytes(self.builder.layered, self.plan, self.builder.rank)

    def _use(self, engine: Engine) -> None:
        cfg, layered, rank = self.cfg, self.builder.layered, self.builder.rank
        self.engine, plan = engine, engine.plan
        global_batch = self.global_batch(plan)
        if global_batch != self.train_sampler.global_batch_size:
            self.train_sampler = EpochSampler(len(self.data.train), global_batch, cfg.train.seed)
            self.eval_sampler = EpochSampler(len(self.data.eval), global_batch, cfg.train.seed, shuffle=False)
        self.positions = replace(self.positions, steps_per_epoch=self._epoch_steps())
        first = self.runtime.is_first
        if self.cache is not None and first:
            self.cache.set_depth(plan.cached_units, first_sample(self.data, layered.input_names))
        caching = self.cache is not None and plan.cached_units > 0 and first
        replica, dp = (0, 1) if len(plan.lanes(rank)) > 1 else (plan.coords(rank)[0], plan.dp)
        device = self.builder.device
        pin_memory = device.type == "cuda" and cfg.device.pin_memory
        self.feed = Feed(
            self.data,
            self.plain_train,
            self.cache if caching else None,
            self.train_sampler,
            self.eval_sampler,
            replica,
            dp,
            device,
            layered.input_names,
            cfg.model.task,
            pin_memory,
        )
        # Replica 0 of each stage measures its blocks: the replicas agree.
        self.measurement.hold(held_blocks(layered, self.runtime.unit_indices, plan.coords(rank)[0] == 0))
        self.step_parts = StepParts(
            self.runtime,
            engine.optimizer,
            self.scaler,
            cfg.optim,
            cfg.train.grad_clip,
            self.total_steps,
            self.measurement.grad_norms_of,
            layered.num_blocks,
            self.divergence,
        )
