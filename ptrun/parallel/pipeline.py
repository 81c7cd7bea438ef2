"""One rank's share of a Plan: its stage (a slice of units) run by a torch.distributed.pipelining schedule,
plus the data-parallel gradient all-reduce and the global-norm clip.

K = 1 is the same code path (a one-stage GPipe schedule), so pure data parallelism and pipelines never
diverge. Schedules run with `scale_grads=False`: the loss function already divides by the global batch
weight, so gradients are exact global means for any K, M and DP width.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from ptrun.models.layered import run_units
from ptrun.parallel.groups import Groups
from ptrun.parallel.plan import Plan
from ptrun.train.losses import WeightedLoss

SCHEDULE_CLASSES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}


class StageModule(nn.Module):
    """A contiguous slice of units, run in order; each unit's output is splatted into the next."""

    def __init__(self, units: Sequence[nn.Module]):
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self, *carry):
        return run_units(self.units, *carry)


class PipelineRuntime:
    """Builds and runs this rank's stage of `plan` for the given layered model."""

    def __init__(self, layered, plan: Plan, rank: int, groups: Groups, device: torch.device, loss: WeightedLoss):
        self.plan, self.groups, self.loss, self.device = plan, groups, loss, device
        self.replica, self.stage_index = plan.coords(rank)
        lo, hi = plan.stage_bounds[self.stage_index]
        self.unit_range = range(lo, hi)
        self.module = StageModule(layered.units[lo:hi]).to(device)
        self.stage = PipelineStage(self.module, self.stage_index, plan.pp, device, group=groups.pp)
        self.schedule = SCHEDULE_CLASSES[plan.schedule](
            self.stage, n_microbatches=plan.microbatches, loss_fn=loss, scale_grads=False
        )
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == plan.pp - 1

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    def _run(self, run, inputs: tuple, target: torch.Tensor | None, losses: list | None):
        args = inputs if self.is_first else ()
        kwargs = {"target": target, "losses": losses} if self.is_last and target is not None else {}
        return run(*args, **kwargs)

    def forward_backward(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor:
        """One pipelined forward + backward over the replica batch. Returns this rank's share of the
        global mean loss (non-zero on last stages only; summing over all ranks gives the global loss)."""
        self.module.train()
        losses: list[torch.Tensor] = []
        self._run(self.schedule.step, inputs, target, losses)
        if self.is_last:
            return torch.stack([l.detach() for l in losses]).sum()
        return torch.zeros((), device=self.device)

    @torch.no_grad()
    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        """Forward the replica batch through the pipeline; returns the merged output on the last stage.
        (The schedule computes its loss on the way, so it needs the target even here.)"""
        self.module.eval()
        out = self._run(self.schedule.eval, inputs, target, None)
        return out if self.is_last else None

    def sync_and_clip(self, max_norm: float) -> torch.Tensor:
        """All-reduce gradients over the DP group (one flat buffer), then clip by the global norm over all
        stages (replicas hold identical gradients after the all-reduce, so the PP group suffices).
        Returns the global pre-clip gradient norm."""
        grads = [p.grad for p in self.trainable_parameters() if p.grad is not None]
        if self.plan.dp > 1 and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.groups.dp)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for g in grads:
            sq += g.detach().double().pow(2).sum()
        if self.plan.pp > 1:
            dist.all_reduce(sq, group=self.groups.pp)
        norm = sq.sqrt()
        if max_norm > 0 and math.isfinite(norm.item()):
            coef = max_norm / (norm.item() + 1e-6)
            if coef < 1:
                for g in grads:
                    g.mul_(coef)
        return norm.float()
