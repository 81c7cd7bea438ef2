"""`pipe.*`: the pipeline's length, stages, schedule and micro-batches, and the rules each schedule sets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ptrun.config.rules import check_choices, choice, require
from ptrun.errors import ConfigError


@dataclass(frozen=True)
class Schedule:
    """What ptrun knows of one `pipe.schedule`, in one place: the config's rules (`schedule_problem`), the
    stage placement (`ptrun.layout.plan.Plan.local_stages`), the runtime (`ptrun.parallel.pipeline`) and the
    memory estimate (`ptrun.layout.fit`) read it."""

    stages_per_rank: int | None
    """The stages a rank must hold (1: the schedule drives one stage; 2: a V), None: any count (looped)."""
    microbatches: Literal["any", "one", "at_least_length", "multiple_of_length", "at_least_stages"] = "any"
    """The micro-batch count M it needs: any, exactly 1, at least K, a multiple of K, or at least the K x 2
    stages of a V."""
    v_shape: bool = False
    """Rank r holds stages r and 2K-1-r (the pipeline folds back), not r, r+K, r+2K, ..."""
    split_backward: bool = False
    """The backward of a stage is split into input and weight passes. The weight pass writes `.grad` from
    `torch.autograd.grad`, so DDP's gradient hooks never fire: the replicas sum gradients after the step
    (`StageRuntime._all_reduce_dp`) instead of in DDP's buckets during the backward pass."""
    bounded_in_flight: bool = False
    """At most K micro-batches' activations held at once (1F1B's steady state); otherwise all M (GPipe, and the
    looped and V schedules, conservatively)."""
    flushing: bool = True
    """A torch.distributed.pipelining `Schedule<name>` that flushes the pipeline every step; False: ptrun's
    asynchronous PipeDream runtime."""


SCHEDULE_SPECS: dict[str, Schedule] = {
    "GPipe": Schedule(stages_per_rank=1),
    "1F1B": Schedule(stages_per_rank=1, microbatches="at_least_length", bounded_in_flight=True),
    "Interleaved1F1B": Schedule(stages_per_rank=None, microbatches="multiple_of_length"),
    "LoopedBFS": Schedule(stages_per_rank=None),
    "InterleavedZeroBubble": Schedule(stages_per_rank=None, microbatches="multiple_of_length", split_backward=True),
    "ZBVZeroBubble": Schedule(stages_per_rank=2, microbatches="at_least_stages", v_shape=True, split_backward=True),
    "DualPipeV": Schedule(stages_per_rank=2, microbatches="at_least_stages", v_shape=True, split_backward=True),
    "pipedream": Schedule(stages_per_rank=1, microbatches="one", bounded_in_flight=True, flushing=False),
}
"""Every `pipe.schedule`, by name, with its properties."""
SCHEDULES = tuple(SCHEDULE_SPECS)
"""`pipe.schedule`."""
PARTITION_STAGES = {
    "uniform": False,
    "params": False,
    "time": False,
    "pipetransformer": False,
    "pipedream": False,
    "explicit": True,
}
"""Every `pipe.partition`, and whether its stages are the user's (`pipe.stages`) rather than computed."""
PARTITIONS = tuple(PARTITION_STAGES)
"""`pipe.partition`: the keys of the partitioners' table (`ptrun.layout.partition.PARTITIONERS`), a layer above the
schema; a test holds the two equal."""


