"""A run that diverges, for real: the CLI as a user starts it, two workers, a learning rate of 1e6 after a good
first epoch. It must stop every worker at the step it diverged, exit 1 with one line (the epoch, the step,
`optim.lr`, the newest good checkpoint and the command that resumes from it at a lower learning rate), restart
nothing, export nothing and write no checkpoint of the diverged state; under fp16 the scaler's skipped steps
are trained through until the documented count."""

from __future__ import annotations

import shlex

import pytest
from conftest import TINY, run_events, run_ptrun

from ptrun.train.checkpoint import lookup
from ptrun.train.divergence import SKIPS_DIVERGED

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # two runs per precision: ~40 s each

STEPS = SKIPS_DIVERGED + 10  # an epoch long enough for fp16's run of skips


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_diverged_run_stops_with_one_line_and_keeps_the_last_good_checkpoint(precision, tmp_path):
    run_dir, tmpdir = tmp_path / "run", tmp_path / "tmp"
    tmpdir.mkdir()
    base = [
        "recipe=digits_vit",
        *TINY,
        f"train.max_steps_per_epoch={STEPS}",
        f"train.precision={precision}",
        "checkpoint.every_epochs=1",
        "launcher.max_restarts=3",
        f"hydra.run.dir={run_dir}",
    ]
    first = run_ptrun("train", *base, "train.epochs=1", "train.export=false", cwd=tmp_path, env={"TMPDIR": str(tmpdir)})
    assert first.returncode == 0, first.stderr[-3000:]
    good = lookup.list_checkpoints(run_dir)
    assert [p.name for p in good] == [f"step_{STEPS:08d}"]

    out = run_ptrun(
        "train",
        *base,
        "train.epochs=2",
        "train.resume=true",
        "optim.lr=1e6",
        "train.export=true",
        cwd=tmp_path,
        env={"TMPDIR": str(tmpdir)},
    )
    assert out.returncode == 1, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stdout, out.stderr
    (stopped,) = run_events(run_dir, "stopped")
    diverged = stopped["diverged"]
    assert diverged["epoch"] == 1 and diverged["global_step"] == STEPS + diverged["step"]
    why = (
        "the training loss is not finite"
        if precision == "fp32"
        else f"fp16 overflowed {SKIPS_DIVERGED} steps in a row (each skipped, its loss scale halved)"
    )
    assert lines[0].startswith(
        f"ptrun: error: training diverged in epoch 2, step {diverged['step'] + 1} "
        f"(global step {diverged['global_step'] + 1}): {why}, at optim.lr=1e+06 "
    ), lines[0]
    # every worker stopped at that step (fp16: after the count of skips), before an epoch's end
    skipped = SKIPS_DIVERGED - 1 if precision == "fp16" else 0
    assert stopped["global_step"] == diverged["global_step"] + skipped < 2 * STEPS
    assert [e["epoch"] for e in run_events(run_dir, "epoch")] == [0]
    # nothing restarted, exported or checkpointed after the last good step
    assert len(run_events(run_dir, "start")) == 2
    assert not (run_dir / "model").exists()
    assert lookup.list_checkpoints(run_dir) == good
    assert f"newest good checkpoint {good[0]} (before epoch 2); resume from it at a lower learning rate: " in lines[0]
    command = shlex.split(lines[0].split("at a lower learning rate: ", 1)[1])
    assert command[:2] == ["ptrun", "train"] and "optim.lr=100000" in command and "optim.lr=1e6" not in command
    assert command[-2:] == ["train.resume=true", f"hydra.run.dir={run_dir}"]
    assert not (run_dir / "elastic").exists() and list(tmpdir.iterdir()) == []
