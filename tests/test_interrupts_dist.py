"""Ctrl-C and SIGTERM, for real: the CLI is started as a user starts it, the signal is sent while it trains,
and the run must stop at a step every worker agrees on with a checkpoint, print one line (where the
checkpoint is and the command that resumes), exit 130 / 143, leave nothing in the temp directory or
/dev/shm, and the command it printed must finish the run with exactly the parameters of an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY, final_params

pytestmark = pytest.mark.dist

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["recipe=digits_vit", *TINY, "train.epochs=4", "train.max_steps_per_epoch=30", "train.export=false",
             "launcher.nproc_per_node=2", "checkpoint.every_epochs=1",
             # a layout change and the AutoCache memory tier in /dev/shm, so both are part of what must stop
             # cleanly and leave nothing behind
             "freeze.policy=schedule", "freeze.blocks=[0,1,1,1]", "freeze.max_fraction=1.0", "auto.cache=true"]


def ptrun(args: list[str], tmpdir: Path) -> subprocess.Popen:
    """`ptrun train ARGS` in a session of its own (as a terminal's foreground job), with a private TMPDIR."""
    env = {**os.environ, "TMPDIR": str(tmpdir),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "ptrun.cli", "train", *args], env=env, cwd=tmpdir.parent,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=240)
    return proc.returncode, out, err


def shm_entries() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("ptrun-*")} if Path("/dev/shm").is_dir() else set()


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, torch.Tensor]:
    root = tmp_path_factory.mktemp("reference")
    (root / "tmp").mkdir()
    code, _, err = finish(ptrun([*OVERRIDES, f"hydra.run.dir={root / 'run'}"], root / "tmp"))
    assert code == 0, err
    return final_params(root / "run")


@pytest.mark.parametrize("signum, to_group", [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c to the foreground job", "SIGTERM to the launcher"])
def test_a_signal_stops_with_a_checkpoint_and_the_printed_command_resumes_exactly(
        tmp_path, reference, signum, to_group):
    run_dir, tmpdir = tmp_path / "run", tmp_path / "tmp"
    tmpdir.mkdir()
    shm_before = shm_entries()
    proc = ptrun([*OVERRIDES, f"hydra.run.dir={run_dir}"], tmpdir)
    deadline = time.monotonic() + 180
    while not any(e["event"] == "epoch" for e in events(run_dir)):  # trained an epoch: 3 of 4 to go
        assert proc.poll() is None and time.monotonic() < deadline, finish(proc)
        time.sleep(0.05)
    # A terminal sends Ctrl-C to every process of the foreground job; Kubernetes sends SIGTERM to the
    # container's first process (here the launcher), which passes it on to its workers.
    os.killpg(proc.pid, signum) if to_group else os.kill(proc.pid, signum)
    code, _, err = finish(proc)

    assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}[signum], err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ptrun: stopped by {signum.name} "), err
    assert "Traceback" not in err
    stopped = [e for e in events(run_dir) if e["event"] == "stopped"]
    assert len(stopped) == 1 and stopped[0]["checkpoint_step"] == stopped[0]["global_step"] < 4 * 30, stopped
    assert f"checkpoints/step_{stopped[0]['global_step']:08d};" in lines[0]
    assert not (run_dir / "elastic").exists()  # elastic's per-attempt directories held no error file
    assert list(tmpdir.iterdir()) == [] and shm_entries() <= shm_before

    command = shlex.split(lines[0].split("resume with: ", 1)[1])
    assert command[:2] == ["ptrun", "train"] and f"hydra.run.dir={run_dir}" in command
    code, _, err = finish(ptrun(command[2:], tmpdir))
    assert code == 0, err
    got = final_params(run_dir)
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference), \
        [k for k in reference if not torch.equal(got[k], reference[k])]
    assert list(tmpdir.iterdir()) == [] and shm_entries() <= shm_before
