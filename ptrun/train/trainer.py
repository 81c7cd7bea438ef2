"""The training loop of one worker: build data, model, plan and stages; train epochs; evaluate; checkpoint;
and at the end of every freeze interval (each epoch boundary by default; any step with `freeze.every` < 1)
let the controller freeze, repartition and widen data parallelism, in the running job.

Each worker builds the model without storage and fills only its stages' units; the layout is a Plan value,
and a transition moves only the units that change hands. Read `train_epoch` first: its loop takes each step's
forward and backward passes from the runtime (`runtime.train_steps`, an iterator), applies the update
(`ptrun.train.step.train_step`), counts the step (`_count`) and does what is due after it (`_after_step`).
The start (`startup.py`), checkpoints (`checkpointing.py`), evaluation (`evaluation.py`) and the epoch's
extra statistics (`stats.py`) are plain functions this class calls; the run's position is one `TrainState`.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from ptrun.auto.autodp import Layout, build_layout, change_layout, gather_to
from ptrun.auto.intervals import Positions, epoch_steps
from ptrun.auto.residency import held_units, release_unheld
from ptrun.config import PtrunConfig
from ptrun.data import EpochSampler, build_datasets
from ptrun.models import build_model
from ptrun.models.export import export_model
from ptrun.models.lazy import init_units
from ptrun.models.losses import WeightedLoss, batch_denominator
from ptrun.parallel.pipeline import Step
from ptrun.parallel.plan import Plan
from ptrun.parallel.precision import LossScaler, compute_dtype
from ptrun.report.savings import run_savings
from ptrun.train import checkpointing, faults, startup, stats
from ptrun.train.classes import agree_on_classes, check_resumed_classes
from ptrun.train.evaluation import evaluate
from ptrun.train.feed import Feed
from ptrun.train.recorders import StepRecorders
from ptrun.train.report import MetricsLog, ProgressView, done_line, epoch_line, start_line, transition_line
from ptrun.train.signals import held_blocks, make_signal
from ptrun.train.state import EpochSums, TrainState
from ptrun.train.step import StepParts, Update, train_step
from ptrun.train.stop import Interrupted, StopRequests

log = logging.getLogger(__name__)

Decide = Callable[["Trainer", int], Plan]
"""A decision made in place of the controller's (a benchmark's or a test's): the trainer and the freeze interval
about to start -> the plan to train it in (the same on every rank)."""


class Trainer:
    def __init__(self, cfg: PtrunConfig, rank: int, world_size: int, device: torch.device, resume: bool,
                 stops: StopRequests | None = None, decide: Decide | None = None,
                 start_clock: stats.StartClock | None = None):
        self.rank, self.world_size, self.device = rank, world_size, device
        self.start_clock = start_clock = start_clock or stats.StartClock()
        self.decide, self.is_main = decide, rank == 0
        # Ctrl-C / SIGTERM, recorded by the worker's handlers: the loop stops where every rank agrees to.
        self.stops = stops or StopRequests()
        self.announced = False  # the start event written: from here on the run has a record to continue
        self.data = build_datasets(cfg.data, task=cfg.model.task)
        # Every rank maps labels to the same indices, and a resume keeps the indices the run began with.
        agree_on_classes(self.data.class_names)
        if resume:
            check_resumed_classes(self.data.class_names, cfg.run_dir)
        start_clock.lap("data")
        torch.manual_seed(cfg.train.seed)  # identical per-unit initial values on every rank
        # No unit has values yet: a worker fills its own stages' units once it knows its layout (apply_plan).
        self.layered = build_model(cfg.model, num_classes=self.data.num_classes, img_size=self.data.image_size,
                                   in_chans=self.data.in_chans, vocab_size=self.data.vocab_size, units=())
        self.param_name = {id(p): n for n, p in self.layered.model.named_parameters()}
        # `pipe.length=auto` and an unset micro-batch count need the model and the devices: filled here, once.
        cfg, self.length_choice = startup.fill_length(cfg, self.layered, self.data, world_size, device)
        self.cfg = cfg
        start_clock.lap("model")
        self.loss = WeightedLoss(cfg.model.task)
        self.compute_dtype = compute_dtype(cfg.train.precision)
        self.scaler = LossScaler(enabled=cfg.train.precision == "fp16")
        self.builder = startup.make_builder(cfg, self.layered, self.data, rank, device, self.loss, self.param_name)
        """What this worker's layouts are built from (the same for every Plan)."""
        self.pin_memory = device.type == "cuda" and cfg.device.pin_memory
        batch, seed = cfg.train.global_batch_size, cfg.train.seed
        self.train_sampler = EpochSampler(len(self.data.train), batch, seed)
        self.eval_sampler = EpochSampler(len(self.data.eval), batch, seed, shuffle=False)
        base_steps = self._epoch_steps()
        self.positions = Positions(base_steps, base_steps, cfg.freeze.every, cfg.freeze.every_steps, cfg.auto.freeze)
        self.total_steps = cfg.train.epochs * base_steps
        self.controller, self.tuning = startup.start_controller(cfg, self.layered, self.builder, self.data,
                                                                self.train_sampler, world_size, base_steps)
        start_clock.lap("controller")
        self.state = TrainState()
        # What the freeze policy reads at a decision, measured over the open interval (`ptrun.train.signals`).
        self.signal = make_signal(self.controller.signal, self.layered.num_blocks, device)
        self.cache, self.plain_train = None, self.data.train
        if cfg.auto.cache:
            self.cache, self.plain_train = startup.make_cache(cfg, self.layered, self.data, device,
                                                              self.compute_dtype, self.is_main)
        start_clock.lap("cache")
        self.view = ProgressView(enabled=self.is_main)
        # The live view's running loss is an all-reduce, so every rank must agree that there is a view.
        self.live_view = bool(self.all_sum([float(self.view.live)]).item())
        self.recorders = StepRecorders(cfg.train.timeline_step, cfg.train.profile_step, cfg.run_dir, rank, device)
        self.clock = stats.StepClock(device)
        self.resumed_from, plan, optimizer_states = None, self.controller.first, {}
        resumed = checkpointing.resume(cfg, self.layered, self.controller, self.scaler, rank, world_size,
                                       self.positions.interval_at) if resume else None
        if resumed is not None:
            self.resumed_from, self.state, plan = resumed.path, resumed.state, resumed.plan
            optimizer_states = resumed.optimizer_states
            if self.is_main:  # rank 0 alone: the all-reduce at the decision counts it once
                self.signal.resume(self.state.progress)
        self.apply_plan(plan, optimizer_states)
        start_clock.lap("layout")
        if self.state.interval_steps == 0:  # the run starts (or resumes) where an interval begins
            self.signal.begin()
        faults.reached("start", self.state.global_step)
        # Opened once the start has succeeded: a failed one leaves no new file in the run directory.
        self.metrics = MetricsLog(cfg.run_dir, cfg.logger, cfg) if self.is_main else None

    # ---- positions ----------------------------------------------------------------------------------
    def _epoch_steps(self) -> int:
        return epoch_steps(len(self.data.train), self.train_sampler.global_batch_size,
                           self.cfg.train.max_steps_per_epoch)

    @property
    def steps_per_epoch(self) -> int:
        return self.positions.steps_per_epoch

    def _checkpoint_due(self, epoch_base: int, step: int) -> bool:
        return checkpointing.checkpoint_due(self.cfg, self.state, epoch_base, step, self.steps_per_epoch)

    @property
    def has_trained(self) -> bool:
        """Whether this process has finished a training step (its start-up is over)."""
        return self.clock.steps > 0

    # ---- layout -------------------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self.layout.plan

    @property
    def runtime(self):
        return self.layout.runtime

    def apply_plan(self, plan: Plan, optimizer_states: dict | None = None) -> None:
        """Build `plan`'s layout on this rank (the first one, or after a resume); `transition` changes it."""
        init_units(self.layered, held_units(self.layered, plan, self.rank))  # those a resume did not fill
        self._use(build_layout(self.builder, plan, optimizer_states))
        release_unheld(self.layered, plan, self.rank)  # from here on a worker holds its own stages' weights

    def transition(self, plan: Plan) -> float:
        """Apply `plan` in the running job (collective); returns its wall time in seconds."""
        t0 = time.perf_counter()
        self._use(change_layout(self.builder, self.layout, plan,
                                midway=lambda: faults.reached("transition", self.state.global_step)))
        dist.barrier()
        return time.perf_counter() - t0

    def _use(self, layout: Layout) -> None:
        self.layout = layout
        global_batch = self.controller.global_batch(self.plan)
        if global_batch != self.train_sampler.global_batch_size:
            self.train_sampler = EpochSampler(len(self.data.train), global_batch, self.cfg.train.seed)
            self.eval_sampler = EpochSampler(len(self.data.eval), global_batch, self.cfg.train.seed, shuffle=False)
        self.positions = replace(self.positions, steps_per_epoch=self._epoch_steps())
        if self.cache is not None and self.runtime.is_first:
            self.cache.set_depth(self.plan.cached_units, startup.first_sample(self.data, self.layered.input_names))
        caching = self.cache is not None and self.plan.cached_units > 0 and self.runtime.is_first
        replica, dp = (0, 1) if len(self.plan.lanes(self.rank)) > 1 else (self.plan.coords(self.rank)[0], self.plan.dp)
        self.feed = Feed(self.data, self.plain_train, self.cache if caching else None, self.train_sampler,
                         self.eval_sampler, replica, dp, self.device, self.layered.input_names, self.cfg.model.task,
                         self.pin_memory)
        # Replica 0 of each stage measures its blocks: the replicas agree.
        self.signal.hold(held_blocks(self.layered, self.runtime.unit_indices, self.plan.coords(self.rank)[0] == 0))
        self.step_parts = StepParts(self.runtime, layout.optimizer, self.scaler, self.cfg.optim,
                                    self.cfg.train.grad_clip, self.total_steps, self.signal.grad_norms_of,
                                    self.layered.num_blocks)
        """What this layout's steps are updated with (`ptrun.train.step.train_step`)."""

    def all_sum(self, values: list[float] | torch.Tensor) -> torch.Tensor:
        return stats.all_sum(values, self.device)

    # ---- batches ------------------------------------------------------------------------------------
    def _steps(self, start: int, end: int, epoch_base: int):
        """Steps `start .. end - 1` of the epoch as the runtime takes them (built as it pulls them, so a
        checkpoint's due date sees every update before it)."""
        for step, batch in self.feed.batches("train", self.state.epoch, start, end):
            self.recorders.begin(self.runtime, epoch_base + step)
            inputs, target = self.feed.inputs_and_target(batch, "train")
            indices, weights = self.train_sampler.global_batch(self.state.epoch, step)
            denominator = batch_denominator(self.data.train, indices, weights, self.cfg.model.task)
            self.clock.step_begins()
            # An asynchronous pipeline drains before a mid-epoch checkpoint: it holds every update up to its step.
            yield Step(step, inputs, target, denominator, float(weights.sum()), loss_scale=self.scaler.scale,
                       drain_after=self._checkpoint_due(epoch_base, step), extra=batch)

    # ---- train --------------------------------------------------------------------------------------
    def train_epoch(self) -> dict:
        """One epoch from where it resumes, in segments between the freeze decisions that fall inside it (one
        segment with whole-epoch intervals); returns the epoch event's statistics (`fit` adds the cache's
        counters once the epoch's evaluation has counted its own)."""
        state, batch = self.state, self.train_sampler.global_batch_size
        start = checkpointing.resume_step(state.step_in_epoch, state.global_batch, batch)
        if start != state.step_in_epoch and self.is_main:
            log.warning("the global batch changed from %d to %d on resuming: epoch %d restarts at step %d "
                        "(%d samples of it are trained twice)", state.global_batch, batch, state.epoch, start,
                        state.step_in_epoch * state.global_batch - start * batch)
        # Sums over the epoch; a resumed epoch starts from the checkpoint's (held by rank 0 alone, so the
        # all-reduce at the end counts them once).
        progress = state.progress if start else {}
        carried = progress if self.is_main else {}
        sums = EpochSums(
            loss=carried.get("loss_sum", torch.zeros(1, dtype=torch.float64))[0].to(self.device),
            # How often each training sample was used this epoch (counted on each replica's first stage).
            seen=carried.get("seen", torch.zeros(len(self.data.train), dtype=torch.float64)).clone(),
            samples_before=float(progress["samples"][0]) if "samples" in progress else 0.0)
        state.progress, state.step_in_epoch, state.global_batch = {}, 0, batch
        epoch_base = state.global_step - start  # the global step before this epoch's step 0
        skipped_before = self.scaler.skipped
        self.view.start_epoch(state.epoch, self.cfg.train.epochs, self.steps_per_epoch)
        position = start
        while position < self.steps_per_epoch:
            self._decide(position)  # a decision inside the epoch (or one a resume has not made yet)
            if position > start and self._checkpoint_due(epoch_base, position - 1):
                # the checkpoint due at the segment's last step, written after the decision: a restart resumes
                # in the new layout, at this step
                self.save_checkpoint(sums.so_far(self.all_sum), step_in_epoch=position)
            end = self.positions.segment_end(state.epoch, position)
            for item, loss in self.runtime.train_steps(self._steps(position, end, epoch_base)):
                self.recorders.end(self.runtime, self.plan, self.state.global_step)
                progress = self.positions.progress(state.epoch, item.step)  # the schedule's clock
                self.state, done = train_step(self.state, progress, self.step_parts)
                self._count(sums, item, loss, done)
                self._after_step(sums, item.step, end, epoch_base)
            self.clock.pause()  # the next step's time is not a step's: a decision comes first
            position = end
        elapsed = time.perf_counter() - sums.t0
        self.stops.settle()  # the stop all-reduce in flight ends before the epoch's own collectives
        self.view.end_epoch()
        steps = self.steps_per_epoch
        seen = self.all_sum(sums.seen)
        resumed = {"resumed_at_step": start} if start else {}
        return {"train_loss": self.all_sum(sums.loss).item() / steps, "samples_per_s": sums.samples / elapsed,
                "epoch_time_s": elapsed, "lr": sums.lr, "steps": steps, "signal_s": sums.signal_s,
                "samples": int(sums.samples_before + sums.samples), **resumed,
                "sample_uses_min": int(seen.min().item()), "sample_uses_max": int(seen.max().item()),
                **stats.scaler_stats(self.scaler, skipped_before), **stats.stash_stats(self.runtime, self.device),
                **stats.memory_stats(self.layered, self.layout, self.rank, self.device), **self.clock.epoch_fields()}

    def _count(self, sums: EpochSums, item: Step, loss: torch.Tensor | None, done: Update) -> None:
        """A step's bookkeeping: the first steps' end times, the freeze signal, the epoch's sums."""
        self.clock.step_ended()
        t0 = time.perf_counter()
        self.signal.after_step(done)
        sums.signal_s += done.signal_s + time.perf_counter() - t0
        if loss is not None:
            sums.loss += loss.double()
        sums.lr = done.lr
        sums.samples += item.samples
        if self.runtime.is_first:
            sums.seen.index_add_(0, item.extra["index"], item.extra["weight"].double())

    def _after_step(self, sums: EpochSums, step: int, segment_end: int, epoch_base: int) -> None:
        """What is due after step `step` of the epoch: a fault point, a mid-epoch checkpoint, a stop, the live
        view."""
        faults.reached("step", self.state.global_step)
        # A stop is decided between the steps of a synchronous runtime; an asynchronous one has later steps
        # in flight, so it stops at the epoch's end (in `fit`).
        stop = not self.runtime.asynchronous and self.stops.poll() and step + 1 < self.steps_per_epoch
        # A checkpoint due where a decision falls is written after it (`train_epoch`), in the new layout.
        if (self._checkpoint_due(epoch_base, step) and step + 1 < segment_end) or stop:
            self.save_checkpoint(sums.so_far(self.all_sum), step_in_epoch=step + 1)
        if stop:
            raise Interrupted(self.stops.agreed)
        if (step + 1) % self.cfg.train.log_every_steps == 0 and self.live_view:
            running = self.all_sum(sums.loss).item() / (step + 1)
            self.view.update(step + 1, running, sums.samples / (time.perf_counter() - sums.t0))

    def evaluate(self) -> dict:
        """Collective: the eval split's metrics."""
        batches = ((batch, *self.feed.inputs_and_target(batch, "eval")) for _, batch in self.feed.batches("eval"))
        return evaluate(self.runtime, batches, self.data, self.cfg.model.task, self.device, self.is_main)

    # ---- checkpoints --------------------------------------------------------------------------------
    def save_checkpoint(self, progress: dict[str, torch.Tensor] | None = None, step_in_epoch: int = 0) -> None:
        """Collective. At an epoch boundary (`step_in_epoch` 0), or mid-epoch after `step_in_epoch` steps with
        the epoch's sums so far (`progress`, already summed over the ranks). What the freeze signal has
        measured of the open interval goes with it either way (an interval may span a boundary)."""
        position = replace(self.state, step_in_epoch=step_in_epoch, global_batch=self.train_sampler.global_batch_size,
                           progress={**(progress or {}), **self.signal.progress(self.all_sum)})
        checkpointing.save(self.cfg, self.layered, self.layout, position, self.rank, controller=self.controller,
                           scaler=self.scaler, param_name=self.param_name)
        self.state.last_checkpoint_step = self.state.global_step

    # ---- the run ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train the remaining epochs; at each boundary let the controller change the layout, checkpoint, and
        stop there if asked to. Returns the final eval."""
        cfg = self.cfg
        # A stop asked for while the workers started (a signal, or the agent re-forming the job for machines
        # that joined or left) ends them before they train: nothing is recorded, the run goes on from where it
        # was when they started.
        if self.stops.now():
            raise Interrupted(self.stops.agreed)
        self._announce()
        tuned = self.tuning.event_fields() if self.tuning is not None else {}  # on this process's first plan
        t_start = time.perf_counter()
        moved: dict = {}  # the last transition's cost, on the plan event of the epoch it led into
        self.view.show_layout(self.plan, self.layered.unit_names)
        while self.state.epoch < cfg.train.epochs:
            # A decision still due where the run resumes (the last boundary of a finished run given more
            # epochs, or a step a stop interrupted before its decision) comes first.
            moved = self._decide(self.state.step_in_epoch, announce=False) or moved
            self._event("plan", epoch=self.state.epoch, step=self.state.step_in_epoch, **{"transition_s": 0.0, **moved},
                        **self.plan.to_dict(), **tuned)
            tuned = {}
            epoch_stats = self.train_epoch()
            last = self.state.epoch == cfg.train.epochs - 1
            t_eval = time.perf_counter()
            ev = self.evaluate() if last or (self.state.epoch + 1) % cfg.train.eval_every_epochs == 0 else {}
            epoch_stats["eval_time_s"] = time.perf_counter() - t_eval if ev else 0.0
            self.state.remember(ev)
            epoch_stats.update(stats.cache_stats(self.cache, self.plan, self.device))  # training's and eval's
            epoch_stats.update(stats.compile_stats(self.builder.compiler))
            self._event("epoch", epoch=self.state.epoch, eval=ev, **epoch_stats)
            self.view.print(epoch_line(self.state.epoch, cfg.train.epochs, epoch_stats, ev, self.plan))
            self.state.epoch += 1
            stopped = {} if last else self._stop_caching_if_slower()
            # The boundary: decide the next layout and move to it before the checkpoint, so a restart resumes
            # in the layout the next epoch was meant to run in.
            moved = {} if last else (self._decide(0, announce=False) or stopped)
            if checkpointing.boundary_due(cfg, self.state, last):
                self.save_checkpoint()
            if not last and self.stops.now():
                if self.state.last_checkpoint_step != self.state.global_step:
                    self.save_checkpoint()
                raise Interrupted(self.stops.agreed)
        total = time.perf_counter() - t_start
        self.recorders.close()
        if cfg.train.export:
            self.export()
        self._release_cache()
        saved = run_savings(self.cfg.run_dir) if self.metrics is not None else None
        if saved is not None:
            self._event("savings", **saved.event_fields())
        self._event("end", epochs=cfg.train.epochs, total_time_s=total, final_eval=self.state.last_eval,
                    best_eval=self.state.best_eval)
        self.view.print(done_line(cfg.train.epochs, total, self.state.last_eval, cfg.run_dir))
        if saved is not None:
            self.view.print(saved.line())
        return self.state.last_eval

    def _event(self, event: str, **fields) -> None:
        """A record in metrics.jsonl (and the trackers); rank 0 keeps them."""
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    def _announce(self) -> None:
        """The start event and the terminal's first lines."""
        cfg = self.cfg
        self.announced = True
        start = dict(world_size=self.world_size, recipe=cfg.recipe, model=cfg.model.name,
                     num_units=len(self.layered.units), num_blocks=self.layered.num_blocks,
                     params=sum(s.numel() for s in self.layered.param_shapes.values()),
                     train_samples=len(self.data.train), eval_samples=len(self.data.eval),
                     resumed_from=self.resumed_from, device=str(self.device), precision=cfg.train.precision)
        self._event("start", **start, worker_start_time=self.start_clock.began, start_phases=self.start_clock.phases)
        self.view.print(start_line(start, cfg.run_dir))
        for choice in (self.length_choice, self.tuning, self.builder.compiler):  # the last: what compiling cost
            if choice is not None:
                self.view.print(choice.summary())

    def _decide(self, position: int, announce: bool = True) -> dict:
        """Collective, before step `position` of the epoch: if a freeze interval has ended since the last
        decision, the controller's decision on what its policy's signal measured over it, moved to if it
        changes the layout (`announce`: a `plan` event for a change inside an epoch; the epoch's own start
        writes one at a boundary); then the next interval's measurement begins. Returns the transition's cost
        for that event: its seconds and the bytes moved between the workers (nothing when nothing was decided
        or the layout stays)."""
        state = self.state
        interval = self.positions.interval_at(state.epoch, position)
        if interval <= state.interval:
            return {}
        measured = self.signal.measure(self.all_sum, state.interval_steps)
        state.interval, state.interval_steps = interval, 0
        plan = self.decide(self, interval) if self.decide else self.controller.decide(interval, self.plan, measured)
        cost = self._move_to(plan, position, announce) if plan != self.plan else {}
        self.signal.begin()  # the next interval is measured from here, in the layout it trains in
        return cost

    def _stop_caching_if_slower(self) -> dict:
        """Collective, at an epoch boundary: if the epoch served cached samples more slowly than recomputing
        their frozen prefix would have taken, no plan caches from here on (one line says so) and the layout
        moves to the same one without a cached prefix; returns that transition's cost (nothing otherwise)."""
        slower = stats.cache_slower(self.cache, self.plan, self.device) if self.cache is not None else None
        if slower is None:
            return {}
        self.view.print(slower)
        return self._move_to(self.controller.stop_caching(self.plan), 0, announce=False)

    def _move_to(self, plan: Plan, position: int, announce: bool) -> dict:
        """Collective: the transition to a decided `plan` before step `position`, shown and (`announce`)
        recorded; returns its cost for the `plan` event."""
        old, transition_s = self.plan, self.transition(plan)
        cost = {"transition_s": transition_s, "moved_bytes": int(self.all_sum([self.layout.received_bytes]).item()),
                **self.layout.compiled}  # compiling the new layout's units, part of the transition's seconds
        self.view.print(transition_line(self.state.epoch, old, plan, transition_s, position, self.clock.step_s,
                                        cost.get("compile_s")))
        self.view.show_layout(plan, self.layered.unit_names)
        if announce:
            self._event("plan", epoch=self.state.epoch, step=position, **cost, **plan.to_dict())
        return cost

    def _release_cache(self) -> None:
        """Collective: the cache's shared memory and files go (unless `cache.keep`) once every worker is done."""
        if self.cache is not None:
            dist.barrier()  # every worker is done with the cache before one per node deletes it
            self.cache.close(remove=not self.cfg.cache.keep and int(os.environ.get("LOCAL_RANK", "0")) == 0)
            self.cache = None

    def stopped(self, signum: int) -> None:
        """Collective, after `fit` raised Interrupted (its checkpoint written): release what the run holds
        outside its directory and record where it stopped (if it had started training)."""
        self.view.end_epoch()
        self._release_cache()
        if self.announced:
            self._event("stopped", signal=signal.Signals(signum).name, epoch=self.state.epoch,
                        global_step=self.state.global_step, checkpoint_step=self.state.last_checkpoint_step)

    def export(self) -> None:
        """Collective: rank 0 gathers every unit from its owner and writes the model in the library's format."""
        gather_to(self.layered, self.plan, 0, self.device)
        if self.is_main:
            out = export_model(self.layered, Path(self.cfg.run_dir) / "model", self.cfg.data.tokenizer,
                               class_names=self.data.class_names)
            library = "timm" if self.layered.family == "vit" else "transformers"
            self.view.print(f"model saved for {library} without ptrun: {out}")

    def close(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        if getattr(self, "layout", None) is not None:
            self.layout.groups.destroy()