@dataclass
class PipeConfig:
    length: int | str = "auto"
    """Pipeline stages K per replica; the data-parallel width is world_size / K. `auto` (the default): the
    shortest pipeline whose largest stage fits one device's memory (`device.memory`): its parameters,
    gradients and optimizer state plus the activations of the micro-batches it holds, estimated from the
    model's units before training. A model that fits one device trains as pure data parallelism (K = 1), as a
    user would run it. The launcher chooses before any worker starts, from the model's analytic sizes (as `ptrun
    plan` does) and the devices' memory, prints the estimate and the choice, and the run's config.yaml holds it."""
    microbatches: int | str | None = None
    """Micro-batches M each replica's batch is split into (GPipe chunks): unset (the default), M follows the
    pipeline length and the per-replica batch (`auto.microbatch_table`, else the paper's table: 1 at K = 1);
    an integer that divides the per-replica batch; or `auto`: before training, time a few steps (forward + backward, no
    optimizer step) at each candidate M (K, 2K, ..., 6K that divide the per-replica batch and suit the schedule; 1-6 at
    K = 1) for every pipeline length K the run may use, and take the fastest, within 3% the fewer. Measured once per
    model and machine and cached in `~/.cache/ptrun/microtune` (`PTRUN_MICROTUNE_DIR` moves it); the first `plan` event
    says what was chosen and why."""
    schedule: str = choice("GPipe", SCHEDULES)
    """torch.distributed.pipelining schedule: `GPipe`, `1F1B` (one stage per rank), or `Interleaved1F1B`,
    `LoopedBFS`, `InterleavedZeroBubble` (looped: rank r holds stages r, r+K, ...), `ZBVZeroBubble`,
    `DualPipeV` (V-shaped: rank r holds stages r and 2K-1-r; `stages_per_rank` must be 2); or `pipedream`
    (ptrun's asynchronous 1F1B without flushes: each stage updates its weights after every mini-batch's
    backward, with bounded staleness; `microbatches` must be 1; see docs/pipedream.md)."""
    stages_per_rank: int = 1
    """Stages each pipeline rank holds: 1 for GPipe / 1F1B, 2 for the V-shaped schedules, 1+ for the looped
    ones. The model is split into `length x stages_per_rank` stages."""
    partition: str = choice("params", PARTITIONS)
    """How units are split into stages: `uniform` (equal unit counts), `params` (balanced trainable parameter
    size, a frozen unit counted at 1/6), `time` (balanced forward + backward time, profiled on this device),
    `pipetransformer` (the paper's greedy mean + variance rule on parameter size), `pipedream` (PipeDream's
    dynamic program on profiled time plus activation transfer), or `explicit` (`stages`)."""
    stages: list[list[int]] | None = None
    """Explicit stage ranges `[[lo, hi], ...]` in units (half-open) for `partition=explicit`."""
    recompute: str = "none"
    """Activation recomputation: `none`, `stage` (keep only stage-boundary activations and recompute each
    stage in backward: GPipe's re-materialization) or `every:N` (a checkpoint every N units)."""
    weight_stashing: bool = True
    """`pipedream` only: run each mini-batch's backward pass with the weight version its forward pass used
    (PipeDream's weight stashing, one stashed copy of a stage's weights per version in flight). Off, the
    backward uses whatever the weights are by then: less memory, mismatched gradients."""
    vertical_sync: bool = False
    """`pipedream` only, with weight stashing: every stage runs a mini-batch with the weight version the
    input stage chose for it (PipeDream's vertical sync), so all stages see one version per mini-batch;
    later stages keep the older versions they may still be asked for."""
    first_stage_replicas: int = 1
    """`pipedream` only: PipeDream's stage replication. The first stage runs on this many workers, each later
    stage on one worker that takes the replicas' mini-batches in turn (round robin) and sends each gradient
    back to the replica that ran its forward pass; the world is `first_stage_replicas + length - 1` workers
    (e.g. 2 + 1: the input stage, often the slowest, on two workers). A step is one mini-batch per replica,
    and every stage updates once per step, so training is exactly that of `length` x `first_stage_replicas`
    pipelines; only the placement differs. Fixes the layout: `auto.pipe` and `auto.dp` must be off."""


def parse_recompute(spec: str) -> int | None:
    """`pipe.recompute`: `none` -> None (keep activations), `stage` -> 0 (recompute the whole stage, GPipe's
    re-materialization), `every:N` -> N (one checkpoint per N units)."""
    if spec == "none":
        return None
    if spec == "stage":
        return 0
    if spec.startswith("every:") and spec[6:].isdigit() and int(spec[6:]) >= 1:
        return int(spec[6:])
    raise ConfigError(f"pipe.recompute={spec!r} is not allowed: none, stage or every:N with N >= 1")


def recomputes(spec: str) -> bool:
    """Whether `pipe.recompute=spec` recomputes activations in the backward pass (anything but `none`)."""
    return parse_recompute(spec) is not None


