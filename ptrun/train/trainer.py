"""The training loop of one worker: build data, model, plan and stages; train epochs; evaluate; checkpoint;
and at the end of every freeze interval (each epoch boundary by default; any step with `freeze.every` < 1)
let the controller freeze, repartition and widen data parallelism, in the running job.

The trainer keeps the loop and the wiring; its parts each do one job with their own state:
- `in_use` (`ptrun.train.plan_in_use.PlanInUse`): the plan in use and what is made from it, `switch_to(plan)`;
- `decisions` (`ptrun.auto.controller.Decisions`): when the controller decides and when the cache stops;
- `checkpoints` (`ptrun.train.checkpoint.checkpoints.Checkpoints`): when one is due, save, resume, keep, export;
- `record` (`ptrun.train.record.RunRecord`): events, lines, the live view, clocks, epoch statistics, savings.
Read `_train_segment` first: each step's bookkeeping before it, its passes in the runtime
(`runtime.run_step`), which calls back for each update due (`ptrun.train.step.train_step`), its counts
(`_count`) and what is due after it (`_after_step`). Then `_boundary`, the one routine every boundary runs,
after a step, between segments and epochs: decide, compile if it pays, checkpoint if due, stop if agreed. The
run's position is one `TrainState`, a value the loop replaces.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from ptrun.auto.controller import Decide, Decisions
from ptrun.compose import for_world
from ptrun.config import PtrunConfig
from ptrun.config.model import FAMILY_SPECS, model_family
from ptrun.freezing.measures import make_measurement
from ptrun.layout.fill import device_budget
from ptrun.layout.fit import UnitMemory, in_place, refusal, state_copies
from ptrun.layout.plan import Plan
from ptrun.numerics.precision import LossScaler
from ptrun.parallel.pipeline import Step
from ptrun.train import epoch_stats, startup
from ptrun.train.checkpoint.checkpoints import Checkpoints, resume_step
from ptrun.train.evaluation import evaluate
from ptrun.train.fault_injection import reached as fault_point
from ptrun.train.plan_in_use import PlanInUse
from ptrun.train.record import RunRecord
from ptrun.train.run_end import Interrupted
from ptrun.train.state import Boundary, Due, EpochSums, TrainState
from ptrun.train.step import Update, train_step
from ptrun.train.stop import StopRequests

log = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self,
        cfg: PtrunConfig,
        rank: int,
        world_size: int,
        device: torch.device,
        resume: bool,
        stops: StopRequests | None = None,
        decide: Decide | None = None,
        start_clock: epoch_stats.StartClock | None = None,
        unit_memory: UnitMemory | None = None,
    ):
        cfg = for_world(cfg, world_size)  # the launcher filled the layout: the rendezvous's world checks it
        self.cfg, self.rank, self.world_size, self.device, self.unit_memory = cfg, rank, world_size, device, unit_memory
        # Ctrl-C / SIGTERM, recorded by the worker's handlers: the loop stops where every rank agrees to.
        self.stops = stops or StopRequests()
        clock = start_clock or epoch_stats.StartClock()
        self.data = startup.load_data(cfg, resume)
        clock.lap("data")
        self.layered = startup.build_units(cfg, self.data)
        clock.lap("model")
        builder = startup.make_builder(cfg, self.layered, self.data, rank, device)
        self.scaler = LossScaler.for_precision(cfg.train.precision)
        controller, tuning = startup.start_controller(cfg, self.layered, builder, self.data, world_size)
        clock.lap("controller")
        # What the freeze policy reads at a decision, measured over the open interval (`ptrun.freezing.measures`).
        measurement = make_measurement(controller.measure, self.layered.num_blocks, device)
        self.cache, plain_train = startup.make_cache(
            cfg, self.layered, self.data, device, builder.compute_dtype, rank == 0
        )
        clock.lap("cache")
        self.decisions = Decisions(controller, measurement, self.all_sum, decide)
        self.record = RunRecord(cfg, rank, device, clock, self.all_sum, tuning)
        self.checkpoints = Checkpoints(cfg, self.layered, controller, self.scaler, rank, world_size, builder.name_of)
        self.in_use = PlanInUse(
            cfg,
            builder,
            self.data,
            plain_train,
            self.cache,
            measurement,
            self.scaler,
            controller.global_batch,
            self.stops.divergence,
        )
        self.state, plan, optimizer_states = self._resume() if resume else (TrainState(), controller.first, {})
        self.in_use.start(plan, optimizer_states, self._steps_left, tuning)
        clock.lap("layout")
        if self.state.interval_steps == 0:  # the run starts (or resumes) where an interval begins
            self.decisions.interval_begins()
        fault_point("start", self.state.global_step)
        self.record.open()  # once the start has succeeded: a failed one leaves no new file in the run directory

    def _resume(self) -> tuple[TrainState, Plan, dict]:
        """The newest checkpoint's position, plan and this rank's optimizer state (the start's without one)."""
        resumed = self.checkpoints.resume(self.in_use.positions.interval_at)
        if resumed is None:
            return TrainState(), self.controller.first, {}
        self.record.resumed_from = resumed.path
        if self.rank == 0:  # rank 0 alone: the all-reduce at the decision counts it once
            self.decisions.measurement.resume(resumed.state.progress)
        return resumed.state, resumed.plan, resumed.optimizer_states

    # ---- what the parts hold ------------------------------------------------------------------------
    @property
    def plan(self) -> Plan:
        return self.in_use.plan

    @property
    def runtime(self):
        return self.in_use.runtime

    @property
    def controller(self):
        return self.decisions.controller

    @property
    def steps_per_epoch(self) -> int:
        return self.in_use.positions.steps_per_epoch

    @property
    def has_trained(self) -> bool:
        """Whether this process has finished a training step (its start-up is over)."""
        return self.record.clock.steps > 0

    @property
    def _steps_left(self) -> int:
        return max(self.in_use.total_steps - self.state.global_step, 0)

    def all_sum(self, values: list[float] | torch.Tensor) -> torch.Tensor:
        return epoch_stats.all_sum(values, self.device)

    def _due(self, epoch_base: int, step: int, segment_end: int) -> Due:
        """What falls after `step` of the epoch, in a segment that ends before `segment_end`."""
        checkpoint = self.checkpoints.due(self.state, epoch_base, step, self.steps_per_epoch)
        return Due.of(step + 1 == segment_end, checkpoint)

    # ---- train --------------------------------------------------------------------------------------
    def train_epoch(self) -> dict:
        """One epoch from where it resumes, in segments between the freeze decisions that fall inside it (one
        segment with whole-epoch intervals); returns the epoch event's statistics (`fit` adds the cache's
        counters once the epoch's evaluation has counted its own)."""
        state, batch = self.state, self.in_use.train_sampler.global_batch_size
        start = resume_step(state.step_in_epoch, state.global_batch, batch)
        if start != state.step_in_epoch and self.rank == 0:
            log.warning(
                "the global batch changed from %d to %d on resuming: epoch %d restarts at step %d "
                "(%d samples of it are trained twice)",
                state.global_batch,
                batch,
                state.epoch,
                start,
                state.step_in_epoch * state.global_batch - start * batch,
            )
        sums = self._epoch_sums(start)
        self.state = replace(state, progress={}, step_in_epoch=0, global_batch=batch)
        epoch_base = state.global_step - start  # the global step before this epoch's step 0
        skipped_before = self.scaler.skipped
        self.record.view.start_epoch(state.epoch, self.cfg.train.epochs, self.steps_per_epoch)
        position, checkpoint = start, False
        while position < self.steps_per_epoch:
            # a decision inside the epoch (or one a resume has not made yet), then the checkpoint due where the
            # last segment ended: a restart resumes in the new layout, at this step
            self._boundary(Boundary.SEGMENT_STARTS, position, sums, checkpoint)
            end = self.in_use.positions.segment_end(state.epoch, position)
            end = self.in_use.compiling.segment_end(position, end, self.record.clock.steps)
            checkpoint = self._train_segment(sums, position, end, epoch_base).checkpoint
            position = end
        elapsed = time.perf_counter() - sums.t0
        self._boundary(Boundary.TRAINED)  # the stop all-reduce in flight ends before the epoch's own collectives
        self.record.view.end_epoch()
        extra = {
            **epoch_stats.scaler_stats(self.scaler, skipped_before),
            **epoch_stats.stash_stats(self.runtime, self.device),
            **epoch_stats.memory_stats(self.layered, self.in_use.engine, self.rank, self.device),
        }
        return self.record.epoch_stats(sums, elapsed, self.steps_per_epoch, start, self.all_sum, extra)

    def _epoch_sums(self, start: int) -> EpochSums:
        """Sums over the epoch; a resumed epoch starts from the checkpoint's (held by rank 0 alone, so the
        all-reduce at the end counts them once)."""
        progress = self.state.progress if start else {}
        carried = progress if self.rank == 0 else {}
        return EpochSums(
            loss=carried.get("loss_sum", torch.zeros(1, dtype=torch.float64))[0].to(self.device),
            # How often each training sample was used this epoch (counted on each replica's first stage).
            seen=carried.get("seen", torch.zeros(len(self.data.train), dtype=torch.float64)).clone(),
            samples_before=float(progress["samples"][0]) if "samples" in progress else 0.0,
        )

    def _train_segment(self, sums: EpochSums, start: int, end: int, epoch_base: int) -> Due:
        """Steps `start .. end - 1` of the epoch in one layout (no decision between them); returns the last's Due."""
        runtime, feed, epoch = self.runtime, self.in_use.feed, self.state.epoch
        dues: dict[int, Due] = {}  # by step, until its update is applied (PipeDream applies it steps later)

        def apply_update(item: Step, loss: torch.Tensor | None) -> None:  # the runtime calls it for each step due
            self.record.step_passed(runtime, self.plan, self.state.global_step)
            progress = self.in_use.positions.progress(epoch, item.step)  # the schedule's clock
            self.state, done = train_step(self.state, progress, self.in_use.step_parts, item.step)
            self._count(sums, item, loss, done)
            self._after_step(sums, item.step, dues.pop(item.step))

        for index, batch in feed.batches("train", epoch, start, end):
            self.record.step_begins(runtime, epoch_base + index)
            step = feed.step(epoch, index, batch)
            self.record.clock.step_begins()
            due = dues[index] = self._due(epoch_base, index, end)
            runtime.run_step(step, apply_update, self.scaler.scale, due.drain)
        runtime.pause()
        self.record.clock.pause()  # the next step's time is not a step's: a decision comes first
        return due

    def _count(self, sums: EpochSums, item: Step, loss: torch.Tensor | None, done: Update) -> None:
        """A step's bookkeeping: the first steps' end times, the freeze measure, the epoch's sums."""
        self.record.clock.step_ended()
        t0 = time.perf_counter()
        self.decisions.measurement.after_step(done)
        sums.measure_s += done.measure_s + time.perf_counter() - t0
        if loss is not None:
            sums.loss += loss.double()
        sums.lr = done.lr
        sums.samples += item.samples
        if self.runtime.is_first:
            sums.seen.index_add_(0, item.extra["index"], item.extra["weight"].double())

    def _after_step(self, sums: EpochSums, step: int, due: Due) -> None:
        """After step `step` of the epoch's update: a fault point, its boundary (what is `due`), the live view."""
        fault_point("step", self.state.global_step)
        # A stop is asked for from outside (a signal, a full disk), so it is polled here, not known in advance:
        # between the steps of a synchronous runtime; an asynchronous one has later steps in flight, so it
        # stops at the epoch's end (in `fit`), as a stop polled after the epoch's last step does.
        if self.runtime.asynchronous:
            at = Boundary.PIPELINED_STEP_ENDS
        else:
            at = Boundary.STEP_ENDS if step + 1 < self.steps_per_epoch else Boundary.LAST_STEP_ENDS
        self._boundary(at, step + 1, sums, due.checkpoint_now)
        self.record.live_update(step, sums, self.all_sum)

    def evaluate(self) -> dict:
        """Collective: the eval split's metrics."""
        feed = self.in_use.feed
        batches = ((batch, *feed.inputs_and_target(batch, "eval")) for _, batch in feed.batches("eval"))
        return evaluate(self.runtime, batches, self.data, self.cfg.model.task, self.device, self.rank == 0)

    def save_checkpoint(self, sums: EpochSums | None = None, step_in_epoch: int = 0) -> None:
        """Collective. At an epoch boundary (`step_in_epoch` 0), or mid-epoch after `step_in_epoch` steps with
        the epoch's sums so far (`sums`, summed over the ranks here), once the workers agreed on no divergence
        (`_boundary`). What the freeze measurement took of the open interval goes with it either way."""
        progress = sums.so_far(self.all_sum) if sums is not None else {}
        position = replace(
            self.state,
            step_in_epoch=step_in_epoch,
            global_batch=self.in_use.train_sampler.global_batch_size,
            progress={**progress, **self.decisions.measurement.progress(self.all_sum)},
        )
        self.checkpoints.save(self.in_use.engine, position)
        self.state = replace(self.state, last_checkpoint_step=self.state.global_step)

    # ---- the run ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train the remaining epochs, with a boundary (`_boundary`) before, between and after them; returns the
        final eval."""
        epochs = self.cfg.train.epochs
        # A stop asked for while the workers started (a signal, or the agent re-forming the job for machines that
        # joined or left) ends them before they train: nothing is recorded, the run goes on from where it was.
        self._boundary(Boundary.EPOCH_STARTS)
        compiler, decision = self.in_use.builder.compiler, self.in_use.compiling.decision
        self.record.announce(self.layered, self.data, self.world_size, self.device, self.plan, compiler, decision)
        t_start = time.perf_counter()
        # the last transition's cost, on the plan event of the epoch it led into (at the start: memory held)
        moved = epoch_stats.start_memory(self.in_use.unheld_bytes(), self.rank, self.world_size, self.device)
        while self.state.epoch < epochs:
            # A decision still due where the run resumes (the last boundary of a finished run given more
            # epochs, or a step a stop interrupted before its decision) comes first.
            moved = self._boundary(Boundary.RESUMES, self.state.step_in_epoch) or moved
            self.record.epoch_plan(self.state.epoch, self.state.step_in_epoch, moved, self.plan)
            last = self.state.epoch == epochs - 1
            self._epoch_ended(self.train_epoch(), last)
            # The next epoch's layout is decided and moved to before the checkpoint, so a restart resumes in the
            # layout that epoch was meant to run in; then it starts unless a stop is agreed.
            due = self.checkpoints.due_at_boundary(self.state, last)
            moved = self._boundary(Boundary.LAST_EPOCH_ENDS if last else Boundary.EPOCH_ENDS, 0, None, due)
            if not last:
                self._boundary(Boundary.EPOCH_STARTS)
        total = time.perf_counter() - t_start
        self.record.training_ended()
        if self.cfg.train.export:
            self.export()
        self._release_cache()
        self.record.ended(total, self.state)
        # a file one worker found no room for since the last step ends the run all the same
        self._boundary(Boundary.TRAINED)
        return self.state.last_eval

    def _epoch_ended(self, extras: dict, last: bool) -> None:
        """Collective, once an epoch's steps are trained: its evaluation where one is due (`last`: the run's
        last epoch), its event, and the state moved on to the next epoch."""
        t_eval = time.perf_counter()
        epoch = self.state.epoch
        ev = self.evaluate() if last or (epoch + 1) % self.cfg.train.eval_every_epochs == 0 else {}
        extras["eval_time_s"] = time.perf_counter() - t_eval if ev else 0.0
        self.state = self.state.remembered(ev)
        extras.update(epoch_stats.cache_stats(self.cache, self.plan, self.device))  # training's and eval's
        extras.update(epoch_stats.compile_stats(self.in_use.builder.compiler))
        self.record.epoch_ended(epoch, extras, ev, self.plan)
        self.state = replace(self.state, epoch=epoch + 1)

    def _boundary(
        self, at: Boundary, position: int = 0, sums: EpochSums | None = None, checkpoint: bool = False
    ) -> dict | None:
        """Collective, at a boundary of the loop of kind `at`, before step `position` of the epoch (`sums`: the
        epoch's so far, inside one): decide, compile if it pays, checkpoint if due (`checkpoint`), stop if
        agreed. Returns, where `at` decides, the cost of the transition made here for the next `plan` event
        (empty where the layout stays)."""
        cost = None
        if at.decides:
            stopped = self._stop_caching_if_slower() if at.stops_cache else {}
            cost = self._decide(position, at.announce) or stopped
        if at.compiles:
            self._compile_if_it_pays(position)
        stop = self.stops.at_boundary(at.polls, at.waits or checkpoint, at.stops)
        if checkpoint or (stop and self.state.last_checkpoint_step != self.state.global_step):
            self.save_checkpoint(sums, position)
        if stop:
            raise Interrupted(self.stops.agreed)
        return cost

    def _decide(self, position: int, announce: bool) -> dict:
        """Collective, before step `position` of the epoch: if a freeze interval has ended since the last
        decision, the decision on what the policy's measure found over it, moved to if it changes the layout
        (`announce`: with its own `plan` event); then the next interval's measurement begins. Returns the
        transition's cost: its seconds and the bytes moved (nothing when nothing was decided or moved)."""
        state = self.state
        decided = self.decisions.due(
            self.in_use.positions, state.epoch, position, state.interval, state.interval_steps, self.plan
        )
        if decided is None:
            return {}
        interval, plan = decided
        self.state = replace(state, interval=interval, interval_steps=0)
        plan = self._fitting(plan)
        cost = self._move_to(plan, position, announce) if plan != self.plan else {}
        self.decisions.interval_begins()
        return cost

    def _fitting(self, plan: Plan) -> Plan:
        """Collective where `plan` changes the layout: `plan`, or where it would not fit a worker's device by the
        planner's memory model, its frozen prefix in the layout in use (one line says so)."""
        if plan == self.plan or self.unit_memory is None or (plan.pp, plan.dp) == (self.plan.pp, self.plan.dp):
            return plan
        line = refusal(
            self.unit_memory,
            self.plan,
            plan,
            self.controller.global_batch(plan),
            device_budget(self.cfg, self.device),
            state_copies(self.cfg.optim.name),
        )
        if not self.all_sum([float(line is not None)]).item():  # the workers agree
            return plan
        if line is not None:
            self.record.print(line)
        return in_place(self.plan, plan)

    def _stop_caching_if_slower(self) -> dict:
        """Collective, at an epoch boundary: if the epoch served cached samples more slowly than recomputing
        their frozen prefix would have taken, no plan caches from here on (one line says so) and the layout
        moves to the same one without a cached prefix; returns that transition's cost (nothing otherwise)."""
        stop = self.decisions.cache_stop(self.cache, self.plan) if self.cache is not None else None
        if stop is None:
            return {}
        line, plan = stop
        self.record.print(line)
        return self._move_to(plan, 0, announce=False)

    def _move_to(self, plan: Plan, position: int, announce: bool) -> dict:
        """Collective: the transition to a decided `plan` before step `position`, shown and (`announce`)
        recorded; returns its cost for the `plan` event."""
        old, in_use = self.plan, self.in_use
        # a compiled run of `auto` prices the new layout's variants: where they do not pay it runs eager
        in_use.builder, priced = in_use.compiling.at_transition(
            in_use.builder, plan, self._steps_left, self.record.clock.step_s
        )
        transition_s = in_use.switch_to(plan, self.state.global_step)
        # parameter storage outside the workers' stages (none) is summed with what moved
        engine = in_use.engine
        moved, unheld = self.all_sum([engine.received_bytes, in_use.unheld_bytes()]).tolist()
        cost = {
            "transition_s": transition_s,
            "moved_bytes": int(moved),
            "unheld_param_bytes": int(unheld),
            **engine.compiled,
        }  # compiling the new layout's units, part of the transition's seconds
        self.record.transition(self.state.epoch, old, plan, cost, position, announce, self.layered.unit_names)
        if priced is not None:
            self.record.compile_decided(priced, self.state.epoch, position)
        return cost

    def _compile_if_it_pays(self, position: int) -> None:
        """Collective between two segments: once the first steps are timed, what they measured is kept, and
        `train.compile=auto` that started eager for want of a step time decides; where compiling pays, this
        layout is built again compiled, now (its optimizer and every value kept)."""
        in_use, clock = self.in_use, self.record.clock
        in_use.builder, decided = in_use.compiling.after_first_steps(
            in_use.builder, self.plan, self._steps_left, clock.step_s, clock.steps
        )
        if decided is None:
            return
        seconds = None
        if decided.compile:
            seconds = in_use.switch_to(self.plan, self.state.global_step)
            clock.recent.clear()  # the step time from here is a compiled step's
        self.record.compile_decided(decided, self.state.epoch, position, seconds)

    def _release_cache(self) -> None:
        """Collective: the cache's shared memory and files go (unless `cache.keep`) once every worker is done."""
        if self.cache is not None:
            dist.barrier()  # every worker is done with the cache before one per node deletes it
            self.cache.close(remove=not self.cfg.cache.keep and int(os.environ.get("LOCAL_RANK", "0")) == 0)
            self.cache = None

    def stopped(self, why: dict) -> None:
        """Collective, after `fit` raised Interrupted (its checkpoint written) or Diverged (none written): release
        what the run holds outside its directory and record where it stopped and `why` (if it had started)."""
        self._release_cache()
        self.record.stopped(why, self.state)

    def export(self) -> None:
        """Collective: the model in its library's format, for use without ptrun (written by rank 0)."""
        out = self.checkpoints.export(self.plan, self.device, self.data.class_names, self.state.global_step)
        if out is not None:
            library = FAMILY_SPECS[model_family(self.cfg.model)].library
            if self.layered.adapters and not self.cfg.adapter.merge:
                library = "peft"  # the adapter alone: PeftModel.from_pretrained(base, dir)
            self.record.print(f"model saved for {library} without ptrun: {out}")

    def close(self) -> None:
        self.record.close()
        self.in_use.close()
