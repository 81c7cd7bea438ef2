"""Process groups for one Plan: a pipeline (PP) group per replica and a data-parallel (DP) group per stage.

Plain `dist.new_group`, not DeviceMesh: the layout changes inside a job, and DeviceMesh groups can neither
be destroyed safely nor left alive (each leaks file descriptors and threads). Every rank must create every
group in the same order, even the groups it is not part of.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from ptrun.layout.plan import Plan


@dataclass
class Groups:
    pp: dist.ProcessGroup
    """This rank's pipeline: the ranks of its replica, ordered by stage."""
    dp: dist.ProcessGroup
    """This rank's stage across replicas: gradients are all-reduced here."""
    owned: list[dist.ProcessGroup]
    """Every group this rank created (all must be destroyed, including ones it is not a member of)."""
    tied: dict[str, dist.ProcessGroup] = field(default_factory=dict)
    """Tied weight name -> the ranks of this replica holding a copy, when that is more than this rank."""

    def destroy(self) -> None:
        for group in self.owned:
            if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)
        self.owned.clear()


def build_groups(plan: Plan, rank: int, tied: dict[str, tuple[int, ...]] | None = None) -> Groups:
    """Groups for `plan`; `tied` maps a tied weight's name to the units that use it."""
    replica, stage = plan.coords(rank)
    pp_groups = [dist.new_group(plan.pipeline_ranks(r)) for r in range(plan.dp)]
    dp_groups = [dist.new_group(plan.stage_ranks(s)) for s in range(plan.pp)]
    owned = pp_groups + dp_groups
    mine: dict[str, dist.ProcessGroup] = {}
    for r in range(plan.dp):
        for name, units in sorted((tied or {}).items()):
            # a cached unit runs nowhere (its output is read from the cache), so it holds no replica
            ranks = sorted({plan.rank_of_stage(r, plan.stage_of_unit(u)) for u in units if u >= plan.cached_units})
            if len(ranks) > 1:
                group = dist.new_group(ranks)
                owned.append(group)
                if rank in ranks:
                    mine[name] = group
    return Groups(pp=pp_groups[replica], dp=dp_groups[stage], owned=owned, tied=mine)
