"""Micro-batches and batch sizes for a layout: how many equal micro-batches a replica's batch is cut into at
a pipeline length, by the rules the schedules accept, and the per-replica batch at a data-parallel width.
Pure functions, shared by the start-up layout, AutoPipe's re-plans and micro-batch tuning."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ptrun.config import BATCH_POLICIES, ConfigError, schedule_problem

PAPER_MICROBATCHES: dict[int, int] = {8: 16, 4: 16, 2: 16, 1: 4}
"""Best micro-batch count per pipeline length in the paper's profiling: 2K at K = 8, 4K at
K = 4, 8K at K = 2, and 4 at K = 1 (where micro-batching only bounds activation memory)."""


def min_microbatches(schedule: str, pp: int, stages_per_rank: int = 1) -> int:
    """The fewest micro-batches `schedule` accepts at pipeline length `pp` (too few hangs or raises in some
    runtimes), by the same rule config validation applies (`schedule_problem`)."""
    return next(m for m in range(1, 4 * pp * stages_per_rank + 1) if schedule_accepts(schedule, pp, stages_per_rank, m))


def schedule_accepts(schedule: str, pp: int, stages_per_rank: int, m: int) -> bool:
    """Whether `schedule` runs with m micro-batches: one rule for user layouts and controller layouts."""
    return schedule_problem(schedule, pp, stages_per_rank, m) is None


def _table_target(pp: int, table: Mapping[Any, int] | None) -> int:
    """The wanted M at length pp: a profiled entry, else the paper's, else GPipe's 4K. Keys may be strings
    (a table read back from JSON)."""
    if table:
        for key, value in table.items():
            if int(key) == pp:
                if int(value) < 1:
                    raise ConfigError(f"micro-batch table entry {pp}: {value} is not allowed: an integer >= 1")
                return int(value)
    return PAPER_MICROBATCHES.get(pp, 4 * pp)


def pick_microbatches(
    pp: int,
    per_replica_batch: int,
    schedule: str,
    table: Mapping[Any, int] | None = None,
    *,
    stages_per_rank: int = 1,
) -> int:
    """Micro-batches M for a replica batch at pipeline length pp.

    The target is the profiled `table`'s entry for pp (entries override the paper's per length; lengths the
    table lacks fall back), else `PAPER_MICROBATCHES`, else 4 x pp. The answer is the largest M <= target
    that divides `per_replica_batch` (micro-batches must be equal) and that the schedule accepts
    (`schedule_problem`: the rules config validation applies). If every such M is
    above the target (the schedule needs more), the smallest acceptable one is taken; if there is none
    (the batch is smaller than the schedule's minimum), ConfigError.
    """
    if pp < 1 or stages_per_rank < 1:
        raise ConfigError(f"pipe.length={pp} x stages_per_rank={stages_per_rank} is not allowed: integers >= 1")
    if per_replica_batch < 1:
        raise ConfigError(f"the per-replica batch {per_replica_batch} is not allowed: at least one sample")
    target = _table_target(pp, table)
    ok = [
        m
        for m in range(1, per_replica_batch + 1)
        if per_replica_batch % m == 0 and schedule_accepts(schedule, pp, stages_per_rank, m)
    ]
    if not ok:
        raise ConfigError(
            f"pipe.schedule={schedule} at pipe.length={pp} needs at least "
            f"{min_microbatches(schedule, pp, stages_per_rank)} equal micro-batches, but the "
            f"per-replica batch is {per_replica_batch}"
        )
    below = [m for m in ok if m <= target]
    return max(below) if below else min(ok)


def batch_sizes(
    dp: int,
    *,
    batch_policy: str = "fixed_global",
    global_batch: int | None = None,
    per_pipeline_batch: int | None = None,
) -> tuple[int, int]:
    """(per-replica batch, global batch) at data-parallel width dp.

    `fixed_global` needs `global_batch`, which dp must divide; `fixed_per_pipeline` needs
    `per_pipeline_batch` (the batch of one replica, kept at every width) and returns
    per_pipeline_batch x dp as the global batch. Raises ConfigError otherwise.
    """
    if dp < 1:
        raise ConfigError(f"data-parallel width {dp} is not allowed: an integer >= 1")
    if batch_policy == "fixed_global":
        if global_batch is None or global_batch < 1:
            raise ConfigError(f"batch policy fixed_global needs a global batch >= 1, got {global_batch}")
        if global_batch % dp:
            raise ConfigError(
                f"train.global_batch_size={global_batch} is not allowed: a multiple of the data-parallel width {dp}"
            )
        return global_batch // dp, global_batch
    if batch_policy == "fixed_per_pipeline":
        if per_pipeline_batch is None or per_pipeline_batch < 1:
            raise ConfigError(
                f"batch policy fixed_per_pipeline needs a per-pipeline batch >= 1, got {per_pipeline_batch}"
            )
        return per_pipeline_batch, per_pipeline_batch * dp
    raise ConfigError(f"batch policy {batch_policy!r} is not allowed: one of {', '.join(BATCH_POLICIES)}")
