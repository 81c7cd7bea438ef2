"""A worker's checkpoints: when one is due, what this rank writes (its stages' parameters and optimizer state,
the run's `TrainState`, and mid-epoch the epoch's sums so far), resuming from the newest valid one into any
layout, how many are kept, and the model exported in its library's format at the end (`Checkpoints`, the
trainer's part). The files themselves are `store.py`'s."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ptrun.auto.autodp import gather_to
from ptrun.auto.residency import held_names
from ptrun.config import ConfigError, PtrunConfig
from ptrun.config.adapter import adapter_settings
from ptrun.freezing.counts import blocks_of_units
from ptrun.layout.plan import Plan
from ptrun.models.export import export_model
from ptrun.models.lazy import allocate, init_units
from ptrun.train import fault_injection, machine_faults
from ptrun.train.checkpoint import lookup, store
from ptrun.train.state import TrainState

log = logging.getLogger("ptrun.train.trainer")


def stage_param_names(layered, runtime, plan: Plan) -> list[str]:
    """The parameters this rank's stages own and a checkpoint holds; the first stage also owns the cached
    prefix's. Not the base weights under adapters: they never change, and a resume reads them as the run
    began, from the pretrained file or the units' seeds."""
    units = runtime.unit_indices
    if runtime.is_first:
        units = list(range(plan.cached_units)) + units
    return [n for u in units for n in layered.unit_param_names(u) if n not in layered.fixed]


def save(
    cfg: PtrunConfig, layered, layout, state: TrainState, rank: int, *, controller, scaler, param_name: dict[int, str]
) -> None:
    """Collective: the run's position (`state` whole: `state.step_in_epoch` 0 is an epoch boundary; its
    `progress` holds what a resume there carries on), this rank's stages and their optimizer state, and the
    states of the controller and the loss scaler."""
    plan, runtime = layout.plan, layout.runtime
    params = dict(layered.model.named_parameters())
    names = stage_param_names(layered, runtime, plan)
    optim_state = {}
    if layout.optimizer is not None:
        optim_state = {param_name[id(p)]: s for p, s in layout.optimizer.state.items()}
    saved = {
        **state.to_dict(),
        "plan": plan.to_dict(),
        "first_plan": controller.first.to_dict(),  # the layout the run's keys start in, for a resume to compare
        "controller": controller.state_dict(),
        "model": {
            "name": cfg.model.name,
            "num_units": len(layered.units),
            "adapter": cfg.adapter.name,
            "adapter_settings": adapter_settings(cfg.adapter),
        },
        "loss_scale": scaler.state_dict(),
    }
    replica, stage = plan.coords(rank)
    path = store.save(
        cfg.run_dir,
        global_step=state.global_step,
        named_params={n: params[n] for n in names},
        optim_state=optim_state,
        writer=replica == 0,
        stage=stage,
        trainer_state=saved,
        keep=cfg.checkpoint.keep,
        progress=state.progress,
    )
    log.info("checkpoint written: %s", path)


@dataclass
class Resumed:
    """What a resume hands the trainer."""

    path: str
    state: TrainState
    plan: Plan
    """The layout to continue in."""
    optimizer_states: dict
    """The optimizer state of the parameters this rank holds, by name."""


def _check_model(ckpt, state: dict, cfg: PtrunConfig, layered) -> None:
    if state["model"]["num_units"] != len(layered.units) or state["model"]["name"] != cfg.model.name:
        raise ConfigError(
            f"checkpoint {ckpt} is of model {state['model']['name']} with "
            f"{state['model']['num_units']} units, not {cfg.model.name} with "
            f"{len(layered.units)} units; resume with the run's model settings or choose "
            f"another hydra.run.dir"
        )
    problem = lookup.adapter_problem(ckpt, adapter_settings(cfg.adapter))
    if problem is not None:
        raise ConfigError(problem)
    shapes = store.param_shapes(ckpt)
    own = {n: shape for n, shape in layered.param_shapes.items() if n not in layered.fixed}
    missing = sorted(set(own) - set(shapes))
    if missing:
        raise ConfigError(
            f"checkpoint {ckpt} lacks parameter {missing[0]}; resume with the run's model "
            f"settings or choose another hydra.run.dir"
        )
    wrong = next((n for n, shape in own.items() if shapes[n] != tuple(shape)), None)
    if wrong is not None:
        raise ConfigError(
            f"checkpoint {ckpt}: {wrong} has shape {shapes[wrong]}, the model "
            f"{tuple(own[wrong])}; resume with the run's model settings or choose "
            f"another hydra.run.dir"
        )


