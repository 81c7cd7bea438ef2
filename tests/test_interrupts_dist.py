"""Ctrl-C and SIGTERM, for real: the CLI is started as a user starts it, the signal is sent while it trains,
and the run must stop at a step every worker agrees on with a checkpoint, print one line (where the
checkpoint is and the command that resumes), exit 130 / 143, leave nothing in the temp directory or
/dev/shm, and the command it printed must finish the run with exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, final_params, run_events, run_workers, start_ptrun

from ptrun.auto.autocache import cache_dirs
from ptrun.config import CacheConfig
from ptrun.launcher import leftovers

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # a reference and three runs in a chain

# Each signal is sent once an epoch has ended, and the run must still be training when it arrives: at least 40
# steps are left after each (the second signal comes in epoch 2 of 0..3).
EPOCHS, STEPS = 4, 20
OVERRIDES = [
    "recipe=digits_vit",
    *TINY,
    f"train.epochs={EPOCHS}",
    f"train.max_steps_per_epoch={STEPS}",
    "train.export=false",
    "launcher.nproc_per_node=2",
    "checkpoint.every_epochs=1",
    # a layout change, so it is part of what must stop and resume exactly. Not auto.cache: its memory
    # tier does not outlive a run (unless cache.keep), so a resumed run recomputes the entries, in
    # other batches than the first run did, which moves the result by float rounding.
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,1,1]",
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


def owner_pid(entry: Path) -> int | None:
    """The pid of the launcher that claimed the memory tier `entry` (its owner file), None if unclaimed."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        return json.loads((entry / leftovers.OWNER_FILE).read_text())["pid"]
    return None


def shm_left(run_dir: Path, launchers: set[int]) -> set[str]:
    """What the launchers `launchers` of the run in `run_dir` left in /dev/shm: its AutoCache memory tier (named
    after the run's cache directory) or a tier one of them claimed. Other test sessions on this machine make and
    remove their own meanwhile: those are not this run's."""
    root = Path("/dev/shm")
    if not root.is_dir():
        return set()
    own = cache_dirs(CacheConfig(), run_dir)[1].name
    return {e.name for e in root.glob("ptrun-*") if e.name == own or owner_pid(e) in launchers}


def stop_when_training(
    args: list[str], run_dir: Path, tmpdir: Path, signum: int, to_group: bool, epochs_before: int
) -> tuple[str, int]:
    """Start `ptrun train ARGS`, send `signum` once it has trained another epoch (after `epochs_before`), and
    check how it stops; returns its one line and the launcher's pid."""
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
    assert stopped["signal"] == signum.name and stopped["checkpoint_step"] == stopped["global_step"] < EPOCHS * STEPS
    assert f"checkpoints/step_{stopped['global_step']:08d};" in lines[0]
    assert not (run_dir / "elastic").exists()  # elastic's per-attempt directories held no error file
    assert list(tmpdir.iterdir()) == []
    return lines[0], proc.pid


def resume_command(line: str, run_dir: Path) -> list[str]:
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["ptrun", "train"] and f"hydra.run.dir={run_dir}" in command
    return command[2:]


def test_ctrl_c_then_sigterm_stop_with_checkpoints_and_the_printed_commands_resume_exactly(tmp_path):
    """Ctrl-C to the whole foreground job in epoch 1 (of 0..3), resume with the printed command, SIGTERM to the
    launcher alone in epoch 2 (as Kubernetes sends it), resume again: the run ends with exactly the parameters of an
    uninterrupted one, and nothing is left in the temp directory or /dev/shm."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    # The uninterrupted run, launched in this process: the workers are the same, and it skips a launcher's start.
    reference = tmp_path / "reference"
    run_workers(OVERRIDES, reference)

    run_dir = tmp_path / "run"
    args = [*OVERRIDES, f"hydra.run.dir={run_dir}"]
    line, first = stop_when_training(args, run_dir, tmpdir, signal.SIGINT, True, 0)
    line, second = stop_when_training(resume_command(line, run_dir), run_dir, tmpdir, signal.SIGTERM, False, 1)
    last = ptrun(resume_command(line, run_dir), tmpdir)
    code, _, err = finish(last)
    assert code == 0, err

    assert [e["signal"] for e in run_events(run_dir, "stopped")] == ["SIGINT", "SIGTERM"]
    got, want = final_params(run_dir), final_params(reference)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), [k for k in want if not torch.equal(got[k], want[k])]
    assert list(tmpdir.iterdir()) == [] and shm_left(run_dir, {first, second, last.pid}) == set()
