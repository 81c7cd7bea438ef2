"""The layout rules, in one place: a pipeline length K against the world size and the global batch (K divides
the workers, or PipeDream's replicated first stage adds up to them; the data-parallel width divides the batch;
M divides a replica's batch), and the micro-batch count against the schedule (`schedule_problem`); for
`pipe.length=auto`, the first rule each candidate length breaks (`length_problem`), in the one line that
refuses a job no length fits (`no_length_fits`).

Called by the config's validation (`check_layout`, where the world size is known before the start: one
machine), and once more only where a value becomes known later, through the layout's one entry
(`ptrun.layout.fill.resolve`: `check_concrete`): the values the launch fills (`ptrun.compose.for_launch`), on
several machines the world size the rendezvous counted (`ptrun.compose.for_world`), in `ptrun plan` the world
size of a cluster of several (`ptrun.compose.for_cluster`). So a layout the start chooses obeys the rules a
layout the user writes does."""

from __future__ import annotations

from typing import Any

from ptrun.config.launcher import parse_nnodes, workers_per_node
from ptrun.config.pipe import schedule_problem
from ptrun.config.rules import require
from ptrun.errors import ConfigError


def width_problem(pipe, world: int, nproc: Any = None, note: str = "") -> tuple | None:
    """The first rule an integer `pipe.length` breaks against `world` workers, as (key, allowed, value); None if
    there is none. `nproc`: the `launcher.nproc_per_node` that set the world size on one machine (a replicated
    first stage that does not add up names it); `note` follows the world size in the message (what `auto`
    came to)."""
    k, replicas = pipe.length, pipe.first_stage_replicas
    if replicas > 1 and world != replicas + k - 1:
        if nproc is not None:
            return (
                "launcher.nproc_per_node",
                f"{replicas + k - 1} workers for pipe.first_stage_replicas="
                f"{replicas} at pipe.length={k} (replicas + length - 1{note})",
                nproc,
            )
        return (
            "pipe.first_stage_replicas",
            f"{world - k + 1} with {world} workers at pipe.length={k} (workers = replicas + length - 1)",
            replicas,
        )
    if replicas == 1 and world % k:
        return "pipe.length", f"a divisor of the world size {world} (launcher.nproc_per_node x nnodes{note})", k
    return None


def data_parallel_width(pipe, world: int) -> int:
    """The replicas of a layout `width_problem` accepted: world / K, or the replicas of PipeDream's replicated
    first stage."""
    return pipe.first_stage_replicas if pipe.first_stage_replicas > 1 else world // pipe.length


def world_problem(pipe, world: int, global_batch: int, nproc: Any = None, note: str = "") -> tuple | None:
    """`width_problem`, then the batch: the data-parallel width divides `global_batch`, an integer
    `pipe.microbatches` the replica's batch."""
    problem = width_problem(pipe, world, nproc, note)
    if problem:
        return problem
    dp = data_parallel_width(pipe, world)
    if global_batch % dp:
        return "train.global_batch_size", f"a multiple of the data-parallel width {dp}", global_batch
    per_replica = global_batch // dp
    m = pipe.microbatches
    if isinstance(m, int) and per_replica % m:
        return "pipe.microbatches", f"a divisor of the per-replica batch {per_replica}", m
    return None


def stage_problem(pipe, k: int, num_units: int | None = None) -> str | None:
    """Why no pipeline of length `k` can be built for `pipe.length=auto`, in words with its numbers: its stages
    against the schedule and the model's `num_units` (when known); None if it can."""
    per_rank = pipe.stages_per_rank
    if k == 1 and per_rank > 1:
        return f"pipe.stages_per_rank={per_rank} needs a pipeline of at least 2 ranks"
    if num_units is not None and k * per_rank > num_units:
        return f"{k * per_rank} stages (pipe.length x pipe.stages_per_rank) exceed the model's {num_units} units"
    return None


def length_problem(pipe, k: int, world: int, global_batch: int, num_units: int | None = None) -> str | None:
    """Why `pipe.length=auto` cannot take the length `k` (a divisor of `world`), memory aside: the first rule it
    breaks, in words with its numbers (`stage_problem`, then the data-parallel width against the batch, then
    the micro-batch count against the replica's batch and the schedule); None if it breaks none. One rule set
    for the check before the start and the choice in the workers."""
    problem = stage_problem(pipe, k, num_units)
    if problem:
        return problem
    dp = world // k
    if global_batch % dp:
        return f"train.global_batch_size={global_batch} cannot be split evenly over a data-parallel width of {dp}"
    per_replica, m, schedule = global_batch // dp, pipe.microbatches, pipe.schedule
    if isinstance(m, int):
        if per_replica % m:
            return f"pipe.microbatches={m} does not divide the per-replica batch {per_replica}"
        problem = schedule_problem(schedule, k, pipe.stages_per_rank, m)
        return None if problem is None else f"{problem[0]}={problem[2]!r} is not allowed: {problem[1]}"
    # `auto` and unset: some count must divide the replica's batch and suit the schedule
    if any(
        per_replica % c == 0 and schedule_problem(schedule, k, pipe.stages_per_rank, c) is None
        for c in range(1, per_replica + 1)
    ):
        return None
    key, allowed, value = schedule_problem(schedule, k, pipe.stages_per_rank, per_replica)
    if key != "pipe.microbatches":  # a rule of the schedule that no count satisfies
        return f"{key}={value!r} is not allowed: {allowed}"
    return (
        f"no micro-batch count divides the per-replica batch {per_replica} and suits pipe.schedule={schedule} "
        f"at pipe.length={k} ({allowed})"
    )


