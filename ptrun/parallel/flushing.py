"""The flushing runtimes, each step's micro-batches all finished before its update.

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
from functools import partial

import torch
from torch.nn.parallel import DistributedDataParallel

from ptrun.config import SCHEDULE_SPECS
from ptrun.parallel.pipeline import StageParts, StageRuntime, data_parallel


class PipelineRuntime(StageRuntime):
    """Builds and runs this rank's stages of `plan` with a torch.distributed.pipelining schedule, which
    flushes the pipeline every step."""

    def __init__(self, parts: StageParts):
        super().__init__(parts)
        import torch.distributed.pipelining as pipelining  # inner import: optional library

        plan, groups, device = parts.plan, parts.groups, parts.device

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
            for m, s in zip(runs, self.stage_indices, strict=True)
        ]
        kwargs = dict(n_microbatches=plan.microbatches, loss_fn=parts.loss, scale_grads=False)
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
        multiplied by `loss_scale` (`Runtime.run_step`). Returns this rank's share of the global mean loss
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
        for stage, index in zip(self.stages, self.stage_indices, strict=True):
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


class LocalRuntime(StageRuntime):
    """K = 1: the whole (active) model is this rank's one stage, run directly: forward, loss, backward, with
    no schedule, no shape inference and no micro-batch split unless the plan asks for M > 1 (gradient
    accumulation; the all-reduce then runs on the last micro-batch only, through `no_sync`).

    With replicas, the stage module is wrapped in DistributedDataParallel over the DP group, so its bucketed
    all-reduce overlaps the backward pass; a module with nothing to train (never the case at K = 1 in
    practice: the head always trains) runs unwrapped."""

    def __init__(self, parts: StageParts):
        super().__init__(parts)
        assert self.plan.pp == 1 and len(self.modules) == 1, "LocalRuntime runs one stage per replica"
        self.module = self.modules[0]
        self.run = self.module
        if self.dp_peers > 1 and self.trainable_parameters():
            self.run = data_parallel(self.module, parts.groups, parts.device)
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
        `loss_scale` (`Runtime.run_step`); returns this replica's share of the global mean loss (summing over the
        replicas gives the global loss), without the loss scale."""
        self.train(True)
        loss_fn = partial(self.loss, denominator=denominator, scale=loss_scale)
        chunks = self._chunks(inputs, target)
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(chunks):
            last = i == len(chunks) - 1
            sync = self.run.no_sync() if (self.syncs_in_backward and not last) else contextlib.nullcontext()
            with sync:
                loss = self._timed("F", i, lambda x=x, y=y: loss_fn(self.run(*x), y))
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


def flushing_runtime(parts: StageParts) -> StageRuntime:
    """The runtime of a flushing plan: a single stage runs directly (`LocalRuntime`), more stages run a
    pipelining schedule (`PipelineRuntime`)."""
    return (LocalRuntime if parts.plan.num_stages == 1 else PipelineRuntime)(parts)
