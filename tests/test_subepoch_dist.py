"""Freezing inside an epoch, on 4 real workers: a forced schedule decides every half epoch (`freeze.every=0.5`),
so the controller repacks the pipeline (K 4 -> 2 -> 1), widens DP (1 -> 2 -> 4) and advances the cache in
the middle of epochs. Checked against the single-process reference that freezes the same blocks at the same
steps, for sample coverage, and through SIGKILLed workers."""

from __future__ import annotations

import pytest
import torch
from conftest import compose_config, final_params, run_events, run_killed, run_workers
from test_controller_dist import FOUR_STAGES
from test_train_dist import assert_params_close, reference_params

from ptrun.train.checkpoint import lookup, store

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

STEPS = 12  # 180 training samples in global batches of 16 (the last one padded)
HALF = STEPS // 2
BLOCKS = [0, 1, 1, 2]  # per half epoch: block 0 frozen at epoch 0 step 6, block 1 at epoch 1 step 6
LAYOUT = [*FOUR_STAGES, "train.epochs=2", f"freeze.blocks=[{','.join(map(str, BLOCKS))}]", "freeze.every=0.5"]

# The held-out split is the other 90% of digits (1,617 samples): evaluating it costs several epochs of these
# 12 steps. Where nothing reads an epoch's evaluation (a forced schedule decides without one), only the run's
# last is made. Not with AutoCache: its evaluations fill and read the cache's eval entries, which it checks.
LAST_EVAL_ONLY = ["train.eval_every_epochs=2"]


def events(run_dir, kind: str) -> list[dict]:
    return run_events(run_dir, kind)


@pytest.mark.slow  # a reference, a run and a run with kills: ~90 s
def test_transitions_inside_epochs_match_the_reference_and_survive_kills(tmp_path, tiny, monkeypatch):
    """The layout changes at step 6 of each epoch; every epoch still uses every sample exactly once; the final
    parameters equal the reference's. Then the same job with a worker SIGKILLed right after the first
    mid-epoch transition (it resumes from the checkpoint written in the new layout at that step) and another
    killed inside the second transition ends with bit-identical parameters and optimizer state."""
    overrides = tiny + LAYOUT + [f"checkpoint.every_steps={HALF}", *LAST_EVAL_ONLY]
    clean = tmp_path / "clean"
    run_workers(overrides, clean)
    plans = [(p["epoch"], p["step"], p["pp"], p["dp"], p["frozen_units"]) for p in events(clean, "plan")]
    assert plans == [(0, 0, 4, 1, 0), (0, HALF, 2, 2, 3), (1, 0, 2, 2, 3), (1, HALF, 1, 4, 5)]
    epochs = events(clean, "epoch")
    assert [(e["sample_uses_min"], e["sample_uses_max"], e["steps"]) for e in epochs] == [(1, 1, STEPS)] * 2
    want = reference_params(compose_config(overrides, tmp_path / "ref"), freeze_blocks=BLOCKS, interval_steps=HALF)
    assert_params_close(final_params(clean), want)
    # Each worker's parameters are its stage's: at epoch 0's end (K = 2) the two stages split the model, at
    # epoch 1's (K = 1) every worker holds all of it; AdamW's state is two tensors per trainable parameter.
    model_bytes = sum(p.numel() * 4 for p in want.values())
    held = [e["memory"]["param_bytes"] for e in epochs]
    assert held[0][0] + held[0][1] == model_bytes and held[0][:2] == held[0][2:] and max(held[0]) < model_bytes
    assert held[1] == [model_bytes] * 4
    assert all(
        0 < e["memory"]["optim_bytes"][r] <= 2 * held_r
        for e, h in zip(epochs, held, strict=True)
        for r, held_r in enumerate(h)
    )

    # The checkpoint due at step 6 is written after the decision: it holds the new layout and the step.
    mid = next(c for c in lookup.list_checkpoints(clean) if c.name.endswith(f"{HALF:08d}"))
    state = store.load(mid)[2]
    assert (state["epoch"], state["step_in_epoch"], state["plan"]["pp"], state["plan"]["dp"]) == (0, HALF, 2, 2)

    kills = [
        {"rank": 2, "point": "step", "step": HALF + 1},  # right after the first mid-epoch transition
        {"rank": 1, "point": "transition", "step": STEPS + HALF},
    ]  # inside the second one
    killed = tmp_path / "killed"
    run_killed(overrides + ["launcher.max_restarts=2"], killed, kills, monkeypatch)
    starts = events(killed, "start")
    assert len(starts) == 3 and all(s["resumed_from"] for s in starts[1:])
    resumed = [e.get("resumed_at_step") for e in events(killed, "epoch")]
    assert HALF in resumed, resumed
    last_epochs = {e["epoch"]: e for e in events(killed, "epoch")}
    assert all(e["sample_uses_min"] == e["sample_uses_max"] == 1 for e in last_epochs.values())
    got_params, got_optim, got_state = store.load(lookup.latest_valid(killed))
    want_params, want_optim, want_state = store.load(lookup.latest_valid(clean))
    assert got_state["global_step"] == want_state["global_step"] == 2 * STEPS
    for name in want_params:
        assert torch.equal(got_params[name], want_params[name]), name
    for name in want_optim:
        for key, value in want_optim[name].items():
            assert torch.equal(got_optim[name][key], value), (name, key)


