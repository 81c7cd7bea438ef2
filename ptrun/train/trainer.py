"""The training loop of one worker: build data, model, plan and stages; train epochs; evaluate; checkpoint;
and at every epoch boundary let the controller freeze, repartition and widen data parallelism.

Every rank holds the whole layered model in host memory (built from the same seed, so identical) and runs
only its stages' units on its device. The layout is a Plan value; a transition first makes every rank's host
copy current (parameters and optimizer state from each stage's owner), then builds the new plan's groups,
stages and optimizer in the same processes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.auto.autocache import AutoCache
from ptrun.auto.autodp import Layout, build_layout, change_layout, share_everything
from ptrun.auto.controller import Controller
from ptrun.auto.freeze import blocks_of_units
from ptrun.config import ConfigError, DataConfig, PtrunConfig, validate
from ptrun.data import EpochSampler, build_datasets, iterate_batches
from ptrun.models import build_model
from ptrun.models.export import export_model
from ptrun.parallel import microtune
from ptrun.parallel.fit import device_budget, resolve_length
from ptrun.parallel.layout import NEEDS_PROFILE, first_plan, param_costs, starting_microbatches
from ptrun.parallel.partition import partition
from ptrun.parallel.pipedream import AsyncPipelineRuntime, Step
from ptrun.parallel.plan import Plan
from ptrun.parallel.profile import agree, measure_bandwidth, profile_units
from ptrun.train import checkpoint, faults
from ptrun.models.losses import LABEL_KEYS, WeightedLoss, make_target, per_sample_loss
from ptrun.parallel.optim import set_lr
from ptrun.parallel.precision import LossScaler, compute_dtype, step_or_skip
from ptrun.train.report import MetricsLog, ProgressView, done_line, epoch_line, start_line, transition_line
from ptrun.train.stop import Interrupted, StopRequests

log = logging.getLogger(__name__)


@dataclass
class EpochSums:
    """What one rank adds up over an epoch."""

    loss: torch.Tensor
    """This rank's share of the summed step losses (last stages only)."""
    seen: torch.Tensor
    """Uses of each training sample (first stages only)."""
    block_norms: torch.Tensor
    """Each block's gradient norm, summed over the steps (replica 0 only)."""
    samples_before: float = 0.0
    """Samples the epoch had trained before a mid-epoch resume."""
    samples: float = 0.0
    t0: float = field(default_factory=time.perf_counter)
    lr: float = 0.0


def data_config(cfg: PtrunConfig) -> DataConfig:
    """The data configuration as the sources need it: a text source's tokenizer defaults to the model's own
    directory (`model.pretrained`)."""
    if cfg.data.tokenizer is None and cfg.model.pretrained is not None:
        return replace(cfg.data, tokenizer=cfg.model.pretrained)
    return cfg.data


def metric_key(result: dict) -> str:
    """The eval number that ranks checkpoints: the GLUE score, SQuAD F1 or top-1 when there is one (higher
    is better), else the loss (lower is better)."""
    return next((k for k in ("score", "f1", "top1") if k in result), "loss")


