"""SIGKILL, for real: `ptrun train` is started as a user starts it, and once AutoCache holds entries its launcher
(which runs the elastic agent), its whole process group (as a scheduler kills a job), or one of its workers is
SIGKILLed. Within 10 s no process the run started may be left (the process tree collected from /proc before the
kill, whatever the command lines), and /dev/shm must hold nothing of the run: no memory tier, no semaphore one
of its processes held. A worker that fails, or is killed alone, is one line on the terminal. And the sweep of
the next launch removes what a run killed with its janitor left, never what a live one holds. (The launcher
runs the elastic agent: a SIGKILL to the agent is one to the launcher.)"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY, _parents, mapped_shm_inodes, process_tree, run_events, semaphores, start_ptrun

from ptrun.auto.autocache import cache_dirs
from ptrun.config import CacheConfig
from ptrun.launcher import leftovers

CACHED = [
    "recipe=digits_vit",
    *TINY,
    "train.epochs=20",
    "train.max_steps_per_epoch=10",
    "train.export=false",
    "launcher.nproc_per_node=2",
    # the forced schedule each 2-worker run of a frozen block spells out (test_trackers.py's too)
    "freeze.policy=schedule",
    "freeze.blocks=[0,1]",
    "freeze.max_fraction=1.0",
    "cache.min_frozen_units=1",
    "auto.cache=true",
]
"""The small digits ViT on two workers (K = 1, DP = 2), caching from its second epoch on: the embedded default's
setting (AutoCache on, the node-shared memory tier) at the tests' size."""
LORA_PIPELINE = [*CACHED, "adapter=lora", "pipe.length=2", "pipe.microbatches=2"]
"""The same as a K = 2 pipeline of LoRA units (AutoPipe repacks it as blocks freeze)."""
GONE_WITHIN_S = 10


def memory_tier(run_dir: Path) -> Path:
    return cache_dirs(CacheConfig(), run_dir)[1]


