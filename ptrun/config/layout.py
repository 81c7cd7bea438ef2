"""The layout rules, in one place: a pipeline length K against the world size and the global batch (K divides
the workers, or PipeDream's replicated first stage adds up to them; the data-parallel width divides the batch;
M divides a replica's batch), and the micro-batch count against the schedule (`schedule_problem`).

Called by the config's validation (`check_layout`, where the world size is known before the start: one
machine, or the cluster `ptrun plan` is given), by `ptrun.parallel.fit.resolve_length` once it has made K and
M concrete in the workers, and by the first plan (`ptrun.parallel.layout.first_plan`), so a layout the start
chooses obeys the rules a layout the user writes does."""

from __future__ import annotations

from typing import Any

from ptrun.config.launcher import parse_nnodes, workers_per_node
from ptrun.config.pipe import schedule_problem
from ptrun.config.rules import require


def width_problem(pipe, world: int, nproc: Any = None, note: str = "") -> tuple | None:
    """The first rule an integer `pipe.length` breaks against `world` workers, as (key, allowed, value); None if
    there is none. `nproc`: the `launcher.nproc_per_node` that set the world size on one machine (a replicated
    first stage that does not add up names it); `note` follows the world size in the message (what `auto`
    came to)."""
    k, replicas = pipe.length, pipe.first_stage_replicas
    if replicas > 1 and world != replicas + k - 1:
        if nproc is not None:
            return ("launcher.nproc_per_node", f"{replicas + k - 1} workers for pipe.first_stage_replicas="
                    f"{replicas} at pipe.length={k} (replicas + length - 1{note})", nproc)
        return ("pipe.first_stage_replicas", f"{world - k + 1} with {world} workers at pipe.length={k} "
                f"(workers = replicas + length - 1)", replicas)
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


def replica_batch(pipe, world: int, global_batch: int) -> int:
    """One replica's batch in a layout `world_problem` accepted."""
    return global_batch // data_parallel_width(pipe, world)


def check_concrete(pipe, world: int, global_batch: int) -> None:
    """Every layout rule for an integer `pipe.length` on `world` workers (what the start chose, or what a plan
    runs), with an integer `pipe.microbatches` or `auto` (measured later, among the counts the schedule
    accepts); ConfigError naming the key."""
    problem = world_problem(pipe, world, global_batch)
    if problem is None and isinstance(pipe.microbatches, int):
        problem = schedule_problem(pipe.schedule, pipe.length, pipe.stages_per_rank, pipe.microbatches)
    if problem:
        require(False, *problem)


def check_layout(cfg) -> None:
    """The config's layout against the workers of one machine, when `launcher.nnodes` is 1 (with more machines
    the world is known only at the start, which checks it then: `first_plan`, `resolve_length`), and the
    micro-batch count against the schedule: `auto` and unset need one count that works."""
    p, t, lc = cfg.pipe, cfg.train, cfg.launcher
    auto_k = p.length == "auto"
    auto_m = p.microbatches == "auto" or p.microbatches is None
    num_stages = (1 if auto_k else p.length) * p.stages_per_rank
    one_machine = parse_nnodes(lc.nnodes)[1] == 1
    per_replica = None
    if not auto_k and one_machine:
        world = workers_per_node(lc)
        note = f"; auto = {world} on this machine" if lc.nproc_per_node == "auto" else ""
        problem = world_problem(p, world, t.global_batch_size, nproc=lc.nproc_per_node, note=note)
        if problem:
            require(False, *problem)
        per_replica = replica_batch(p, world, t.global_batch_size)
    k = 1 if auto_k else p.length  # with pipe.length=auto, the start checks again at the chosen length
    if auto_m:
        # `auto` needs one count that works: the schedule's stage rules still apply, its micro-batch rules
        # only narrow the candidates (on several machines the batch per replica is known only at start).
        counts = [m for m in range(1, per_replica + 1) if per_replica % m == 0] if per_replica else \
            range(1, 4 * num_stages + 1)
        problems = [schedule_problem(p.schedule, k, p.stages_per_rank, m) for m in counts]
        if all(problems):
            require(False, *next((pr for pr in problems if pr[0] != "pipe.microbatches"), (
                "pipe.microbatches", f"a count that suits {p.schedule} at pipe.length={k}"
                + (f" and divides the per-replica batch {per_replica}" if per_replica else "") + "; none does",
                p.microbatches)))
    else:
        problem = schedule_problem(p.schedule, k, p.stages_per_rank, p.microbatches)
        if problem:
            require(False, *problem)
