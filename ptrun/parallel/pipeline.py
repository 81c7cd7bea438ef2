"""One rank's share of a Plan: its stages (slices of units) run by a torch.distributed.pipelining schedule,
plus the data-parallel gradient all-reduce, the tied-weight all-reduce and the global-norm clip.

This module holds what every runtime shares: the step a runtime takes (`Step`), the protocol the trainer
drives (`Runtime`), the stages' base (`StageRuntime`) and the summing DDP wrap (`data_parallel`). The
runtimes themselves: the flushing ones (`ptrun.parallel.flushing`: `LocalRuntime` at K = 1,
`PipelineRuntime` over a schedule) and PipeDream's asynchronous one (`ptrun.parallel.pipedream`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ptrun.compat import ddp_no_buffer_sync
from ptrun.compiling.compiler import UnitCompiler
from ptrun.config import parse_recompute
from ptrun.layout.plan import Plan
from ptrun.models.losses import WeightedLoss
from ptrun.parallel.groups import Groups
from ptrun.parallel.stage_module import StageModule


@dataclass
class Step:
    """One mini-batch's data as the trainer hands it to a runtime's `run_step`."""

    step: int
    """The step of the epoch."""
    inputs: tuple
    """The model inputs (read by the first stage)."""
    target: torch.Tensor
    """Labels and sample weights (read by the last stage)."""
    denominator: float
    """The global batch's loss weight: the loss is a mean over exactly these samples."""
    samples: float = 0.0
    """The global batch's real (weight-1) samples, for the trainer's counts (the denominator too, unless the
    loss is a mean over tokens)."""
    extra: Any = None
    """Whatever the caller wants back after the step's update (its batch)."""


ApplyUpdate = Callable[[Step, "torch.Tensor | None"], None]
"""What a runtime's `run_step` calls for each step whose update is due: `(step, loss)`, the loss this rank's
share of the global mean loss (None where an asynchronous stage has none), without the loss scale. The
caller's update (`ptrun.train.step.train_step`) runs inside the call; the runtime goes on when it returns."""


@dataclass(frozen=True)
class Norms:
    """A step's gradient norms before the clip (`Runtime.sync_and_clip`), on the device."""

    total: torch.Tensor
    """The global norm (a float32 scalar), the same on every rank; non-finite where any stage's gradients
    overflowed."""
    squares: torch.Tensor
    """Each counted parameter's squared norm on this rank (float64), in the order of `params`."""
    params: list[nn.Parameter]
    """The parameters the norm counts on this rank (a tied weight on the rank of its owner unit only)."""


class Runtime(Protocol):
    """What the trainer and its parts ask of the runtime of a rank's stages, whichever it is: a flushing
    schedule (`ptrun.parallel.flushing`: `PipelineRuntime`, `LocalRuntime` at K = 1) or PipeDream's
    asynchronous 1F1B (`ptrun.parallel.pipedream.AsyncPipelineRuntime`). Every attribute and method the step
    (`ptrun.train.step`), the trainer and its parts use on a runtime is declared here
    (tests/test_runtime_contract.py reads their source for it)."""

    asynchronous: bool
    """Whether steps overlap (later steps are in flight when one's update is due): a stop then waits for the
    epoch's end, where the pipeline drains."""
    is_first: bool
    """Whether this rank holds the first stage (it reads the samples: the epoch's counts, the cache)."""
    is_last: bool
    """Whether this rank holds the last stage (it computes the loss)."""
    unit_indices: list[int]
    """The units of this rank's stages, in order."""

    def run_step(self, step: Step, apply_update: ApplyUpdate, loss_scale: float = 1.0, drain: bool = False) -> None:
        """`step`'s passes, its loss multiplied by `loss_scale` (fp16's, 1 otherwise) where backward starts;
        calls `apply_update(step, loss)` for each step whose update is now due, in order, before any later
        pass: a flushing runtime for `step` itself, PipeDream for the oldest step in flight once its pipeline
        is full, and with `drain` for every step in flight."""

    def pause(self) -> None:
        """Training stops here for a while (a decision, an evaluation, the epoch's end; nothing is in flight):
        what only running steps need goes."""

    def sync_and_clip(self, max_norm: float, inv_scale: float = 1.0) -> Norms:
        """Make every gradient the global one and clip it by `max_norm` (0: no clip); returns its norms before
        the clip."""

    def zero_grad(self) -> None:
        """Drop every gradient of this rank's parameters."""

    def trainable_parameters(self) -> list[nn.Parameter]:
        """This rank's parameters that train (what the optimizer steps)."""

    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        """Evaluation: the output of the replica batch on the last stage, None elsewhere."""

    def take_stash_peak(self) -> int | None:
        """PipeDream: the most bytes of stashed weight versions held since the last call; None elsewhere."""

    def record_timeline(self) -> list[dict]:
        """Time every pass of this rank's stages from now on, until `stop_timeline`; returns the list the
        events go into ({stage, microbatch, kind, start_s, end_s}, wall-clock seconds)."""

    def stop_timeline(self) -> None:
        """Stop timing the passes."""


