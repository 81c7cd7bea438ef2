"""Worker side of tests/test_compiled_dist.py: pipelines trained with compiled units and without, in real
processes (gloo), each case writing its per-step losses (and the frozen parameters' gradients after a freeze)
for the test to compare."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import pipeline_cases as pc
import torch
import torch._dynamo
import torch.distributed as dist
from helpers import process_group

from ptrun.auto.autodp import Builder, build_engine, change_engine
from ptrun.compiling.compiler import UnitCompiler
from ptrun.config import SCHEDULE_SPECS
from ptrun.models.losses import WeightedLoss
from ptrun.numerics.precision import LossScaler, compute_dtype
from ptrun.parallel.pipeline import Step

STEPS, FREEZE_AT, FROZEN = 8, 4, 3
"""Steps of a case, the step the freeze comes before, the units it freezes. A case's compiling happens in its
first step and at the freeze; the steps after each are where a recompile or a fallback to eager would show,
so a few of each suffice (every step's loss is compared with the eager case's)."""


@dataclass(frozen=True)
class Case:
    schedule: str  # 1F1B or pipedream
    compiled: bool
    precision: str = "fp32"
    recompute: str = "none"
    freeze: bool = True  # the first FROZEN units freeze in place before step FREEZE_AT (flushing schedules)

    @property
    def name(self) -> str:
        return f"{self.schedule}-{self.precision}-{self.recompute}-{'compiled' if self.compiled else 'eager'}"


def run_case(case: Case, rank: int, out_dir: Path) -> None:
    layered = pc.model("bert")
    n = len(layered.units)
    name_of = {id(p): name for name, p in layered.model.named_parameters()}
    loss = WeightedLoss(pc.task("bert"))
    torch._dynamo.reset()  # each case is a run of its own: its variants alone count against the recompile limit
    compiler = UnitCompiler("default", layered) if case.compiled else None
    builder = Builder(
        layered,
        rank,
        torch.device("cpu"),
        loss,
        pc.OPTIM,
        name_of,
        case.recompute,
        compute_dtype(case.precision),
        compiler=compiler,
    )
    per_rank = SCHEDULE_SPECS[case.schedule].stages_per_rank or 2  # a looped schedule: two stages a rank
    microbatches = {"pipedream": 1, "1F1B": 2, "GPipe": 2}.get(case.schedule, 4)
    plan = pc.even_plan(n, 2, 1, microbatches, case.schedule, per_rank)
    layout = build_engine(builder, plan)
    scaler = LossScaler(enabled=case.precision == "fp16")
    losses, frozen_grads, recompiles_after = [], [], None

    def update(item: Step, share: torch.Tensor | None) -> None:
        norm = layout.runtime.sync_and_clip(pc.CLIP, inv_scale=1.0 / scaler.scale).total
        if (not scaler.enabled or scaler.update(bool(torch.isfinite(norm)))) and layout.optimizer is not None:
            layout.optimizer.step()
        if item.step >= FREEZE_AT and case.freeze:
            frozen_grads.extend(
                p.grad for u in layered.units[:FROZEN] for p in u.parameters() if u in layout.runtime.modules[0].units
            )
        layout.runtime.zero_grad()
        losses.append(float(share) if share is not None else 0.0)  # summed over the ranks at the end

    step = 0
    while step < STEPS:
        count = FREEZE_AT - step if case.freeze and step < FREEZE_AT else STEPS - step
        for data in pc.steps(layered, "bert", step, count):
            drain = data.step == step + count - 1  # a segment's last step drains PipeDream's pipeline
            layout.runtime.run_step(data, update, scaler.scale, drain)
        step += count
        if step == FREEZE_AT and case.freeze:
            layout = change_engine(builder, layout, replace(plan, frozen_units=FROZEN))
            recompiles_after = compiler.counts.snapshot() if compiler else None
    compiles_after = (
        compiler.counts.snapshot()["compiles"] - recompiles_after["compiles"] if compiler and recompiles_after else None
    )
    summed = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(summed)  # each step's loss: the last stage's share (PipeDream: the last stage's only)
    saved = {
        "losses": summed.tolist(),
        "frozen_grads": [g is None for g in frozen_grads],
        "compiles_after_freeze": compiles_after,
        "eager_kinds": sorted(compiler.eager_kinds) if compiler else [],
    }
    process_group.save_rank(saved, out_dir, case.name, rank)
    layout.groups.destroy()


def launch(cases: list[Case], out_dir: Path) -> None:
    process_group.launch_cases(run_case, cases, 2, "compiled", out_dir)
