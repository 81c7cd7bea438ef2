"""The training loop of one worker: build data, model, plan and stages; train epochs; evaluate; checkpoint;
and at the end of every freeze interval (each epoch boundary by default; any step with `freeze.every` < 1)
let the controller freeze, repartition and widen data parallelism, in the running job.

Every rank holds the whole layered model in host memory (built from the same seed, so identical) and runs
only its stages' units on its device. The layout is a Plan value; a transition first makes every rank's host
copy current (parameters and optimizer state from each stage's owner), then builds the new plan's groups,
stages and optimizer in the same processes.

The class is split by job: the start (`startup.py`), checkpoints and resuming (`checkpointing.py`),
evaluation (`evaluation.py`) and the epoch's extra statistics (`stats.py`) are mixins; this file holds the
constructor, the layout in use, the step loop and the run (`fit`).
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.auto.autodp import Builder, Layout, build_layout, change_layout, gather_to
from ptrun.auto.residency import held_units, release_unheld
from ptrun.config import PtrunConfig
from ptrun.data import EpochSampler, build_datasets, iterate_batches
from ptrun.models import build_model
from ptrun.models.lazy import init_units
from ptrun.models.export import export_model
from ptrun.models.losses import LABEL_KEYS, WeightedLoss, make_target
from ptrun.parallel.optim import set_lr
from ptrun.parallel.pipedream import AsyncPipelineRuntime, Step
from ptrun.parallel.plan import Plan
from ptrun.parallel.precision import LossScaler, compute_dtype, step_or_skip
from ptrun.train import faults
from ptrun.train.checkpointing import Checkpointing
from ptrun.train.evaluation import Evaluation
from ptrun.train.report import MetricsLog, ProgressView, done_line, epoch_line, start_line, transition_line
from ptrun.train.startup import StartUp, data_config
from ptrun.train.stats import EpochStats
from ptrun.train.stop import Interrupted, StopRequests

log = logging.getLogger(__name__)


@dataclass
class EpochSums:
    """What one rank adds up over an epoch."""

    loss: torch.Tensor
    """This rank's share of the summed step losses (last stages only)."""
    seen: torch.Tensor
    """Uses of each training sample (first stages only)."""
    samples_before: float = 0.0
    """Samples the epoch had trained before a mid-epoch resume."""
    samples: float = 0.0
    t0: float = field(default_factory=time.perf_counter)
    lr: float = 0.0