@dataclass(frozen=True)
class StageParts:
    """What one rank's stages of a plan are built from: every runtime takes one."""

    layered: Any
    """The model as layer units (`ptrun.models`' layered model): its units, tied and fixed weights."""
    plan: Plan
    rank: int
    groups: Groups
    """The plan's process groups, as this rank sees them."""
    device: torch.device
    loss: WeightedLoss
    recompute: str = "none"
    """`pipe.recompute`: which units recompute their activations in the backward pass."""
    compute_dtype: torch.dtype | None = None
    """The autocast dtype (`train.precision`; None: fp32)."""
    compiler: UnitCompiler | None = None
    """The worker's compiled units (`train.compile`), else None."""


class StageRuntime:
    """What every runtime of one rank's stages shares: the stage modules, their parameters, and the
    gradient all-reduce and clip. `PipelineRuntime` runs them with a flushing schedule; the asynchronous
    `ptrun.parallel.pipedream.AsyncPipelineRuntime` without flushes."""

    clip_over_pipeline = True
    """Whether the clipping norm spans every stage (a flushing schedule: all stages are at the same step)
    or this stage alone (asynchronous stages step apart)."""
    asynchronous = False
    """A flushing runtime finishes each step before the next (`Runtime.asynchronous`)."""

    def __init__(self, parts: StageParts):
        layered, plan, groups, device, compiler = parts.layered, parts.plan, parts.groups, parts.device, parts.compiler
        self.plan, self.groups, self.loss, self.device = plan, groups, parts.loss, device
        self.replica, stage_rank = plan.coords(parts.rank)
        self.stage_indices = plan.local_stages(stage_rank)
        self.dp_peers = len(plan.stage_ranks(stage_rank))  # ranks of this stage across replicas (self included)
        every = parse_recompute(parts.recompute)
        self.modules = [
            StageModule(
                layered.units[slice(*plan.active_range(s))],
                every,
                parts.compute_dtype,
                compiler,
                plan.active_range(s)[0],
            ).to(device)
            for s in self.stage_indices
        ]
        if compiler is not None:  # the new variants compile now, in the transition, not in the steps after it
            for s, m in zip(self.stage_indices, self.modules, strict=True):
                compiler.warm_stage(m, plan.active_range(s)[0], s, plan)
        self.is_first = 0 in self.stage_indices
        self.is_last = plan.num_stages - 1 in self.stage_indices
        self.unit_indices = [u for s in self.stage_indices for u in range(*plan.active_range(s))]
        # Fixed for the layout (freezing builds a new runtime): walking the modules every step costs time.
        self._trainable = [p for p in self._unique_parameters() if p.requires_grad]
        # A tied weight's gradient is norm-counted on the rank holding its owner (first) unit only.
        self._norm_excluded = {
            id(layered.model.get_parameter(name))
            for name, units in layered.tied.items()
            if units[0] not in self.unit_indices
        }
        # The tied weights this rank shares with other ranks of its replica, in the same order everywhere.
        self._tied = [(layered.model.get_parameter(name), groups.tied[name]) for name in sorted(groups.tied)]

    def run_step(self, step: Step, apply_update: ApplyUpdate, loss_scale: float = 1.0, drain: bool = False) -> None:
        """`step`'s forward and backward passes, then its update, `apply_update(step, loss)` (a flushing schedule
        finishes every step: `drain` changes nothing)."""
        apply_update(step, self.forward_backward(step.inputs, step.target, step.denominator, loss_scale))

    def pause(self) -> None:
        """Nothing outlives a step."""

    def take_stash_peak(self) -> None:
        """No weight versions are stashed."""
        return None

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
        """This rank's parameters that train (a tied weight held by two local stages is listed once), as
        they were when the layout was built."""
        return list(self._trainable)

    def zero_grad(self) -> None:
        for p in self._trainable:  # only these ever get gradients
            p.grad = None

    def train(self, mode: bool = True) -> None:
        """Set the stages' mode; a no-op when it is already set (walking every submodule each step costs a
        few percent of a small model's step). Freezing rebuilds the runtime, so the frozen units' eval mode
        (`StageModule.train`) is set again for every new layout."""
        if getattr(self, "_mode", None) is mode:
            return
        for m in self.modules:
            m.train(mode)
        self._mode = mode

    # ---- gradients ----------------------------------------------------------------------------------
    syncs_in_backward = False
    """Whether the data-parallel all-reduce already ran inside the backward pass (DDP's buckets)."""

    def _all_reduce_dp(self, grads: list[torch.Tensor]) -> None:
        """Sum the replicas' partial gradients over the DP group in one flat buffer."""
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.groups.dp)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def sync_and_clip(self, max_norm: float, inv_scale: float = 1.0) -> Norms:
        """Make every gradient the global one, then clip by the global norm. Returns the norms before the clip:
        the global one, the same on every rank (non-finite if any stage's gradients overflowed: fp16's
        step-or-skip verdict), and each counted parameter's.

        1. All-reduce over the DP group: the replicas' partial sums (a stage shared by all replicas already
           holds their sum). DDP-wrapped stages (`syncs_in_backward`) did this during the backward pass.
        2. All-reduce each tied weight over the ranks of this replica that hold a copy (DeepSpeed's rule):
           the embedding's and the decoder's contributions add up, and both copies step identically.
        3. The norm over all stages (the PP group; replicas are identical after step 1), counting a tied
           weight once; over this rank's stage alone when `clip_over_pipeline` is off.
        `inv_scale` undoes fp16's loss scale before the norm. Everything stays on the device: no host
        synchronisation."""
        for p, _ in self._tied:
            if p.requires_grad and p.grad is None:  # every holder takes part in the tied all-reduce
                p.grad = torch.zeros_like(p)
        params = [p for p in self._trainable if p.grad is not None]
        grads = [p.grad for p in params]
        if self.dp_peers > 1 and grads and not self.syncs_in_backward:
            self._all_reduce_dp(grads)
        for p, group in self._tied:
            if p.requires_grad:
                dist.all_reduce(p.grad, group=group)
        if inv_scale != 1.0 and grads:
            torch._foreach_mul_(grads, inv_scale)
        counted = [p for p in params if id(p) not in self._norm_excluded]
        # One fused kernel for every parameter's norm (what torch.nn.utils.get_total_norm runs), kept per
        # parameter because the freeze policies read per-block norms.
        norms = torch._foreach_norm([p.grad for p in counted]) if counted else []
        sq = torch.stack(norms).double().pow(2) if norms else torch.zeros(0, dtype=torch.float64, device=self.device)
        total_sq = sq.sum()
        if self.plan.pp > 1 and self.clip_over_pipeline:
            dist.all_reduce(total_sq, group=self.groups.pp)
        norm = total_sq.sqrt().float()
        if max_norm > 0 and grads:
            # Non-finite norms (an fp16 overflow) leave the gradients as they are: the step is skipped.
            coef = torch.where(torch.isfinite(norm), (max_norm / (norm + 1e-6)).clamp(max=1.0), 1.0)
            torch._foreach_mul_(grads, coef)
        return Norms(norm, sq, counted)


def data_parallel(module: nn.Module, groups: Groups, device: torch.device) -> DistributedDataParallel:
    """`module` in DistributedDataParallel over the DP group, summing (not averaging) the replicas' bucketed
    gradients during the backward pass. No initial broadcast: every replica already holds the same weights
    (one seed, or moved there by AutoDP)."""
    ddp = DistributedDataParallel(
        module,
        process_group=groups.dp,
        init_sync=False,
        gradient_as_bucket_view=True,
        device_ids=[device.index] if device.type == "cuda" else None,
        **ddp_no_buffer_sync(),
    )
    ddp.register_comm_hook(groups.dp, _sum_hook)
    return ddp


def _sum_hook(group, bucket):
    """DDP communication hook: sum a bucket over the DP group (DDP's default averages; ptrun's loss already
    divides by the global batch, so the replicas' partial gradients must add up, as in `_all_reduce_dp`)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])