def batch_at(train, dp: int) -> int:
    """The global batch of a layout `dp` replicas wide: `train.pipeline_batch_size` x dp when that gives the
    batch, else `train.global_batch_size`."""
    return train.global_batch_size if train.pipeline_batch_size is None else train.pipeline_batch_size * dp


def no_length_fits(world: int, reasons: dict[int, str], note: str = "", hint: str = "") -> ConfigError:
    """The one-line refusal of `pipe.length=auto` when every candidate length broke a rule: each length with
    the first rule it broke (`reasons`, in order), then `hint`."""
    per_length = "; ".join(f"K={k}: {reason}" for k, reason in reasons.items())
    return ConfigError(
        f"pipe.length=auto: no layout fits {world} workers{note}: {per_length}" + (f"; {hint}" if hint else "")
    )


def auto_lengths(world: int) -> list[int]:
    """The lengths `pipe.length=auto` considers on `world` workers, shortest first: the divisors."""
    return [k for k in range(1, world + 1) if world % k == 0]


def replica_batch(pipe, world: int, global_batch: int) -> int:
    """One replica's batch in a layout `world_problem` accepted."""
    return global_batch // data_parallel_width(pipe, world)


def check_concrete(pipe, world: int, global_batch: int) -> None:
    """Every layout rule for an integer `pipe.length` on `world` workers (what the start chose, a layout written
    for several machines once the rendezvous has counted them, or what a plan runs), with an integer
    `pipe.microbatches` or `auto` (measured later, among the counts the schedule accepts); ConfigError naming
    the key."""
    problem = world_problem(pipe, world, global_batch)
    if problem is None and isinstance(pipe.microbatches, int):
        problem = schedule_problem(pipe.schedule, pipe.length, pipe.stages_per_rank, pipe.microbatches)
    if problem:
        require(False, *problem)


def check_layout(cfg) -> None:
    """The config's layout against the workers of one machine, when `launcher.nnodes` is 1 (with more machines
    the world is known only at the start, which checks it then: `ptrun.compose.for_world`), and the
    micro-batch count against the schedule: `auto` and unset need one count that works. With
    `pipe.length=auto` on one machine, some length must obey the rules (memory picks among them later)."""
    p, t, lc = cfg.pipe, cfg.train, cfg.launcher
    auto_k = p.length == "auto"
    auto_m = p.microbatches == "auto" or p.microbatches is None
    num_stages = (1 if auto_k else p.length) * p.stages_per_rank
    one_machine = parse_nnodes(lc.nnodes)[1] == 1
    per_replica = None
    if not auto_k and one_machine:
        world = workers_per_node(lc)
        note = f"; auto = {world} on this machine" if lc.nproc_per_node == "auto" else ""
        problem = width_problem(p, world, nproc=lc.nproc_per_node, note=note)
        batch = batch_at(t, data_parallel_width(p, world)) if problem is None else None
        problem = problem or world_problem(p, world, batch, nproc=lc.nproc_per_node, note=note)
        if problem:
            require(False, *problem)
        per_replica = replica_batch(p, world, batch)
    k = 1 if auto_k else p.length  # with pipe.length=auto, the start checks again at the chosen length
    if auto_m:
        # `auto` needs one count that works: the schedule's stage rules still apply, its micro-batch rules
        # only narrow the candidates (on several machines the batch per replica is known only at start).
        counts = (
            [m for m in range(1, per_replica + 1) if per_replica % m == 0]
            if per_replica
            else range(1, 4 * num_stages + 1)
        )
        problems = [schedule_problem(p.schedule, k, p.stages_per_rank, m) for m in counts]
        if all(problems):
            require(
                False,
                *next(
                    (pr for pr in problems if pr[0] != "pipe.microbatches"),
                    (
                        "pipe.microbatches",
                        f"a count that suits {p.schedule} at pipe.length={k}"
                        + (f" and divides the per-replica batch {per_replica}" if per_replica else "")
                        + "; none does",
                        p.microbatches,
                    ),
                ),
            )
    else:
        problem = schedule_problem(p.schedule, k, p.stages_per_rank, p.microbatches)
        if problem:
            require(False, *problem)
    if auto_k and one_machine:
        # Memory is measured in the workers; the rules that need no model are checked now, for every length.
        world = workers_per_node(lc)
        num_units = 2 * cfg.model.depth + 2 if cfg.model.depth else None  # as check_pipe counts them
        reasons = {k: length_problem(p, k, world, batch_at(t, world // k), num_units) for k in auto_lengths(world)}
        if all(reasons.values()):
            note = " (launcher.nproc_per_node=auto on this machine)" if lc.nproc_per_node == "auto" else ""
            raise no_length_fits(world, reasons, note)
