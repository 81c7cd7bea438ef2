"""`pipe.length=auto`: the shortest pipeline whose largest stage fits one device, chosen before training.

A stage needs its parameters, their gradients and the optimizer's state (AdamW: two moments, SGD: one
momentum buffer; all float32), plus the activations autograd keeps for the micro-batches in flight. The
activations are measured, not guessed: one sample goes through the units with a saved-tensor hook counting
what each unit stores for its backward pass (the weights it saves are not counted twice), scaled by the
micro-batch size. A pipeline appears only when memory asks for one; everything else trains as data
parallelism, the layout a user would pick.

The same memory model checks every layout against a device: the planner's first layout (`check_fits`), a layout
change the controller decides in a run (`refusal`, else `in_place`), and the layout a worker ran out of memory
in (`largest_stage`, for the keys that would fit). What a device offers is `ptrun.layout.fill.device_budget`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ptrun.config import (
    OPTIMIZER_SPECS,
    SCHEDULE_SPECS,
    ConfigError,
    PtrunConfig,
)
from ptrun.config.layout_rules import auto_lengths, batch_at, length_problem, no_length_fits, stage_problem
from ptrun.layout.microbatches import pick_microbatches
from ptrun.layout.partition import partition, stage_sums
from ptrun.layout.plan import Plan
from ptrun.models.lazy import borrowed, unit_names


def state_copies(optimizer: str) -> int:
    """Tensors of a parameter's size that training keeps per parameter: the parameter, its gradient and the
    optimizer's state (`Optimizer.state_copies`)."""
    return 2 + OPTIMIZER_SPECS[optimizer].state_copies


@dataclass(frozen=True)
class UnitMemory:
    state_bytes: list[float]
    """Bytes per unit that do not scale with the batch: parameters + gradients + optimizer state."""
    activation_bytes: list[float]
    """Bytes per unit autograd keeps for one sample's backward pass."""


def measure_unit_memory(layered, sample: tuple, optimizer: str) -> UnitMemory:
    """Per-unit memory from the model's own units and one sample (a batch of 1) on the host. The units run
    one at a time, each given its values only while it runs (`borrowed`): measuring a model that has no
    values yet holds one unit at a time."""
    copies = state_copies(optimizer)
    params = dict(layered.model.named_parameters())
    state = [
        float(
            sum(layered.param_shapes[n].numel() * params[n].element_size() * copies for n in unit_names(layered, [i]))
        )
        for i in range(len(layered.units))
    ]
    activations: list[float] = []
    carry: tuple = tuple(sample)
    for i, unit in enumerate(layered.units):
        seen: set[int] = set()
        kept = [0]
        with borrowed(layered, [i]):
            weights = {p.untyped_storage().data_ptr() for p in unit.parameters()}

            def pack(t: torch.Tensor, weights=weights, seen=seen, kept=kept):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in weights and ptr not in seen:
                    seen.add(ptr)
                    kept[0] += t.untyped_storage().nbytes()
                return t

            # The random state is restored afterwards: measuring must not shift the run's dropout masks.
            with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = unit(*carry)
        activations.append(float(kept[0]))
        carry = tuple(x.detach() for x in out) if isinstance(out, tuple) else (out.detach(),)
        carry = tuple(x.requires_grad_(True) if x.is_floating_point() else x for x in carry)
    return UnitMemory(state, activations)


@dataclass(frozen=True)
class LengthChoice:
    length: int
    microbatches: int
    stage_bytes: float
    """The chosen layout's largest stage, in bytes."""
    budget: int
    whole_bytes: float
    """The whole model as one stage (K = 1), in bytes."""

    def summary(self) -> str:
        gib = 2**30
        if self.length == 1:
            return (
                f"pipe.length=auto: the model needs ~{self.whole_bytes / gib:.2f} GiB per device (parameters, "
                f"gradients, optimizer state, activations), the device offers {self.budget / gib:.1f} GiB: "
                f"K = 1 (data parallelism), M = {self.microbatches}"
            )
        return (
            f"pipe.length=auto: the whole model needs ~{self.whole_bytes / gib:.2f} GiB, a device offers "
            f"{self.budget / gib:.1f} GiB: K = {self.length} (largest stage ~{self.stage_bytes / gib:.2f} GiB), "
            f"M = {self.microbatches}"
        )


