"""One rank's share of a Plan: its stages (slices of units) run by a torch.distributed.pipelining schedule,
plus the data-parallel gradient all-reduce, the tied-weight all-reduce and the global-norm clip.

K = 1 is the same code path (a one-stage GPipe schedule), so pure data parallelism and pipelines never
diverge. Schedules run with `scale_grads=False`: the loss function already divides by the global batch
weight, so gradients are exact global means for any K, M, schedule and DP width.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)
from torch.utils.checkpoint import checkpoint

from ptrun.config import parse_recompute
from ptrun.models.layered import run_units
from ptrun.parallel.groups import Groups
from ptrun.parallel.plan import Plan
from ptrun.train.losses import WeightedLoss
from ptrun.train.precision import autocast

SINGLE_STAGE_SCHEDULES = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}
"""Schedules that drive exactly one stage per rank."""
MULTI_STAGE_SCHEDULES = {
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "LoopedBFS": ScheduleLoopedBFS,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
    "ZBVZeroBubble": ScheduleZBVZeroBubble,
    "DualPipeV": ScheduleDualPipeV,
}
"""Schedules that drive a list of stages per rank (`pipe.stages_per_rank`)."""


class StageModule(nn.Module):
    """A contiguous slice of units, run in order; each unit's output is splatted into the next.

    With recomputation on, the forward pass keeps only the inputs of each checkpointed chunk and the backward
    pass runs the chunk again (non-reentrant checkpointing, which restores the RNG state so dropout masks
    match).

    With a `compute_dtype` (bf16 / fp16) the units run under autocast and the stage's main output (the hidden
    states; masks stay as they are) leaves in that dtype, so half the bytes cross to the next stage."""

    def __init__(self, units: Sequence[nn.Module], recompute: int | None = None,
                 compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.units = nn.ModuleList(units)
        self.recompute = recompute
        self.compute_dtype = compute_dtype

    def train(self, mode: bool = True) -> "StageModule":
        """Frozen units stay in eval mode (no dropout or stochastic depth): a frozen layer is a fixed
        function, the same here as in AutoCache's prefix, so caching it changes nothing."""
        super().train(mode)
        for unit in self.units:
            if not any(p.requires_grad for p in unit.parameters()):
                unit.train(False)
        return self

    def forward(self, *carry):
        training = self.training and torch.is_grad_enabled()
        if self.compute_dtype is not None and carry[0].dtype == self.compute_dtype:
            # Received in the compute dtype, the residual stream goes on in float32 as autocast keeps it in
            # one process: one rounding per boundary rather than bf16 sums through the rest of the model.
            carry = (carry[0].float(), *carry[1:])
        with autocast(carry[0].device, self.compute_dtype):
            if self.recompute is None or not training:
                out = run_units(self.units, *carry)
            else:
                size = self.recompute or len(self.units)
                out = carry
                for lo in range(0, len(self.units), size):
                    chunk = list(self.units[lo : lo + size])
                    out = checkpoint(run_units, chunk, *(out if isinstance(out, tuple) else (out,)),
                                     use_reentrant=False)
        head = out[0] if isinstance(out, tuple) else out
        if self.compute_dtype is not None and head.is_floating_point() and head.dtype != self.compute_dtype:
            head = head.to(self.compute_dtype)  # autocast keeps residual streams in float32
            out = (head, *out[1:]) if isinstance(out, tuple) else head
        if training and head.is_floating_point() and not head.requires_grad:
            # A stage of only frozen units (a frozen prefix on stage 0) computes its output without
            # autograd; the schedule still runs its backward, which needs an output that takes a gradient.
            head.requires_grad_(True)
        return out


