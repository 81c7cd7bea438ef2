"""Faults of the machine, for real where the machine allows it (a small tmpfs as the run directory or the cache's
directory: root only), injected where it does not (`ptrun.train.fault_injection`): a full disk and an exhausted
memory end the run with one line (what, where, the numbers, the newest good checkpoint and the command that
resumes), exit 1, no traceback and no restart, and the printed command finishes the run; the cache's disk tier
without space only recomputes. (A worker killed without such evidence still restarts and resumes: test_train_dist,
test_faults_dist.)
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, final_params, run_events, run_ptrun, run_workers, start_ptrun, worker_pids

pytestmark = [pytest.mark.dist, pytest.mark.slow]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of `size` mounted at `path` while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def one_line(out: subprocess.CompletedProcess, starts: str) -> str:
    """The fault contract: exit 1, one stderr line `ptrun: error: STARTS...`, no traceback, one start line
    (no restart). Returns the line."""
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-4000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ptrun: error: {starts}"), out.stderr[-4000:]
    assert "Traceback" not in out.stdout + out.stderr
    started = [line for line in out.stdout.splitlines() if line.startswith("ptrun: ")]
    assert len(started) == 1, out.stdout
    print(lines[0])  # `pytest -rP` shows each case's line
    return lines[0]


def resume_args(line: str) -> list[str]:
    """The `ptrun train` arguments of the command a line says to resume with."""
    command = shlex.split(line.split("resume with: ", 1)[1])
    assert command[:2] == ["ptrun", "train"], line
    return command[2:]


def no_partial_files(run_dir: Path) -> None:
    left = [p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert not left, left
    assert not list(run_dir.glob("elastic/*/attempt_1")), "restarted"


FULL_DISK = ["recipe=digits_vit", "checkpoint.every_steps=5", "train.epochs=1", "train.max_steps_per_epoch=20"]


@needs_root
def test_a_full_disk_stops_at_the_checkpoint_it_cannot_write_and_the_printed_command_finishes_the_run(tmp_path):
    """digits_vit on a 3 MB tmpfs: the step-5 checkpoint fits, the step-10 one does not."""
    run_dir = tmp_path / "run"
    with tmpfs(run_dir, "3m"):
        out = run_ptrun("train", *FULL_DISK, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        line = one_line(
            out, f"no space left on the disk of {run_dir}/checkpoints/step_00000010 to write the checkpoint"
        )
        needed, free = (
            int(n) for n in (line.split("it needs ")[1].split(" bytes")[0], line.split(", ")[1].split(" ")[0])
        )
        assert needed > free
        assert f"newest good checkpoint {run_dir}/checkpoints/step_00000005 (in epoch 1 after step 5)" in line
        assert "checkpoint.keep=1 would not make room" in line and "copy" in line
        no_partial_files(run_dir)
        shutil.copytree(run_dir, tmp_path / "copy")
    # the run directory, now on the big disk where the tmpfs was
    shutil.copytree(tmp_path / "copy", run_dir, dirs_exist_ok=True)
    resumed = run_ptrun("train", *resume_args(line), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The uninterrupted run, launched in this process: the same workers, without a second launcher's start.
    reference = tmp_path / "reference"
    run_workers(FULL_DISK, reference)

    assert run_events(run_dir, "start")[-1]["resumed_from"].endswith("step_00000005")
    assert run_events(run_dir, "end")[-1]["final_eval"] == run_events(reference, "end")[-1]["final_eval"]
    got, want = final_params(run_dir), final_params(reference)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


CACHED = [
    *TINY,
    "train.epochs=3",
    "train.max_steps_per_epoch=20",
    "launcher.nproc_per_node=2",
    "freeze.policy=schedule",
    "freeze.blocks=[0,1,2]",
    "freeze.max_fraction=1.0",
    "train.export=false",
]


@needs_root
def test_the_cache_disk_tier_without_space_recomputes_and_says_so_once(tmp_path):
    cache_dir = tmp_path / "cache"
    with tmpfs(cache_dir, "64k"):
        out = run_ptrun(
            "train",
            *CACHED,
            "auto.cache=true",
            "cache.max_memory=0",
            f"cache.dir={cache_dir}",
            f"hydra.run.dir={tmp_path / 'cached'}",
            cwd=tmp_path,
        )
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line for line in (out.stdout + out.stderr).splitlines() if "no space for the cache's disk tier" in line]
    assert len(said) == 1 and "is recomputed instead" in said[0], out.stderr
    run_workers([*CACHED, "auto.cache=false"], tmp_path / "plain")  # the run without a cache, in this process
    got, want = run_events(tmp_path / "cached", "epoch"), run_events(tmp_path / "plain", "epoch")
    assert run_events(tmp_path / "cached", "plan")[-1]["cached_units"] > 0
    assert [e["train_loss"] for e in got] == pytest.approx([e["train_loss"] for e in want], rel=1e-6)
    assert got[-1]["eval"] == pytest.approx(want[-1]["eval"], rel=1e-6)


INJECTED = [
    *TINY,
    "train.epochs=2",
    "train.max_steps_per_epoch=20",
    "launcher.nproc_per_node=2",
    "launcher.max_restarts=2",
    "checkpoint.every_steps=5",
    "freeze.policy=schedule",
    "freeze.blocks=[0,1]",
    "freeze.max_fraction=1.0",
    "auto.cache=false",
    "train.export=false",
]


def planned(*entries: dict) -> dict[str, str]:
    return {"PTRUN_KILL_AT": json.dumps(list(entries))}


def train_injected(tmp_path, *entries: dict):
    """`ptrun train` of `INJECTED` in `tmp_path`/run with the faults `entries` planned: the run directory and
    the finished command."""
    run_dir = tmp_path / "run"
    return run_dir, run_ptrun("train", *INJECTED, f"hydra.run.dir={run_dir}", cwd=tmp_path, env=planned(*entries))


def test_out_of_memory_at_a_step_and_a_transition_is_one_line_with_keys_that_fit(tmp_path):
    """OOM at step 12 on rank 1: one line with keys that fit; resumed with the first of them (its command), an
    OOM in the transition at the epoch boundary; resumed again, the run finishes with every sample used once."""
    run_dir, out = train_injected(tmp_path, {"point": "step", "step": 12, "rank": 1, "oom": True})
    line = one_line(out, "out of memory on cpu in a step: ")
    assert "keys that would fit, by the planner's memory model: pipe.microbatches=2 (~" in line, line
    assert f"newest good checkpoint {run_dir}/checkpoints/step_00000010" in line
    args = resume_args(line)
    assert "pipe.microbatches=2" in args and "pipe.microbatches=1" not in args

    out = run_ptrun("train", *args, cwd=tmp_path, env=planned({"point": "transition", "oom": True}))
    line = one_line(out, "out of memory on cpu in a transition: ")
    # the transition at the epoch boundary comes before the boundary's checkpoint
    assert "keys that would fit" in line and f"newest good checkpoint {run_dir}/checkpoints/step_00000015" in line

    out = run_ptrun("train", *resume_args(line), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    starts = run_events(run_dir, "start")
    assert len(starts) == 3 and all(s["resumed_from"] for s in starts[1:])
    resumed_plans = [p for p in run_events(run_dir, "plan") if p["step"] == 10]  # where the advice was followed
    assert resumed_plans and all(p["microbatches"] == 2 for p in resumed_plans)
    epochs = {e["epoch"]: e for e in run_events(run_dir, "epoch")}
    assert sorted(epochs) == [0, 1]
    assert all(e["samples"] == 20 * 16 and e["sample_uses_max"] == 1 for e in epochs.values())  # none twice
    assert len(run_events(run_dir, "end")) == 1


def test_no_space_for_metrics_a_checkpoint_or_the_export_is_one_line(tmp_path):
    """Injected ENOSPC: metrics.jsonl (rank 0 alone: the workers stop at the next step), a checkpoint on rank
    1 (its peers learn it in the checkpoint's own collective), the export at the end."""
    run_dir, out = train_injected(tmp_path, {"point": "checkpoint", "step": 15, "rank": 1, "errno": 28})
    line = one_line(out, f"no space left on the disk of {run_dir}/checkpoints/step_00000015 to write the checkpoint")
    assert f"newest good checkpoint {run_dir}/checkpoints/step_00000010" in line
    no_partial_files(run_dir)

    out = run_ptrun(
        "train", *resume_args(line), cwd=tmp_path, env=planned({"point": "metrics", "event": "epoch", "errno": 28})
    )
    line = one_line(out, f"no space left on the disk of {run_dir}/metrics.jsonl to write the metrics")
    assert run_events(run_dir, "epoch") == []  # the epoch event was the write that failed
    assert f"newest good checkpoint {run_dir}/checkpoints/step_00000015" in line

    args = [a for a in resume_args(line) if a != "train.export=false"] + ["train.export=true"]
    out = run_ptrun("train", *args, cwd=tmp_path, env=planned({"point": "export", "errno": 28}))
    line = one_line(out, f"no space left on the disk of {run_dir}/model to write the export")
    assert not (run_dir / "model").exists()
    assert f"newest good checkpoint {run_dir}/checkpoints/step_00000040" in line


def test_a_worker_the_kernel_killed_for_memory_is_one_line_and_no_restart(tmp_path):
    """The cgroup's memory events (a file of the test's, `PTRUN_OOM_EVENTS`) count an OOM kill just before a
    worker dies of SIGKILL: one line with its peak resident memory, no restart."""
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n")
    run_dir = tmp_path / "run"
    proc = start_ptrun(
        "train",
        *INJECTED,
        "train.epochs=20",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        env={"PTRUN_OOM_EVENTS": str(events)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while not list(run_dir.glob("checkpoints/step_*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    victim = worker_pids(proc.pid)[-1]
    events.write_text("low 0\nhigh 0\nmax 1\noom 1\noom_kill 1\n")
    os.kill(victim, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=240)
    # A worker makes no named semaphore (`ptrun.launcher.worker.no_named_semaphores`); one a library made would
    # be left to the launcher's resource tracker, which warns as it removes it: what a kill leaves, not ptrun's line.
    tracker = ("resource_tracker: There appear to be", "warnings.warn('resource_tracker")
    stderr = "".join(line for line in stderr.splitlines(True) if not any(t in line for t in tracker))
    ended = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    line = one_line(ended, "the kernel killed worker rank")
    assert f"(pid {victim}) for want of memory (said by {events})" in line
    peak = int(line.split("its peak resident memory was ")[1].split(" bytes")[0])
    assert peak > 50 * 2**20  # a worker with torch loaded
    assert "newest good checkpoint" in line and "resume with: " in line
    assert len(run_events(run_dir, "start")) == 1


def test_a_layout_change_that_would_not_fit_is_refused_and_the_run_freezes_in_place(tmp_path):
    """K = 2 on 2 workers, both blocks frozen after the first epoch: AutoDP would widen to K = 1, DP = 2, where each
    worker holds the whole model, more than a device offers (`device.memory`, tiny): the change is refused,
    the run freezes in place in K = 2 and finishes."""
    run_dir = tmp_path / "run"
    layout = ["pipe.length=2", "pipe.microbatches=2", "pipe.schedule=1F1B", "freeze.blocks=[0,2]", "device.memory=1KB"]
    out = run_ptrun("train", *INJECTED, *layout, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    refused = [line for line in out.stdout.splitlines() if "refused" in line]
    assert len(refused) == 1 and refused[0].startswith("layout K=1 DP=2 refused: its largest stage would need ~")
    assert refused[0].endswith("the 5 frozen units freeze in place, in K=2 DP=1"), refused[0]
    plans = run_events(run_dir, "plan")
    assert [(p["pp"], p["dp"], p["frozen_units"]) for p in plans] == [(2, 1, 0), (2, 1, 5)]
