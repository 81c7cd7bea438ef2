"""The training loop of one worker: build data, model, plan and stage; train epochs; evaluate; checkpoint.

Every rank holds the whole layered model in host memory (built from the same seed, so identical) and runs
only its stage's units on its device. The layout is a Plan value; here it is fixed for the run, and the
PipeTransformer controller will replace it at epoch boundaries.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.config import ConfigError, PtrunConfig
from ptrun.data import EpochSampler, build_datasets, iterate_batches
from ptrun.models import build_model
from ptrun.parallel.groups import build_groups
from ptrun.parallel.pipeline import PipelineRuntime
from ptrun.parallel.layout import NEEDS_PROFILE, first_plan
from ptrun.parallel.plan import Plan
from ptrun.parallel.profile import agree, measure_bandwidth, profile_units
from ptrun.train import checkpoint
from ptrun.train.losses import WeightedLoss, make_target, per_sample_loss
from ptrun.train.optim import build_optimizer, set_lr
from ptrun.train.report import MetricsLog, ProgressView

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, cfg: PtrunConfig, rank: int, world_size: int, device: torch.device, resume: bool):
        self.cfg, self.rank, self.world_size, self.device = cfg, rank, world_size, device
        self.is_main = rank == 0
        self.data = build_datasets(cfg.data)
        torch.manual_seed(cfg.train.seed)  # identical initial weights on every rank
        self.layered = build_model(cfg.model, num_classes=self.data.num_classes, img_size=self.data.image_size,
                                   in_chans=self.data.in_chans)
        self.param_name = {id(p): n for n, p in self.layered.model.named_parameters()}
        self.loss = WeightedLoss(cfg.model.task)
        batch = cfg.train.global_batch_size
        self.train_sampler = EpochSampler(len(self.data.train), batch, cfg.train.seed)
        self.plan = self.first_plan()
        self.eval_sampler = EpochSampler(len(self.data.eval), batch, cfg.train.seed, shuffle=False)
        self.steps_per_epoch = min(self.train_sampler.steps_per_epoch,
                                   cfg.train.max_steps_per_epoch or self.train_sampler.steps_per_epoch)
        self.total_steps = cfg.train.epochs * self.steps_per_epoch
        self.epoch = self.global_step = 0
        self.metrics = MetricsLog(cfg.run_dir) if self.is_main else None
        self.view = ProgressView(enabled=self.is_main)
        self.best_eval: dict = {}
        self.last_eval: dict = {}
        self.apply_plan(self.plan)
        self.resumed_from = self.resume() if resume else None

    # ---- layout -------------------------------------------------------------------------------------
    def first_plan(self) -> Plan:
        """The starting layout; the time-based partitioners profile every unit on one micro-batch first."""
        pipe = self.cfg.pipe
        if pipe.partition not in NEEDS_PROFILE:
            return first_plan(pipe, self.layered, self.world_size)
        dp = self.world_size // pipe.length
        micro = max(1, self.cfg.train.global_batch_size // dp // pipe.microbatches)
        ids, _ = self.train_sampler.global_batch(0, 0)
        batch = dict(self.data.train[ids[:micro].tolist()])
        inputs = tuple(batch[k].to(self.device) for k in self.layered.input_names)
        prof = agree(profile_units(self.layered, inputs, self.device), self.device)
        return first_plan(pipe, self.layered, self.world_size, profile=prof,
                          bandwidth=measure_bandwidth(self.device))

    def apply_plan(self, plan: Plan) -> None:
        """Build process groups, this rank's stages and its optimizer for `plan`."""
        self.plan = plan
        self.groups = build_groups(plan, self.rank, self.layered.tied)
        self.runtime = PipelineRuntime(self.layered, plan, self.rank, self.groups, self.device, self.loss,
                                       recompute=self.cfg.pipe.recompute)
        named = [(self.param_name[id(p)], p) for p in self.runtime.trainable_parameters()]
        self.optimizer = build_optimizer(named, self.cfg.optim)
        self.replica, self.stage = plan.coords(self.rank)

    # ---- checkpoints --------------------------------------------------------------------------------
    def stage_param_names(self) -> list[str]:
        return [n for u in self.runtime.unit_indices for n in self.layered.unit_param_names(u)]

    def save_checkpoint(self) -> None:
        params = dict(self.layered.model.named_parameters())
        names = self.stage_param_names()
        optim_state = {}
        if self.optimizer is not None:
            optim_state = {self.param_name[id(p)]: s for p, s in self.optimizer.state.items()}
        state = {"epoch": self.epoch, "global_step": self.global_step, "plan": self.plan.to_dict(),
                 "model": {"name": self.cfg.model.name, "num_units": len(self.layered.units)},
                 "best_eval": self.best_eval, "last_eval": self.last_eval}
        path = checkpoint.save(self.cfg.run_dir, global_step=self.global_step,
                               named_params={n: params[n] for n in names}, optim_state=optim_state,
                               writer=self.replica == 0, stage=self.stage, trainer_state=state,
                               keep=self.cfg.checkpoint.keep)
        log.info("checkpoint written: %s", path)

    def resume(self) -> str | None:
        ckpt = checkpoint.latest_valid(self.cfg.run_dir)
        if ckpt is None:
            if self.is_main:
                log.warning("no checkpoint to resume from in %s; starting from scratch", self.cfg.run_dir)
            return None
        params, optim_state, state = checkpoint.load(ckpt)
        if state["model"]["num_units"] != len(self.layered.units) or state["model"]["name"] != self.cfg.model.name:
            raise ConfigError(f"checkpoint {ckpt} is of model {state['model']['name']} with "
                              f"{state['model']['num_units']} units, not {self.cfg.model.name}")
        own = dict(self.layered.model.named_parameters())
        missing = sorted(set(own) - set(params))
        if missing:
            raise ConfigError(f"checkpoint {ckpt} lacks parameter {missing[0]}")
        with torch.no_grad():
            for name, p in own.items():
                p.copy_(params[name])
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    saved = optim_state.get(self.param_name[id(p)])
                    if saved:
                        self.optimizer.state[p] = {k: v.to(p.device) if k != "step" else v for k, v in saved.items()}
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.best_eval, self.last_eval = state.get("best_eval", {}), state.get("last_eval", {})
        if self.is_main:
            log.info("resumed from %s at epoch %d (step %d)", ckpt, self.epoch, self.global_step)
        return str(ckpt)

    # ---- collectives --------------------------------------------------------------------------------
    def all_sum(self, values: list[float] | torch.Tensor) -> torch.Tensor:
        t = torch.as_tensor(values, dtype=torch.float64, device=self.device).clone()
        dist.all_reduce(t)
        return t

    # ---- train / eval -------------------------------------------------------------------------------
    def _inputs_and_target(self, batch: dict) -> tuple[tuple, torch.Tensor]:
        inputs = tuple(batch[k].to(self.device, non_blocking=True) for k in self.layered.input_names)
        return inputs, make_target(batch, self.cfg.model.task).to(self.device)

    def train_epoch(self) -> dict:
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        samples, t0 = 0.0, time.perf_counter()
        self.view.start_epoch(self.epoch, self.cfg.train.epochs, self.steps_per_epoch)
        lr = 0.0
        for step, batch in iterate_batches(self.data.train, self.train_sampler, self.epoch, self.replica,
                                           self.plan.dp, max_steps=self.steps_per_epoch):
            inputs, target = self._inputs_and_target(batch)
            # The global batch's real (weight-1) samples: the loss is a mean over exactly these.
            self.loss.denominator = float(self.train_sampler.global_batch(self.epoch, step)[1].sum())
            lr = set_lr(self.optimizer, self.global_step, self.total_steps, self.cfg.optim)
            loss_sum += self.runtime.forward_backward(inputs, target).double()
            self.runtime.sync_and_clip(self.cfg.train.grad_clip)
            if self.optimizer is not None:
                self.optimizer.step()
            self.runtime.zero_grad()
            self.global_step += 1
            samples += self.loss.denominator
            if (step + 1) % self.cfg.train.log_every_steps == 0 and self.view.live:
                running = self.all_sum(loss_sum).item() / (step + 1)
                self.view.update(step + 1, running, samples / (time.perf_counter() - t0))
        elapsed = time.perf_counter() - t0
        self.view.end_epoch()
        steps = self.steps_per_epoch
        train_loss = self.all_sum(loss_sum).item() / steps
        return {"train_loss": train_loss, "samples_per_s": samples / elapsed, "epoch_time_s": elapsed,
                "lr": lr, "steps": steps, "samples": int(samples)}

    @torch.no_grad()
    def evaluate(self) -> dict:
        n = len(self.data.eval)
        sums = torch.zeros(3, dtype=torch.float64, device=self.device)  # loss sum, correct, count
        for step, batch in iterate_batches(self.data.eval, self.eval_sampler, 0, self.replica, self.plan.dp):
            inputs, target = self._inputs_and_target(batch)
            out = self.runtime.forward_only(inputs, target)
            if out is None:
                continue
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
        return result

    # ---- the run ------------------------------------------------------------------------------------
    def fit(self) -> dict:
        cfg = self.cfg
        if self.is_main:
            self.metrics.write("start", world_size=self.world_size, recipe=cfg.recipe, model=cfg.model.name,
                               num_units=len(self.layered.units), num_blocks=self.layered.num_blocks,
                               train_samples=len(self.data.train), eval_samples=len(self.data.eval),
                               resumed_from=self.resumed_from, device=str(self.device))
            self.view.print(
                f"ptrun: {cfg.model.name} ({len(self.layered.units)} units, "
                f"{sum(p.numel() for p in self.layered.model.parameters()) / 1e6:.2f} M params) on "
                f"{len(self.data.train)} train / {len(self.data.eval)} eval samples; {self.world_size} workers, "
                f"run dir {cfg.run_dir}")
        t_start = time.perf_counter()
        while self.epoch < cfg.train.epochs:
            if self.is_main:
                self.metrics.write("plan", epoch=self.epoch, **self.plan.to_dict())
            stats = self.train_epoch()
            last = self.epoch == cfg.train.epochs - 1
            ev = self.evaluate() if last or (self.epoch + 1) % cfg.train.eval_every_epochs == 0 else {}
            if ev:
                self.last_eval = ev
                key = "top1" if "top1" in ev else "loss"
                better = (ev[key] > self.best_eval.get(key, -1)) if key == "top1" else \
                    (ev[key] < self.best_eval.get(key, float("inf")))
                if better:
                    self.best_eval = {**ev, "epoch": self.epoch}
            if self.is_main:
                self.metrics.write("epoch", epoch=self.epoch, eval=ev, **stats)
                shown = " ".join(f"eval_{k} {v:.2f}" for k, v in ev.items())
                self.view.print(f"epoch {self.epoch + 1}/{cfg.train.epochs}  loss {stats['train_loss']:.4f}  "
                                f"{stats['samples_per_s']:.0f} samples/s  {stats['epoch_time_s']:.1f}s  {shown}  "
                                f"[K={self.plan.pp} DP={self.plan.dp} M={self.plan.microbatches}]")
            self.epoch += 1
            every = cfg.checkpoint.every_epochs
            if every and (self.epoch % every == 0 or last):
                self.save_checkpoint()
        total = time.perf_counter() - t_start
        if self.is_main:
            self.metrics.write("end", epochs=cfg.train.epochs, total_time_s=total, final_eval=self.last_eval,
                               best_eval=self.best_eval)
            final = " ".join(f"{k} {v:.2f}" for k, v in self.last_eval.items())
            self.view.print(f"done: {cfg.train.epochs} epochs in {total:.1f}s; final eval: {final}; "
                            f"metrics in {Path(cfg.run_dir) / 'metrics.jsonl'}")
        return self.last_eval

    def close(self) -> None:
        self.groups.destroy()
