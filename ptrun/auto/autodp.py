"""AutoDP's data movement and engines: before a new Plan is applied, each unit's parameters and optimizer
state go from its current owner to the ranks that will hold it and do not yet (`move_to_new_owners`); then
the new plan's groups, stages and optimizer are built (`build_engine`).

A unit is held by every replica's rank of the stage it belongs to (`ptrun.layout.owners`); its owner is
the replica-0 holder (all replicas hold identical values after each step). At a transition only the units
that change hands move, point to point from their old owner, with the optimizer state of the parameters
that still train; nothing goes to a rank that already holds a unit or will not hold it, and a rank empties
what it no longer holds (`residency`). Nothing reads a unit a rank does not hold: checkpoints write each
rank's own units, and the export first gathers every unit to rank 0 from its owner (`gather_to`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ptrun.auto.residency import release_unheld
from ptrun.compiling.compiler import cost_since, counts
from ptrun.layout.owners import gathering, keeps_owners, routes
from ptrun.layout.plan import Plan
from ptrun.models.lazy import allocate, give_back_host_memory
from ptrun.numerics.optim import build_optimizer
from ptrun.parallel.flushing import flushing_runtime
from ptrun.parallel.groups import Groups, build_groups
from ptrun.parallel.pipedream import AsyncPipelineRuntime
from ptrun.parallel.pipeline import StageParts, StageRuntime

OptimState = dict[str, dict[str, Any]]
"""Parameter name -> that parameter's optimizer state (`exp_avg`, `momentum_buffer`, `step`, ...)."""


def optimizer_state_by_name(optimizer: torch.optim.Optimizer | None, name_of: dict[int, str]) -> OptimState:
    if optimizer is None:
        return {}
    return {name_of[id(p)]: dict(s) for p, s in optimizer.state.items() if s}


def load_optimizer_state(optimizer: torch.optim.Optimizer | None, states: OptimState, name_of: dict[int, str]) -> None:
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


def param_units(layered) -> dict[str, list[int]]:
    """Parameter name -> the units using it: its owning unit first, then the units sharing it (tied)."""
    units: dict[str, list[int]] = {}
    for u in range(len(layered.units)):
        for n in layered.unit_param_names(u):
            units.setdefault(n, []).insert(0, u)
        for n in layered.unit_shared_param_names(u):
            units.setdefault(n, []).append(u)
    return units


def move_to_new_owners(
    layered,
    old: Plan,
    new: Plan,
    optimizer: torch.optim.Optimizer | None,
    name_of: dict[int, str],
    device: torch.device,
) -> tuple[OptimState, int]:
    """Collective over all ranks: send each parameter a rank will hold under `new` and does not hold under
    `old` from its old owner, with its optimizer state when it still trains under `new` (a parameter follows
    its owning unit's frozen state). Returns this rank's optimizer state by name for the new layout (what it
    kept plus what it received) and the bytes it received."""
    units_of = param_units(layered)
    trains = {n for n, units in units_of.items() if units[0] >= new.frozen_units}
    mine = optimizer_state_by_name(optimizer, name_of)
    received_states, received = send_along(
        layered, routes(units_of, old, new), {n: s for n, s in mine.items() if n in trains}, device
    )
    kept = {n: s for n, s in mine.items() if n in trains}
    return {**kept, **received_states}, received


def gather_to(layered, plan: Plan, dst: int, device: torch.device) -> None:
    """Collective: make rank `dst`'s host copy of every parameter current, each sent by its owner under
    `plan` (parameters only; for the export)."""
    send_along(layered, gathering(param_units(layered), plan, dst), {}, device)


def send_along(
    layered, routes: dict[tuple[int, int], list[str]], states: OptimState, device: torch.device
) -> tuple[OptimState, int]:
    """Collective: for each (sender, receiver) route, its parameters and then the state tensors the sender
    holds for them in `states`, tensor by tensor (scalars such as `step` in one float64 tensor after them).
    The receiver receives each parameter straight into its storage and each state tensor into its own, so
    neither end ever holds a second copy. Point to point, in one global order, so the two ends of the
    earliest unfinished route are always both at it: nothing deadlocks. Returns the state this rank received
    and the bytes it received."""
    rank = dist.get_rank()
    params = dict(layered.model.named_parameters())
    sent = {n for (src, _), names in routes.items() if src == rank for n in names if n in states}
    # Which state tensors each sent parameter carries, with shape and dtype (small, pickled, one
    # all-gather): receivers allocate them from it.
    layouts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(
        layouts,
        {
            n: {k: ((tuple(v.shape), v.dtype) if torch.is_tensor(v) and v.ndim else None) for k, v in states[n].items()}
            for n in sent
        },
    )
    out: OptimState = {}
    received = 0
    for (src, dst), names in sorted(routes.items()):
        if rank not in (src, dst):
            continue
        layout_of = layouts[src]
        tensors = [(n, k, spec) for n in names for k, spec in layout_of.get(n, {}).items() if spec is not None]
        scalars = [(n, k) for n in names for k, spec in layout_of.get(n, {}).items() if spec is None]
        if rank == src:
            with torch.no_grad():
                for n in names:
                    dist.send(params[n].detach().contiguous(), dst)
                for n, k, _ in tensors:
                    dist.send(states[n][k].detach().contiguous(), dst)
                if scalars:
                    dist.send(
                        torch.tensor([float(states[n][k]) for n, k in scalars], dtype=torch.float64, device=device), dst
                    )
            continue
        allocate(layered, names)
        with torch.no_grad():
            for n in names:
                dist.recv(params[n].data, src)
                received += params[n].numel() * params[n].element_size()
        for n, k, (shape, dtype) in tensors:
            value = torch.empty(shape, dtype=dtype, device=device)
            dist.recv(value, src)
            received += value.numel() * value.element_size()
            out.setdefault(n, {})[k] = value
        if scalars:
            steps = torch.empty(len(scalars), dtype=torch.float64, device=device)
            dist.recv(steps, src)
            for (n, k), value in zip(scalars, steps.tolist(), strict=True):
                out.setdefault(n, {})[k] = torch.tensor(value, dtype=torch.float32)
    return out, received


