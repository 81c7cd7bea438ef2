"""The Plan: one epoch's layout as a small immutable value.

Everything that reshapes training (partitioning, freezing, the controller, the planner and reports) speaks
of plans; only the runtime applies them. Ranks map to coordinates as `rank = replica * pp + stage` (with
PipeDream's stage replication, `replicate_first_only`, see `coords`), so the
ranks of one pipeline are contiguous (on GPUs they share a machine and its fast links).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ptrun.config import SCHEDULE_SPECS, ConfigError, schedule_problem


@dataclass(frozen=True)
class Plan:
    num_units: int
    """Units of the layered model (embedding, 2L block halves, head)."""
    frozen_units: int
    """Length of the frozen prefix (0 = everything trains)."""
    pp: int
    """Pipeline length K (stages per replica)."""
    dp: int
    """Data-parallel width (number of pipeline replicas)."""
    stage_bounds: tuple[tuple[int, int], ...]
    """Half-open unit ranges [lo, hi) per stage, contiguous and covering all units."""
    microbatches: int
    """Micro-batches M per replica batch."""
    schedule: str
    """Pipeline schedule name."""
    stages_per_rank: int = 1
    """Stages each pipeline rank holds (2+ for the looped and V-shaped schedules); K * this = stage count."""
    cached_units: int = 0
    """Length of the prefix served by AutoCache (at most `frozen_units`): these units run in no stage; the
    first stage starts at this unit, reading their output per sample from the cache. Stage 0's range
    still starts at 0 (it owns the cached units' weights)."""

    replicate_first_only: bool = False
    """PipeDream's stage replication (`pipe.first_stage_replicas`): only stage 0 has `dp` replicas (ranks
    0 .. dp-1); every later stage runs on one rank (dp + stage - 1) that serves the replicas' mini-batches in
    turn (round robin), so the world is dp + pp - 1 ranks. The mathematics are those of the K x DP grid:
    only where the work runs differs."""

    def active_range(self, stage: int) -> tuple[int, int]:
        """The units stage `stage` runs: its range less the cached prefix."""
        lo, hi = self.stage_bounds[stage]
        return max(lo, self.cached_units), hi

    @property
    def flushing(self) -> bool:
        """Whether its schedule flushes the pipeline every step (`Schedule.flushing`); PipeDream's does not."""
        return SCHEDULE_SPECS[self.schedule].flushing

    @property
    def num_stages(self) -> int:
        return self.pp * self.stages_per_rank

    def local_stages(self, stage_rank: int) -> list[int]:
        """Stage indices held by pipeline position `stage_rank`: V-shaped schedules fold the pipeline back
        (rank r holds r and 2K-1-r), the others loop (rank r holds r, r+K, r+2K, ...)."""
        if SCHEDULE_SPECS[self.schedule].v_shape:
            return [stage_rank, 2 * self.pp - 1 - stage_rank]
        return [stage_rank + i * self.pp for i in range(self.stages_per_rank)]

    @property
    def world_size(self) -> int:
        return self.dp + self.pp - 1 if self.replicate_first_only else self.pp * self.dp

    def coords(self, rank: int) -> tuple[int, int]:
        """rank -> (replica, stage); a rank that serves every replica (`replicate_first_only`) is replica 0."""
        if self.replicate_first_only:
            return (rank, 0) if rank < self.dp else (0, rank - self.dp + 1)
        return divmod(rank, self.pp)

    def rank_of(self, replica: int, stage: int) -> int:
        if self.replicate_first_only:
            return replica if stage == 0 else self.dp + stage - 1
        return replica * self.pp + stage

    def lanes(self, rank: int) -> list[int]:
        """The replicas whose mini-batches `rank` runs: its own, or all of them on a shared later stage."""
        replica, stage = self.coords(rank)
        return list(range(self.dp)) if self.replicate_first_only and stage > 0 else [replica]

    def pipeline_ranks(self, replica: int) -> list[int]:
        return [self.rank_of(replica, s) for s in range(self.pp)]

    def stage_ranks(self, stage: int) -> list[int]:
        """The distinct ranks running `stage` (one when the stage is shared)."""
        return sorted({self.rank_of(r, stage) for r in range(self.dp)})

    def rank_of_stage(self, replica: int, stage: int) -> int:
        """The rank holding stage index `stage` (of num_stages) in `replica`."""
        return self.rank_of(replica, next(r for r in range(self.pp) if stage in self.local_stages(r)))

    def stage_of_unit(self, unit: int) -> int:
        return next(s for s, (lo, hi) in enumerate(self.stage_bounds) if lo <= unit < hi)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["stage_bounds"] = [list(b) for b in self.stage_bounds]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        return cls(**{**d, "stage_bounds": tuple(tuple(b) for b in d["stage_bounds"])})

    def check(self) -> Plan:
        """Raise ConfigError unless the plan is internally consistent; returns self."""
        if len(self.stage_bounds) != self.num_stages:
            raise ConfigError(
                f"pipe.length={self.pp} x pipe.stages_per_rank={self.stages_per_rank} needs "
                f"{self.num_stages} stage ranges, not {len(self.stage_bounds)}"
            )
        if self.num_stages > self.num_units:
            raise ConfigError(
                f"{self.num_stages} stages (pipe.length x pipe.stages_per_rank) are more than the "
                f"model's {self.num_units} units"
            )
        edges = [lo for lo, _ in self.stage_bounds] + [self.stage_bounds[-1][1]]
        if (
            edges[0] != 0
            or edges[-1] != self.num_units
            or any(hi != lo2 for (_, hi), (lo2, _) in zip(self.stage_bounds, self.stage_bounds[1:], strict=False))
            or any(lo >= hi for lo, hi in self.stage_bounds)
        ):
            raise ConfigError(
                f"stages {list(map(list, self.stage_bounds))} must be non-empty, contiguous and cover units "
                f"0..{self.num_units}"
            )
        problem = schedule_problem(self.schedule, self.pp, self.stages_per_rank, self.microbatches)
        if problem:
            key, allowed, value = problem
            raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")
        if self.replicate_first_only and (self.flushing or self.stages_per_rank != 1):
            raise ConfigError(
                f"pipe.first_stage_replicas is not allowed with pipe.schedule={self.schedule}: "
                f"stage replication needs pipedream"
            )
        if not 0 <= self.frozen_units < self.num_units:
            raise ConfigError(f"frozen units {self.frozen_units} must leave the head trainable (< {self.num_units})")
        if not 0 <= self.cached_units <= self.frozen_units or self.cached_units >= self.stage_bounds[0][1]:
            raise ConfigError(
                f"cached units {self.cached_units} must be a frozen prefix (<= {self.frozen_units}) "
                f"that leaves the first stage a unit to run (< {self.stage_bounds[0][1]})"
            )
        return self


def even_bounds(num_units: int, pp: int) -> tuple[tuple[int, int], ...]:
    """Split units into pp contiguous ranges whose sizes differ by at most one (earlier stages larger)."""
    base, extra = divmod(num_units, pp)
    bounds, lo = [], 0
    for s in range(pp):
        hi = lo + base + (1 if s < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return tuple(bounds)
