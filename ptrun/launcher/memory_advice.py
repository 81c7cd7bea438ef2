"""After a worker ran out of memory: the keys that would fit, from the planner's memory model (the stand-in
`ptrun plan` and `pipe.length=auto` use: `ptrun.layout.fill.fit_memory`, `ptrun.layout.fit.largest_stage`), and
the launcher's one line says them (`ptrun.train.run_end.oom_line`).

The model estimated the layout that ran out; the device measured more than it holds. Each key is changed on
its own (more micro-batches, recomputing activations, a longer pipeline, a smaller global batch) and the
model's peak for it is scaled by what the device measured against the model: a key fits where that scaled
peak stays within the device. Under `where == "cache"` the cache's own budget is the key.
"""

from __future__ import annotations

from dataclasses import replace

from ptrun.config import PtrunConfig
from ptrun.config.pipe import recomputes
from ptrun.costs.from_config import costs_from_config
from ptrun.layout.fill import fit_memory
from ptrun.layout.fit import UnitMemory, largest_stage
from ptrun.layout.partition import partition
from ptrun.layout.plan import Plan

HEADROOM = 0.9
"""The share of the device a layout may fill by the scaled model (`ptrun.layout.fill.DEVICE_SHARE`'s
reasoning: the rest is the context's, the collectives' and the allocator's)."""


def _candidates(cfg: PtrunConfig, memory: UnitMemory, plan: Plan, batch: int) -> list[tuple[str, float]]:
    """(key=value, the model's peak with it) for each key changed on its own that the layout rules allow."""
    out = []
    per_replica = batch // plan.dp
    if per_replica % (2 * plan.microbatches) == 0:
        more = replace(plan, microbatches=2 * plan.microbatches)
        out.append((f"pipe.microbatches={more.microbatches}", largest_stage(memory, more, batch, accumulate=True)))
    if not recomputes(cfg.pipe.recompute):
        out.append(("pipe.recompute=stage", largest_stage(memory, plan, batch, recompute=True, accumulate=True)))
    longer = 2 * plan.pp
    if plan.world_size % longer == 0 and longer * plan.stages_per_rank <= plan.num_units:
        cost = [s + a * per_replica for s, a in zip(memory.state_bytes, memory.activation_bytes, strict=True)]
        bounds = partition("params", longer * plan.stages_per_rank, num_units=plan.num_units, param_costs=cost)
        dp = plan.world_size // longer
        if batch % (dp * plan.microbatches) == 0:
            pipeline = replace(plan, pp=longer, dp=dp, stage_bounds=tuple(bounds), cached_units=0)
            out.append((f"pipe.length={longer}", largest_stage(memory, pipeline, batch, accumulate=True)))
    half = batch // 2
    if half and half % (plan.dp * plan.microbatches) == 0:
        out.append((f"train.global_batch_size={half}", largest_stage(memory, plan, half, accumulate=True)))
    return out


def keys_that_fit(cfg: PtrunConfig, report: dict) -> list[str]:
    """The keys that would fit the device of `report` (a worker's out-of-memory report,
    `ptrun.train.machine_faults.memory_report`), most gentle first, each with the model's bytes."""
    if report["where"] == "cache":
        return ["cache.max_memory=25%", "auto.cache=false"]
    if report.get("plan") is None:
        return []
    plan = Plan.from_dict(report["plan"])
    memory = fit_memory(costs_from_config(cfg.model, cfg.data), cfg)
    batch = cfg.train.global_batch_size
    now = largest_stage(memory, plan, batch, accumulate=True)
    # The device measured the layout at `measured` bytes; the model said `now`: scale the model to it.
    measured = max(report["used"] + report["requested"], report["total"])
    scale = measured / now if now else 1.0
    fits = [
        (key, peak) for key, peak in _candidates(cfg, memory, plan, batch) if peak * scale <= HEADROOM * report["total"]
    ]
    return [f"{key} (~{peak * scale / 2**30:.2f} GiB)" for key, peak in fits]