def resume(cfg: PtrunConfig, layered, controller, scaler, rank: int, world_size: int, interval_of) -> Resumed | None:
    """The newest valid checkpoint, read for the units this rank holds in the plan it resumes in (None: there
    is none). The saved plan is reused when the world size is the same; otherwise AutoPipe re-plans the saved
    frozen prefix for this world. `interval_of(epoch, step)` is the interval of a position, for checkpoints
    written before the interval was saved. Loads the controller's and the loss scaler's state."""
    ckpt = lookup.latest_valid(cfg.run_dir)
    if ckpt is None:
        if rank == 0:
            log.warning("no checkpoint to resume from in %s; starting from scratch", cfg.run_dir)
        return None
    saved = store.trainer_state(ckpt)
    _check_model(ckpt, saved, cfg, layered)
    saved_plan = Plan.from_dict(saved["plan"])
    state = TrainState.from_dict(
        saved,
        store.load_extra(ckpt, "progress"),
        interval=interval_of(saved["epoch"], saved.get("step_in_epoch", 0)),
        global_batch=controller.global_batch(saved_plan),
    )
    controller.load_state_dict(saved.get("controller", {}))
    scaler.load_state_dict(saved.get("loss_scale", {}))
    # The saved layout goes on where the world and the layout the run's keys start in are the same; a run resumed
    # with other layout keys (pipe.microbatches, pipe.length after running out of memory) or in another world
    # is planned again for its frozen prefix.
    first = saved.get("first_plan")
    if saved_plan.world_size == world_size and (first is None or Plan.from_dict(first) == controller.first):
        plan = saved_plan
    else:
        plan = controller.plan_for(controller.first, blocks_of_units(saved_plan.frozen_units), world_size)
    if saved_plan.world_size == world_size:
        rng = store.load_extra(ckpt, f"rng-rank{rank}")
        if rng is not None:
            store.set_rng_states(rng)  # the same ranks go on: dropout continues as it would have
    # Only the parameters (and optimizer state) of the units this rank holds in that plan are read.
    held = held_names(layered, plan, rank)
    params, optim_state, _ = store.load(ckpt, names=held)
    if layered.fixed:  # the base weights under adapters are not in it: the units start as the run began
        init_units(layered, [u for u in range(len(layered.units)) if held.intersection(layered.unit_param_names(u))])
    allocate(layered, held)
    with torch.no_grad():
        for name, p in layered.model.named_parameters():
            if name in held and name not in layered.fixed:
                p.copy_(params[name])
    if rank == 0:
        # Beyond `checkpoint.keep`, the older checkpoints go now, not after the next one is written: a run
        # resumed with checkpoint.keep=1 on a full disk has the room it needs for that one.
        older = [c for c in lookup.list_checkpoints(cfg.run_dir) if c.name < ckpt.name]
        for old in older[: max(0, len(older) - (cfg.checkpoint.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)
        log.info(
            "resumed from %s at epoch %d, step %d of the epoch (global step %d), %d units frozen",
            ckpt,
            state.epoch,
            state.step_in_epoch,
            state.global_step,
            plan.frozen_units,
        )
    return Resumed(str(ckpt), state, plan, optim_state)


def resume_step(step: int, saved_batch: int, batch: int) -> int:
    """The step of a resumed epoch to start at. If the global batch changed with the world size
    (`auto.batch=fixed_per_pipeline`), the step that starts at or before the same sample offset: up to one
    batch of samples is trained twice, none is skipped."""
    if step and saved_batch and saved_batch != batch:
        return step * saved_batch // batch
    return step


def checkpoint_due(cfg: PtrunConfig, state: TrainState, epoch_base: int, step: int, steps_per_epoch: int) -> bool:
    """A mid-epoch checkpoint after `step` of this epoch: `checkpoint.every_steps` steps since the last one,
    and not the epoch's last step (the epoch boundary decides about that one). Known before the step is
    trained (an asynchronous pipeline drains up to it). `epoch_base` is the global step before the epoch's
    step 0."""
    every = cfg.checkpoint.every_steps
    return bool(every) and epoch_base + step + 1 - state.last_checkpoint_step >= every and step + 1 < steps_per_epoch


def boundary_due(cfg: PtrunConfig, state: TrainState, last: bool) -> bool:
    """A checkpoint at the epoch boundary `state.epoch` (`last`: the run's end): every
    `checkpoint.every_epochs` epochs and at the end, or `checkpoint.every_steps` steps since the last one."""
    every, every_steps = cfg.checkpoint.every_epochs, cfg.checkpoint.every_steps
    steps_due = every_steps and state.global_step - state.last_checkpoint_step >= every_steps
    return bool((every and (state.epoch % every == 0 or last)) or steps_due)


class Checkpoints:
    """The trainer's checkpoints: when one is due, saving one (`checkpoint.keep` are kept), resuming from the
    newest, and the model exported at the end."""

    def __init__(
        self, cfg: PtrunConfig, layered, controller, scaler, rank: int, world_size: int, param_name: dict[int, str]
    ):
        self.cfg, self.layered, self.controller, self.scaler = cfg, layered, controller, scaler
        self.rank, self.world_size, self.param_name = rank, world_size, param_name

    def resume(self, interval_of) -> Resumed | None:
        """The newest valid checkpoint, read for the units this rank holds in the plan it resumes in (`resume`)."""
        return resume(self.cfg, self.layered, self.controller, self.scaler, self.rank, self.world_size, interval_of)

    def due(self, state: TrainState, epoch_base: int, step: int, steps_per_epoch: int) -> bool:
        """A mid-epoch checkpoint after `step` of this epoch (`checkpoint_due`)."""
        return checkpoint_due(self.cfg, state, epoch_base, step, steps_per_epoch)

    def due_at_boundary(self, state: TrainState, last: bool) -> bool:
        """A checkpoint at the epoch boundary `state.epoch` (`boundary_due`)."""
        return boundary_due(self.cfg, state, last)

    def save(self, layout, position: TrainState) -> None:
        """Collective: `position` (the run's state as a resume should find it) with this rank's stages."""
        save(
            self.cfg,
            self.layered,
            layout,
            position,
            self.rank,
            controller=self.controller,
            scaler=self.scaler,
            param_name=self.param_name,
        )

    def export(self, plan: Plan, device: torch.device, class_names, step: int) -> Path | None:
        """Collective: rank 0 gathers every unit from its owner and writes the model in the library's format;
        returns where (None on the other ranks). Where it finds no space, every rank raises OutOfSpace and
        the partial export is removed (`step`: the run's global step, for the fault point)."""
        gather_to(self.layered, plan, 0, device)
        target = Path(self.cfg.run_dir) / "model"
        out, error, nbytes = None, None, 0
        if self.rank == 0:
            nbytes = sum(shape.numel() * 4 for shape in self.layered.param_shapes.values())  # float32
            try:
                fault_injection.reached("export", step)
                out = export_model(
                    self.layered,
                    target,
                    self.cfg.data.tokenizer,
                    class_names=class_names,
                    merge=self.cfg.adapter.merge,
                    base=self.cfg.model.pretrained,
                )
            except Exception as e:
                error = e
        machine_faults.settle_write(error, "export", target, nbytes, cleanup=lambda: shutil.rmtree(target, True))
        return out
