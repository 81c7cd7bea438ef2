"""Machines leaving and joining, on loopback: two `ptrun train` agents on this machine act as two nodes of one
elastic job (`launcher.nnodes=1:2`, 2 workers each, one c10d rendezvous). Node A forms the job alone and trains;
node B joins late: the job re-forms from 2 to 4 workers at A's next restart boundary, from A's newest checkpoint,
with a re-planned layout (DP 1 -> 2). Then node B is lost (its agent and workers SIGKILLed): the job re-forms on
the remaining node (DP 2 -> 1) and goes on from the newest checkpoint. The node comes back (`train.resume=true`):
the job scales up again at the next restart boundary (DP 1 -> 2) and finishes with the accuracy and, up to float
drift, the parameters of an uninterrupted 4-worker run (the global batch, data order and loss do not depend on
the layout). Node A stops its workers at each re-form with SIGTERM (SIGKILL only after a grace), so they leave
nothing behind: no named semaphore in /dev/shm, no pickled exception in the temp directory.

Joining is an event, not a time: node A forms the job alone when its last call (`launcher.rdzv_last_call`) runs
out before node B's agent is up, which a loaded machine makes likely. So B starts only after A has formed alone
and checkpointed, and A's workers wait for B (`join_while_paused`), so that the late join (2 -> 4 workers) is
exercised rather than left to chance, and A cannot finish alone while B starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import (
    TINY,
    final_params,
    free_port,
    mapped_shm_inodes,
    run_events,
    run_workers,
    semaphores,
    start_ptrun,
    worker_pids,
)

from ptrun.train.checkpoint import lookup, store

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # two nodes joining, lost and back, and one uninterrupted run

# Long enough that each phase outlasts the test's look at it (the job trains on through a few of the test's
# 0.2 s polls: 60 steps and more are left after each checkpoint it waits for), short enough that the job's
# re-formations, not its training, are most of its time.
EPOCHS, STEPS = 6, 20
JOB = TINY + [
    f"train.epochs={EPOCHS}",
    f"train.max_steps_per_epoch={STEPS}",
    "pipe.length=2",
    "pipe.microbatches=2",
    "launcher.nproc_per_node=2",
    "launcher.max_restarts=3",
]


@pytest.fixture
def node_tmp():
    """`node_tmp(name)`: a new temp directory of the node `name`, removed after the test. A node SIGKILLed as a
    whole cleans up nothing: its launcher's private files go to a temp dir of its own. Short paths, outside the
    test's tmp_path: the node's workers start from ptrun's forkserver, whose Unix socket lives in that temp dir
    and whose path may be ~107 bytes at most (longer, the workers are spawned instead, each importing torch)."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        made[name] = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        return made[name]

    yield make
    for folder in made.values():
        shutil.rmtree(folder, ignore_errors=True)


