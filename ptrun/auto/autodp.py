"""AutoDP's data movement: before a new Plan is applied, every unit's parameters and optimizer state go from
their current owner to every rank.

The owner of a stage is its replica-0 rank (all replicas hold identical values after each step). Each
pipeline position broadcasts one flat buffer (parameters, then optimizer state tensors) over the default
group, so afterwards every rank's host copy of the model is current and any rank can own any unit under the
next Plan. Moving everything to everyone costs one model-sized broadcast per transition (once per epoch at
most) and keeps the code free of pairwise routing; the frozen prefix, which every replica needs when the
pipeline shrinks, is covered by the same step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ptrun.parallel.groups import Groups, build_groups
from ptrun.parallel.pipedream import AsyncPipelineRuntime
from ptrun.parallel.pipeline import StageRuntime, flushing_runtime
from ptrun.parallel.plan import Plan
from ptrun.parallel.optim import build_optimizer

OptimState = dict[str, dict[str, Any]]
"""Parameter name -> that parameter's optimizer state (`exp_avg`, `momentum_buffer`, `step`, ...)."""


def optimizer_state_by_name(optimizer: torch.optim.Optimizer | None, name_of: dict[int, str]) -> OptimState:
    if optimizer is None:
        return {}
    return {name_of[id(p)]: dict(s) for p, s in optimizer.state.items() if s}


def load_optimizer_state(optimizer: torch.optim.Optimizer | None, states: OptimState,
                         name_of: dict[int, str]) -> None:
    """Give each parameter of `optimizer` its state by name (tensors moved to the parameter's device)."""
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            saved = states.get(name_of[id(p)])
            if saved:
                optimizer.state[p] = {k: _state_value(v, p, group) for k, v in saved.items()}


def _state_value(value, p: torch.Tensor, group: dict):
    """A saved state entry as `group`'s implementation keeps it: tensors on the parameter's device; the
    scalar `step` a CPU tensor for the single-tensor / foreach paths, a float32 tensor on the parameter's
    device for the fused kernels (which read it there)."""
    if not torch.is_tensor(value):
        return value
    if value.ndim:
        return value.to(p.device)
    if group.get("fused") or group.get("capturable"):
        return value.to(p.device, torch.float32)
    return value