def test_cache_advanced_inside_an_epoch_equals_recomputation(tmp_path, tiny):
    """AutoCache through mid-epoch depth changes (0 -> 3 -> 5 units): entries are written as samples pass,
    the next epoch already reads what the half epoch before wrote, entries of the shallower depth are
    advanced, and training ends where the reference without any cache does (float32 storage)."""
    overrides = tiny + LAYOUT + ["train.epochs=3", "auto.cache=true", "cache.min_frozen_units=3", "cache.dtype=float32"]
    run_workers(overrides, tmp_path)
    plans = [(p["epoch"], p["step"], p["frozen_units"], p["cached_units"]) for p in events(tmp_path, "plan")]
    assert plans == [(0, 0, 0, 0), (0, HALF, 3, 3), (1, 0, 3, 3), (1, HALF, 5, 5), (2, 0, 5, 5)]
    epochs = events(tmp_path, "epoch")
    assert all(e["sample_uses_min"] == e["sample_uses_max"] == 1 for e in epochs)
    fill, change, after = (e["cache"] for e in epochs)
    assert fill["hits"] == fill["advanced"] == 0 and fill["written"] > 0  # the half epoch at depth 3 writes
    assert change["hits"] > 0 and change["advanced"] > 0  # read what epoch 0 wrote; depth 3 -> 5 advanced
    assert after["hits"] > 0 and after["computed"] == 0  # every sample had an entry at depth 3 or 5
    want = reference_params(compose_config(overrides, tmp_path / "ref"), freeze_blocks=BLOCKS, interval_steps=HALF)
    assert_params_close(final_params(tmp_path), want)


def test_every_steps_decides_across_epoch_boundaries(tmp_path, tiny):
    """`freeze.every_steps=5` on one worker: decisions after global steps 5, 10, 15, 20, wherever they fall
    in the 12-step epochs; training equals the reference that freezes at the same steps."""
    overrides = tiny + [
        "data.eval_fraction=0.9",
        "train.epochs=2",
        "freeze.policy=schedule",
        "freeze.blocks=[0,1,1,2]",
        "freeze.max_fraction=1.0",
        "freeze.every_steps=5",
        *LAST_EVAL_ONLY,
    ]
    run_workers(overrides, tmp_path)
    plans = [(p["epoch"], p["step"], p["frozen_units"]) for p in events(tmp_path, "plan")]
    assert plans == [(0, 0, 0), (0, 5, 3), (1, 0, 3), (1, 3, 5)]
    want = reference_params(compose_config(overrides, tmp_path / "ref"), freeze_blocks=[0, 1, 1, 2], interval_steps=5)
    assert_params_close(final_params(tmp_path), want)