def start_agent(run_dir: Path, port: int, log: Path, tmp: Path, *extra: str) -> subprocess.Popen:
    """One node: a `ptrun train` agent in its own session, so the node can be killed as a whole, with the temp
    directory `tmp`."""
    return start_ptrun(
        "train",
        *JOB,
        "launcher.nnodes=1:2",
        "launcher.rdzv_last_call=3",
        f"launcher.rdzv_endpoint=localhost:{port}",
        "launcher.rdzv_id=loopback",
        f"hydra.run.dir={run_dir}",
        *extra,
        cwd=log.parent,
        env={"TMPDIR": str(tmp)},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def starts(run_dir: Path) -> list[dict]:
    return run_events(run_dir, "start", missing_ok=True)


def error_files(folder: Path) -> set[Path]:
    """The exceptions torch.multiprocessing pickled for workers that raised (in the launcher's temp directory)."""
    return set(folder.glob("pytorch-errorfile-*"))


def wait_for(condition, what: str, timeout: float = 180.0) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def group_pids(pgid: int) -> list[int]:
    """The processes of process group `pgid` (a node: its agent, forkserver, workers, resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def lose_node(agent: subprocess.Popen) -> set[Path]:
    """Lose a node as a machine is lost: every process of it SIGKILLed at once. Returns the named semaphores
    it held, which nothing can release now (a lost machine takes them along; here they stay in /dev/shm).
    The node is frozen first, so that it creates none after they are listed."""
    os.killpg(agent.pid, signal.SIGSTOP)
    held = mapped_shm_inodes(group_pids(agent.pid))
    os.killpg(agent.pid, signal.SIGKILL)
    agent.wait()
    return {path for inode, path in semaphores().items() if inode in held}


def signal_pending(pid: int, signum: int) -> bool:
    """Whether `signum` waits for delivery to the (stopped) process `pid`; True once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    pending = {
        line.split(":")[0]: int(line.split()[1], 16)
        for line in status.splitlines()
        if line.startswith(("SigPnd:", "ShdPnd:"))
    }
    return bool((pending["SigPnd"] | pending["ShdPnd"]) >> (signum - 1) & 1)


def world_sizes(run_dir: Path) -> list[int]:
    return [s["world_size"] for s in starts(run_dir)]


def step_of(checkpoint: str | None) -> int:
    """The global step of a checkpoint directory's name (`step_00000040` -> 40); -1 for none."""
    return -1 if checkpoint is None else int(Path(checkpoint).name.removeprefix("step_"))


def formed_and_checkpointed(run_dir: Path, world_size: int) -> bool:
    """Whether the job's newest formation has `world_size` workers and has written a checkpoint of its own (a step
    past the one it resumed from): it trains, and a node lost now loses no more than the steps since."""
    history = starts(run_dir)
    if not history or history[-1]["world_size"] != world_size:
        return False
    since = step_of(history[-1]["resumed_from"])
    return any(step_of(p.name) > since for p in (run_dir / "checkpoints").glob("step_*"))


def join_while_paused(node_a: subprocess.Popen, start_node_b) -> subprocess.Popen:
    """Start node B (`start_node_b()`) while node A trains, and return it. Node A's workers wait (stopped) until A's
    agent has seen B and asked them to stop, or A could finish alone while B starts: A's agent stays up (it holds
    the rendezvous store) and restarts them when B joins. It stops them with SIGTERM first: they go on once it is
    sent, to stop at a step they agree on."""
    paused = worker_pids(node_a.pid)
    for pid in paused:
        os.kill(pid, signal.SIGSTOP)
    try:
        node_b = start_node_b()
        wait_for(lambda: all(signal_pending(pid, signal.SIGTERM) for pid in paused), "node A stopping its workers")
    finally:
        for pid in paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    return node_b


def stop_nodes(*agents: subprocess.Popen | None) -> None:
    for agent in agents:
        if agent is not None:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()


def assert_stopped_cleanly(tmp_path: Path, *node_tmps: Path) -> None:
    """Node A stopped its workers at each re-form with SIGTERM, and they exited: nothing was left to its resource
    tracker (which warns about what it cleans up), and the exceptions its failed workers pickled (in each node's
    temp directory `node_tmps`; the session checks its own) are gone."""
    # elastic's own records go to the run's train.log (both nodes'), not to the terminal
    log = (tmp_path / "node_a.log").read_text() + (tmp_path / "job" / "train.log").read_text()
    assert "leaked semaphore" not in log and "forcefully exiting via SIGKILL" not in log, log[-3000:]
    assert "Closing process" in log  # it did stop workers
    for folder in node_tmps:
        assert error_files(folder) == set() and list(folder.iterdir()) == [], sorted(folder.iterdir())


def assert_matches_uninterrupted(run_dir: Path, clean: Path) -> None:
    """No step lost or repeated, and the result of an uninterrupted 4-worker run."""
    # Every epoch (its latest record: the attempt that got through) trained its STEPS steps' samples, none
    # twice, and the run ends at its last step.
    epochs = {e["epoch"]: e for e in run_events(run_dir, "epoch")}
    assert sorted(epochs) == list(range(EPOCHS))
    assert all(e["samples"] == STEPS * 16 and e["sample_uses_max"] == 1 for e in epochs.values()), epochs
    assert store.load(lookup.latest_valid(run_dir))[2]["global_step"] == EPOCHS * STEPS
    # The same weights up to float drift: DP = 1 and DP = 2 sum each global batch's gradient in another order,
    # and the steps amplify those 1e-7 differences, the more the longer the job ran at DP = 1, which depends on
    # when the other node joins (measured: 6e-5 over the 120 steps; 1.3e-3 to 6.6e-3 over 400). Losing the last
    # epoch's steps moves weights by 8.6e-4 (its learning rate is the schedule's smallest), two epochs' by 6.6e-3.
    got, want = final_params(run_dir), final_params(clean)
    assert got.keys() == want.keys()
    drift = max((got[n] - want[n]).abs().max().item() for n in want)
    assert drift < 5e-4, drift
    final = {r: run_events(r)[-1]["final_eval"] for r in (run_dir, clean)}
    assert abs(final[run_dir]["top1"] - final[clean]["top1"]) <= 1.5, final
    assert final[run_dir]["loss"] == pytest.approx(final[clean]["loss"], rel=0.01), final


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The same job on one node of 4 workers, never interrupted: what both tests must end at."""
    clean = tmp_path_factory.mktemp("uninterrupted")
    run_workers(JOB[:-2] + ["launcher.nproc_per_node=4", "launcher.max_restarts=0"], clean)
    return clean


def test_a_node_that_joins_late_is_lost_and_comes_back(tmp_path, semaphore_watch, uninterrupted, node_tmp):
    """Node B starts only after node A's last call ran out and A trains alone: the job re-forms from 2 to 4
    workers at A's next restart boundary, from A's newest checkpoint. B is lost: the job re-forms on A alone,
    from the newest checkpoint. B comes back: 4 workers again, and the job ends as the uninterrupted run does."""
    run_dir, port, lost = tmp_path / "job", free_port(), set()
    semaphores_before = set(semaphores().values())
    tmp_a, tmp_b2 = node_tmp("node_a"), node_tmp("node_b2")
    first, second = start_agent(run_dir, port, tmp_path / "node_a.log", tmp_a), None
    node_a = first.pid
    try:
        wait_for(lambda: formed_and_checkpointed(run_dir, 2), "node A training alone and a checkpoint of its own")
        # The run directory holds A's checkpoints by now: B is started as the refusal to start over tells a user
        # to start a late machine of a job whose machines share the run directory.
        second = join_while_paused(
            first,
            lambda: start_agent(run_dir, port, tmp_path / "node_b.log", node_tmp("node_b"), "train.resume=true"),
        )
        wait_for(lambda: formed_and_checkpointed(run_dir, 4), "both nodes training and a checkpoint of theirs")
        lost = lose_node(second)  # node B is lost: its agent and its workers
        wait_for(lambda: world_sizes(run_dir) == [2, 4, 2], "the job re-formed on node A")
        second = join_while_paused(
            first, lambda: start_agent(run_dir, port, tmp_path / "node_b2.log", tmp_b2, "train.resume=true")
        )  # B is back
        node_b2 = second.pid
        assert first.wait(timeout=300) == 0, (tmp_path / "node_a.log").read_text()[-3000:]
        assert second.wait(timeout=60) == 0, (tmp_path / "node_b2.log").read_text()[-3000:]
    finally:
        stop_nodes(first, second)
        # Node B's semaphores went with it (a machine that is really lost takes them along); two nodes on one
        # machine must not leave them behind.
        for path in lost:
            path.unlink(missing_ok=True)

    assert_stopped_cleanly(tmp_path, tmp_a, tmp_b2)
    assert not semaphore_watch.leaked(semaphores_before | lost, branches={node_a, node_b2})  # B's were lost

    history = starts(run_dir)
    assert world_sizes(run_dir) == [2, 4, 2, 4], history
    assert history[0]["resumed_from"] is None, history
    assert all(step_of(s["resumed_from"]) > 0 for s in history[1:]), history
    widths = {(p["pp"], p["dp"]) for p in run_events(run_dir, "plan")}
    assert widths == {(2, 1), (2, 2)}  # re-planned for the world it had: fewer replicas, the same pipeline
    assert_matches_uninterrupted(run_dir, uninterrupted)
