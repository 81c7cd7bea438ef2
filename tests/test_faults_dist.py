"""Killed workers, for real: one job whose workers are SIGKILLed at 10 random points in turn (mid-step,
mid-transition, mid-checkpoint-write; a random rank each time) must finish, cover every training sample
exactly once in every epoch, and end with exactly the parameters and optimizer state of an uninterrupted run.

The points come from a seeded generator (PTRUN_FAULT_SEED, default 0: CI runs one seed; any other seed is a
new set of points). Each restart is a real elastic restart of the whole worker group, which resumes from the
newest valid checkpoint at its exact step (`checkpoint.every_steps`).
"""

from __future__ import annotations

import os
import random

import pytest
import torch
from conftest import TINY, run_events, run_killed, run_workers

from ptrun.train.checkpoint import lookup, store

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # ten kills and restarts: ~40 s

EPOCHS, STEPS_PER_EPOCH, EVERY = 3, 90, 20  # digits: 1,437 training samples in global batches of 16
OVERRIDES = TINY + [
    f"train.epochs={EPOCHS}",
    f"checkpoint.every_steps={EVERY}",
    "checkpoint.keep=3",
    "launcher.nproc_per_node=2",
    "pipe.length=2",
    "pipe.microbatches=2",
    "pipe.schedule=1F1B",
    # one more block frozen at each epoch boundary: two layout changes (K 2 -> 1, DP 1 -> 2), then caching (the
    # forced schedule spelled out, as in test_pipedream_dist.py's runs: the kill points follow from it)
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,2]",
    "freeze.max_fraction=1.0",
    "auto.cache=true",
]


def kill_points(seed: int) -> list[dict]:
    """10 points at distinct global steps after the first checkpoint (so every restart resumes from one),
    in step order: 1 in a transition (at an epoch boundary), 3 in checkpoint writes (every EVERY steps within
    an epoch, and at its end), 6 after an optimizer step; each on a random rank."""
    rng = random.Random(seed)
    total = EPOCHS * STEPS_PER_EPOCH
    boundaries = [STEPS_PER_EPOCH * e for e in range(1, EPOCHS)]
    checkpoints = {s for e in range(EPOCHS) for s in range(e * STEPS_PER_EPOCH, (e + 1) * STEPS_PER_EPOCH, EVERY)}
    checkpoints |= set(boundaries)
    chosen = {rng.choice(boundaries): "transition"}
    for step in rng.sample(sorted(checkpoints - set(chosen) - set(range(EVERY + 1))), 3):
        chosen[step] = "checkpoint"
    for step in rng.sample(sorted(set(range(EVERY + 1, total)) - set(chosen)), 6):
        chosen[step] = "step"
    return [{"rank": rng.randrange(2), "point": chosen[s], "step": s} for s in sorted(chosen)]


def starts_and_epochs(run_dir) -> tuple[list[dict], dict[int, dict]]:
    last_per_epoch = {e["epoch"]: e for e in run_events(run_dir, "epoch")}  # the attempt that got through
    return run_events(run_dir, "start"), last_per_epoch


def test_ten_kills_at_random_points_change_nothing(tmp_path, monkeypatch):
    points = kill_points(int(os.environ.get("PTRUN_FAULT_SEED", "0")))
    killed = tmp_path / "killed"
    run_killed(OVERRIDES + ["launcher.max_restarts=10"], killed, points, monkeypatch)
    clean = tmp_path / "clean"
    run_workers(OVERRIDES, clean)

    starts, epochs = starts_and_epochs(killed)
    assert len(starts) == 11 and all(s["resumed_from"] for s in starts[1:]), [s["resumed_from"] for s in starts]
    assert sorted(epochs) == list(range(EPOCHS))
    for epoch, event in epochs.items():
        assert event["sample_uses_min"] == event["sample_uses_max"] == 1, (epoch, event)
    resumed_mid_epoch = [e for e in run_events(killed, "epoch") if e.get("resumed_at_step")]
    assert resumed_mid_epoch and all(e["resumed_at_step"] % EVERY == 0 for e in resumed_mid_epoch)

    got_params, got_optim, got_state = store.load(lookup.latest_valid(killed))
    want_params, want_optim, want_state = store.load(lookup.latest_valid(clean))
    assert got_state["global_step"] == want_state["global_step"] == EPOCHS * STEPS_PER_EPOCH
    assert got_params.keys() == want_params.keys()
    for name in want_params:
        assert torch.equal(got_params[name], want_params[name]), name
    assert got_optim.keys() == want_optim.keys()
    for name in want_optim:
        for key, value in want_optim[name].items():
            assert torch.equal(got_optim[name][key], value), (name, key)
