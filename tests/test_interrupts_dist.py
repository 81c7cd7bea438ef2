"""Ctrl-C and SIGTERM, for real: the CLI is started as a user starts it, the signal is sent while it trains,
and the run must stop at a step every worker agrees on with a checkpoint, print one line (where the
checkpoint is and the command that resumes), exit 130 / 143, leave nothing in the temp directory or
/dev/shm, and the command it printed must finish the run with exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, final_params, run_events, start_ptrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # five runs in a chain: ~60 s

OVERRIDES = [
    "recipe=digits_vit",
    *TINY,
    "train.epochs=5",
    "train.max_steps_per_epoch=30",
    "train.export=false",
    "launcher.nproc_per_node=2",
    "checkpoint.every_epochs=1",
    # a layout change, so it is part of what must stop and resume exactly. Not auto.cache: its memory
    # tier does not outlive a run (unless cache.keep), so a resumed run recomputes the entries, in
    # other batches than the first run did, which moves the result by float rounding.
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,1,1,1]",
    "freeze.max_fraction=1.0",
    "auto.cache=false",
]


def ptrun(args: list[str], tmpdir: Path) -> subprocess.Popen:
    """`ptrun train ARGS` in a session of its own (as a terminal's foreground job), with a private TMPDIR."""
    return start_ptrun(
        "train",
        *args,
        cwd=tmpdir.parent,
        env={"TMPDIR": str(tmpdir)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def shm_entries() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("ptrun-*")} if Path("/dev/shm").is_dir() else set()


def stop_when_training(
    args: list[str], run_dir: Path, tmpdir: Path, signum: int, to_group: bool, epochs_before: int
) -> str:
    """Start `ptrun train ARGS`, send `signum` once it has trained another epoch (after `epochs_before`), and
    check how it stops; returns its one line."""
    proc = ptrun(args, tmpdir)
    deadline = time.monotonic() + 180
    while len(run_events(run_dir, "epoch", missing_ok=True)) <= epochs_before:
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc)
        time.sleep(0.05)
    # A terminal sends Ctrl-C to every process of the foreground job; Kubernetes sends SIGTERM to the
    # container's first process (here the launcher), which passes it on to its workers.
    os.killpg(proc.pid, signum) if to_group else os.kill(proc.pid, signum)
    code, _, err = finish(proc)

    assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ptrun: stopped by {signum.name} "), err
    stopped = run_events(run_dir, "stopped")[-1]
    assert stopped["signal"] == signum.name and stopped["checkpoint_step"] == stopped["global_step"] < 5 * 30
    assert f"checkpoints/step_{stopped['global_step']:08d};" in lines[0]
    assert not (run_dir / "elastic").exists()  # elastic's per-attempt directories held no error file
    assert list(tmpdir.iterdir()) == []
    return lines[0]


def resume_command(line: str, run_dir: Path) -> list[str]:
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["ptrun", "train"] and f"hydra.run.dir={run_dir}" in command
    return command[2:]


def test_ctrl_c_then_sigterm_stop_with_checkpoints_and_the_printed_commands_resume_exactly(tmp_path):
    """Ctrl-C to the whole foreground job in epoch 2, resume with the printed command, SIGTERM to the launcher
    alone in epoch 3 (as Kubernetes sends it), resume again: the run ends with exactly the parameters of an
    uninterrupted one, and nothing is left in the temp directory or /dev/shm."""
    tmpdir, shm_before = tmp_path / "tmp", shm_entries()
    tmpdir.mkdir()
    reference = tmp_path / "reference"
    code, _, err = finish(ptrun([*OVERRIDES, f"hydra.run.dir={reference}"], tmpdir))
    assert code == 0, err

    run_dir = tmp_path / "run"
    line = stop_when_training([*OVERRIDES, f"hydra.run.dir={run_dir}"], run_dir, tmpdir, signal.SIGINT, True, 0)
    line = stop_when_training(resume_command(line, run_dir), run_dir, tmpdir, signal.SIGTERM, False, 1)
    code, _, err = finish(ptrun(resume_command(line, run_dir), tmpdir))
    assert code == 0, err

    assert [e["signal"] for e in run_events(run_dir, "stopped")] == ["SIGINT", "SIGTERM"]
    got, want = final_params(run_dir), final_params(reference)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]
    assert list(tmpdir.iterdir()) == [] and shm_entries() <= shm_before
