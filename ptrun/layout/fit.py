"""`pipe.length=auto`: the shortest pipeline whose largest stage fits one device, chosen before training.

A stage needs its parameters, their gradients and the optimizer's state (AdamW: two moments, SGD: one
momentum buffer; all float32), plus the activations autograd keeps for the micro-batches in flight. The
activations are measured, not guessed: one sample goes through the units with a saved-tensor hook counting
what each unit stores for its backward pass (the weights it saves are not counted twice), scaled by the
micro-batch size. A pipeline appears only when memory asks for one; everything else trains as data
parallelism, the layout a user would pick.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from ptrun.config import (
    OPTIMIZER_SPECS,
    SCHEDULE_SPECS,
    ConfigError,
    PtrunConfig,
    parse_memory,
)
from ptrun.config.layout_rules import auto_lengths, batch_at, length_problem, no_length_fits, stage_problem
from ptrun.layout.microbatches import pick_microbatches
from ptrun.layout.partition import partition, stage_sums
from ptrun.models.lazy import borrowed, unit_names

DEVICE_SHARE = "90%"
"""What a device offers a stage when `device.memory` is unset. Not all of it: the rest holds what no stage's
tensors can use (the CUDA context and the collectives' buffers, the caching allocator's fragmentation; on
the CPU the processes' own libraries and heaps). One share for the trainer and `ptrun plan`, so the planner
picks the pipeline length the trainer would."""


def state_copies(optimizer: str) -> int:
    """Tensors of a parameter's size that training keeps per parameter: the parameter, its gradient and the
    optimizer's state (`Optimizer.state_copies`)."""
    return 2 + OPTIMIZER_SPECS[optimizer].state_copies


def memory_budget(setting: str | None, total: int) -> int:
    """Bytes one device offers a stage out of its `total`: `device.memory` (a size, or a share of `total`),
    else `DEVICE_SHARE` of it."""
    return parse_memory(setting or DEVICE_SHARE, total=total, key="device.memory")


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


def device_budget(cfg: PtrunConfig, device: torch.device) -> int:
    """Bytes `device` offers a stage (`memory_budget`): of the GPU's memory, or on the CPU of the host's
    memory shared by the node's workers."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return memory_budget(cfg.device.memory, total)


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
