"""The policies that read what training measures, in real short runs of the digits ViT deciding every 2 steps:
`plasticity` (weight changes against a bfloat16 copy) and `autofreeze` at percentile 70 (gradient norms).
Each freezes blocks mid-run and ends with a finite loss: in a trainer on one rank in this process, and
through `ptrun train` on 2 workers whose pipeline splits a block over its two stages (the signal's sums of
squares meet at the decision, and the copy is taken again in each new layout)."""

from __future__ import annotations

import math
import shutil
from contextlib import closing

import pytest
import torch
from conftest import TINY, compose_config, run_events, run_ptrun

DECIDING = [
    "freeze.every_steps=2",
    "freeze.start=0",
    "freeze.max_fraction=1.0",
    "auto.cache=false",
    "train.epochs=3",
    "train.max_steps_per_epoch=8",
    "train.export=false",
]
POLICIES = {
    # the tiny model's plasticity falls by about half in its first 8 steps: 0.5 sees it settle
    "plasticity": ["freeze.policy=plasticity", "freeze.threshold=0.5"],
    "autofreeze": ["freeze.policy=autofreeze", "freeze.percentile=70"],
}


def overrides(*changes: str) -> list[str]:
    """TINY and DECIDING with the keys of `changes` set to their values (each key once)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in TINY + DECIDING if o.split("=", 1)[0] not in keys] + list(changes)


def frozen_in_time(run_dir) -> list[tuple[int, int, int]]:
    """(epoch, step, frozen units) of each plan event."""
    return [(p["epoch"], p["step"], p["frozen_units"]) for p in run_events(run_dir, "plan")]


def assert_froze_mid_run_and_trained_on(run_dir) -> None:
    plans = frozen_in_time(run_dir)
    assert plans[0][2] == 0 and plans[-1][2] >= 3, plans  # at least one block (3 units: embedding + 2 halves)
    first = next(i for i, p in enumerate(plans) if p[2])
    assert plans[first][:2] != (0, 0) and first < len(plans) - 1, plans  # not at the start, not at the end
    epochs = run_events(run_dir, "epoch")
    assert len(epochs) == 3 and all(math.isfinite(e["train_loss"]) for e in epochs)
    assert math.isfinite(run_events(run_dir, "end")[0]["final_eval"]["loss"])


def train_on_one_rank(run_dir, *changes: str, resume: bool = False) -> tuple[list, object]:
    """`fit` a trainer on one rank in this process (a gloo group of one must be up); returns what the
    controller was given at each decision, and the trainer (closed)."""
    from ptrun.train.trainer import Trainer

    run_dir.mkdir(exist_ok=True)
    cfg = compose_config(overrides("launcher.nproc_per_node=1", *changes), run_dir)
    trainer = Trainer(cfg, 0, 1, torch.device("cpu"), resume=resume)
    measured = []
    decide = trainer.controller.decide

    def spy(interval, current, values):
        measured.append(values)
        return decide(interval, current, values)

    trainer.controller.decide = spy
    with closing(trainer):
        trainer.fit()
    return measured, trainer


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_trainer_on_one_rank_freezes_on_what_it_measured(policy, tmp_path, one_rank_group):
    measured, _ = train_on_one_rank(tmp_path / "run", *POLICIES[policy])
    assert_froze_mid_run_and_trained_on(tmp_path / "run")
    # every decision had its measurement: the first one too (the copy is taken as training starts)
    assert len(measured) == 3 * 4 - 1 and all(m is not None and len(m) == 2 for m in measured)
    assert all(v >= 0 and math.isfinite(v) for m in measured for v in m)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_resume_mid_interval_carries_the_gradient_norms_not_the_reference_copy(policy, tmp_path, one_rank_group):
    """Decisions every 3 steps over 8-step epochs: the checkpoint at the first epoch's end falls 2 steps into
    an interval. Resumed from it, `autofreeze` is given exactly what the uninterrupted run was (the
    interval's gradient norm sums are checkpointed); `plasticity` has no reference copy (it is not
    checkpointed), so its first decision has nothing measured, and the next ones are the uninterrupted run's
    again. The policies' state (plasticity's peaks) resumes."""
    # A cap of 0 blocks: the policies measure and keep their state but freeze nothing, so the runs stay
    # comparable step for step.
    every_3 = [*POLICIES[policy], "freeze.every_steps=3", "freeze.max_fraction=0", "train.epochs=2"]
    whole, _ = train_on_one_rank(tmp_path / "whole", *every_3)
    shutil.copytree(tmp_path / "whole", tmp_path / "cut")
    shutil.rmtree(tmp_path / "cut" / "checkpoints" / "step_00000016")  # as if stopped after the first epoch
    measured, resumed = train_on_one_rank(tmp_path / "cut", *every_3, resume=True)
    assert len(whole) == 5 and len(measured) == 3  # at steps 3, 6, 9, 12, 15; resumed at step 8
    assert resumed.state.global_step == 16 and frozen_in_time(tmp_path / "cut")[-1][2] == 0
    assert measured[1:] == whole[3:]  # bit for bit
    if policy == "plasticity":
        assert measured[0] is None
        assert resumed.controller.policy.peaks == [max(m[b] for m in whole[:2] + measured[1:]) for b in (0, 1)]
    else:
        assert measured[0] == whole[2]


@pytest.mark.slow  # two runs of 2 workers: ~30 s
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_ptrun_train_on_two_stages_freezes_on_what_it_measured(policy, tmp_path, one_rank_group):
    """Block 0 split over the stages measures what it does whole on one rank: the same decisions."""
    run_dir = tmp_path / "run"
    # stage 0 holds the embedding and block 0's attention half, stage 1 the rest
    out = run_ptrun(
        "train",
        *overrides(
            *POLICIES[policy],
            "pipe.length=2",
            "pipe.microbatches=2",
            "pipe.partition=explicit",
            "pipe.stages=[[0,2],[2,6]]",
        ),
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert_froze_mid_run_and_trained_on(run_dir)
    train_on_one_rank(tmp_path / "one", *POLICIES[policy])
    assert frozen_in_time(run_dir) == frozen_in_time(tmp_path / "one")
