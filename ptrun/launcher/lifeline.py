"""Nothing of a run outlives its launcher, however the launcher ends (SIGKILL included): each process ptrun starts
for a run watches the process it depends on and ends with it.

- The workers' forkserver gets SIGKILL from the kernel when the launcher ends (Linux's parent-death signal,
  set as this module is imported there: it is the first module the server preloads, `SERVER_PARENT_ENV`
  naming the launcher). On other systems the server ends as multiprocessing's does, when the launcher's end
  of its pipe closes.
- Each worker watches the pipe multiprocessing gives a child to its parent, the launcher (its forkserver's
  client; readable once the launcher is gone, on every system), in a thread that then kills the worker
  (`end_with_launcher`). On Linux the worker also gets the parent-death signal from its own parent (the
  forkserver, which dies with the launcher): the kernel's, which holds even when the worker's interpreter
  cannot run the thread.
- multiprocessing's resource tracker ends when the last process holding its pipe (the launcher, the server,
  the workers) has ended, and unlinks the named semaphores they left then (without a warning on the
  terminal: `quiet_tracker`).
- What the run holds in /dev/shm (AutoCache's memory tier, the named semaphores of the workers' queues) is
  removed by `Janitor` when the launcher is killed; what even that leaves (the janitor killed too) by the
  next launch's sweep (`ptrun.launcher.leftovers`).

A parent-death signal is sent when the *thread* that started the process ends, not the process: the server's
is set only when the launcher's main thread starts it (the interpreter's end there is the process's).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import types
from multiprocessing import resource_tracker
from multiprocessing.connection import wait
from pathlib import Path

try:  # a platform without named semaphores has neither
    from _multiprocessing import sem_unlink
    from multiprocessing.synchronize import SemLock
except ImportError:
    sem_unlink = SemLock = None

PR_SET_PDEATHSIG = 1
"""prctl's option: the signal a process gets when its parent dies (linux/prctl.h)."""
SERVER_PARENT_ENV = "PTRUN_SERVER_PARENT"
"""The launcher's pid, in the environment the workers' forkserver starts with (only when its main thread
starts it): the server dies with that process."""


def die_with_parent(parent: int) -> bool:
    """Linux: this process gets SIGKILL when its parent `parent` ends; ended at once if that has happened
    already (then its parent is another process). Elsewhere nothing (returns False)."""
    if sys.platform != "linux":
        return False
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # a libc without prctl
        return False
    if prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # it ended before the signal was set: nobody would send it
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def server_dies_with_launcher() -> None:
    """In the workers' forkserver, as it preloads this module: die with the launcher that started it."""
    parent = os.environ.get(SERVER_PARENT_ENV)
    if parent and parent.isdigit() and "multiprocessing.forkserver" in sys.modules:
        die_with_parent(int(parent))


@contextlib.contextmanager
def server_parent():
    """While the block starts the workers' forkserver: the environment names this process as the parent it
    dies with, where this is the main thread (a parent-death signal follows the thread that started it)."""
    named = threading.current_thread() is threading.main_thread() and SERVER_PARENT_ENV not in os.environ
    if named:
        os.environ[SERVER_PARENT_ENV] = str(os.getpid())
    try:
        yield
    finally:
        if named:
            del os.environ[SERVER_PARENT_ENV]


TRACKER_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"
"""The warnings filter of the resource tracker ptrun starts: after a killed launcher it unlinks the semaphores of
the workers' queues as it should, and would say `There appear to be N leaked semaphore objects to clean up at
shutdown` on the terminal (what it cleans up after a kill is no leak)."""