def share_everything(layered, plan: Plan, optimizer: torch.optim.Optimizer | None, name_of: dict[int, str],
                     device: torch.device) -> OptimState:
    """Collective over all ranks: broadcast each stage's parameters and optimizer state from its replica-0
    owner under `plan`. Every rank's `layered.model` ends up current; returns the optimizer state of every
    trainable parameter by name (on the CPU)."""
    rank = dist.get_rank()
    params = dict(layered.model.named_parameters())
    mine = optimizer_state_by_name(optimizer, name_of)
    states: OptimState = {}
    for position in range(plan.pp):
        src = plan.rank_of(0, position)
        units = [u for s in plan.local_stages(position) for u in range(*plan.stage_bounds[s])]
        names = [n for u in units for n in layered.unit_param_names(u)]
        # Layout of the state first (small, pickled): which tensors each parameter's state holds.
        layout = [{n: {k: (tuple(v.shape) if torch.is_tensor(v) and v.ndim else None)
                       for k, v in mine.get(n, {}).items()} for n in names}] if rank == src else [None]
        dist.broadcast_object_list(layout, src=src, device=device if device.type == "cuda" else None)
        layout_of: dict[str, dict] = layout[0]
        scalars = [(n, k) for n in names for k, shape in layout_of[n].items() if shape is None]
        tensors = [(n, k, shape) for n in names for k, shape in layout_of[n].items() if shape is not None]
        size = sum(params[n].numel() for n in names) + sum(torch.Size(s).numel() for _, _, s in tensors)
        flat = torch.empty(size, dtype=torch.float32, device=device)
        steps = torch.empty(len(scalars), dtype=torch.float64, device=device)
        if rank == src:
            parts = [params[n].detach().reshape(-1).float() for n in names]
            parts += [mine[n][k].detach().reshape(-1).float() for n, k, _ in tensors]
            if parts:
                flat.copy_(torch.cat(parts))
            steps.copy_(torch.tensor([float(mine[n][k]) for n, k in scalars], dtype=torch.float64))
        dist.broadcast(flat, src=src)
        dist.broadcast(steps, src=src)
        offset = 0
        with torch.no_grad():
            for n in names:
                p = params[n]
                p.copy_(flat[offset : offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()
        for n, k, shape in tensors:
            count = torch.Size(shape).numel()
            states.setdefault(n, {})[k] = flat[offset : offset + count].view(shape).to("cpu", copy=True)
            offset += count
        for (n, k), value in zip(scalars, steps.tolist()):
            states.setdefault(n, {})[k] = torch.tensor(value, dtype=torch.float32)
    return states


@dataclass
class Layout:
    """What one rank runs under a Plan: its process groups, stages + schedule, and optimizer."""

    plan: Plan
    groups: Groups
    runtime: StageRuntime
    optimizer: torch.optim.Optimizer | None


def set_frozen(layered, frozen_units: int) -> None:
    """requires_grad off for the frozen prefix, on elsewhere; a tied weight follows its owning (first) unit,
    so the MLM decoder stops changing the frozen word embedding."""
    for u, unit in enumerate(layered.units):
        for p in unit.parameters():
            p.requires_grad_(u >= frozen_units)
    for name, units in layered.tied.items():
        layered.model.get_parameter(name).requires_grad_(units[0] >= frozen_units)


@dataclass(frozen=True)
class Builder:
    """What every layout of one worker is built from, whatever the Plan: the model, this worker's rank and
    device, the loss, the optimizer's config and the parameters' names, and the runtimes' options."""

    layered: Any
    rank: int
    device: torch.device
    loss: Any
    optim: Any
    """The OptimConfig each layout's optimizer is built from."""
    name_of: dict[int, str]
    """Parameter id -> the library model's parameter name (optimizer state moves by name)."""
    recompute: str = "none"
    compute_dtype: Optional[torch.dtype] = None
    weight_stashing: bool = True
    """`pipe.schedule=pipedream`: see PipeConfig."""
    vertical_sync: bool = False


def build_layout(b: Builder, plan: Plan, states: OptimState | None = None) -> Layout:
    """Collective: freeze the plan's prefix, make its groups, this rank's stages and their optimizer, and give
    each trainable parameter its optimizer state by name (frozen parameters hold none). A `pipedream` plan
    gets the asynchronous runtime (with `weight_stashing` and `vertical_sync`), a one-stage plan (K = 1) runs
    its stage directly (DDP over the replicas), any other a flushing schedule."""
    set_frozen(b.layered, plan.frozen_units)
    groups = build_groups(plan, b.rank, b.layered.tied)
    if plan.schedule == "pipedream":
        runtime = AsyncPipelineRuntime(b.layered, plan, b.rank, groups, b.device, b.loss,
                                       compute_dtype=b.compute_dtype, weight_stashing=b.weight_stashing,
                                       vertical_sync=b.vertical_sync)
    else:
        runtime = flushing_runtime(b.layered, plan, b.rank, groups, b.device, b.loss, b.recompute, b.compute_dtype)
    optimizer = build_optimizer([(b.name_of[id(p)], p) for p in runtime.trainable_parameters()], b.optim)
    load_optimizer_state(optimizer, states or {}, b.name_of)
    return Layout(plan, groups, runtime, optimizer)


def change_layout(b: Builder, old: Layout, plan: Plan, midway: Callable[[], None] | None = None) -> Layout:
    """Collective, between two optimizer steps: move every unit's weights and optimizer state to everyone,
    destroy the old groups (undestroyed groups leak file descriptors and threads), build the new layout.
    `midway` runs between the two (fault-injection tests stop a worker there). An asynchronous pipeline
    must have drained first (its training loop drains at the end of every epoch)."""
    states = share_everything(b.layered, old.plan, old.optimizer, b.name_of, b.device)
    old.groups.destroy()
    if midway is not None:
        midway()
    return build_layout(b, plan, states)
