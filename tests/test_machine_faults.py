"""The parts of ending calmly on a fault of the machine, without processes: what counts as a write that found no
space (the errors torch.save and safetensors really raise), the cure the line names, the keys the planner's
memory model says would fit, and the evidence of an OOM kill. The runs themselves: test_machine_faults_dist."""

from __future__ import annotations

import errno
import io
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import TINY, compose_config

from ptrun.launcher.memory_advice import keys_that_fit
from ptrun.launcher.oom_watch import OomWatch, peak_resident
from ptrun.layout import fit
from ptrun.layout.fit import UnitMemory
from ptrun.layout.plan import Plan
from ptrun.train import fault_injection, machine_faults
from ptrun.train.checkpoint import lookup
from ptrun.train.run_end import no_space_line


class FullDisk(io.RawIOBase):
    """A file whose every write finds no space, as a full disk's does."""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_the_errors_a_full_disk_raises_are_no_space_and_others_are_not():
    # torch.save into a buffered file (what open() gives) reports the file's OSError as its own RuntimeError
    with pytest.raises(RuntimeError) as saved:
        torch.save({"a": torch.zeros(100_000)}, io.BufferedWriter(FullDisk()))
    assert not isinstance(saved.value, OSError) and machine_faults.no_space(saved.value)
    assert machine_faults.no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    rust = "Error while serializing: I/O error: No space left on device (os error 28)"  # safetensors' words
    assert machine_faults.no_space(Exception(rust))
    assert not machine_faults.no_space(OSError(errno.EACCES, "Permission denied"))
    assert not machine_faults.no_space(RuntimeError("Error while serializing: I/O error (os error 5)"))
    assert not machine_faults.no_space(None)


def test_an_injected_errno_is_raised_once(monkeypatch):
    monkeypatch.setenv("PTRUN_KILL_AT", json.dumps([{"point": "metrics", "event": "epoch", "errno": 28}]))
    fault_injection._planned.cache_clear()
    try:
        fault_injection.reached("metrics", -1, event="plan")  # another event: nothing
        with pytest.raises(OSError) as raised:
            fault_injection.reached("metrics", -1, event="epoch")
        assert raised.value.errno == errno.ENOSPC
        fault_injection.reached("metrics", -1, event="epoch")  # once
    finally:
        fault_injection._planned.cache_clear()
        fault_injection._fired.clear()


def checkpoint_dir(run_dir: Path, step: int, nbytes: int) -> Path:
    """A complete checkpoint of `nbytes` bytes of parameters at `step`, as checkpoint.py lays one out."""
    ckpt = run_dir / "checkpoints" / f"step_{step:08d}"
    ckpt.mkdir(parents=True)
    (ckpt / "params-stage0.safetensors").write_bytes(b"\0" * nbytes)
    (ckpt / lookup.TRAINER).write_text(json.dumps({"epoch": 0, "step_in_epoch": step}))
    files = {p.name: {"sha256": lookup.sha256_of(p), "bytes": p.stat().st_size} for p in sorted(ckpt.iterdir())}
    (ckpt / lookup.MANIFEST).write_text(json.dumps({"format": 1, "files": files}))
    return ckpt


def test_the_line_names_checkpoint_keep_1_only_where_the_older_checkpoints_make_the_room(tmp_path):
    run_dir = tmp_path / "run"
    checkpoint_dir(run_dir, 5, 2_000_000)
    newest = checkpoint_dir(run_dir, 10, 2_000_000)
    report = {"what": "checkpoint", "path": str(run_dir / "checkpoints/step_00000015"), "needed": 2_000_000}
    overrides = ["checkpoint.keep=2", "checkpoint.every_steps=5"]

    line = no_space_line(report, 500_000, 2, run_dir, overrides)
    assert line.startswith(
        f"no space left on the disk of {run_dir}/checkpoints/step_00000015 to write the checkpoint: it needs "
        "2000000 bytes (1.9 MiB), 500000 bytes (488.3 KiB) are free there; "
        f"newest good checkpoint {newest} (in epoch 1 after step 10); checkpoint.keep=1 is the cure"
    ), line
    assert line.endswith(
        f"resume with: ptrun train checkpoint.every_steps=5 checkpoint.keep=1 train.resume=true hydra.run.dir={run_dir}"
    )
    # the older checkpoint does not make the room, or there is none to give up: another directory
    for needed, keep in ((3_000_000, 2), (2_000_000, 1)):
        line = no_space_line({**report, "needed": needed}, 500_000, keep, run_dir, overrides)
        assert "checkpoint.keep=1 would not make room" in line and f"copy {run_dir} to a disk with room" in line
        assert line.endswith(
            f"resume with: ptrun train {' '.join(overrides)} train.resume=true hydra.run.dir={run_dir}"
        )
    # room again (an injected fault, or another writer's files gone): no cure to name
    line = no_space_line(report, 2_000_000, 2, run_dir, overrides)
    assert "are free there; newest good checkpoint" in line and "; there is room there now; resume with: " in line


