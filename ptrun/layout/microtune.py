"""Micro-batch auto-tuning (`pipe.microbatches=auto`): time a few training steps at each candidate M for every
pipeline length K the run may use, and take the fastest M per K.

The paper profiled M from K to 6K once per machine and fixed the result in a table; the
best M depends on the model, the batch, the device and the links (on 2 CPU cores per-micro-batch overhead
wins and M = K is fastest; on GPUs a larger M shrinks the bubble). So ptrun measures it in the running job:

- `candidates`: the (K, M) pairs. K is the starting length and, when AutoPipe may shorten the pipeline,
  its halvings down to 1 (the per-replica batch at each K follows `auto.batch`); M runs over K, 2K, ..., 6K
  (1-6 at K = 1) that divide the per-replica batch and that the schedule accepts (`schedule_problem`). A K
  with none of those gets the one M AutoPipe would pick there.
- `measure` (collective, before training): for each K with more than one candidate and each M, build the
  layout as the trainer does, run warm-up and timed forward + backward steps on real training batches
  (with the gradient all-reduce of a real step, no optimizer step), and take the slowest rank's mean step
  time. Weights, buffers, gradients and the random generators end as they were, so tuning changes nothing
  about training.
- `choose` (pure): the fastest M per K; within `TIE` of the fastest the fewer micro-batches win (fewer
  schedule actions and sends, larger and more efficient kernels; the difference is noise anyway), with a
  one-line reason.
- `ptrun.layout.tuning` runs them: `tune` reads the measured times from its disk cache (a model is measured
  once per machine) or measures them, then chooses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ptrun.config import ConfigError, schedule_problem
from ptrun.config.freezing import freezes
from ptrun.data.sampler import EpochSampler
from ptrun.layout.microbatches import batch_sizes, pick_microbatches
from ptrun.layout.plan import Plan
from ptrun.models.losses import make_target

MULTIPLES = range(1, 7)
"""M = K x 1 .. K x 6: the paper's profiling range."""
K1_CANDIDATES = range(1, 7)
"""At K = 1 there is no bubble to fill; M only trades kernel size for activation memory: 1-6."""
TIE = 0.03
"""Step times within 3% of the fastest count as equal (run-to-run noise is larger); the fewer M wins."""
WARMUP_STEPS = 2
"""Untimed steps per candidate: the first builds the schedule's buffers and warms the allocator."""
TIMED_BUDGET_S = 0.5
"""Timed seconds to aim for per candidate (more steps for small models, whose steps are noisier)."""
TIMED_STEPS = (3, 30)
"""Fewest and most timed steps per candidate, whatever the budget says."""
BATCHES = 4
"""Distinct training batches cycled through while timing (the first steps of epoch 0)."""
VERSION = 1
"""Bump when what is measured changes: older cache files then miss."""


@dataclass(frozen=True)
class Length:
    """One pipeline length the run may use, and the micro-batch counts to try there."""

    pp: int
    dp: int
    per_replica: int
    """Samples per replica per step at this K (`auto.batch`)."""
    global_batch: int
    microbatches: tuple[int, ...]
    """Candidate M, ascending; a single one is taken without measuring."""


@dataclass(frozen=True)
class Choice:
    pp: int
    microbatches: int
    reason: str


def shrinking(cfg) -> bool:
    """Whether AutoPipe may shorten the pipeline in this run (else only the starting K is ever used): it
    needs freezing, AutoPipe and AutoDP on, and an epoch boundary to act at."""
    return bool(
        cfg.auto.freeze
        and freezes(cfg.freeze.policy)
        and cfg.freeze.max_fraction > 0
        and cfg.auto.pipe
        and cfg.auto.dp
        and cfg.train.epochs > 1
    )


