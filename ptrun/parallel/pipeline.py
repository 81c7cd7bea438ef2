"""One rank's share of a Plan: its stages (slices of units) run by a torch.distributed.pipelining schedule,
plus the data-parallel gradient all-reduce, the tied-weight all-reduce and the global-norm clip.

K = 1 (pure data parallelism, what most jobs run) skips the pipelining machinery: `LocalRuntime` runs the
one stage module directly, wrapped in torch's DistributedDataParallel so the gradient all-reduce overlaps
the backward pass, which is the loop a user would write by hand. K > 1 runs a schedule
(`PipelineRuntime`); with replicas its stage modules are DDP-wrapped too, and the schedule drives them
(`no_sync` on all but each stage's last micro-batch), except under the zero-bubble schedules, whose split
weight backward bypasses DDP's hooks: there the replicas' gradients are summed after the step. Both run
with the loss function dividing by the global batch weight (schedules with `scale_grads=False`, DDP with a
summing hook), so gradients are exact global means for any K, M, schedule and DP width.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ptrun.compat import ddp_no_buffer_sync
from ptrun.config import SCHEDULE_SPECS, parse_recompute
from ptrun.parallel.compiled import UnitCompiler
from ptrun.parallel.groups import Groups
from ptrun.parallel.plan import Plan
from ptrun.models.losses import WeightedLoss
from ptrun.parallel.stage_module import StageModule


@dataclass
class Step:
    """One mini-batch's data as the trainer hands it to a runtime's `train_step`."""

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


class Runtime(Protocol):
    """What the trainer asks of the runtime of a rank's stages, whichever it is: a flushing schedule
    (`PipelineRuntime`, `LocalRuntime` at K = 1) or PipeDream's asynchronous 1F1B
    (`ptrun.parallel.pipedream.AsyncPipelineRuntime`)."""

    asynchronous: bool
    """Whether steps overlap (later steps are in flight when one's update is due): a stop then waits for the
    epoch's end, where the pipeline drains."""
    is_first: bool
    is_last: bool
    unit_indices: list[int]

    def train_step(
        self, step: Step, loss_scale: float = 1.0, drain: bool = False
    ) -> Iterator[tuple[Step, "torch.Tensor | None"]]:
        """`step`'s passes, its loss multiplied by `loss_scale` (fp16's, 1 otherwise) where backward starts;
        yields `(step, loss)` for each step whose update is now due (the caller applies it, then resumes): a
        flushing runtime yields `step` itself, PipeDream the oldest step in flight once its pipeline is full,
        and with `drain` every step in flight. The loss is this rank's share of the global mean loss (None
        where an asynchronous stage has none), without the loss scale."""

    def pause(self) -> None:
        """Training stops here for a while (a decision, an evaluation, the epoch's end; nothing is in flight):
        what only running steps need goes."""

    def sync_and_clip(self, max_norm: float, inv_scale: float = 1.0, per_parameter: bool = False) -> torch.Tensor: ...

    def zero_grad(self) -> None: ...

    def trainable_parameters(self) -> list[nn.Parameter]: ...

    def forward_only(self, inputs: tuple, target: torch.Tensor) -> "torch.Tensor | None": ...

    def take_stash_peak(self) -> "int | None":
        """PipeDream: the most bytes of stashed weight versions held since the last call; None elsewhere."""


class StageRuntime:
    """What every runtime of one rank's stages shares: the stage modules, their parameters, and the
    gradient all-reduce and clip. `PipelineRuntime` runs them with a flushing schedule; the asynchronous
    `ptrun.parallel.pipedream.AsyncPipelineRuntime` without flushes."""

    clip_over_pipeline = True
    """Whether the clipping norm spans every stage (a flushing schedule: all stages are at the same step)
    or this stage alone (asynchronous stages step apart)."""
    asynchronous = False
    """A flushing runtime finishes each step before the next (`Runtime.asynchronous`)."""

    def __init__(
        self,
        layered,
        plan: Plan,
        rank: int,
        groups: Groups,
        device: torch.device,
        loss: WeightedLoss,
        recompute: str = "none",
        compute_dtype: torch.dtype | None = None,
        compiler: UnitCompiler | None = None,
    ):
        self.plan, self.groups, self.loss, self.device = plan, groups, loss, device
        self.replica, stage_rank = plan.coords(rank)
        self.stage_indices = plan.local_stages(stage_rank)
        self.dp_peers = len(plan.stage_ranks(stage_rank))  # ranks of this stage across replicas (self included)
        every = parse_recompute(recompute)
        self.modules = [
            StageModule(
                layered.units[slice(*plan.active_range(s))], every, compute_dtype, compiler, plan.active_range(s)[0]
            ).to(device)
            for s in self.stage_indices
        ]
        if compiler is not None:  # the new variants compile now, in the transition, not in the steps after it
            for s, m in zip(self.stage_indices, self.modules):
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

    def train_step(
        self, step: Step, loss_scale: float = 1.0, drain: bool = False
    ) -> Iterator[tuple[Step, torch.Tensor]]:
        """`step`'s forward and backward passes; yields `(step, loss)` for its update (a flushing schedule
        finishes every step: `drain` changes nothing)."""
        yield step, self.forward_backward(step.inputs, step.target, step.denominator, loss_scale)

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

    def sync_and_clip(self, max_norm: float, inv_scale: float = 1.0, per_parameter: bool = False) -> torch.Tensor:
        """Make every gradient the global one, then clip by the global norm. Returns the pre-clip norm, the
        same on every rank (non-finite if any stage's gradients overflowed: fp16's step-or-skip verdict).

        1. All-reduce over the DP group: the replicas' partial sums (a stage shared by all replicas already
           holds their sum). DDP-wrapped stages (`syncs_in_backward`) did this during the backward pass.
        2. All-reduce each tied weight over the ranks of this replica that hold a copy (DeepSpeed's rule):
           the embedding's and the decoder's contributions add up, and both copies step identically.
        3. The norm over all stages (the PP group; replicas are identical after step 1), counting a tied
           weight once; over this rank's stage alone when `clip_over_pipeline` is off.
        `inv_scale` undoes fp16's loss scale before the norm. With `per_parameter`, `grad_sq` holds each
        counted parameter's squared gradient norm before clipping (float64, in the order of `grad_sq_params`).
        Everything stays on the device: no host synchronisation."""
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
        if per_parameter:
            self.grad_sq, self.grad_sq_params = sq, counted
        total_sq = sq.sum()
        if self.plan.pp > 1 and self.clip_over_pipeline:
            dist.all_reduce(total_sq, group=self.groups.pp)
        norm = total_sq.sqrt().float()
        if max_norm > 0 and grads:
            # Non-finite norms (an fp16 overflow) leave the gradients as they are: the step is skipped.
            coef = torch.where(torch.isfinite(norm), (max_norm / (norm + 1e-6)).clamp(max=1.0), 1.0)
            torch._foreach_mul_(grads, coef)
        return norm


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


class PipelineRuntime(StageRuntime):
    """Builds and runs this rank's stages of `plan` with a torch.distributed.pipelining schedule, which
    flushes the pipeline every step."""

    def __init__(
        self,
        layered,
        plan: Plan,
        rank: int,
        groups: Groups,
        device: torch.device,
        loss: WeightedLoss,
        recompute: str = "none",
        compute_dtype: torch.dtype | None = None,
        compiler: UnitCompiler | None = None,
    ):
        super().__init__(layered, plan, rank, groups, device, loss, recompute, compute_dtype, compiler)
        import torch.distributed.pipelining as pipelining

        # PipelineStage drives a DDP-wrapped module itself: `no_sync` on every micro-batch but the stage's
        # last, whose backward then all-reduces bucket by bucket as gradients become ready. A weight that two
        # of this rank's stages share (a tie inside one rank) would be reduced by both wrappers: then, as under
        # the split-backward schedules, the replicas are summed after the step.
        shared = sum(len([p for p in m.parameters() if p.requires_grad]) for m in self.modules) > len(self._trainable)
        spec = SCHEDULE_SPECS[plan.schedule]
        wrap = self.dp_peers > 1 and not spec.split_backward and not shared
        runs = [
            data_parallel(m, groups, device) if wrap and any(p.requires_grad for p in m.parameters()) else m
            for m in self.modules
        ]
        self._ddp = [m for m in runs if isinstance(m, DistributedDataParallel)]
        self.syncs_in_backward = bool(self._ddp)
        self.stages = [
            pipelining.PipelineStage(m, s, plan.num_stages, device, group=groups.pp)
            for m, s in zip(runs, self.stage_indices)
        ]
        kwargs = dict(n_microbatches=plan.microbatches, loss_fn=loss, scale_grads=False)
        # torch.distributed.pipelining's `Schedule<name>` classes, imported only where a pipeline runs: the
        # module brings in torch._dynamo, about 1.8 s of every worker's start-up.
        schedule = getattr(pipelining, f"Schedule{plan.schedule}")
        self.schedule = schedule(self.stages[0] if spec.stages_per_rank == 1 else self.stages, **kwargs)

    # ---- running ------------------------------------------------------------------------------------
    def _run(self, run, inputs: tuple, target: torch.Tensor | None, **last):
        """`run` (the schedule's `step` or `eval`) with the inputs on the first stage, and on the last the
        target and `last` (the list the losses go into, the loss's keywords)."""
        args = inputs if self.is_first else ()
        kwargs = {"target": target, **last} if self.is_last and target is not None else {}
        return run(*args, **kwargs)

    def forward_backward(
        self, inputs: tuple, target: torch.Tensor, denominator: float, loss_scale: float = 1.0
    ) -> torch.Tensor:
        """One pipelined forward + backward over the replica batch, the loss divided by `denominator` and
        multiplied by `loss_scale` (`Runtime.train_step`). Returns this rank's share of the global mean loss
        (non-zero on last stages only; summing over all ranks gives the global loss), without the loss scale."""
        self.train(True)
        losses: list[torch.Tensor] = []
        with contextlib.ExitStack() as stack:
            # The stage runs every forward under `no_sync` and prepares DDP's reduction itself before each
            # stage's last backward. Outside `no_sync` are only the first step's shape inference, a real
            # forward and backward that must not reduce: so DDP's own forward never prepares one.
            for ddp in self._ddp:
                stack.enter_context(ddp.no_sync())
            self._run(
                self.schedule.step,
                inputs,
                target,
                losses=losses,
                loss_kwargs={"denominator": denominator, "scale": loss_scale},
            )
        if self.is_last:
            return torch.stack([loss.detach().float() for loss in losses]).sum() / loss_scale
        return torch.zeros((), device=self.device)

    @torch.no_grad()
    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        """Forward the replica batch through the pipeline; returns the merged output on the last stage.
        (The schedule computes its loss on the way, so it needs the target even here.)"""
        self.train(False)
        out = self._run(self.schedule.eval, inputs, target, losses=None)
        return out if self.is_last else None

    # ---- timeline -----------------------------------------------------------------------------------
    def record_timeline(self) -> list[dict]:
        """Time every forward / backward (/ weight-gradient) pass of this rank's stages from now on, until
        `stop_timeline`; returns the list the events go into ({stage, microbatch, kind, start_s, end_s},
        wall-clock seconds, so the ranks of one machine share the clock)."""
        events: list[dict] = []
        self._timed = []
        for stage, index in zip(self.stages, self.stage_indices):
            for method, kind in (
                ("forward_one_chunk", "F"),
                ("backward_one_chunk", "B"),
                ("backward_weight_one_chunk", "W"),
            ):
                original = getattr(stage, method)

                def timed(chunk, *args, _run=original, _kind=kind, _stage=index, **kwargs):
                    start = time.time()
                    out = _run(chunk, *args, **kwargs)
                    events.append(
                        {"stage": _stage, "microbatch": chunk, "kind": _kind, "start_s": start, "end_s": time.time()}
                    )
                    return out

                setattr(stage, method, timed)  # an instance attribute shadows the class's method
                self._timed.append((stage, method))
        return events

    def stop_timeline(self) -> None:
        for stage, method in getattr(self, "_timed", []):
            delattr(stage, method)
        self._timed = []


def _sum_hook(group, bucket):
    """DDP communication hook: sum a bucket over the DP group (DDP's default averages; ptrun's loss already
    divides by the global batch, so the replicas' partial gradients must add up, as in `_all_reduce_dp`)."""
    work = dist.all_reduce(bucket.buffer(), group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


class LocalRuntime(StageRuntime):
    """K = 1: the whole (active) model is this rank's one stage, run directly: forward, loss, backward, with
    no schedule, no shape inference and no micro-batch split unless the plan asks for M > 1 (gradient
    accumulation; the all-reduce then runs on the last micro-batch only, through `no_sync`).

    With replicas, the stage module is wrapped in DistributedDataParallel over the DP group, so its bucketed
    all-reduce overlaps the backward pass; a module with nothing to train (never the case at K = 1 in
    practice: the head always trains) runs unwrapped."""

    def __init__(
        self,
        layered,
        plan: Plan,
        rank: int,
        groups: Groups,
        device: torch.device,
        loss: WeightedLoss,
        recompute: str = "none",
        compute_dtype: torch.dtype | None = None,
        compiler: UnitCompiler | None = None,
    ):
        super().__init__(layered, plan, rank, groups, device, loss, recompute, compute_dtype, compiler)
        assert plan.pp == 1 and len(self.modules) == 1, "LocalRuntime runs one stage per replica"
        self.module = self.modules[0]
        self.run = self.module
        if self.dp_peers > 1 and self.trainable_parameters():
            self.run = data_parallel(self.module, groups, device)
            self.syncs_in_backward = True
        self._events: list[dict] | None = None

    def _chunks(self, inputs: tuple, target: torch.Tensor | None) -> list[tuple[tuple, torch.Tensor | None]]:
        m = self.plan.microbatches
        if m == 1:
            return [(inputs, target)]
        # The same equal split as torch.distributed.pipelining's (tensor_split along the batch dimension).
        split = [x.tensor_split(m) for x in inputs]
        targets = target.tensor_split(m) if target is not None else [None] * m
        return [(tuple(parts[i] for parts in split), targets[i]) for i in range(m)]

    def _timed(self, kind: str, chunk: int, fn, *args):
        if self._events is None:
            return fn(*args)
        start = time.time()
        out = fn(*args)
        self._events.append({"stage": 0, "microbatch": chunk, "kind": kind, "start_s": start, "end_s": time.time()})
        return out

    def forward_backward(
        self, inputs: tuple, target: torch.Tensor, denominator: float, loss_scale: float = 1.0
    ) -> torch.Tensor:
        """Forward + backward over the replica batch, the loss divided by `denominator` and multiplied by
        `loss_scale` (`Runtime.train_step`); returns this replica's share of the global mean loss (summing over the
        replicas gives the global loss), without the loss scale."""
        self.train(True)
        loss_fn = partial(self.loss, denominator=denominator, scale=loss_scale)
        chunks = self._chunks(inputs, target)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = self.run.no_sync() if (self.syncs_in_backward and not last) else contextlib.nullcontext()
            with sync:
                loss = self._timed("F", i, lambda: loss_fn(self.run(*x), y))
                self._timed("B", i, loss.backward)
            total += loss.detach().float()
        return total / loss_scale

    @torch.no_grad()
    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor:
        """The model's output for the replica batch (evaluation: no DDP, nothing to synchronise)."""
        self.train(False)
        outs = [self.module(*x) for x, _ in self._chunks(inputs, None)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def record_timeline(self) -> list[dict]:
        """Time every forward and backward pass from now on until `stop_timeline` (the events of
        `PipelineRuntime.record_timeline`, all of stage 0)."""
        self._events = []
        return self._events

    def stop_timeline(self) -> None:
        self._events = None


def flushing_runtime(
    layered,
    plan: Plan,
    rank: int,
    groups: Groups,
    device: torch.device,
    loss: WeightedLoss,
    recompute: str = "none",
    compute_dtype: torch.dtype | None = None,
    compiler: UnitCompiler | None = None,
) -> StageRuntime:
    """The runtime of a flushing plan: a single stage runs directly (`LocalRuntime`), more stages run a
    pipelining schedule (`PipelineRuntime`); `compiler` compiles their units (`train.compile`)."""
    kind = LocalRuntime if plan.num_stages == 1 else PipelineRuntime
    return kind(
        layered, plan, rank, groups, device, loss, recompute=recompute, compute_dtype=compute_dtype, compiler=compiler
    )
