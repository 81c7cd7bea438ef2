"""Ctrl-C and SIGTERM stop the test suite itself at once, as a contributor presses Ctrl-C in a terminal: a pytest
of its own (its own process group and TMPDIR) runs a real in-process launch (a `run_workers` test, one launch at
the smallest size) and then a test that sleeps; the signal goes to the whole group while the launch's workers train,
or once the launch has passed (elastic's agent, in pytest's process, took over the handlers meanwhile). pytest
must end within 10 s (interrupted by Ctrl-C; ended by SIGTERM's default), and nothing it started may be left:
no process (by the pids recorded before the signal, not by name), no /dev/shm entry its processes made."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import LITTER, REPO, cli_env, process_tree, run_events

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # one short launch per case, in a pytest of its own

LAUNCH_TEST = "tests/test_train_dist.py::test_padded_last_batch_matches_reference"  # one launch, 4 steps of TINY
STOP_WITHIN_S = 10

SLEEPER = """
import os
import time
from pathlib import Path


def test_sleeps_long():
    Path(os.environ["SLEEPER_STARTED"]).touch()
    time.sleep(600)
"""


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command's name (state first), None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started_tree(root: int) -> dict[int, str]:
    """`root` and every process descended from it, each with its start time (which tells it from a later process
    that got the same pid)."""
    stats = {pid: _stat(pid) for pid in process_tree(root)}
    return {pid: s[19] for pid, s in stats.items() if s is not None}


def training(tmpdir: Path) -> bool:
    """Whether the launch's workers train: rank 0 has written the start event of the run (in the test's
    tmp_path, under the pytest's TMPDIR)."""
    runs = {path.parent for path in tmpdir.glob("pytest-of-*/pytest-*/**/metrics.jsonl")}  # xdist: popen-gwN/
    return any(run_events(run, "start", missing_ok=True) for run in runs)


def still_running(processes: dict[int, str]) -> dict[int, str]:
    """Those of `processes` that run yet: the same process (same start time), not a zombie waiting to be reaped."""
    left = {}
    for pid, started in processes.items():
        s = _stat(pid)
        if s is not None and s[19] == started and s[0] != "Z":
            left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
    return left


def group_members(pgid: int) -> set[int]:
    """The live (not zombie) processes of process group `pgid`."""
    members = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            s = _stat(int(entry.name))
            if s is not None and s[0] != "Z" and int(s[2]) == pgid:
                members.add(int(entry.name))
    return members


def mapped_shm_entries(pids) -> dict[Path, int]:
    """The /dev/shm entries (top-level: a semaphore's file, a cache tier's directory) that the processes `pids`
    have files of mapped, with their inodes."""
    out = {}
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith("/dev/shm/") and not fields[5].endswith("(deleted)"):
                    entry = Path("/dev/shm", Path(fields[5]).relative_to("/dev/shm").parts[0])
                    with contextlib.suppress(OSError):
                        out[entry] = entry.stat().st_ino
    return out


class ShmWatch:
    """The /dev/shm entries that the processes of a tree have files of mapped (named semaphores, the cache's
    memory tier), looked at every 0.1 s in a thread until `stop()`. /dev/shm is the machine's: only these can be
    told from what other programs make meanwhile."""

    def __init__(self, root: int):
        self.entries: dict[Path, int] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(root,), daemon=True)
        self._thread.start()

    def _run(self, root: int) -> None:
        while not self._done.wait(0.1):
            self.entries.update(mapped_shm_entries(started_tree(root)))

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def left(self) -> set[Path]:
        """Those of the entries seen that are still there (the same inode)."""
        left = set()
        for path, inode in self.entries.items():
            with contextlib.suppress(OSError):
                if path.stat().st_ino == inode:
                    left.add(path)
        return left