class StageRuntime:
    """What every runtime of one rank's stages shares: the stage modules, their parameters, and the
    gradient all-reduce and clip. `PipelineRuntime` runs them with a flushing schedule; the asynchronous
    `ptrun.parallel.pipedream.AsyncPipelineRuntime` without flushes."""

    clip_over_pipeline = True
    """Whether the clipping norm spans every stage (a flushing schedule: all stages are at the same step)
    or this stage alone (asynchronous stages step apart)."""

    def __init__(self, layered, plan: Plan, rank: int, groups: Groups, device: torch.device, loss: WeightedLoss,
                 recompute: str = "none", compute_dtype: torch.dtype | None = None):
        self.plan, self.groups, self.loss, self.device = plan, groups, loss, device
        self.replica, stage_rank = plan.coords(rank)
        self.stage_indices = plan.local_stages(stage_rank)
        self.dp_peers = len(plan.stage_ranks(stage_rank))  # ranks of this stage across replicas (self included)
        every = parse_recompute(recompute)
        self.modules = [StageModule(layered.units[slice(*plan.active_range(s))], every, compute_dtype).to(device)
                        for s in self.stage_indices]
        self.is_first = 0 in self.stage_indices
        self.is_last = plan.num_stages - 1 in self.stage_indices
        self.unit_indices = [u for s in self.stage_indices for u in range(*plan.active_range(s))]
        # A tied weight's gradient is norm-counted on the rank holding its owner (first) unit only.
        self._norm_excluded = {id(layered.model.get_parameter(name)) for name, units in layered.tied.items()
                               if units[0] not in self.unit_indices}
        # The tied weights this rank shares with other ranks of its replica, in the same order everywhere.
        self._tied = [(layered.model.get_parameter(name), groups.tied[name]) for name in sorted(groups.tied)]

    # ---- parameters ---------------------------------------------------------------------------------
    def _unique_parameters(self) -> list[nn.Parameter]:
        seen, out = set(), []
        for m in self.modules:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def trainable_parameters(self) -> list[nn.Parameter]:
        """This rank's parameters that train (a tied weight held by two local stages is listed once)."""
        return [p for p in self._unique_parameters() if p.requires_grad]

    def zero_grad(self) -> None:
        for m in self.modules:
            m.zero_grad(set_to_none=True)

    def train(self, mode: bool = True) -> None:
        for m in self.modules:
            m.train(mode)

    # ---- gradients ----------------------------------------------------------------------------------
    def sync_and_clip(self, max_norm: float, record: dict | None = None, inv_scale: float = 1.0) -> torch.Tensor:
        """Make every gradient the global one, then clip by the global norm. Returns the pre-clip norm, the
        same on every rank (non-finite if any stage's gradients overflowed: fp16's step-or-skip verdict).

        1. All-reduce over the DP group (one flat buffer): the replicas' partial sums (a stage shared by all
           replicas already holds their sum).
        2. All-reduce each tied weight over the ranks of this replica that hold a copy (DeepSpeed's rule):
           the embedding's and the decoder's contributions add up, and both copies step identically.
        3. The norm over all stages (the PP group; replicas are identical after step 1), counting a tied
           weight once; over this rank's stage alone when `clip_over_pipeline` is off.
        `inv_scale` undoes fp16's loss scale before the norm. `record`, when given, receives id(parameter) ->
        its squared gradient norm before clipping."""
        for p, _ in self._tied:
            if p.requires_grad and p.grad is None:  # every holder takes part in the tied all-reduce
                p.grad = torch.zeros_like(p)
        params = [p for p in self.trainable_parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        if self.dp_peers > 1 and grads:
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.groups.dp)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        for p, group in self._tied:
            if p.requires_grad:
                dist.all_reduce(p.grad, group=group)
        if inv_scale != 1.0:
            for g in grads:
                g.mul_(inv_scale)
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for p in params:
            if id(p) not in self._norm_excluded:
                p_sq = p.grad.detach().double().pow(2).sum()
                sq += p_sq
                if record is not None:
                    record[id(p)] = p_sq
        if self.plan.pp > 1 and self.clip_over_pipeline:
            dist.all_reduce(sq, group=self.groups.pp)
        norm = sq.sqrt()
        if max_norm > 0 and math.isfinite(norm.item()):
            coef = max_norm / (norm.item() + 1e-6)
            if coef < 1:
                for g in grads:
                    g.mul_(coef)
        return norm.float()


class PipelineRuntime(StageRuntime):
    """Builds and runs this rank's stages of `plan` with a torch.distributed.pipelining schedule, which
    flushes the pipeline every step."""

    def __init__(self, layered, plan: Plan, rank: int, groups: Groups, device: torch.device, loss: WeightedLoss,
                 recompute: str = "none", compute_dtype: torch.dtype | None = None):
        super().__init__(layered, plan, rank, groups, device, loss, recompute, compute_dtype)
        self.stages = [PipelineStage(m, s, plan.num_stages, device, group=groups.pp)
                       for m, s in zip(self.modules, self.stage_indices)]
        kwargs = dict(n_microbatches=plan.microbatches, loss_fn=loss, scale_grads=False)
        if plan.schedule in SINGLE_STAGE_SCHEDULES:
            self.schedule = SINGLE_STAGE_SCHEDULES[plan.schedule](self.stages[0], **kwargs)
        else:
            self.schedule = MULTI_STAGE_SCHEDULES[plan.schedule](self.stages, **kwargs)

    # ---- running ------------------------------------------------------------------------------------
    def _run(self, run, inputs: tuple, target: torch.Tensor | None, losses: list | None):
        args = inputs if self.is_first else ()
        kwargs = {"target": target, "losses": losses} if self.is_last and target is not None else {}
        return run(*args, **kwargs)

    def forward_backward(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor:
        """One pipelined forward + backward over the replica batch. Returns this rank's share of the
        global mean loss (non-zero on last stages only; summing over all ranks gives the global loss),
        without the loss scale."""
        self.train(True)
        losses: list[torch.Tensor] = []
        self._run(self.schedule.step, inputs, target, losses)
        if self.is_last:
            return torch.stack([l.detach().float() for l in losses]).sum() / self.loss.scale
        return torch.zeros((), device=self.device)

    @torch.no_grad()
    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        """Forward the replica batch through the pipeline; returns the merged output on the last stage.
        (The schedule computes its loss on the way, so it needs the target even here.)"""
        self.train(False)
        out = self._run(self.schedule.eval, inputs, target, None)
        return out if self.is_last else None

    # ---- timeline -----------------------------------------------------------------------------------
    def record_timeline(self) -> list[dict]:
        """Time every forward / backward (/ weight-gradient) pass of this rank's stages from now on, until
        `stop_timeline`; returns the list the events go into ({stage, microbatch, kind, start_s, end_s},
        wall-clock seconds, so the ranks of one machine share the clock)."""
        events: list[dict] = []
        self._timed = []
        for stage, index in zip(self.stages, self.stage_indices):
            for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", "B"),
                                 ("backward_weight_one_chunk", "W")):
                original = getattr(stage, method)

                def timed(chunk, *args, _run=original, _kind=kind, _stage=index, **kwargs):
                    start = time.time()
                    out = _run(chunk, *args, **kwargs)
                    events.append({"stage": _stage, "microbatch": chunk, "kind": _kind, "start_s": start,
                                   "end_s": time.time()})
                    return out

                setattr(stage, method, timed)  # an instance attribute shadows the class's method
                self._timed.append((stage, method))
        return events

    def stop_timeline(self) -> None:
        for stage, method in getattr(self, "_timed", []):
            delattr(stage, method)
        self._timed = []