class Trainer(StartUp, Checkpointing, Evaluation, EpochStats):
    def __init__(self, cfg: PtrunConfig, rank: int, world_size: int, device: torch.device, resume: bool,
                 stops: StopRequests | None = None):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        # Ctrl-C / SIGTERM, recorded by the worker's handlers: the loop stops where every rank agrees to.
        self.stops = stops or StopRequests()
        self.is_main = rank == 0
        self.data = build_datasets(data_config(cfg))
        torch.manual_seed(cfg.train.seed)  # identical per-unit initial values on every rank
        # No unit has values yet: a worker fills its own stages' units once it knows its layout (apply_plan).
        self.layered = build_model(cfg.model, num_classes=self.data.num_classes, img_size=self.data.image_size,
                                   in_chans=self.data.in_chans, vocab_size=self.data.vocab_size, units=())
        self.param_name = {id(p): n for n, p in self.layered.model.named_parameters()}
        self.cfg = cfg = self._resolve_length(cfg)
        self.loss = WeightedLoss(cfg.model.task)
        self.compute_dtype = compute_dtype(cfg.train.precision)
        self.scaler = LossScaler(enabled=cfg.train.precision == "fp16")
        # Pinned host batches make their copy to the GPU asynchronous (`non_blocking` below).
        self.pin_memory = device.type == "cuda" and cfg.device.pin_memory
        self.eval_sampler = EpochSampler(len(self.data.eval), cfg.train.global_batch_size, cfg.train.seed,
                                         shuffle=False)
        self.train_sampler = EpochSampler(len(self.data.train), cfg.train.global_batch_size, cfg.train.seed)
        # The learning-rate schedule runs on epoch progress measured in the first layout's steps, so it
        # is the same curve whatever the batch policy does to the steps of later epochs.
        self.base_steps = self._steps_for(self.train_sampler)
        self.steps_per_epoch = self.base_steps  # the layout's (`_use`); the first layout's until one is built
        self.total_steps = cfg.train.epochs * self.base_steps
        self._profile = None
        self.controller = self._start()
        # pipe.microbatches=auto: measure (or read from the disk cache) the fastest M per pipeline length
        # before anything trains; the start again, with it: the first plan and AutoPipe's later picks use it.
        self.tuning = self._tune_microbatches() if cfg.pipe.microbatches == "auto" else None
        if self.tuning is not None:
            self.controller = self._start(self.tuning.table)
        self.epoch = self.global_step = 0
        self.step_in_epoch = 0  # where the current epoch resumes (non-zero only after a mid-epoch checkpoint)
        # The freeze interval in force (the controller has decided up to its start), and each block's gradient
        # norm summed over its steps so far (replica 0 of each stage adds its blocks').
        self.interval = self.interval_steps = 0
        self.interval_norms = torch.zeros(self.layered.num_blocks, dtype=torch.float64, device=device)
        self.epoch_sums: dict[str, torch.Tensor] = {}  # that checkpoint's partial epoch sums
        self.last_checkpoint_step = 0
        self.saved_global_batch: int | None = None  # the resumed checkpoint's, to map its step if it differs
        self.cache = self._make_cache() if cfg.auto.cache else None
        self.view = ProgressView(enabled=self.is_main)
        # The live view's running loss is an all-reduce, so every rank must agree that there is a view.
        self.live_view = bool(self.all_sum([float(self.view.live)]).item())
        self._timeline: list[dict] | None = None
        self._epoch_base = 0
        self.best_eval: dict = {}
        self.last_eval: dict = {}
        self.resumed_from, plan, states = self.resume() if resume else (None, self.controller.first, {})
        self.apply_plan(plan, states)
        # Opened once the start has succeeded: a failed one leaves no new file in the run directory.
        self.metrics = MetricsLog(cfg.run_dir, cfg.logger, cfg) if self.is_main else None

    def _interval_at(self, epoch: int, steps_done: int) -> int:
        """The freeze interval in force after `steps_done` steps of `epoch`: how many interval ends (decision
        points) lie at or before that position. Whole-epoch intervals end at epoch boundaries only."""
        steps = self.steps_per_epoch
        if self.cfg.freeze.every_steps:
            return (epoch * steps + steps_done) // self.cfg.freeze.every_steps
        every = Fraction(self.cfg.freeze.every).limit_denominator(1000)  # 0.333.. is 1/3: no float drift
        return math.floor(Fraction(epoch * steps + steps_done, steps) / every)

    def _segment_end(self, epoch: int, position: int) -> int:
        """The step of `epoch` after which the next decision falls (or the epoch's end): the segment from
        `position` trains in one layout. Without freezing nothing is ever decided, so an epoch is one segment
        (each segment starts its own batch loader)."""
        if not self.cfg.auto.freeze:
            return self.steps_per_epoch
        now = self._interval_at(epoch, position)
        return next((n for n in range(position + 1, self.steps_per_epoch)
                     if self._interval_at(epoch, n) > now), self.steps_per_epoch)

    def _steps_for(self, sampler: EpochSampler) -> int:
        limit = self.cfg.train.max_steps_per_epoch
        return min(sampler.steps_per_epoch, limit or sampler.steps_per_epoch)

    @property
    def caching(self) -> bool:
        """Whether this rank reads its inputs from AutoCache (the first stage, while a prefix is cached)."""
        return self.cache is not None and self.plan.cached_units > 0 and self.runtime.is_first

    def _train_source(self):
        return self.plain_train if self.caching else self.data.train

    # ---- layout -------------------------------------------------------------------------------------

    def apply_plan(self, plan: Plan, optimizer_states: dict | None = None) -> None:
        """Build `plan`'s layout on this rank (the first one, or after a resume); `transition` changes it."""
        init_units(self.layered, held_units(self.layered, plan, self.rank))  # those a resume did not fill
        self._use(build_layout(self.builder, plan, optimizer_states))
        release_unheld(self.layered, plan, self.rank)  # from here on a worker holds its own stages' weights

    def transition(self, plan: Plan) -> float:
        """Apply `plan` in the running job (collective); returns its wall time in seconds."""
        t0 = time.perf_counter()
        self._use(change_layout(self.builder, self.layout, plan,
                                midway=lambda: faults.reached("transition", self.global_step)))
        dist.barrier()
        return time.perf_counter() - t0

    @property
    def builder(self) -> Builder:
        """What this worker's layouts are built from (the same for every Plan)."""
        pipe = self.cfg.pipe
        return Builder(self.layered, self.rank, self.device, self.loss, self.cfg.optim, self.param_name,
                       pipe.recompute, self.compute_dtype, pipe.weight_stashing, pipe.vertical_sync)

    @property
    def plan(self) -> Plan:
        return self.layout.plan

    @property
    def runtime(self):
        return self.layout.runtime

    @property
    def optimizer(self):
        return self.layout.optimizer

    def _use(self, layout: Layout) -> None:
        self.layout = layout
        self.replica, self.stage = self.plan.coords(self.rank)
        global_batch = self.controller.global_batch(self.plan)
        if global_batch != self.train_sampler.global_batch_size:
            self.train_sampler = EpochSampler(len(self.data.train), global_batch, self.cfg.train.seed)
            self.eval_sampler = EpochSampler(len(self.data.eval), global_batch, self.cfg.train.seed, shuffle=False)
        self.steps_per_epoch = self._steps_for(self.train_sampler)
        if self.cache is not None and self.runtime.is_first:
            probe = dict(self.data.train[[0]])
            self.cache.set_depth(self.plan.cached_units, tuple(probe[k] for k in self.layered.input_names))
        self._block_of = {id(p): self.layered.unit_block(u) for u in self.runtime.unit_indices
                          for p in self.layered.units[u].parameters() if self.layered.unit_block(u) is not None}

    # ---- collectives --------------------------------------------------------------------------------
    def all_sum(self, values: list[float] | torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=torch.float64, device=self.device).clone()
        dist.all_reduce(t)
        return t

    # ---- train / eval -------------------------------------------------------------------------------
    def _inputs_and_target(self, batch: dict, split: str) -> tuple[tuple, torch.Tensor]:
        names = self.layered.input_names
        inputs = tuple(batch[k].to(self.device, non_blocking=True) for k in names if k in batch)
        if self.caching:  # raw inputs are there only for samples the cache does not serve
            inputs = self.cache.inputs(split, batch, inputs)
        return inputs, make_target(batch, self.cfg.model.task).to(self.device, non_blocking=True)

    def _batches(self, split: str, start_step: int = 0, end_step: int | None = None):
        """This rank's batches of `split` from `start_step` up to `end_step` (the epoch's end): its replica's
        share, or the whole global batch on a stage shared by every replica (AutoCache entries read in the
        loading thread when caching)."""
        if split == "train":
            data, sampler, epoch = self._train_source(), self.train_sampler, self.epoch
            steps = self.steps_per_epoch if end_step is None else end_step
        else:
            data, sampler, epoch, steps = self.data.eval, self.eval_sampler, 0, None
        fetch = None
        if self.caching:
            fetch = partial(self.cache.fetch, split, data, input_names=self.layered.input_names,
                            label_names=LABEL_KEYS[self.cfg.model.task])
        # A stage shared by every replica (PipeDream's stage replication) runs the whole global batch, in lanes.
        replica, dp = (0, 1) if len(self.plan.lanes(self.rank)) > 1 else (self.replica, self.plan.dp)
        return iterate_batches(data, sampler, epoch, replica, dp, start_step=start_step,
                               max_steps=steps, fetch=fetch, pin_memory=self.pin_memory)

    def train_epoch(self) -> dict:
        """One epoch from where it resumes, in segments between the freeze decisions that fall inside it (one
        segment with whole-epoch intervals); returns the epoch event's statistics."""
        start = self._resume_step()
        # Sums over the epoch; a resumed epoch starts from the checkpoint's (held by rank 0 alone, so the
        # all-reduce at the end counts them once).
        carried = self.epoch_sums if (start and self.is_main) else {}
        sums = EpochSums(
            loss=carried.get("loss_sum", torch.zeros(1, dtype=torch.float64))[0].to(self.device),
            # How often each training sample was used this epoch (counted on each replica's first stage).
            seen=carried.get("seen", torch.zeros(len(self.data.train), dtype=torch.float64)).clone(),
            samples_before=float(self.epoch_sums["samples"][0]) if start and "samples" in self.epoch_sums else 0.0)
        self.epoch_sums, self.step_in_epoch = {}, 0
        self._epoch_base = self.global_step - start  # the global step before this epoch's step 0
        skipped_before = self.scaler.skipped
        if self.cache is not None:
            self.cache.take_stats()  # count this epoch's training batches only
        self.view.start_epoch(self.epoch, self.cfg.train.epochs, self.steps_per_epoch)
        if isinstance(self.runtime, AsyncPipelineRuntime):
            self.runtime.stash_bytes_peak = 0
        position = start
        while position < self.steps_per_epoch:
            self._decide(position)  # a decision inside the epoch (or one a resume has not made yet)
            if position > start and self._checkpoint_due(position - 1):
                # the checkpoint due at the segment's last step, written after the decision: a restart resumes
                # in the new layout, at this step
                self.save_checkpoint(self._partial_sums(sums.loss, sums.seen, sums.samples_before + sums.samples),
                                     step_in_epoch=position)
            self._segment = end = self._segment_end(self.epoch, position)
            self._train_steps(sums, position, end)
            position = end
        elapsed = time.perf_counter() - sums.t0
        self.stops.settle()  # the stop all-reduce in flight ends before the epoch's own collectives
        self.view.end_epoch()
        steps = self.steps_per_epoch
        train_loss = self.all_sum(sums.loss).item() / steps
        seen = self.all_sum(sums.seen)
        resumed = {"resumed_at_step": start} if start else {}
        return {"train_loss": train_loss, "samples_per_s": sums.samples / elapsed, "epoch_time_s": elapsed,
                "lr": sums.lr, "steps": steps, "samples": int(sums.samples_before + sums.samples), **resumed,
                "sample_uses_min": int(seen.min().item()), "sample_uses_max": int(seen.max().item()),
                **self._cache_stats(), **self._scaler_stats(skipped_before), **self._stash_stats(),
                **self._memory_stats()}

    def _train_steps(self, sums: EpochSums, start: int, end: int) -> None:
        """Steps `start .. end - 1` of the epoch in the current layout."""
        steps = (self._step(step, batch) for step, batch in self._batches("train", start_step=start, end_step=end))
        if isinstance(self.runtime, AsyncPipelineRuntime):
            # Drain before a mid-epoch checkpoint (it must hold every update up to its step) and at the end.
            self.runtime.train_steps(steps, ends_segment=lambda s: self._checkpoint_due(s.step),
                                     after_backward=partial(self._finish_step, sums))
        else:
            for item in steps:
                self.loss.denominator = item.denominator
                self.loss.scale = self.scaler.scale
                self._finish_step(sums, item, self.runtime.forward_backward(item.inputs, item.target))

    def _step(self, step: int, batch: dict) -> Step:
        """One step's mini-batch, as the runtime takes it; starts the timeline when this is the step to
        record (the runtime's passes from this step's forward to its update)."""
        inputs, target = self._inputs_and_target(batch, "train")
        if self._epoch_base + step == self.cfg.train.timeline_step:
            self._timeline = self.runtime.record_timeline()
        # The global batch's real (weight-1) samples: the loss is a mean over exactly these.
        denominator = float(self.train_sampler.global_batch(self.epoch, step)[1].sum())
        return Step(step, inputs, target, denominator, extra=batch)

    def _finish_step(self, sums: "EpochSums", item: Step, loss: torch.Tensor | None) -> None:
        """After one step's backward pass on this rank: the update (learning rate, gradient sync and clip,
        optimizer step), the epoch's sums, and whatever is due after the step (a fault point, a mid-epoch
        checkpoint, the live view)."""
        step, batch = item.step, item.extra
        if self._timeline is not None:
            self.runtime.stop_timeline()
            self._write_timeline(self._timeline)
            self._timeline = None
        if loss is not None:
            sums.loss += loss.double()
        progress = self.epoch * self.base_steps + step * self.base_steps / self.steps_per_epoch
        sums.lr = set_lr(self.optimizer, progress, self.total_steps, self.cfg.optim)
        want_norms = self.controller.wants_grad_norms and self.replica == 0  # replicas hold equal gradients
        stepped = step_or_skip(self.runtime, self.optimizer, self.scaler, self.cfg.train.grad_clip, want_norms)
        if want_norms and stepped:
            blocks = [self._block_of.get(id(p)) for p in self.runtime.grad_sq_params]
            in_block = [i for i, b in enumerate(blocks) if b is not None]
            step_sq = torch.zeros_like(self.interval_norms)  # stays on the device: no sync per parameter
            step_sq.index_add_(0, torch.tensor([blocks[i] for i in in_block], dtype=torch.long, device=step_sq.device),
                               self.runtime.grad_sq[in_block])
            self.interval_norms += step_sq.sqrt()
        self.interval_steps += 1
        self.global_step += 1
        sums.samples += item.denominator
        if self.runtime.is_first:
            sums.seen.index_add_(0, batch["index"], batch["weight"].double())
        faults.reached("step", self.global_step)
        # A stop is decided between the steps of a synchronous runtime; PipeDream's asynchronous one has
        # later steps in flight, so it stops at the epoch's end (in `fit`).
        stop = not isinstance(self.runtime, AsyncPipelineRuntime) and self.stops.poll() \
            and step + 1 < self.steps_per_epoch
        # A checkpoint due where a decision falls is written after it (`train_epoch`), in the new layout.
        if (self._checkpoint_due(step) and step + 1 < self._segment) or stop:
            self.save_checkpoint(self._partial_sums(sums.loss, sums.seen, sums.samples_before + sums.samples),
                                 step_in_epoch=step + 1)
        if stop:
            raise Interrupted(self.stops.agreed)
        if (step + 1) % self.cfg.train.log_every_steps == 0 and self.live_view:
            running = self.all_sum(sums.loss).item() / (step + 1)
            self.view.update(step + 1, running, sums.samples / (time.perf_counter() - sums.t0))

    # ---- the run ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train the remaining epochs; at each boundary let the controller change the layout, checkpoint, and
        stop there if asked to. Returns the final eval."""
        cfg = self.cfg
        self._announce()
        tuned = self.tuning.event_fields() if self.tuning is not None else {}  # on this process's first plan
        t_start = time.perf_counter()
        moved: dict = {}  # the last transition's cost, on the plan event of the epoch it led into
        self.view.show_layout(self.plan, self.layered.unit_names)
        while self.epoch < cfg.train.epochs:
            # A decision still due where the run resumes (the last boundary of a finished run given more
            # epochs, or a step a stop interrupted before its decision) comes first.
            moved = self._decide(self.step_in_epoch, announce=False) or moved
            self._event("plan", epoch=self.epoch, step=self.step_in_epoch, **{"transition_s": 0.0, **moved},
                        **self.plan.to_dict(), **tuned)
            tuned = {}
            stats = self.train_epoch()
            last = self.epoch == cfg.train.epochs - 1
            ev = self.evaluate() if last or (self.epoch + 1) % cfg.train.eval_every_epochs == 0 else {}
            self._remember(ev)
            self._event("epoch", epoch=self.epoch, eval=ev, **stats)
            self.view.print(epoch_line(self.epoch, cfg.train.epochs, stats, ev, self.plan))
            self.epoch += 1
            # The boundary: decide the next layout and move to it before the checkpoint, so a restart resumes
            # in the layout the next epoch was meant to run in.
            moved = {} if last else self._decide(0, announce=False)
            every = cfg.checkpoint.every_epochs
            steps_due = cfg.checkpoint.every_steps and \
                self.global_step - self.last_checkpoint_step >= cfg.checkpoint.every_steps
            if (every and (self.epoch % every == 0 or last)) or steps_due:
                self.save_checkpoint()
            if not last and self.stops.now():
                if self.last_checkpoint_step != self.global_step:
                    self.save_checkpoint()
                raise Interrupted(self.stops.agreed)
        total = time.perf_counter() - t_start
        if cfg.train.export:
            self.export()
        self._release_cache()
        self._event("end", epochs=cfg.train.epochs, total_time_s=total, final_eval=self.last_eval,
                    best_eval=self.best_eval)
        self.view.print(done_line(cfg.train.epochs, total, self.last_eval, cfg.run_dir))
        return self.last_eval

    def _event(self, event: str, **fields) -> None:
        """A record in metrics.jsonl (and the trackers); rank 0 keeps them."""
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    def _announce(self) -> None:
        """The start event and the terminal's first lines."""
        cfg = self.cfg
        self._event("start", world_size=self.world_size, recipe=cfg.recipe, model=cfg.model.name,
                    num_units=len(self.layered.units), num_blocks=self.layered.num_blocks,
                    train_samples=len(self.data.train), eval_samples=len(self.data.eval),
                    resumed_from=self.resumed_from, device=str(self.device), precision=cfg.train.precision)
        self.view.print(start_line(cfg.model.name, len(self.layered.units),
                                   sum(s.numel() for s in self.layered.param_shapes.values()), len(self.data.train),
                                   len(self.data.eval), self.world_size, self.device.type, cfg.train.precision,
                                   cfg.run_dir))
        for choice in (self.length_choice, self.tuning):
            if choice is not None:
                self.view.print(choice.summary())

    def _decide(self, position: int, announce: bool = True) -> float:
        """Collective, before step `position` of `self.epoch`: if a freeze interval has ended since the last
        decision, the controller's decision on its mean gradient norms, moved to if it changes the layout
        (`announce`: a `plan` event for a change inside an epoch; the epoch's own start writes one at a
        boundary). Returns the transition's cost for that event: its seconds and the bytes moved between the
        workers (nothing when nothing was decided or the layout stays)."""
        interval = self._interval_at(self.epoch, position)
        if interval <= self.interval:
            return {}
        norms = None
        if self.controller.wants_grad_norms and self.interval_steps:
            # Each block's gradient norm, averaged over the interval's steps, summed over the stages holding it.
            norms = (self.all_sum(self.interval_norms) / self.interval_steps).tolist()
        self.interval_norms.zero_()
        self.interval, self.interval_steps = interval, 0
        plan = self.controller.decide(interval, self.plan, norms)
        if plan == self.plan:
            return {}
        old = self.plan
        transition_s = self.transition(plan)
        cost = {"transition_s": transition_s, "moved_bytes": int(self.all_sum([self.layout.received_bytes]).item())}
        self.view.print(transition_line(self.epoch, old, plan, transition_s, step=position))
        self.view.show_layout(plan, self.layered.unit_names)
        if announce:
            self._event("plan", epoch=self.epoch, step=position, **cost, **plan.to_dict())
        return cost

    def _release_cache(self) -> None:
        """Collective: the cache's shared memory and files go (unless `cache.keep`) once every worker is done."""
        if self.cache is not None:
            dist.barrier()  # every worker is done with the cache before one per node deletes it
            self.cache.close(remove=not self.cfg.cache.keep and int(os.environ.get("LOCAL_RANK", "0")) == 0)
            self.cache = None

    def stopped(self, signum: int) -> None:
        """Collective, after `fit` raised Interrupted (its checkpoint written): release what the run holds
        outside its directory and record where it stopped."""
        self.view.end_epoch()
        self._release_cache()
        self._event("stopped", signal=signal.Signals(signum).name, epoch=self.epoch, global_step=self.global_step,
                    checkpoint_step=self.last_checkpoint_step)

    def export(self) -> None:
        """Collective: rank 0 gathers every unit from its owner and writes the model in the library's format."""
        gather_to(self.layered, self.plan, 0, self.device)
        if self.is_main:
            out = export_model(self.layered, Path(self.cfg.run_dir) / "model", data_config(self.cfg).tokenizer)
            self.view.print(f"model saved for {self.layered.family} libraries without ptrun: {out}")

    def close(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        if getattr(self, "layout", None) is not None:
            self.layout.groups.destroy()