def candidates(
    pp: int,
    world_size: int,
    global_batch: int,
    schedule: str,
    *,
    stages_per_rank: int = 1,
    batch_policy: str = "fixed_global",
    shrinks: bool = True,
) -> list[Length]:
    """The lengths to tune, longest first: the starting `pp` and, with `shrinks`, each halving AutoPipe can
    reach (it halves while K is even, and stops at a K whose batch does not split: `next_plan`)."""
    dp0 = world_size // pp
    out: list[Length] = []
    k = pp
    while True:
        try:
            per_replica, batch = batch_sizes(
                world_size // k,
                batch_policy=batch_policy,
                global_batch=global_batch,
                per_pipeline_batch=global_batch // dp0,
            )
            fallback = pick_microbatches(k, per_replica, schedule, stages_per_rank=stages_per_rank)
        except ConfigError:
            if k == pp:
                raise
            break
        counts = K1_CANDIDATES if k == 1 else [k * f for f in MULTIPLES]
        ms = tuple(
            m for m in counts if per_replica % m == 0 and schedule_problem(schedule, k, stages_per_rank, m) is None
        )
        out.append(Length(k, world_size // k, per_replica, batch, ms or (fallback,)))
        if not shrinks or k == 1 or k % 2:
            break
        k //= 2
    return out


# ---- the choice (pure) ---------------------------------------------------------------------------------------


def choose(lengths: Sequence[Length], costs: Mapping[tuple[int, int], float], tie: float = TIE) -> dict[int, Choice]:
    """The M per K from `costs` ({(K, M): seconds per step}): the fastest, except that any M within `tie`
    of the fastest step time and smaller wins (the smallest such M). A K with one candidate needs no cost."""
    out = {}
    for length in lengths:
        k, ms = length.pp, length.microbatches
        if len(ms) == 1:
            seconds = costs.get((k, ms[0]))
            shown = f"{length.global_batch / seconds:.0f} samples/s, " if seconds else ""
            out[k] = Choice(k, ms[0], f"M={ms[0]} at K={k}: {shown}the only candidate")
            continue
        missing = [m for m in ms if not (costs.get((k, m), 0) > 0 and math.isfinite(costs[(k, m)]))]
        if missing:
            raise ValueError(f"no step time for K={k}, M={missing[0]}")
        rate = {m: length.global_batch / costs[(k, m)] for m in ms}
        fastest = min(ms, key=lambda m: (costs[(k, m)], m))
        m = min(m for m in ms if costs[(k, m)] <= costs[(k, fastest)] * (1 + tie))
        head = f"M={m} at K={k}: {rate[m]:.0f} samples/s"
        if m != fastest:
            reason = (
                f"{head}, within {tie:.0%} of the fastest M={fastest} ({rate[fastest]:.0f}, "
                f"{rate[fastest] / rate[m] - 1:+.0%}): the fewer micro-batches"
            )
        else:
            nxt = min((x for x in ms if x != m), key=lambda x: (costs[(k, x)], x))
            reason = f"{head}, next best M={nxt} at {rate[nxt]:.0f} ({rate[nxt] / rate[m] - 1:+.0%})"
        out[k] = Choice(k, m, reason)
    return out


def with_table(choices: Mapping[int, Choice], table: Mapping[Any, int] | None) -> tuple[dict[int, int], list[str]]:
    """The table AutoPipe uses (`Controller.microbatch_table`): the measured M per K with the entries of
    `auto.microbatch_table` laid over it (an explicit entry wins at its K), and a note per entry that
    overrides a measured K."""
    merged = {k: c.microbatches for k, c in choices.items()}
    notes = []
    for key, value in (table or {}).items():
        k, m = int(key), int(value)
        if k in choices and m != choices[k].microbatches:
            notes.append(
                f"K={k} after a change: M={m} from auto.microbatch_table (measured: M={choices[k].microbatches})"
            )
        merged[k] = m
    return merged, notes


# ---- the measurement (collective) ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    inputs: tuple
    target: torch.Tensor
    denominator: float
    """The global batch's loss weight (the trainer's `Step.denominator`)."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _slowest(seconds: float, device: torch.device) -> float:
    """The largest value over all ranks (the same on every rank)."""
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_steps(runtime, batches: Sequence[Batch], device: torch.device) -> float:
    """Collective: the slowest rank's mean seconds per step (forward + backward, and the gradient
    all-reduce and norm of `sync_and_clip`, which a real step has and which keep the ranks in step; no
    clipping, no optimizer step; gradients zeroed after each step)."""

    def step(i: int) -> None:
        b = batches[i % len(batches)]
        runtime.forward_backward(b.inputs, b.target, b.denominator)
        runtime.sync_and_clip(0.0)
        runtime.zero_grad()

    for i in range(WARMUP_STEPS):
        _sync(device)
        t0 = time.perf_counter()
        step(i)
        _sync(device)
        last = time.perf_counter() - t0
    lo, hi = TIMED_STEPS  # every rank must run the same number of steps: derived from an agreed time
    n = max(lo, min(hi, math.ceil(TIMED_BUDGET_S / max(_slowest(last, device), 1e-6))))
    if dist.is_initialized():
        dist.barrier()
    _sync(device)
    t0 = time.perf_counter()
    for i in range(n):
        step(WARMUP_STEPS + i)
    _sync(device)
    return _slowest((time.perf_counter() - t0) / n, device)


def training_batches(
    dataset,
    length: Length,
    rank: int,
    *,
    seed: int,
    input_names: Sequence[str],
    task: str,
    device: torch.device,
    count: int = BATCHES,
) -> list[Batch]:
    """This rank's replica batches of the first `count` steps of epoch 0 at `length` (real training data,
    in the order training will see it)."""

    sampler = EpochSampler(len(dataset), length.global_batch, seed)
    replica = rank // length.pp
    out = []
    for step in range(min(count, sampler.steps_per_epoch)):
        ids, weight = sampler.replica_batch(0, step, replica, length.dp)
        batch = dict(dataset[ids.tolist()])
        batch["weight"] = weight
        inputs = tuple(batch[k].to(device) for k in input_names if k in batch)
        denominator = float(sampler.global_batch(0, step)[1].sum())
        out.append(Batch(inputs, make_target(batch, task).to(device), denominator))
    return out


def measure(
    lengths: Sequence[Length],
    *,
    plan_at: Callable[[int, int], Plan],
    build: Callable[[Plan], Any],
    batches: Callable[[Length], list[Batch]],
    model: torch.nn.Module,
    device: torch.device,
) -> dict[tuple[int, int], float]:
    """Collective over all ranks: {(K, M): seconds per step} for every K with more than one candidate.

    `plan_at(K, M)` is the Plan to time (nothing frozen), `build(plan)` its Engine (groups + runtime; the
    groups are destroyed after timing), `batches(length)` this rank's real batches at that length. Training
    state is restored afterwards: buffers, gradients (none) and the random generators
    (dropout and augmentation draw from them, so a tuned run trains exactly like an untuned one)."""
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    costs: dict[tuple[int, int], float] = {}
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            for length in lengths:
                if len(length.microbatches) < 2:
                    continue
                data = batches(length)
                for m in length.microbatches:
                    engine = build(plan_at(length.pp, m))
                    try:
                        costs[(length.pp, m)] = time_steps(engine.runtime, data, device)
                    finally:
                        engine.runtime.zero_grad()
                        engine.groups.destroy()
        finally:
            _restore(model, buffers)
    return costs


def _restore(model: torch.nn.Module, buffers: list) -> None:
    with torch.no_grad():
        for b, saved in buffers:
            b.copy_(saved)
    for p in model.parameters():
        p.grad = None


# ---- the disk cache --------------------------------------------------------------------------------------------


# ---- the whole tuning ------------------------------------------------------------------------------------------


__all__ = [
    "Batch",
    "Choice",
    "Length",
    "candidates",
    "choose",
    "measure",
    "shrinking",
    "training_batches",
    "with_table",
]
