"""PipeDream's asynchronous 1F1B (SOSP 2019): a pipeline that never flushes between mini-batches.

Each stage keeps up to `K - s` mini-batches in flight (stage s of K), alternates one forward and one backward
pass once the pipeline is full, and updates its weights right after each backward pass, so every stage is
busy in the steady state and there is no bubble. The price is staleness: stage s runs mini-batch t's forward
pass with the weights of `K - s - 1` updates ago (the later mini-batches' updates have not come back yet).

- **Weight stashing** (`pipe.weight_stashing`): the forward pass runs on a snapshot of the stage's weights
  (one per version in flight, shared by the mini-batches of that version); the backward pass differentiates
  through the same snapshot, so each mini-batch's gradient is the true gradient of the function its forward
  pass computed. The gradient is then applied to the current weights. Off, one working copy is refreshed in
  place after every update, so a backward pass sees weights newer than its forward pass did.
- **Vertical sync** (`pipe.vertical_sync`): the input stage's version number travels with each mini-batch,
  and every later stage runs it with its own weights of that version (kept until no mini-batch can ask for
  them), so all stages agree on one version per mini-batch.

Here a mini-batch is one replica's batch of a step (M = 1), and one update per stage per step keeps the
step count, the learning-rate schedule and the loss normalisation of the flushing schedules; replicas of a
stage all-reduce their gradients at the same step, as in data parallelism.

**Stage replication** (`pipe.first_stage_replicas`, a Plan with `replicate_first_only`): the first stage
runs on R ranks and every later stage on one rank, which runs the R replicas' mini-batches of a step in turn
(round robin: "lanes"), receiving lane d from replica d and sending lane d's gradient back to it. Its
gradient is the sum over its lanes, so it equals what R pipelines' all-reduce would give, and the whole run
trains exactly as K x R pipelines would: only the placement differs.

The pipeline drains (every mini-batch in flight finishes its backward pass and its update) wherever the
caller ends a segment: at every epoch's end, before a layout change, and before a mid-epoch checkpoint.
Activations and gradients cross stage boundaries by point-to-point send/recv: sends are asynchronous,
receives block, and every stage follows the same order of mini-batches (and lanes), so the pipeline cannot
deadlock.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch.func import functional_call

from ptrun.config import ConfigError
from ptrun.parallel.pipeline import ApplyUpdate, StageParts, StageRuntime, Step


def backwards_due(in_flight: int, limit: int, drain: bool) -> int:
    """PipeDream's 1F1B order for one stage, after a step's forward pass: how many of the `in_flight` steps
    (that one included) run their backward pass now, oldest first. Once `limit` steps are in flight the
    oldest one's; with `drain` every one (nothing after it starts until all have finished). The next step's
    forward pass comes after them, so a stage alternates one forward and one backward pass once full."""
    if drain:
        return in_flight
    return 1 if in_flight >= limit else 0


@dataclass
class _InFlight:
    step: Step
    loss_scale: float
    version: int
    weights: dict[str, torch.Tensor] | None  # the tensors the forward pass ran on (None: the live parameters)
    inputs: list[tuple] = field(default_factory=list)  # per lane (replica served)
    outputs: list[torch.Tensor] = field(default_factory=list)  # per lane: the output head, or the loss (last stage)
    loss: torch.Tensor | None = None  # the lanes' losses summed (last stage)
    trace: dict = field(default_factory=dict)


# ---- point-to-point messages --------------------------------------------------------------------------
_DTYPES = [
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.uint8,
]
_MAX_TENSORS, _MAX_DIMS = 4, 6
_HEADER = 2 + _MAX_TENSORS * (2 + _MAX_DIMS)
_TAG_FORWARD, _TAG_BACKWARD = 1, 2


def _header(tensors: tuple, version: int) -> torch.Tensor:
    """[version, count, (dtype code, ndim, dims...) per tensor], so the receiver can allocate."""
    if len(tensors) > _MAX_TENSORS or any(t.dim() > _MAX_DIMS for t in tensors):
        raise ValueError(f"a stage may pass at most {_MAX_TENSORS} tensors of at most {_MAX_DIMS} dimensions")
    head = torch.zeros(_HEADER, dtype=torch.int64)
    head[0], head[1] = version, len(tensors)
    for i, t in enumerate(tensors):
        base = 2 + i * (2 + _MAX_DIMS)
        head[base], head[base + 1] = _DTYPES.index(t.dtype), t.dim()
        head[base + 2 : base + 2 + t.dim()] = torch.tensor(t.shape)
    return head


def _parse_header(head: torch.Tensor) -> tuple[int, list[tuple[torch.dtype, tuple[int, ...]]]]:
    values = head.tolist()
    specs = []
    for i in range(values[1]):
        base = 2 + i * (2 + _MAX_DIMS)
        specs.append((_DTYPES[values[base]], tuple(values[base + 2 : base + 2 + values[base + 1]])))
    return values[0], specs


class AsyncPipelineRuntime(StageRuntime):
    """This rank's stage of `plan`, run with PipeDream's asynchronous 1F1B (`pipe.schedule=pipedream`).

    `run_step` takes one mini-batch at a time and calls the caller's update for each when it is due;
    `forward_only` evaluates (synchronously: evaluation changes no weights). The optimizer belongs to the
    caller, which steps it in that call; the version counter here counts those updates."""

    clip_over_pipeline = False  # the stages are at different steps: each clips by its own norm
    asynchronous = True  # later steps are in flight when one's update is due

    def __init__(self, parts: StageParts, weight_stashing: bool = True, vertical_sync: bool = False):
        super().__init__(replace(parts, recompute="none"))  # the config allows no other under pipedream
        plan, rank = parts.plan, parts.rank
        for name, units in parts.layered.tied.items():
            if name in parts.layered.fixed:
                continue  # a base weight under adapters never steps: its copies stay equal
            holders = {plan.stage_of_unit(u) for u in units if u >= plan.cached_units}
            if len(holders) > 1:
                raise ConfigError(
                    f"pipe.schedule=pipedream is not allowed for this model: {name} is tied across "
                    f"stages {sorted(holders)}, which step apart; use a flushing schedule (1F1B)"
                )
        self.module = self.modules[0]
        self.stage = self.stage_indices[0]
        # The replicas whose mini-batches this rank runs: its own, or (a later stage shared under PipeDream's
        # stage replication) every replica's in turn. Each lane talks to that replica's neighbours, so a
        # mini-batch's gradient goes back to the rank that ran its forward pass.
        self.lanes = plan.lanes(rank)
        self.prev_ranks = [plan.rank_of(d, self.stage - 1) for d in self.lanes] if not self.is_first else []
        self.next_ranks = [plan.rank_of(d, self.stage + 1) for d in self.lanes] if not self.is_last else []
        self.limit = plan.pp - self.stage  # mini-batches in flight: the 1F1B warm-up depth of this stage
        self.weight_stashing = weight_stashing
        self.vertical_sync = vertical_sync and not self.is_first  # the input stage's own version is the one
        self.version = 0  # updates applied since this layout was built (every stage starts drained at 0)
        self._live = {n: p for n, p in self.module.named_parameters() if p.requires_grad}
        # A stage with one mini-batch in flight finishes its backward pass before its next update, so it can
        # run on the live weights; so can a frozen stage. Otherwise the forward pass runs on copies.
        self._copies = bool(self._live) and (self.limit > 1 or self.vertical_sync)
        self._stash: dict[int, dict[str, torch.Tensor]] = {}  # version -> snapshot (weight stashing)
        self._working: dict[str, torch.Tensor] | None = None  # the one copy refreshed in place (no stashing)
        self._newest_requested = 0  # vertical sync: no later mini-batch asks for an older version than this
        self._sends: list = []  # (work, tensors) of asynchronous sends not yet known complete
        self._in_flight: deque[_InFlight] = deque()  # the steps whose forward pass ran and backward has not
        self.stash_bytes_peak = 0
        self.trace: list[dict] | None = None  # tests: per pass, the version and a fingerprint of the weights used

    # ---- weights ------------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone().requires_grad_(True) for n, p in self._live.items()}

    def _weights_for(self, version: int) -> dict[str, torch.Tensor] | None:
        if not self._copies:
            return None
        if not self.weight_stashing:
            if self._working is None:
                self._working = self._snapshot()
                self.stash_bytes_peak = max(self.stash_bytes_peak, self.stash_bytes)
            return self._working
        if version not in self._stash:
            if version != self.version:
                raise RuntimeError(
                    f"stage {self.stage}: weight version {version} was asked for but not kept (current {self.version})"
                )
            self._stash[version] = self._snapshot()
            self.stash_bytes_peak = max(self.stash_bytes_peak, self.stash_bytes)
        return self._stash[version]

    def _after_update(self, in_flight: deque) -> None:
        """Bump the version and keep exactly the snapshots a mini-batch in flight or still to come may use."""
        self.version += 1
        if not self._copies:
            return
        if not self.weight_stashing:
            for n, w in self._working.items():
                # `.data` bypasses autograd's version check on purpose: the backward passes in flight then
                # see the new weights, which is what running without weight stashing means.
                w.data.copy_(self._live[n].data)
            self.stash_bytes_peak = max(self.stash_bytes_peak, self.stash_bytes)
            return
        if self.vertical_sync:
            self._stash[self.version] = self._snapshot()  # a later mini-batch may ask for this version
        keep = {r.version for r in in_flight}
        if self.vertical_sync:
            keep |= {v for v in self._stash if v >= self._newest_requested}
        else:
            keep.add(self.version)
        for v in [v for v in self._stash if v not in keep]:
            del self._stash[v]
        self.stash_bytes_peak = max(self.stash_bytes_peak, self.stash_bytes)

    @property
    def stash_bytes(self) -> int:
        """Bytes of weight copies held now (stashed versions, or the one working copy)."""
        copies = list(self._stash.values()) + ([self._working] if self._working is not None else [])
        return sum(t.numel() * t.element_size() for snap in copies for t in snap.values())

    def _fingerprint(self, weights: dict[str, torch.Tensor] | None) -> float:
        tensors = (weights or self._live).values()
        return float(sum(t.detach().double().abs().sum() + t.detach().double().sum() * 1e-3 for t in tensors))

    # ---- messages -----------------------------------------------------------------------------------
    def _send(self, tensors: tuple, dst: int, tag: int, version: int | None = None) -> None:
        tensors = tuple(t.detach().contiguous() for t in tensors)
        if version is not None:
            tensors = (_header(tensors, version).to(self.device), *tensors)
        for t in tensors:
            self._sends.append((dist.isend(t, dst, tag=tag), t))
        self._sends = [(w, t) for w, t in self._sends if not w.is_completed()]

    def _recv_activations(self, src: int) -> tuple[int, tuple]:
        head = torch.empty(_HEADER, dtype=torch.int64, device=self.device)
        dist.recv(head, src, tag=_TAG_FORWARD)
        version, specs = _parse_header(head.cpu())
        tensors = []
        for dtype, shape in specs:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(t, src, tag=_TAG_FORWARD)
            tensors.append(t)
        return version, tuple(tensors)

    def _lane_targets(self, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A shared stage's batch is the whole global batch: lane d's share is its d-th contiguous slice,
        the replica batch the sampler gives replica d."""
        return torch.tensor_split(target, len(self.lanes)) if len(self.lanes) > 1 else (target,)

    def _wait_sends(self) -> None:
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

    # ---- passes -------------------------------------------------------------------------------------
    def _run_module(self, weights: dict[str, torch.Tensor] | None, carry: tuple):
        if weights is None:
            return self.module(*carry)
        return functional_call(self.module, weights, carry, strict=False)

    def _forward(self, step: Step, loss_scale: float) -> _InFlight:
        version = self.version
        record = _InFlight(step, loss_scale, version, None)
        targets = self._lane_targets(step.target) if self.is_last else ()
        sent_versions = []
        for i in range(len(self.lanes)):
            carry = step.inputs
            if not self.is_first:
                sent, carry = self._recv_activations(self.prev_ranks[i])
                sent_versions.append(sent)
                if self.vertical_sync and i == 0:  # the replicas of the input stage step together
                    version = record.version = sent
                    self._newest_requested = sent
                # a leaf that takes the gradient this stage sends back
                carry = (carry[0].requires_grad_(carry[0].is_floating_point()), *carry[1:])
            if i == 0:
                record.weights = self._weights_for(version)
            record.inputs.append(carry)
            out = self._run_module(record.weights, carry)
            if self.is_last:
                lane_loss = self.loss(out, targets[i], denominator=step.denominator, scale=loss_scale)
                record.outputs.append(lane_loss)
                record.loss = lane_loss if record.loss is None else record.loss + lane_loss
            else:
                out = out if isinstance(out, tuple) else (out,)
                record.outputs.append(out[0])
                self._send(
                    out, self.next_ranks[i], _TAG_FORWARD, version=version if self.vertical_sync else self.version
                )
        if self.trace is not None:
            record.trace = {
                "stage": self.stage,
                "step": step.step,
                "version": version,
                "forward_fingerprint": self._fingerprint(record.weights),
                "lanes": list(self.lanes),
                "received_versions": sent_versions,
                "from_ranks": list(self.prev_ranks),
                "to_ranks": list(self.next_ranks),
            }
        return record

    def _backward(self, record: _InFlight) -> None:
        for i, output in enumerate(record.outputs):
            grad = None
            if not self.is_last:
                grad = torch.empty(output.shape, dtype=output.dtype, device=self.device)
                dist.recv(grad, self.next_ranks[i], tag=_TAG_BACKWARD)
            if output.requires_grad:
                torch.autograd.backward(output, grad)
            if not self.is_first:  # back to the rank that ran this lane's forward pass on the stage before
                head = record.inputs[i][0]
                self._send(
                    (head.grad if head.grad is not None else torch.zeros_like(head),), self.prev_ranks[i], _TAG_BACKWARD
                )
        if record.weights is not None:  # the gradient of the copy is the gradient for the live weights
            for n, w in record.weights.items():
                if w.grad is not None:
                    live = self._live[n]
                    live.grad = w.grad if live.grad is None else live.grad + w.grad
                    w.grad = None
        if self.trace is not None:
            self.trace.append(
                {
                    **record.trace,
                    "backward_fingerprint": self._fingerprint(record.weights),
                    "grads": {n: p.grad.detach().clone() for n, p in self._live.items() if p.grad is not None},
                }
            )

    def run_step(self, step: Step, apply_update: ApplyUpdate, loss_scale: float = 1.0, drain: bool = False) -> None:
        """`step`'s forward pass, then the backward passes PipeDream's 1F1B runs now (`backwards_due`): after
        each, `apply_update(step, loss)` for that step (the loss on the last stage only: this replica's share
        of the global mean loss) and the new weight version, before the next backward pass, whose gradient
        must not join this one's. The pipeline drains (every step in flight finishes) with `drain`, which the
        caller asks for at a segment's last step and before a mid-epoch checkpoint."""
        self.train(True)
        self._in_flight.append(self._forward(step, loss_scale))
        for _ in range(backwards_due(len(self._in_flight), self.limit, drain)):
            record = self._in_flight.popleft()
            self._backward(record)
            apply_update(record.step, record.loss.detach() if record.loss is not None else None)
            self._after_update(self._in_flight)
            if not self._in_flight:
                self._wait_sends()  # drained: nothing of this segment is left on the wire

    def pause(self) -> None:
        """The stashed weight copies go: they are rebuilt from the current weights when training resumes."""
        self._stash.clear()
        self._working = None

    def take_stash_peak(self) -> int:
        """The most bytes of stashed weight versions held since the last call."""
        peak, self.stash_bytes_peak = self.stash_bytes_peak, 0
        return peak

    @torch.no_grad()
    def forward_only(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        """Forward one replica batch through the pipeline with the current weights; returns the output on
        the last stage."""
        self.train(False)
        outs = []
        for i in range(len(self.lanes)):
            carry = inputs if self.is_first else self._recv_activations(self.prev_ranks[i])[1]
            out = self.module(*carry)
            if self.is_last:
                outs.append(out)
            else:
                self._send(
                    out if isinstance(out, tuple) else (out,), self.next_ranks[i], _TAG_FORWARD, version=self.version
                )
        self._wait_sends()
        if not self.is_last:
            return None
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    # ---- timeline -----------------------------------------------------------------------------------
    def record_timeline(self) -> list[dict]:
        """Time every forward and backward pass of this stage until `stop_timeline` (steps of the epoch
        in place of micro-batches)."""
        events: list[dict] = []
        self._timed_originals = (self._forward, self._backward)

        def forward(step: Step, loss_scale: float) -> _InFlight:
            start = time.time()
            record = self._timed_originals[0](step, loss_scale)
            events.append(
                {"stage": self.stage, "microbatch": step.step, "kind": "F", "start_s": start, "end_s": time.time()}
            )
            return record

        def backward(record: _InFlight) -> None:
            start = time.time()
            self._timed_originals[1](record)
            events.append(
                {
                    "stage": self.stage,
                    "microbatch": record.step.step,
                    "kind": "B",
                    "start_s": start,
                    "end_s": time.time(),
                }
            )

        self._forward, self._backward = forward, backward
        return events

    def stop_timeline(self) -> None:
        if getattr(self, "_timed_originals", None):
            del self._forward, self._backward
            self._timed_originals = None