def start_caching(args: list[str], tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """`ptrun train ARGS` in a session of its own, returned once the memory tier holds entries of a trained
    epoch (an epoch event with cache writes), with its memory tier."""
    run_dir = tmp_path / "run"
    proc = start_ptrun(
        "train",
        *args,
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        env={"TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not any(e.get("cache", {}).get("written") for e in run_events(run_dir, "epoch", missing_ok=True)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    tier = memory_tier(run_dir)
    assert any(tier.glob("entries-*.mem")), sorted(tier.iterdir())
    return proc, tier


def restarted_workers(launcher: int) -> list[int]:
    """The live workers of the launcher `launcher`: the processes of its tree whose parent is one of the tree's
    but not the launcher itself."""
    tree, parents = process_tree(launcher), _parents()
    return sorted(
        pid for pid in tree if alive(pid) and parents.get(pid) not in (launcher, None) and parents[pid] in tree
    )


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: only its exit status is left to read)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def assert_nothing_left(proc: subprocess.Popen, tree: set[int], held: set[int], tier: Path) -> None:
    """Within GONE_WITHIN_S of the kill: no process of `tree` but the launcher's zombie, no semaphore of `held`
    (inodes) and no memory tier `tier`."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while True:
        proc.poll()  # reaps the launcher once it has ended
        left = {pid for pid in tree if alive(pid)}
        sems = {path for inode, path in semaphores().items() if inode in held}
        if not left and not sems and not tier.exists() or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left if Path(f"/proc/{pid}").exists()}
    for pid in left:  # leave nothing behind for the next test, whatever failed
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"still running {GONE_WITHIN_S} s after the kill: {commands}"
    assert not sems, f"semaphores left: {sems}"
    assert not tier.exists(), f"memory tier left: {sorted(tier.iterdir())}"


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.parametrize(
    ("args", "to_group"),
    [(CACHED, False), (LORA_PIPELINE, True)],
    ids=["default_setting-launcher", "lora_pipeline-process_group"],
)
def test_a_killed_launcher_leaves_no_process_and_nothing_in_shared_memory(tmp_path, args, to_group):
    """The launcher (the elastic agent's process) alone, as the OOM killer or `kill -9 PID` do; or its whole
    process group, as a scheduler does when SIGTERM's grace has run out."""
    proc, tier = start_caching(args, tmp_path)
    tree = process_tree(proc.pid)
    held = mapped_shm_inodes(tree)
    assert len(tree) >= 5 and held  # the launcher, its janitor, the server, the tracker, the workers
    os.killpg(proc.pid, signal.SIGKILL) if to_group else os.kill(proc.pid, signal.SIGKILL)
    assert_nothing_left(proc, tree, held, tier)
    _, err = proc.communicate()
    assert "Traceback" not in err and "resource_tracker" not in err, err  # nothing of ours on the terminal after


@pytest.mark.slow
@pytest.mark.dist
def test_failed_and_killed_workers_are_one_line_each_and_leave_nothing(tmp_path, monkeypatch):
    """A worker whose read fails (EIO, an OSError that is no bug of ptrun's) in the cached epoch: one line says
    so and that the workers restart, its traceback goes to train.log. Then one worker SIGKILLed from outside,
    with no restart left: one line names it, and the rest of the run ends as after a killed launcher."""
    monkeypatch.setenv("PTRUN_KILL_AT", json.dumps([{"rank": 1, "point": "step", "step": 15, "errno": 5}]))
    # epochs enough that the restarted workers still train when they are looked for, however busy the machine
    proc, tier = start_caching([*CACHED, "launcher.max_restarts=1", "train.epochs=1000"], tmp_path)
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 120
    while len(run_events(run_dir, "start", missing_ok=True)) < 2:  # restarted after the failure
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    # The restarted workers: the processes whose parent is one of the run's but not the launcher (the server's
    # children), once the failed attempt's have ended (its zombies are not waited for here).
    while len(workers := restarted_workers(proc.pid)) != 2:
        assert proc.poll() is None and time.monotonic() < deadline, (workers, proc.communicate())
        time.sleep(0.1)
    tree = process_tree(proc.pid)
    held = mapped_shm_inodes(tree)
    os.kill(workers[1], signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    said = [line for line in err.splitlines() if line.startswith("ptrun: ")]
    log = run_dir / "train.log"
    assert said[0] == (
        f"ptrun: worker rank 1 failed (exit code 1): OSError: [Errno 5] Input/output error (traceback in {log}); "
        f"the workers restart (1 restart(s) left)"
    ), err
    assert len(said) == 2 and re.fullmatch(
        rf"ptrun: error: worker rank [01] \(pid {workers[1]}\) was killed by SIGKILL, from outside ptrun", said[1]
    ), err
    assert "Traceback" not in err
    text = log.read_text()
    assert "Traceback" in text and "OSError: [Errno 5] Input/output error" in text and "SIGKILL" in text
    assert_nothing_left(proc, tree, held, tier)


def test_the_sweep_removes_a_dead_owners_memory_tier_and_leaves_a_live_ones(tmp_path, capsys):
    """Two tiers in a /dev/shm: one whose launcher ended (a real process, gone), one whose launcher runs (this
    process); and one of another pid namespace, which cannot be judged. Only the first goes, in one line."""
    root = tmp_path / "shm"
    dead = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    owner = {**leftovers.this_process(), "pid": dead.pid, "start": leftovers.start_time(dead.pid)}
    dead.kill()
    dead.wait()
    gone, live, foreign = root / "ptrun-cache-gone", root / "ptrun-cache-live", root / "ptrun-cache-foreign"
    for tier in (gone, live, foreign):
        leftovers.claim(tier)
        (tier / "entries-0.mem").write_bytes(b"\1" * 3 * 2**20)
    (gone / leftovers.OWNER_FILE).write_text(json.dumps(owner))
    (foreign / leftovers.OWNER_FILE).write_text(json.dumps({**owner, "pidns": "pid:[1]"}))
    removed, freed = leftovers.sweep(root)
    assert (removed, not gone.exists(), live.is_dir(), foreign.is_dir()) == (1, True, True, True)
    assert 3 * 2**20 <= freed < 4 * 2**20
    line = leftovers.sweep_line(removed, freed, root)
    assert line == f"ptrun: removed 1 AutoCache memory tier that killed runs left in {root} (3.0 MiB freed)"
    assert leftovers.sweep(root) == (0, 0) and leftovers.sweep_line(0, 0, root) is None


def test_a_launch_sweeps_what_killed_runs_left_and_claims_its_own_memory_tier(tmp_path, capsys, monkeypatch):
    """What a launch does before its workers start and after they end, around them (no worker here): the sweep
    of the node's shared memory in one line on stderr (a tier whose launcher ended goes, a live one's stays), its
    own memory tier claimed for it while it runs, and removed after it. The shared memory is a directory of the
    test's own: in /dev/shm, another test's launch running meanwhile would sweep the ended launcher's tier first."""
    from conftest import compose_config

    from ptrun.auto import autocache
    from ptrun.launcher.launch import _janitor, _no_cache_left

    root = tmp_path / "shm"
    root.mkdir()
    monkeypatch.setattr(autocache, "shared_memory_root", lambda: root)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    owner = {**leftovers.this_process(), "pid": ended.pid, "start": leftovers.start_time(ended.pid)}
    ended.wait()
    left = root / f"ptrun-cache-killed-{os.getpid()}"
    live = root / f"ptrun-cache-live-{os.getpid()}"
    for tier in (left, live):
        leftovers.claim(tier)
        (tier / "entries-0.mem").write_bytes(b"\1" * 2**20)
    (left / leftovers.OWNER_FILE).write_text(json.dumps(owner))
    cfg = compose_config(["auto.cache=true"], tmp_path / "run")
    own = memory_tier(tmp_path / "run")
    try:
        with _janitor() as janitor, _no_cache_left(cfg, janitor):
            said = capsys.readouterr().err.splitlines()
            assert not left.exists() and live.is_dir()
            assert json.loads((own / leftovers.OWNER_FILE).read_text())["pid"] == os.getpid()
        assert not own.exists()
        assert len(said) == 1 and said[0].startswith("ptrun: removed ") and f"left in {root} (" in said[0], said
    finally:
        for tier in (left, live):
            shutil.rmtree(tier, ignore_errors=True)