@dataclass
class Engine:
    """What one rank runs under a Plan: its process groups, stages + schedule, and optimizer."""

    plan: Plan
    groups: Groups
    runtime: StageRuntime
    optimizer: torch.optim.Optimizer | None
    received_bytes: int = 0
    """What the transition into this layout sent to this rank (parameters and optimizer state)."""
    compiled: dict = field(default_factory=dict)
    """What compiling the new layout's units cost in the transition into it, the busiest rank's (`compile_s`,
    `recompiles`); empty without compiled units."""


def set_frozen(layered, frozen_units: int) -> None:
    """requires_grad off for the frozen prefix, on elsewhere; a tied weight follows its owning (first) unit,
    so the MLM decoder stops changing the frozen word embedding. The base weights under adapters stay off."""
    for u, unit in enumerate(layered.units):
        for p in unit.parameters():
            p.requires_grad_(u >= frozen_units)
    for name, units in layered.tied.items():
        layered.model.get_parameter(name).requires_grad_(units[0] >= frozen_units)
    for name in layered.fixed:
        layered.model.get_parameter(name).requires_grad_(False)


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
    compute_dtype: torch.dtype | None = None
    weight_stashing: bool = True
    """`pipe.schedule=pipedream`: see PipeConfig."""
    vertical_sync: bool = False
    compiler: Any = None
    """The worker's compiled units (`ptrun.compiling.compiler.UnitCompiler`, `train.compile` on), else None."""

    def stage_parts(self, plan: Plan, groups: Groups) -> StageParts:
        """What this rank's stages of `plan` are built from."""
        return StageParts(
            self.layered,
            plan,
            self.rank,
            groups,
            self.device,
            self.loss,
            self.recompute,
            self.compute_dtype,
            self.compiler,
        )


def build_engine(b: Builder, plan: Plan, states: OptimState | None = None) -> Engine:
    """Collective: freeze the plan's prefix, make its groups, this rank's stages and their optimizer, and give
    each trainable parameter its optimizer state by name (frozen parameters hold none). A `pipedream` plan
    gets the asynchronous runtime (with `weight_stashing` and `vertical_sync`), a one-stage plan (K = 1) runs
    its stage directly (DDP over the replicas), any other a flushing schedule."""
    set_frozen(b.layered, plan.frozen_units)
    groups = build_groups(plan, b.rank, b.layered.tied)
    parts = b.stage_parts(plan, groups)
    if not plan.flushing:
        runtime = AsyncPipelineRuntime(parts, b.weight_stashing, b.vertical_sync)
    else:
        runtime = flushing_runtime(parts)
    optimizer = build_optimizer([(b.name_of[id(p)], p) for p in runtime.trainable_parameters()], b.optim)
    load_optimizer_state(optimizer, states or {}, b.name_of)
    return Engine(plan, groups, runtime, optimizer)


def freeze_in_place(b: Builder, old: Engine, plan: Plan) -> Engine:
    """A transition that keeps every unit where it is (`keeps_owners`): the newly frozen parameters stop
    requiring gradients and leave the optimizer (their state with them), and the stages are wrapped again on
    the same process groups (DDP's buckets and the schedule take only what trains; a longer cached prefix
    leaves stage 0). No group is created (a new NCCL communicator costs up to a second), nothing is sent,
    and the optimizer keeps its other parameters' state where it is."""
    set_frozen(b.layered, plan.frozen_units)
    runtime = flushing_runtime(b.stage_parts(plan, old.groups))
    trains = {id(p) for p in runtime.trainable_parameters()}
    optimizer = old.optimizer
    if optimizer is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in trains:
                    optimizer.state.pop(p, None)
                    p.grad = None
            group["params"] = [p for p in group["params"] if id(p) in trains]
        optimizer.param_groups[:] = [g for g in optimizer.param_groups if g["params"]]
        if not optimizer.param_groups:  # a stage with nothing left to train holds no optimizer
            optimizer = None
    if b.device.type == "cpu":  # the frozen parameters' optimizer state and gradients were freed on the host
        give_back_host_memory()
    return Engine(plan, old.groups, runtime, optimizer)


def change_engine(b: Builder, old: Engine, plan: Plan, midway: Callable[[], None] | None = None) -> Engine:
    """Collective, between two optimizer steps: move to `plan` in place where it keeps every unit's owner
    (`freeze_in_place`); otherwise move the units that change hands to their new holders, destroy the old
    groups (undestroyed groups leak file descriptors and threads), build the new layout. `midway` runs
    between the two (fault-injection tests stop a worker there). An asynchronous pipeline must have drained
    first (its training loop drains at the end of every epoch)."""
    before = counts(b.compiler)
    if keeps_owners(old.plan, plan):
        if midway is not None:
            midway()
        layout = freeze_in_place(b, old, plan)
    else:
        states, received = move_to_new_owners(b.layered, old.plan, plan, old.optimizer, b.name_of, b.device)
        old.groups.destroy()
        if midway is not None:
            midway()
        layout = build_engine(b, plan, states)
        if old.optimizer is not None:  # the old layout ends here: the state of the units that left goes now
            old.optimizer.state.clear()
        release_unheld(b.layered, plan, b.rank)
        if b.device.type == "cpu":
            give_back_host_memory()
        layout.received_bytes = received
    layout.compiled = cost_since(b.compiler, before)
    return layout