@contextlib.contextmanager
def quiet_tracker():
    """While the block starts multiprocessing's resource tracker (with the workers' forkserver): it starts with
    `TRACKER_WARNING` (the environment's PYTHONWARNINGS, which it reads as it starts)."""
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [before, TRACKER_WARNING]))
    try:
        yield
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def end_with_launcher() -> None:
    """In a worker: end (SIGKILL) when the launcher ends, by a thread that waits on the pipe to it; on Linux the
    kernel's parent-death signal from the worker's own parent too. Nothing in a process multiprocessing did not
    start."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:
        return
    if os.getppid() != parent.pid:  # forked by the forkserver (single-threaded), which dies with the launcher
        die_with_parent(os.getppid())
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="ptrun-end-with-launcher", daemon=True).start()


class Janitor:
    """A small process in a session of its own (a SIGKILL to the launcher's process group leaves it) that
    removes what it was given once the launcher ends without saying it is done, however it ends: it waits for
    the end of a pipe only the launcher holds. What it is given is what a killed launcher cannot remove
    itself: AutoCache's memory tier in /dev/shm, and the named semaphores of the workers' queues, which
    multiprocessing's resource tracker would unlink unless it is killed with the launcher (it is in the
    launcher's process group). A launch that ends normally removes them itself (`close`)."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        # It imports this module from where the launcher did, never from the directory it runs in (another
        # checkout there, a folder named like a library): the launcher's path, in the file system's root.
        path = os.pathsep.join(p for p in sys.path if p)
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "ptrun.launcher.lifeline"],
                cwd=os.path.abspath(os.sep),
                env={**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                text=True,
            )

    def _say(self, line: str) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError, ValueError):
                self._proc.stdin.write(f"{line}\n")
                self._proc.stdin.flush()

    def remove_when_gone(self, path: Path) -> None:
        """`path` (a directory or a file) is removed if the launcher is killed."""
        self._say(f"path {path}")

    def unlink_when_gone(self, semaphores) -> None:
        """The named semaphores `semaphores` (their names) are unlinked if the launcher is killed, once this
        process's resource tracker has ended: it unlinks them itself unless it was killed too (and warns of
        each one that is gone already)."""
        tracker = getattr(resource_tracker._resource_tracker, "_pid", None)  # None: none started
        if tracker is not None:
            self._say(f"tracker {tracker}")
        for name in semaphores:
            self._say(f"sem {name}")

    def close(self) -> None:
        """The launcher is done: it removed what it registered itself, and the janitor ends."""
        if self._proc is not None:
            self._say("done")
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=10)
            self._proc = None


def named_semaphores(root, depth: int = 10, limit: int = 20000) -> set[str]:
    """The names of the named semaphores (multiprocessing's locks, events, queues) that `root` holds, looked for
    in the objects it refers to, up to `depth` references away (at most `limit` objects: a queue or an event of
    an object's attributes is a few away; classes, modules and functions are not followed)."""
    if SemLock is None:
        return set()
    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes)
    seen: set[int] = set()
    names: set[str] = set()
    frontier = [root]
    for _ in range(depth):
        found = []
        for obj in frontier:
            if id(obj) in seen or isinstance(obj, skip) or len(seen) >= limit:
                continue
            seen.add(id(obj))
            if isinstance(obj, SemLock):
                name = getattr(obj._semlock, "name", None)  # None: a lock of the fork start method, unlinked
                if name:
                    names.add(name)
                continue
            found.extend(gc.get_referents(obj))
        frontier = found
    return names


TRACKER_WAIT_S = 5
"""How long the janitor waits for the launcher's resource tracker to end (once the launcher's clients, the
server and the workers, have ended) before it unlinks the semaphores itself."""


def _runs(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, ended but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)  # a system without /proc
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True


def _janitor_main() -> None:
    """The janitor's process: read what to remove until the launcher's end of the pipe closes; remove it unless
    the launcher said it is done."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C goes to the launcher, which stops the run
    paths, semaphores, trackers, done = [], [], set(), False
    for line in sys.stdin:
        kind, _, value = line.rstrip("\n").partition(" ")
        if kind == "path" and value:
            paths.append(Path(value))
        elif kind == "sem" and value:
            semaphores.append(value)
        elif kind == "tracker" and value.isdigit():
            trackers.add(int(value))
        done = kind == "done"
    if done:
        return
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
    if sem_unlink is None:
        return
    deadline = time.monotonic() + TRACKER_WAIT_S
    while any(_runs(pid) for pid in trackers) and time.monotonic() < deadline:
        time.sleep(0.1)
    for name in semaphores:
        with contextlib.suppress(OSError):
            sem_unlink(name)


if __name__ == "__main__":
    _janitor_main()
else:
    server_dies_with_launcher()