def schedule_problem(schedule: str, pp: int, stages_per_rank: int, microbatches: int) -> tuple | None:
    """The first rule a (schedule, K, stages per rank, M) layout breaks, as (key, allowed, value); None if
    it is valid. Shared by config validation and `Plan.check`, so a plan the controller makes obeys the same
    rules as one a user writes."""
    stages = pp * stages_per_rank
    spec = SCHEDULE_SPECS.get(schedule)
    if spec is None:
        return None
    if spec.stages_per_rank is not None and stages_per_rank != spec.stages_per_rank:
        why = " (a V of two stages per rank)" if spec.v_shape else ""
        return "pipe.stages_per_rank", f"{spec.stages_per_rank} for {schedule}{why}", stages_per_rank
    rule = spec.microbatches
    if rule == "one" and microbatches != 1:
        return (
            "pipe.microbatches",
            f"1 for {schedule} (a mini-batch is one replica batch; the pipeline stays full across steps instead)",
            microbatches,
        )
    if rule == "at_least_length" and microbatches < pp:
        return "pipe.microbatches", f"at least pipe.length={pp} for {schedule}", microbatches
    if rule == "multiple_of_length" and microbatches % pp:
        return "pipe.microbatches", f"a multiple of pipe.length={pp} for {schedule}", microbatches
    if rule == "at_least_stages" and microbatches < stages:
        return "pipe.microbatches", f"at least 2 x pipe.length={stages} for {schedule}", microbatches
    return None


def check_pipe(cfg) -> None:
    """The pipeline's own keys, and its stages against the model's unit count."""
    p, m = cfg.pipe, cfg.model
    check_choices(p, "pipe")
    auto_k = p.length == "auto"
    require(auto_k or (isinstance(p.length, int) and p.length >= 1), "pipe.length", "an integer >= 1 or auto", p.length)
    # `auto` and unset: the count is chosen at start, so only "some count works" can be checked here.
    auto_m = p.microbatches == "auto" or p.microbatches is None
    require(
        auto_m or (isinstance(p.microbatches, int) and p.microbatches >= 1),
        "pipe.microbatches",
        "an integer >= 1, auto, or unset (follows the pipeline length)",
        p.microbatches,
    )
    if auto_k:
        require(
            p.stages is None, "pipe.length", "an integer with pipe.stages (explicit stages fix the length)", p.length
        )
    require(p.stages_per_rank >= 1, "pipe.stages_per_rank", "an integer >= 1", p.stages_per_rank)
    require(
        (p.stages is not None) == PARTITION_STAGES[p.partition],
        "pipe.stages",
        "a list of [lo, hi] unit ranges exactly when pipe.partition=explicit",
        p.stages,
    )
    num_stages = (1 if auto_k else p.length) * p.stages_per_rank
    num_units = 2 * m.depth + 2 if m.depth else None  # embedding, two halves per block, head
    if p.stages is not None:
        ranges = [list(r) for r in p.stages]
        require(
            len(ranges) == num_stages,
            "pipe.stages",
            f"{num_stages} ranges (pipe.length x pipe.stages_per_rank)",
            ranges,
        )
        edges = [r[0] for r in ranges if len(r) == 2] + [ranges[-1][-1]]
        require(
            all(len(r) == 2 and r[0] < r[1] for r in ranges)
            and edges[0] == 0
            and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
            and (num_units is None or edges[-1] == num_units),
            "pipe.stages",
            f"contiguous non-empty [lo, hi) unit ranges from 0 to the model's "
            f"{num_units if num_units else 'unit count'}",
            ranges,
        )
    if num_units is not None and not auto_k:
        require(
            num_stages <= num_units,
            "pipe.length",
            f"at most {num_units} stages in all (the model's units; pipe.length x pipe.stages_per_rank = {num_stages})",
            p.length,
        )
    parse_recompute(p.recompute)
    require(
        isinstance(p.first_stage_replicas, int) and p.first_stage_replicas >= 1,
        "pipe.first_stage_replicas",
        "an integer >= 1",
        p.first_stage_replicas,
    )
    require(
        not p.vertical_sync or p.weight_stashing,
        "pipe.vertical_sync",
        "false unless pipe.weight_stashing=true (vertical sync picks among stashed versions)",
        p.vertical_sync,
    )