class Trainer:
    def __init__(self, cfg: PtrunConfig, rank: int, world_size: int, device: torch.device, resume: bool,
                 stops: StopRequests | None = None):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        # Ctrl-C / SIGTERM, recorded by the worker's handlers: the loop stops where every rank agrees to.
        self.stops = stops or StopRequests()
        self.is_main = rank == 0
        self.data = build_datasets(data_config(cfg))
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.layered = build_model(cfg.model, num_classes=self.data.num_classes, img_size=self.data.image_size,
                                   in_chans=self.data.in_chans, vocab_size=self.data.vocab_size)
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
        self.total_steps = cfg.train.epochs * self.base_steps
        self._first, partition_kwargs = self._starting_plan()
        self.controller = Controller(cfg, self.layered.num_blocks, param_costs(self.layered), self._first,
                                     partition_kwargs)
        # pipe.microbatches=auto: measure (or read from the disk cache) the fastest M per pipeline length
        # before anything trains; the first plan and AutoPipe's later picks use it.
        self.tuning = self._tune_microbatches() if cfg.pipe.microbatches == "auto" else None
        if self.tuning is not None:
            self._first = replace(self._first, microbatches=self.tuning.choices[self._first.pp].microbatches).check()
            self.controller.microbatch_table = self.tuning.table
        self.epoch = self.global_step = 0
        self.step_in_epoch = 0  # where the current epoch resumes (non-zero only after a mid-epoch checkpoint)
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
        self.resumed_from, plan, states = self.resume() if resume else (None, self._first, {})
        self.apply_plan(plan, states)
        # Opened once the start has succeeded: a failed one leaves no new file in the run directory.
        self.metrics = MetricsLog(cfg.run_dir, cfg.logger, cfg) if self.is_main else None

    def _resolve_length(self, cfg: PtrunConfig) -> PtrunConfig:
        """Collective: `pipe.length=auto` made the shortest pipeline that fits a device, an unset micro-batch
        count made the one that follows the length; then the length-dependent rules checked (ConfigError).
        Every rank takes the smallest device budget, so all choose the same layout."""
        self.length_choice = None
        if cfg.pipe.length != "auto" and cfg.pipe.microbatches is not None:
            return cfg
        budget = torch.tensor([float(device_budget(cfg, self.device))], dtype=torch.float64, device=self.device)
        dist.all_reduce(budget, op=dist.ReduceOp.MIN)
        probe = dict(self.data.train[[0]])
        sample = tuple(probe[k] for k in self.layered.input_names if k in probe)
        resolved, self.length_choice = resolve_length(cfg, self.layered, sample, self.world_size,
                                                      int(budget.item()))
        validate(resolved)
        if self.is_main and self.length_choice is not None:
            log.info("%s", self.length_choice.summary())
        return resolved

    def _steps_for(self, sampler: EpochSampler) -> int:
        limit = self.cfg.train.max_steps_per_epoch
        return min(sampler.steps_per_epoch, limit or sampler.steps_per_epoch)

    def _make_cache(self) -> AutoCache:
        """AutoCache for this worker. Its entries are keyed by everything that shapes a cached activation
        besides the frozen weights: the model and data configuration and the augmentation mode."""
        cfg = self.cfg
        self.plain_train = self.data.train
        if cfg.data.augment:
            if cfg.cache.augment == "off":  # cached samples are loaded without random augmentation
                self.plain_train = build_datasets(replace(data_config(cfg), augment=False)).train
            elif self.is_main:
                log.warning("auto.cache with data.augment: each cached sample keeps the augmented view it had "
                            "when it was cached (cache.augment=fixed); cache.augment=off trains cached epochs "
                            "without random augmentation")
        tag = json.dumps({"model": asdict(cfg.model), "data": asdict(cfg.data), "augment": cfg.cache.augment,
                          "seed": cfg.train.seed, "precision": cfg.train.precision}, sort_keys=True)
        return AutoCache(self.layered, cfg.cache, tag=tag, num_train=len(self.data.train),
                         num_eval=len(self.data.eval), device=self.device, run_dir=cfg.run_dir,
                         compute_dtype=self.compute_dtype)

    @property
    def caching(self) -> bool:
        """Whether this rank reads its inputs from AutoCache (the first stage, while a prefix is cached)."""
        return self.cache is not None and self.plan.cached_units > 0 and self.runtime.is_first

    def _train_source(self):
        return self.plain_train if self.caching else self.data.train

    # ---- layout -------------------------------------------------------------------------------------
    def _starting_plan(self) -> tuple[Plan, dict]:
        """The starting layout, plus what AutoPipe needs to re-partition the same way later (the profile of
        the time-based partitioners, measured on one micro-batch; nothing for the others)."""
        pipe = self.cfg.pipe
        # With pipe.microbatches=auto, a stand-in until tuning (which needs this layout) replaces it.
        m = starting_microbatches(pipe, self.world_size, self.cfg.train.global_batch_size,
                                  self.cfg.auto.microbatch_table)
        if pipe.partition not in NEEDS_PROFILE:
            return first_plan(pipe, self.layered, self.world_size, microbatches=m), {}
        dp = pipe.first_stage_replicas if pipe.first_stage_replicas > 1 else self.world_size // pipe.length
        micro = max(1, self.cfg.train.global_batch_size // dp // m)
        ids, _ = self.train_sampler.global_batch(0, 0)
        batch = dict(self.data.train[ids[:micro].tolist()])
        inputs = tuple(batch[k].to(self.device) for k in self.layered.input_names)
        prof = agree(profile_units(self.layered, inputs, self.device), self.device)
        bandwidth = measure_bandwidth(self.device)
        plan = first_plan(pipe, self.layered, self.world_size, profile=prof, bandwidth=bandwidth, microbatches=m)
        return plan, dict(time_costs=prof.time_s, activation=prof.activation_bytes, bandwidth=bandwidth)

    def _tune_microbatches(self) -> microtune.Tuning:
        """Collective: the M per pipeline length this run may use, from the disk cache or measured on the
        starting layout and on the nothing-frozen layouts AutoPipe would build at the shorter lengths."""
        cfg, first, c = self.cfg, self._first, self.controller
        lengths = microtune.candidates(first.pp, self.world_size, cfg.train.global_batch_size, first.schedule,
                                       stages_per_rank=first.stages_per_rank, batch_policy=cfg.auto.batch,
                                       shrinks=microtune.shrinking(cfg))

        def plan_at(pp: int, m: int) -> Plan:
            bounds = first.stage_bounds if pp == first.pp else partition(
                c.method, pp * first.stages_per_rank, num_units=first.num_units, param_costs=c.param_costs,
                **c.partition_kwargs)
            return replace(first, pp=pp, dp=self.world_size // pp, microbatches=m,
                           stage_bounds=tuple(tuple(b) for b in bounds)).check()

        build = partial(build_layout, self.layered, rank=self.rank, device=self.device, loss=self.loss,
                        optim_cfg=cfg.optim, name_of=self.param_name, recompute=cfg.pipe.recompute,
                        compute_dtype=self.compute_dtype, **self._runtime_options)
        batches = partial(microtune.training_batches, self.data.train, rank=self.rank, seed=cfg.train.seed,
                          input_names=self.layered.input_names, task=cfg.model.task, device=self.device)
        probe = dict(self.data.train[[0]])
        shapes = {k: [list(probe[k].shape[1:]), str(probe[k].dtype)] for k in self.layered.input_names if k in probe}
        fields = microtune.cache_fields(
            model=asdict(cfg.model), input_shapes=shapes, lengths=lengths, world_size=self.world_size,
            schedule=first.schedule, stages_per_rank=first.stages_per_rank,
            partition=cfg.pipe.partition if cfg.pipe.stages is None else json.dumps(cfg.pipe.stages),
            recompute=cfg.pipe.recompute, precision=cfg.train.precision, threads=cfg.launcher.threads_per_worker,
            device=self.device)
        measure = partial(microtune.measure, lengths, plan_at=plan_at, build=build, batches=batches,
                          model=self.layered.model, loss=self.loss, device=self.device)
        tuning = microtune.tune(lengths, fields, measure_costs=measure, explicit_table=cfg.auto.microbatch_table,
                                device=self.device)
        if self.is_main:
            log.info("%s", tuning.summary())
        return tuning

    def apply_plan(self, plan: Plan, optimizer_states: dict | None = None) -> None:
        """Build `plan`'s layout on this rank (the first one, or after a resume); `transition` changes it."""
        self._use(build_layout(self.layered, plan, self.rank, self.device, self.loss, self.cfg.optim,
                               self.param_name, self.cfg.pipe.recompute, optimizer_states, self.compute_dtype,
                               **self._runtime_options))

    def transition(self, plan: Plan) -> float:
        """Apply `plan` in the running job (collective); returns its wall time in seconds."""
        t0 = time.perf_counter()
        self._use(change_layout(self.layered, self.layout, plan, self.rank, self.device, self.loss,
                                self.cfg.optim, self.param_name, self.cfg.pipe.recompute, self.compute_dtype,
                                midway=lambda: faults.reached("transition", self.global_step),
                                **self._runtime_options))
        dist.barrier()
        return time.perf_counter() - t0

    @property
    def _runtime_options(self) -> dict:
        """The asynchronous runtime's options (`pipe.schedule=pipedream`)."""
        return {"weight_stashing": self.cfg.pipe.weight_stashing, "vertical_sync": self.cfg.pipe.vertical_sync}

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

    # ---- checkpoints --------------------------------------------------------------------------------
    def stage_param_names(self) -> list[str]:
        """The parameters this rank's stages own; the first stage also owns the cached prefix's."""
        units = self.runtime.unit_indices
        if self.runtime.is_first:
            units = list(range(self.plan.cached_units)) + units
        return [n for u in units for n in self.layered.unit_param_names(u)]

    def save_checkpoint(self, progress: dict[str, torch.Tensor] | None = None) -> None:
        """Collective. At an epoch boundary (`step_in_epoch` 0), or mid-epoch with the epoch's sums so far
        (`progress`, already summed over the ranks)."""
        params = dict(self.layered.model.named_parameters())
        names = self.stage_param_names()
        optim_state = {}
        if self.optimizer is not None:
            optim_state = {self.param_name[id(p)]: s for p, s in self.optimizer.state.items()}
        state = {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
                 "plan": self.plan.to_dict(),
                 "controller": self.controller.state_dict(),
                 "model": {"name": self.cfg.model.name, "num_units": len(self.layered.units)},
                 "best_eval": self.best_eval, "last_eval": self.last_eval, "loss_scale": self.scaler.state_dict()}
        path = checkpoint.save(self.cfg.run_dir, global_step=self.global_step,
                               named_params={n: params[n] for n in names}, optim_state=optim_state,
                               writer=self.replica == 0, stage=self.stage, trainer_state=state,
                               keep=self.cfg.checkpoint.keep, progress=progress)
        self.last_checkpoint_step = self.global_step
        log.info("checkpoint written: %s", path)

    def resume(self) -> tuple[str | None, Plan, dict]:
        """Load the newest valid checkpoint into the host model. Returns (its path, the plan to continue
        with, the optimizer state by parameter name). The saved plan is reused when the world size is the
        same; otherwise AutoPipe re-plans the saved frozen prefix for this world."""
        ckpt = checkpoint.latest_valid(self.cfg.run_dir)
        if ckpt is None:
            if self.is_main:
                log.warning("no checkpoint to resume from in %s; starting from scratch", self.cfg.run_dir)
            return None, self._first, {}
        params, optim_state, state = checkpoint.load(ckpt)
        if state["model"]["num_units"] != len(self.layered.units) or state["model"]["name"] != self.cfg.model.name:
            raise ConfigError(f"checkpoint {ckpt} is of model {state['model']['name']} with "
                              f"{state['model']['num_units']} units, not {self.cfg.model.name} with "
                              f"{len(self.layered.units)} units; resume with the run's model settings or choose "
                              f"another hydra.run.dir")
        own = dict(self.layered.model.named_parameters())
        missing = sorted(set(own) - set(params))
        if missing:
            raise ConfigError(f"checkpoint {ckpt} lacks parameter {missing[0]}; resume with the run's model "
                              f"settings or choose another hydra.run.dir")
        wrong = next((n for n, p in own.items() if params[n].shape != p.shape), None)
        if wrong is not None:
            raise ConfigError(f"checkpoint {ckpt}: {wrong} has shape {tuple(params[wrong].shape)}, the model "
                              f"{tuple(own[wrong].shape)}; resume with the run's model settings or choose "
                              f"another hydra.run.dir")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(params[name])
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.last_checkpoint_step = self.global_step
        self.step_in_epoch = state.get("step_in_epoch", 0)
        self.epoch_sums = checkpoint.load_extra(ckpt, "progress") or {}
        self.best_eval, self.last_eval = state.get("best_eval", {}), state.get("last_eval", {})
        self.controller.load_state_dict(state.get("controller", {}))
        self.scaler.load_state_dict(state.get("loss_scale", {}))
        saved = Plan.from_dict(state["plan"])
        self.saved_global_batch = self.controller.global_batch(saved)
        if saved.world_size == self.world_size:
            plan = saved
            rng = checkpoint.load_extra(ckpt, f"rng-rank{self.rank}")
            if rng is not None:
                checkpoint.set_rng_states(rng)  # the same ranks go on: dropout continues as it would have
        else:
            plan = self.controller.plan_for(self._first, blocks_of_units(saved.frozen_units), self.world_size)
        if self.is_main:
            log.info("resumed from %s at epoch %d, step %d of the epoch (global step %d), %d units frozen", ckpt,
                     self.epoch, self.step_in_epoch, self.global_step, plan.frozen_units)
        return str(ckpt), plan, optim_state

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

    def _batches(self, split: str, start_step: int = 0):
        """This rank's batches of `split` from `start_step`: its replica's share, or the whole global batch on
        a stage shared by every replica (AutoCache entries read in the loading thread when caching)."""
        if split == "train":
            data, sampler, epoch, steps = self._train_source(), self.train_sampler, self.epoch, self.steps_per_epoch
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

    def _resume_step(self) -> int:
        """The step of the current epoch to start at: 0, or where a mid-epoch checkpoint left off. If the
        global batch changed with the world size (`auto.batch=fixed_per_pipeline`), the step that starts at
        or before the same sample offset: up to one batch of samples is trained twice, none is skipped."""
        start, saved = self.step_in_epoch, self.saved_global_batch
        if start and saved and saved != self.train_sampler.global_batch_size:
            offset = start * saved
            start = offset // self.train_sampler.global_batch_size
            if self.is_main:
                log.warning("the global batch changed from %d to %d on resuming: epoch %d restarts at step %d "
                            "(%d samples of it are trained twice)", saved, self.train_sampler.global_batch_size,
                            self.epoch, start, offset - start * self.train_sampler.global_batch_size)
        return start

    def _partial_sums(self, loss_sum, block_norms, seen, samples: float) -> dict[str, torch.Tensor]:
        """Collective: the epoch's sums so far over all ranks, for a mid-epoch checkpoint."""
        return {"loss_sum": self.all_sum(loss_sum.reshape(1)).cpu(), "block_norms": self.all_sum(block_norms).cpu(),
                "seen": self.all_sum(seen).cpu(), "samples": torch.tensor([samples], dtype=torch.float64)}

    def _checkpoint_due(self, step: int) -> bool:
        """A mid-epoch checkpoint after `step` of this epoch: `checkpoint.every_steps` steps since the last
        one, and not the epoch's last step (the epoch boundary decides about that one). Known before the
        step is trained (an asynchronous pipeline drains up to it)."""
        every = self.cfg.checkpoint.every_steps
        return bool(every) and self._epoch_base + step + 1 - self.last_checkpoint_step >= every \
            and step + 1 < self.steps_per_epoch

    def train_epoch(self) -> dict:
        start = self._resume_step()
        # Sums over the epoch; a resumed epoch starts from the checkpoint's (held by rank 0 alone, so the
        # all-reduce at the end counts them once).
        carried = self.epoch_sums if (start and self.is_main) else {}
        sums = EpochSums(
            loss=carried.get("loss_sum", torch.zeros(1, dtype=torch.float64))[0].to(self.device),
            # How often each training sample was used this epoch (counted on each replica's first stage).
            seen=carried.get("seen", torch.zeros(len(self.data.train), dtype=torch.float64)).clone(),
            block_norms=carried.get("block_norms",
                                    torch.zeros(self.layered.num_blocks, dtype=torch.float64)).to(self.device),
            samples_before=float(self.epoch_sums["samples"][0]) if start and "samples" in self.epoch_sums else 0.0)
        self.epoch_sums, self.step_in_epoch = {}, 0
        self._epoch_base = self.global_step - start  # the global step before this epoch's step 0
        skipped_before = self.scaler.skipped
        if self.cache is not None:
            self.cache.take_stats()  # count this epoch's training batches only
        self.view.start_epoch(self.epoch, self.cfg.train.epochs, self.steps_per_epoch)
        steps = (self._step(step, batch) for step, batch in self._batches("train", start_step=start))
        if isinstance(self.runtime, AsyncPipelineRuntime):
            self.runtime.stash_bytes_peak = 0
            # Drain before a mid-epoch checkpoint (it must hold every update up to its step) and at the end.
            self.runtime.train_steps(steps, ends_segment=lambda s: self._checkpoint_due(s.step),
                                     after_backward=partial(self._finish_step, sums))
        else:
            for item in steps:
                self.loss.denominator = item.denominator
                self.loss.scale = self.scaler.scale
                self._finish_step(sums, item, self.runtime.forward_backward(item.inputs, item.target))
        elapsed = time.perf_counter() - sums.t0
        self.stops.settle()  # the stop all-reduce in flight ends before the epoch's own collectives
        self.view.end_epoch()
        steps = self.steps_per_epoch
        train_loss = self.all_sum(sums.loss).item() / steps
        seen = self.all_sum(sums.seen)
        # Each block's gradient norm, averaged over the epoch's steps and summed over the stages holding it.
        self.grad_norms = (self.all_sum(sums.block_norms) / steps).tolist() if self.controller.wants_grad_norms else None
        resumed = {"resumed_at_step": start} if start else {}
        return {"train_loss": train_loss, "samples_per_s": sums.samples / elapsed, "epoch_time_s": elapsed,
                "lr": sums.lr, "steps": steps, "samples": int(sums.samples_before + sums.samples), **resumed,
                "sample_uses_min": int(seen.min().item()), "sample_uses_max": int(seen.max().item()),
                **self._cache_stats(), **self._scaler_stats(skipped_before), **self._stash_stats()}

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
            step_sq = torch.zeros_like(sums.block_norms)  # stays on the device: no sync per parameter
            step_sq.index_add_(0, torch.tensor([blocks[i] for i in in_block], dtype=torch.long, device=step_sq.device),
                               self.runtime.grad_sq[in_block])
            sums.block_norms += step_sq.sqrt()
        self.global_step += 1
        sums.samples += item.denominator
        if self.runtime.is_first:
            sums.seen.index_add_(0, batch["index"], batch["weight"].double())
        faults.reached("step", self.global_step)
        # A stop is decided between the steps of a synchronous runtime; PipeDream's asynchronous one has
        # later steps in flight, so it stops at the epoch's end (in `fit`).
        stop = not isinstance(self.runtime, AsyncPipelineRuntime) and self.stops.poll() \
            and step + 1 < self.steps_per_epoch
        if self._checkpoint_due(step) or stop:
            self.step_in_epoch = step + 1
            self.save_checkpoint(self._partial_sums(sums.loss, sums.block_norms, sums.seen,
                                                    sums.samples_before + sums.samples))
            self.step_in_epoch = 0
        if stop:
            raise Interrupted(self.stops.agreed)
        if (step + 1) % self.cfg.train.log_every_steps == 0 and self.live_view:
            running = self.all_sum(sums.loss).item() / (step + 1)
            self.view.update(step + 1, running, sums.samples / (time.perf_counter() - sums.t0))

    def _stash_stats(self) -> dict:
        """pipedream: the most bytes of weight copies (stashed versions) any rank held during the epoch."""
        if not isinstance(self.runtime, AsyncPipelineRuntime):
            return {}
        peak = torch.tensor([float(self.runtime.stash_bytes_peak)], dtype=torch.float64, device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return {"stash_bytes_peak": int(peak.item())}

    def _scaler_stats(self, skipped_before: int) -> dict:
        """fp16: the loss scale at the epoch's end and the overflowed steps it skipped."""
        if not self.scaler.enabled:
            return {}
        return {"loss_scale": self.scaler.scale, "skipped_steps": self.scaler.skipped - skipped_before}

    def _write_timeline(self, events: list[dict]) -> None:
        """Collective: every rank's recorded passes of one step, written by rank 0 to RUN_DIR/timeline.json
        (only replica 0's pipeline: the replicas run the same schedule)."""
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, events if self.replica == 0 else [])
        if self.is_main:
            plan = self.plan.to_dict()
            (Path(self.cfg.run_dir) / "timeline.json").write_text(json.dumps(
                {"step": self.global_step, "plan": plan, "events": [e for part in gathered for e in part]}))

    def _cache_stats(self) -> dict:
        """AutoCache counters of the epoch summed over the workers, and this node's cache size in bytes."""
        if self.cache is None:
            return {}
        own = self.cache.take_stats()
        total = self.all_sum(list(own.values())).long().tolist()
        return {"cache": {**dict(zip(own, total)), "cached_units": self.plan.cached_units,
                          "memory_bytes": self.cache.memory_bytes, "disk_bytes": self.cache.disk_bytes}}

    @torch.no_grad()
    def evaluate(self) -> dict:
        n = len(self.data.eval)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, count
        # A task's own metrics (GLUE's, SQuAD's) need every eval output at once: (sample ids, outputs) of the
        # real samples
        outputs: list[tuple[torch.Tensor, torch.Tensor]] = []
        for step, batch in self._batches("eval"):
            inputs, target = self._inputs_and_target(batch, "eval")
            out = self.runtime.forward_only(inputs, target)
            if out is None:
                continue
            if self.data.metrics is not None:
                real = batch["weight"] > 0
                outputs.append((batch["index"][real], out[real.to(out.device)].float().cpu()))
            weight = target[:, -1].double()
            sums[0] += (per_sample_loss(out, target, self.cfg.model.task).double() * weight).sum()
            if self.cfg.model.task == "classification":
                sums[1] += ((out.argmax(-1) == target[:, 0]).double() * weight).sum()
            sums[2] += weight.sum()
        dist.all_reduce(sums)
        loss, correct, count = sums.tolist()
        assert int(count) == n, f"evaluated {count} samples, expected {n}"
        result = {"loss": loss / count}
        if self.cfg.model.task == "classification":
            result["top1"] = 100.0 * correct / count
        if self.data.metrics is not None:
            result.update(self._task_metrics(outputs))
        return result

    def _task_metrics(self, outputs: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """The data source's metrics (`DataSplits.metrics`) from every last stage's outputs; computed on rank 0
        and shared."""
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, outputs)
        box: list = [None]
        if self.is_main:
            pairs = [pair for part in gathered for pair in part]
            ids = torch.cat([i for i, _ in pairs])
            order = ids.argsort()
            values = torch.cat([o for _, o in pairs])[order]
            assert torch.equal(ids[order], torch.arange(len(self.data.eval))), "eval outputs do not cover the set"
            box[0] = self.data.metrics(values, self.data.eval)
        dist.broadcast_object_list(box, src=0)
        return box[0]

    # ---- the run ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        """Train the remaining epochs; at each boundary let the controller change the layout, checkpoint, and
        stop there if asked to. Returns the final eval."""
        cfg = self.cfg
        self._announce()
        tuned = self.tuning.event_fields() if self.tuning is not None else {}  # on this process's first plan
        t_start = time.perf_counter()
        transition_s = 0.0
        self.view.show_layout(self.plan, self.layered.unit_names)
        while self.epoch < cfg.train.epochs:
            self._event("plan", epoch=self.epoch, transition_s=transition_s, **self.plan.to_dict(), **tuned)
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
            transition_s = 0.0 if last else self._next_layout()
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
                                   sum(p.numel() for p in self.layered.model.parameters()), len(self.data.train),
                                   len(self.data.eval), self.world_size, self.device.type, cfg.train.precision,
                                   cfg.run_dir))
        for choice in (self.length_choice, self.tuning):
            if choice is not None:
                self.view.print(choice.summary())

    def _remember(self, ev: dict) -> None:
        """Keep the newest eval, and the best one by its ranking metric (`metric_key`)."""
        if not ev:
            return
        self.last_eval = ev
        key = metric_key(ev)
        better = (ev[key] > self.best_eval.get(key, -1)) if key != "loss" else \
            (ev[key] < self.best_eval.get(key, float("inf")))
        if better:
            self.best_eval = {**ev, "epoch": self.epoch}

    def _next_layout(self) -> float:
        """Collective, at the boundary before `self.epoch`: the controller's decision, moved to if it changes
        the layout. Returns the transition's seconds (0 when the layout stays)."""
        plan = self.controller.decide(self.epoch, self.plan, self.grad_norms)
        if plan == self.plan:
            return 0.0
        old = self.plan
        transition_s = self.transition(plan)
        self.view.print(transition_line(self.epoch, old, plan, transition_s))
        self.view.show_layout(plan, self.layered.unit_names)
        return transition_s

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
        """Collective: make every rank's host model current, then rank 0 writes it in the library's format."""
        share_everything(self.layered, self.plan, self.optimizer, self.param_name, self.device)
        if self.is_main:
            out = export_model(self.layered, Path(self.cfg.run_dir) / "model", data_config(self.cfg).tokenizer)
            self.view.print(f"model saved for {self.layered.family} libraries without ptrun: {out}")

    def close(self) -> None:
        if getattr(self, "metrics", None) is not None:
            self.metrics.close()
        if getattr(self, "layout", None) is not None:
            self.layout.groups.destroy()