def follow_microbatches(pp: int, per_replica: int, cfg: PtrunConfig) -> int:
    """The micro-batch count an unset `pipe.microbatches` takes at length `pp`: 1 for a single stage (split
    steps only cost time there), else AutoPipe's pick (`auto.microbatch_table`, else the paper's table)."""
    pipe = cfg.pipe
    if pp * pipe.stages_per_rank == 1:
        return 1
    return pick_microbatches(
        pp, per_replica, pipe.schedule, cfg.auto.microbatch_table, stages_per_rank=pipe.stages_per_rank
    )


def _in_flight(schedule: str, pp: int, microbatches: int) -> int:
    """Micro-batches whose activations the first stage holds at once: all of them under GPipe (and the looped
    schedules, conservatively), at most K under 1F1B's steady state."""
    return min(pp, microbatches) if SCHEDULE_SPECS[schedule].bounded_in_flight else microbatches


def choose_length(memory: UnitMemory, cfg: PtrunConfig, world_size: int, budget: int) -> LengthChoice:
    """The smallest K (a divisor of the world size) whose largest stage fits `budget`, with the micro-batch
    count that follows it (`pipe.microbatches` if set). Memory alone picks K, so a pipeline appears only when
    memory asks for one; the layout rules at that K are checked afterwards (`ptrun.layout.fill.resolve`). ConfigError
    when no K works: where every K breaks a layout rule (`length_problem`) or none fits, naming for each K
    the first rule it broke, or what its largest stage needs."""
    pipe, num_units, train = cfg.pipe, len(memory.state_bytes), cfg.train
    reasons = {
        pp: length_problem(pipe, pp, world_size, batch_at(train, world_size // pp), num_units)
        for pp in auto_lengths(world_size)
    }
    if all(reasons.values()):
        raise no_length_fits(world_size, reasons)
    gib = 2**30
    whole = None
    for pp in auto_lengths(world_size):
        if stage_problem(pipe, pp, num_units):
            continue  # no such pipeline can be built
        per_replica = max(1, batch_at(train, world_size // pp) // (world_size // pp))
        if reasons[pp] is None:
            m = pipe.microbatches if isinstance(pipe.microbatches, int) else follow_microbatches(pp, per_replica, cfg)
        else:  # an estimate: if memory picks this K, `ptrun.layout.fill.resolve` names the rule it breaks
            m = pipe.microbatches if isinstance(pipe.microbatches, int) else 1
        micro = per_replica / m
        cost = [
            s + a * micro * _in_flight(pipe.schedule, pp, m)
            for s, a in zip(memory.state_bytes, memory.activation_bytes, strict=True)
        ]
        bounds = partition("params", pp * pipe.stages_per_rank, num_units=num_units, param_costs=cost)
        stages = stage_sums(bounds, cost)
        # A rank holds `stages_per_rank` stages: charge it the largest ones' sum.
        largest = sum(sorted(stages)[-pipe.stages_per_rank :])
        whole = sum(cost) if whole is None else whole
        if largest <= budget:
            return LengthChoice(pp, m, largest, budget, whole)
        reasons[pp] = reasons[pp] or (
            f"the largest stage needs ~{largest / gib:.2f} GiB, a device offers {budget / gib:.2f} GiB"
        )
    raise no_length_fits(
        world_size, reasons, hint="use more workers, a smaller batch, pipe.recompute, or set device.memory"
    )


def stage_bytes(memory: UnitMemory, plan, global_batch: int) -> list[float]:
    """Bytes each stage of `plan` needs on its device: its units' parameters, gradients and optimizer state,
    and the activations of the micro-batches in flight (a rank of a looped or V schedule holds several)."""
    micro = global_batch // plan.dp / plan.microbatches
    flight = _in_flight(plan.schedule, plan.pp, plan.microbatches)
    return [
        sum(memory.state_bytes[u] + memory.activation_bytes[u] * micro * flight for u in range(lo, hi))
        for lo, hi in plan.stage_bounds
    ]


def check_fits(memory: UnitMemory, plan, global_batch: int, budget: int) -> list[float]:
    """`stage_bytes`, or ConfigError naming the first stage that does not fit `budget`."""
    need = stage_bytes(memory, plan, global_batch)
    gib = 2**30
    for stage, (bytes_, (lo, hi)) in enumerate(zip(need, plan.stage_bounds, strict=True)):
        if bytes_ > budget:
            raise ConfigError(
                f"pipe.length={plan.pp}: stage {stage} (units {lo}-{hi - 1}) needs ~{bytes_ / gib:.2f} "
                f"GiB, a device offers {budget / gib:.2f} GiB (device.memory); use a longer pipeline "
                f"(or pipe.length=auto), a smaller batch, or pipe.recompute"
            )
    return need


def largest_stage(
    memory: UnitMemory,
    plan: Plan,
    global_batch: float,
    *,
    copies: int | None = None,
    recompute: bool = False,
    accumulate: bool = False,
) -> float:
    """The memory model's largest stage of `plan`, in bytes (the largest of `stage_bytes`):

    - with `copies` (`state_copies`), `plan`'s frozen units keep their parameters alone (1 of the `copies` their
      state counts) and no activations (a cached one runs in no stage, its weights with the first);
    - with `recompute` (`pipe.recompute`), a stage keeps one unit's activations at a time;
    - with `accumulate`, one stage (K = 1) runs its micro-batches one after another: one of `global_batch / M`
      is in flight whatever the schedule.

    A layout change is checked with `copies` (`refusal`); the layout a worker ran out of memory in is read with
    `recompute` and `accumulate` (`ptrun.launcher.memory_advice`)."""
    if accumulate and plan.num_stages == 1:  # one micro-batch of batch / M at a time
        global_batch, plan = global_batch / plan.microbatches, replace(plan, microbatches=1)
    if copies is not None:
        frozen = plan.frozen_units
        memory = UnitMemory(
            [s / copies if u < frozen else s for u, s in enumerate(memory.state_bytes)],
            [0.0 if u < frozen else a for u, a in enumerate(memory.activation_bytes)],
        )
    if not recompute:
        return max(stage_bytes(memory, plan, global_batch))
    held = UnitMemory(memory.state_bytes, [0.0] * len(memory.state_bytes))
    micro = global_batch / plan.dp / plan.microbatches
    flight = _in_flight(plan.schedule, plan.pp, plan.microbatches)
    return max(
        b + max(memory.activation_bytes[lo:hi]) * micro * flight
        for b, (lo, hi) in zip(stage_bytes(held, plan, global_batch), plan.stage_bounds, strict=True)
    )


def refusal(memory: UnitMemory, current: Plan, new: Plan, global_batch: int, budget: int, copies: int) -> str | None:
    """Whether a layout change the controller decided fits the worker's device: the line refusing `new` where its
    largest stage would not fit `budget` and needs more than `new`'s frozen prefix in `current`'s layout (which
    runs); None where it may go ahead. A change that would not fit (AutoDP widening, which hands each rank more
    units) is refused before it runs, and the run freezes in place instead (`in_place`)."""
    need = largest_stage(memory, new, global_batch, copies=copies)
    if need <= budget or need <= largest_stage(memory, in_place(current, new), global_batch, copies=copies):
        return None
    gib = 2**30
    return (
        f"layout K={new.pp} DP={new.dp} refused: its largest stage would need ~{need / gib:.2f} GiB by the "
        f"planner's memory model, a device offers {budget / gib:.2f} GiB (device.memory); the {new.frozen_units} "
        f"frozen units freeze in place, in K={current.pp} DP={current.dp}"
    )


def in_place(current: Plan, new: Plan) -> Plan:
    """`new`'s frozen prefix in `current`'s layout (its stages stay; the cache may serve at most what leaves the
    first stage a unit to run)."""
    cached = min(new.cached_units, current.stage_bounds[0][1] - 1)
    return replace(current, frozen_units=new.frozen_units, cached_units=cached).check()
