"""The trainer's checkpoints: what this rank writes (its stages' parameters and optimizer state, the trainer's
state, and mid-epoch the epoch's sums so far), and resuming from the newest valid one into any layout.
A mixin of `Trainer` (ptrun/train/trainer.py)."""

from __future__ import annotations

import logging

import torch

from ptrun.auto.freeze import blocks_of_units
from ptrun.auto.residency import held_names
from ptrun.config import ConfigError
from ptrun.models.lazy import allocate
from ptrun.parallel.plan import Plan
from ptrun.train import checkpoint

log = logging.getLogger("ptrun.train.trainer")


class Checkpointing:
    def stage_param_names(self) -> list[str]:
        """The parameters this rank's stages own; the first stage also owns the cached prefix's."""
        units = self.runtime.unit_indices
        if self.runtime.is_first:
            units = list(range(self.plan.cached_units)) + units
        return [n for u in units for n in self.layered.unit_param_names(u)]

    def save_checkpoint(self, progress: dict[str, torch.Tensor] | None = None, step_in_epoch: int = 0) -> None:
        """Collective. At an epoch boundary (`step_in_epoch` 0), or mid-epoch after `step_in_epoch` steps with
        the epoch's sums so far (`progress`, already summed over the ranks). The open freeze interval's
        gradient norm sums go with it either way (an interval may span a boundary)."""
        progress = {**(progress or {}), **self._interval_sums()}
        params = dict(self.layered.model.named_parameters())
        names = self.stage_param_names()
        optim_state = {}
        if self.optimizer is not None:
            optim_state = {self.param_name[id(p)]: s for p, s in self.optimizer.state.items()}
        state = {"epoch": self.epoch, "step_in_epoch": step_in_epoch, "global_step": self.global_step,
                 "interval": self.interval, "interval_steps": self.interval_steps,
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
        """Load the newest valid checkpoint: the values of the units this rank holds in the plan it resumes in.
        Returns (its path, the plan to continue with, the optimizer state by parameter name). The saved plan
        is reused when the world size is the same; otherwise AutoPipe re-plans the saved frozen prefix for
        this world."""
        ckpt = checkpoint.latest_valid(self.cfg.run_dir)
        if ckpt is None:
            if self.is_main:
                log.warning("no checkpoint to resume from in %s; starting from scratch", self.cfg.run_dir)
            return None, self.controller.first, {}
        state = checkpoint.trainer_state(ckpt)
        if state["model"]["num_units"] != len(self.layered.units) or state["model"]["name"] != self.cfg.model.name:
            raise ConfigError(f"checkpoint {ckpt} is of model {state['model']['name']} with "
                              f"{state['model']['num_units']} units, not {self.cfg.model.name} with "
                              f"{len(self.layered.units)} units; resume with the run's model settings or choose "
                              f"another hydra.run.dir")
        shapes = checkpoint.param_shapes(ckpt)
        own = self.layered.param_shapes
        missing = sorted(set(own) - set(shapes))
        if missing:
            raise ConfigError(f"checkpoint {ckpt} lacks parameter {missing[0]}; resume with the run's model "
                              f"settings or choose another hydra.run.dir")
        wrong = next((n for n, shape in own.items() if shapes[n] != tuple(shape)), None)
        if wrong is not None:
            raise ConfigError(f"checkpoint {ckpt}: {wrong} has shape {shapes[wrong]}, the model "
                              f"{tuple(own[wrong])}; resume with the run's model settings or choose "
                              f"another hydra.run.dir")
        self.epoch, self.global_step = state["epoch"], state["global_step"]
        self.last_checkpoint_step = self.global_step
        self.step_in_epoch = state.get("step_in_epoch", 0)
        self.epoch_sums = checkpoint.load_extra(ckpt, "progress") or {}
        # The freeze interval in force; older checkpoints were written after their position's decision.
        self.interval = state.get("interval", self._interval_at(self.epoch, self.step_in_epoch))
        self.interval_steps = state.get("interval_steps", 0)
        if self.is_main and "interval_norms" in self.epoch_sums:  # rank 0 alone: the all-reduce counts it once
            self.interval_norms.copy_(self.epoch_sums["interval_norms"])
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
            plan = self.controller.plan_for(self.controller.first, blocks_of_units(saved.frozen_units), self.world_size)
        # Only the parameters (and optimizer state) of the units this rank holds in that plan are read.
        held = held_names(self.layered, plan, self.rank)
        params, optim_state, _ = checkpoint.load(ckpt, names=held)
        allocate(self.layered, held)
        with torch.no_grad():
            for name, p in self.layered.model.named_parameters():
                if name in held:
                    p.copy_(params[name])
        if self.is_main:
            log.info("resumed from %s at epoch %d, step %d of the epoch (global step %d), %d units frozen", ckpt,
                     self.epoch, self.step_in_epoch, self.global_step, plan.frozen_units)
        return str(ckpt), plan, optim_state

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

    def _partial_sums(self, loss_sum, seen, samples: float) -> dict[str, torch.Tensor]:
        """Collective: the epoch's sums so far over all ranks, for a mid-epoch checkpoint."""
        return {"loss_sum": self.all_sum(loss_sum.reshape(1)).cpu(), "seen": self.all_sum(seen).cpu(),
                "samples": torch.tensor([samples], dtype=torch.float64)}

    def _interval_sums(self) -> dict[str, torch.Tensor]:
        """Collective when the policy reads gradient norms: the open interval's sums over all ranks."""
        if not self.controller.wants_grad_norms:
            return {}
        return {"interval_norms": self.all_sum(self.interval_norms).cpu()}

    def _checkpoint_due(self, step: int) -> bool:
        """A mid-epoch checkpoint after `step` of this epoch: `checkpoint.every_steps` steps since the last
        one, and not the epoch's last step (the epoch boundary decides about that one). Known before the
        step is trained (an asynchronous pipeline drains up to it)."""
        every = self.cfg.checkpoint.every_steps
        return bool(every) and self._epoch_base + step + 1 - self.last_checkpoint_step >= every \
            and step + 1 < self.steps_per_epoch