def default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(condition, proc: subprocess.Popen, output: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"pytest ended early ({proc.returncode}):\n{output.read_text()}"
        assert time.monotonic() < deadline, f"waited {timeout} s:\n{output.read_text()}"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "signum, moment, workers",
    [
        # Ctrl-C in elastic's handler: the launch stops, and pytest's KeyboardInterrupt follows
        pytest.param(signal.SIGINT, "while_its_workers_run", [], id="ctrl_c_while_its_workers_run"),
        # in a later test: the handler the launch restored (SIGTERM's default) ends pytest
        pytest.param(signal.SIGTERM, "after_the_launch_passed", [], id="sigterm_after_the_launch_passed"),
        # the README's test command: pytest-xdist's workers, one launching while the other sleeps
        pytest.param(
            signal.SIGINT, "while_its_workers_run", ["-n", "2", "--dist", "loadfile"], id="ctrl_c_to_xdist_workers"
        ),
        pytest.param(
            signal.SIGTERM, "while_its_workers_run", ["-n", "2", "--dist", "loadfile"], id="sigterm_to_xdist_workers"
        ),
    ],
)  # the other two pairs of the first two check nothing these and `signal_handlers_kept` do not
def test_a_signal_to_the_test_session_stops_it_at_once(tmp_path, signum, moment, workers):
    tmpdir, output, started = tmp_path / "tmp", tmp_path / "pytest.out", tmp_path / "sleeper-started"
    tmpdir.mkdir()
    sleeper = tmp_path / "sleeper" / "test_sleeper.py"
    sleeper.parent.mkdir()
    sleeper.write_text(SLEEPER)
    command = [sys.executable, "-m", "pytest", "-v", "-rA", "-p", "no:cacheprovider", *workers, LAUNCH_TEST]
    with output.open("w") as out:
        proc = subprocess.Popen(
            [*command, str(sleeper)],
            cwd=REPO,
            env=cli_env(TMPDIR=str(tmpdir), SLEEPER_STARTED=str(started), PYTHONUNBUFFERED="1"),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's foreground job
            # with Ctrl-C as a terminal gives it, even where this suite was started in the background by a
            # non-interactive shell (which ignores SIGINT, and a child inherits that)
            preexec_fn=default_ctrl_c,
        )
    shm = ShmWatch(proc.pid)
    try:
        if moment == "while_its_workers_run":
            wait_for(lambda: training(tmpdir), proc, output)
        else:
            wait_for(started.exists, proc, output)
        processes = started_tree(proc.pid)
        os.killpg(proc.pid, signum)  # Ctrl-C: the terminal signals every process of the foreground job
        signalled = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_WITHIN_S)
        ended_s = time.monotonic() - signalled
        text = output.read_text()
        assert proc.returncode is not None, f"pytest still runs {STOP_WITHIN_S} s after {signum.name}:\n{text}"
        while (still_running(processes) or group_members(proc.pid)) and time.monotonic() < signalled + STOP_WITHIN_S:
            time.sleep(0.05)
    finally:
        shm.stop()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failure left (nothing, when the test passes)
        proc.wait()

    assert still_running(processes) == {}, f"left running {STOP_WITHIN_S} s after {signum.name}:\n{text}"
    assert group_members(proc.pid) == set(), text
    if signum == signal.SIGINT:
        assert proc.returncode == pytest.ExitCode.INTERRUPTED, text
        assert "KeyboardInterrupt" in text, text
    else:
        assert proc.returncode == -signal.SIGTERM, text  # pytest keeps SIGTERM's default: the process ends
    # The signal came when it was meant to; a launch that passed did so cleanly (at its teardown no error of
    # `signal_handlers_kept`, which would have put back the handlers it left and so hidden them from the signal).
    assert (f"{LAUNCH_TEST} PASSED" in text) == (moment == "after_the_launch_passed"), text
    assert f"{LAUNCH_TEST} ERROR" not in text, text
    made = shm.left() | {p for pattern in LITTER for p in tmpdir.glob(pattern)}
    assert not made, f"left behind: {sorted(map(str, made))}"
    print(f"{signum.name} {moment}: pytest ended in {ended_s:.1f} s; /dev/shm entries mapped: {len(shm.entries)}")
