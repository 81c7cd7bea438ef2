"""PipeDream cases run inside real worker processes (imported by name by the spawned workers).

Each case trains a tiny model for a few steps with `AsyncPipelineRuntime` (plain SGD, no clipping), possibly
draining mid-way and changing the layout, and saves what each rank holds (its parameters) plus the runtime's
trace: per pass, the weight version the forward pass chose and a fingerprint of the weights the forward and
the backward pass actually ran on. The test replays the same semantics in one process and compares.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pipeline_cases as pc
import torch
from helpers import process_group

from ptrun.auto.autodp import Builder, build_engine, change_engine
from ptrun.config import OptimConfig
from ptrun.layout.plan import Plan
from ptrun.models.losses import WeightedLoss, loss_weight, make_target
from ptrun.parallel.pipedream import backwards_due
from ptrun.parallel.pipeline import Step

CPU = torch.device("cpu")
LR = 0.1
SGD = OptimConfig(name="sgd", lr=LR, momentum=0.0, weight_decay=0.0, schedule="constant", warmup_fraction=0.0)
"""Plain SGD: the reference applies theta - lr x g itself."""


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    pp: int
    dp: int
    steps: int
    stashing: bool = True
    vertical: bool = False
    drains: tuple[int, ...] = ()
    """Steps after which the pipeline drains (a segment ends)."""
    then: tuple[int, int, int] | None = None
    """After the steps: change the layout to (K, DP, steps) and train that many more steps."""
    replicated: bool = False
    """PipeDream's stage replication: the first stage on `dp` ranks, each later stage on one (dp + pp - 1
    ranks), which must train exactly like the K x DP grid."""

    @property
    def world(self) -> int:
        return self.dp + self.pp - 1 if self.replicated else self.pp * self.dp


def order_1f1b(limit: int, items, drains) -> list[tuple[str, int]]:
    """One stage's passes over the segment `items` as the runtime runs them (`backwards_due` after each forward
    pass): ("F", t) and ("B", t), draining after each step in `drains` and after the segment's last."""
    items, in_flight, order = list(items), deque(), []
    for i, t in enumerate(items):
        in_flight.append(t)
        order.append(("F", t))
        for _ in range(backwards_due(len(in_flight), limit, t in drains or i == len(items) - 1)):
            order.append(("B", in_flight.popleft()))
    return order


def forward_versions(pp: int, first: int, count: int, drains) -> list[dict[int, int]]:
    """Per stage: step -> the number of updates its 1F1B order applied before that step's forward pass."""
    out = []
    for s in range(pp):
        version, at = 0, {}
        for kind, t in order_1f1b(pp - s, range(first, first + count), drains):
            if kind == "F":
                at[t] = version
            else:
                version += 1
        out.append(at)
    return out


def plan_for(n: int, pp: int, dp: int, replicated: bool = False) -> Plan:
    return pc.even_plan(n, pp, dp, 1, "pipedream", replicate_first_only=replicated)


def steps(layered, loss_task: str, plan: Plan, rank: int, kind: str, first: int, count: int):
    """This rank's mini-batches: its replica's share of each global batch, or all of it on a shared stage
    (as the trainer loads them)."""
    replica, _ = plan.coords(rank)
    per = pc.GLOBAL_BATCH // plan.dp
    if len(plan.lanes(rank)) > 1:
        replica, per = 0, pc.GLOBAL_BATCH
    for t in range(first, first + count):
        full = pc.batch(kind, t)
        local = {k: v[replica * per : (replica + 1) * per] for k, v in full.items()}
        yield Step(
            t,
            tuple(local[k] for k in layered.input_names),
            make_target(local, loss_task),
            float(loss_weight(make_target(full, loss_task), loss_task)),
        )


def run_case(case: Case, rank: int, out_dir: Path) -> None:
    layered = pc.model(case.kind)
    n = len(layered.units)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss(pc.task(case.kind))
    options = dict(weight_stashing=case.stashing, vertical_sync=case.vertical)
    plan = plan_for(n, case.pp, case.dp, case.replicated)
    builder = Builder(layered, rank, CPU, loss, SGD, name_of, **options)
    layout = build_engine(builder, plan)
    traces, versions = [], []

    def update(step: Step, _loss) -> None:
        layout.runtime.sync_and_clip(0.0)
        if layout.optimizer is not None:
            layout.optimizer.step()
        layout.runtime.zero_grad()

    def train(first: int, count: int, drains=()) -> None:
        layout.runtime.trace = []
        for step in steps(layered, loss.task, layout.plan, rank, case.kind, first, count):
            drain = step.step in drains or step.step == first + count - 1  # a segment's last step drains
            layout.runtime.run_step(step, update, drain=drain)
        layout.runtime.pause()
        traces.append([{k: v for k, v in r.items() if k != "grads"} for r in layout.runtime.trace])
        versions.append(layout.runtime.version)

    train(0, case.steps, case.drains)
    stash_peak = layout.runtime.stash_bytes_peak
    if case.then is not None:
        pp, dp, count = case.then
        layout = change_engine(builder, layout, plan_for(n, pp, dp))
        train(case.steps, count)
    params = dict(layered.model.named_parameters())
    held = {name for u in layout.runtime.unit_indices for name in layered.unit_param_names(u)}
    saved = {
        "params": {k: params[k].detach().clone() for k in held},
        "traces": traces,
        "versions": versions,
        "stash_peak": stash_peak,
        "stage": layout.runtime.stage,
        "lanes": layout.runtime.lanes,
    }
    process_group.save_rank(saved, out_dir, case.name, rank)
    layout.groups.destroy()


def launch(cases: list[Case], nproc: int, out_dir: Path) -> None:
    process_group.launch_cases(run_case, cases, nproc, "pipedream", out_dir, minutes=5)
