"""Whether the kernel killed a worker for want of memory, for the agent, which then restarts nothing (the same
layout would run out of memory the same way) and the launcher's one line, with the worker's peak resident
memory. A worker killed otherwise (a lost machine, a scheduler, a user) is restarted as before.

The evidence, both read from the launch's start on and each where this user may read it:
- the cgroup's memory events (`oom_kill`, counting kills in the cgroup the launcher runs in: cgroup v2's
  memory.events, v1's memory.oom_control); `PTRUN_OOM_EVENTS` names another file in that format;
- the kernel's log (/dev/kmsg, root's), a line naming the worker's pid (`Killed process PID` or
  `oom-kill:...,pid=PID,`); `PTRUN_KERNEL_LOG` names another file of such lines.
The peak resident memory is each worker's VmHWM, sampled while the agent monitors the workers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

OOM_EVENTS_ENV = "PTRUN_OOM_EVENTS"
KERNEL_LOG_ENV = "PTRUN_KERNEL_LOG"
KERNEL_LOG = "/dev/kmsg"


def own_memory_events() -> Path | None:
    """The memory events file of the cgroup this process runs in (v2's memory.events, else v1's
    memory.oom_control); None where there is none to read."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        if candidate.is_file():
            return candidate
    return None


def oom_kills(path: Path | None) -> int | None:
    """The `oom_kill` count of a memory events file; None where it cannot be read."""
    try:
        text = path.read_text() if path is not None else ""
    except OSError:
        return None
    found = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def peak_resident(pid: int) -> int:
    """A process's peak resident memory in bytes (VmHWM), 0 where /proc does not say (it ended)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class OomWatch:
    """From its start on: what the machine says of out-of-memory kills, and the workers' peak resident
    memory (`sample`, at each look of the agent)."""

    def __init__(self):
        named = os.environ.get(OOM_EVENTS_ENV)
        self.events = Path(named) if named else own_memory_events()
        self.kills_before = oom_kills(self.events)
        self._log = _open_at_end(os.environ.get(KERNEL_LOG_ENV) or KERNEL_LOG)
        self.peak: dict[int, int] = {}
        self._log_text = ""

    def sample(self, pids) -> None:
        """Take the workers' (`pids`) peak resident memory so far."""
        for pid in pids:
            self.peak[pid] = max(self.peak.get(pid, 0), peak_resident(pid))

    def killed(self, pid: int) -> str | None:
        """Where the machine says worker `pid`, just killed by SIGKILL, was killed for want of memory (the
        kernel's log, or the cgroup's memory events); None where it says nothing of it."""
        self._log_text += self._read_log()
        if re.search(rf"(Killed process {pid}\b|[,:]pid={pid},)", self._log_text):
            return "the kernel's log"
        kills = oom_kills(self.events)
        if kills is not None and self.kills_before is not None and kills > self.kills_before:
            return f"{self.events}"
        return None

    def seen(self) -> bool:
        """Whether the machine says it killed one of the workers sampled so far for want of memory."""
        return any(self.killed(pid) for pid in self.peak)

    def _read_log(self) -> str:
        """What the kernel's log gained since the last read (a record per read on /dev/kmsg)."""
        if self._log is None:
            return ""
        chunks = []
        while True:
            try:
                chunk = os.read(self._log, 8192)
            except BlockingIOError:
                break
            except OSError as e:  # EPIPE: records overwritten before they were read; the next read goes on
                if e.errno == errno.EPIPE:
                    continue
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def close(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                os.close(self._log)
            self._log = None


def _open_at_end(path: str) -> int | None:
    """A descriptor of the log `path` positioned at its end (what is logged from now on); None where this user
    may not read it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        os.lseek(fd, 0, os.SEEK_END)
    except OSError:
        os.close(fd)
        return None
    return fd