def test_the_keys_that_would_fit_come_from_the_planners_memory_model(tmp_path):
    cfg = compose_config([*TINY, "launcher.nproc_per_node=2"], tmp_path)
    plan = Plan(num_units=6, frozen_units=0, pp=1, dp=2, stage_bounds=((0, 6),), microbatches=1, schedule="GPipe")
    report = {"where": "step", "plan": plan.to_dict(), "used": 2**30, "total": 2**30, "requested": 2**28}
    keys = [k.split(" ")[0] for k in keys_that_fit(cfg, report)]
    # each halves or drops the activations, the most of the tiny model's memory; not pipe.length=2: the
    # parameters are spread over the stages by their share, and a stage still holds half the activations
    assert keys[:2] == ["pipe.microbatches=2", "pipe.recompute=stage"] and "train.global_batch_size=8" in keys
    # a device twice as short: nothing a single key gives fits
    assert keys_that_fit(cfg, {**report, "used": 2**31}) == []
    assert keys_that_fit(cfg, {**report, "where": "cache"}) == ["cache.max_memory=25%", "auto.cache=false"]


def test_an_oom_kill_is_seen_in_the_kernel_log_or_the_memory_events_from_the_start_on(tmp_path, monkeypatch):
    log, events = tmp_path / "kmsg", tmp_path / "memory.events"
    log.write_text("6,1,1,-;Out of memory: Killed process 4242 (python) total-vm:100kB, anon-rss:99kB\n")
    events.write_text("oom 1\noom_kill 1\n")
    monkeypatch.setenv("PTRUN_KERNEL_LOG", str(log))
    monkeypatch.setenv("PTRUN_OOM_EVENTS", str(events))
    watch = OomWatch()
    try:
        assert watch.killed(4242) is None  # before the start: another run's
        with log.open("a") as f:
            f.write("3,2,2,-;oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=4343,uid=0\n")
        assert watch.killed(4343) == "the kernel's log" and watch.killed(4344) is None
        events.write_text("oom 2\noom_kill 2\n")
        assert watch.killed(4344) == str(events)
        watch.sample([os.getpid()])
        assert watch.peak[os.getpid()] == peak_resident(os.getpid()) > 0
    finally:
        watch.close()


def test_an_oom_report_says_the_device_and_its_memory():
    error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has 1.00 GiB free")
    report = machine_faults.memory_report(error, torch.device("cpu"), "step", None)
    assert report["device"] == "cpu" and report["requested"] == 2 * 2**30
    assert 0 < report["used"] < report["total"] and report["plan"] is None


def test_a_widening_that_would_not_fit_is_refused_for_the_same_layout_frozen_in_place(tmp_path):
    # the planner's memory of the tiny digits ViT (embedding, two blocks' halves, head)
    memory = UnitMemory([11776.0, 68608.0, 68096.0, 68608.0, 68096.0, 6304.0], [13056.0] * 5 + [240.0])
    current = Plan(
        num_units=6, frozen_units=0, pp=2, dp=1, stage_bounds=((0, 3), (3, 6)), microbatches=2, schedule="1F1B"
    )
    wide = Plan(num_units=6, frozen_units=5, pp=1, dp=2, stage_bounds=((0, 6),), microbatches=2, schedule="1F1B")
    kept = fit.in_place(current, wide)
    assert (kept.pp, kept.dp, kept.frozen_units, kept.stage_bounds) == (2, 1, 5, current.stage_bounds)
    # K = 1 holds every frozen unit's parameters (a quarter of their AdamW state) and the head
    need = fit.largest_stage(memory, wide, 16, copies=4)
    assert need == pytest.approx(sum(memory.state_bytes[:5]) / 4 + 6304.0 + 240.0 * 16 / 2 / 2)  # one micro-batch
    assert fit.largest_stage(memory, kept, 16, copies=4) < need
    assert fit.refusal(memory, current, wide, 16, int(need), 4) is None  # it fits
    line = fit.refusal(memory, current, wide, 16, int(need) - 1, 4)
    assert line.startswith("layout K=1 DP=2 refused: its largest stage would need ~0.00 GiB")
    assert line.endswith("the 5 frozen units freeze in place, in K=2 DP=1")
