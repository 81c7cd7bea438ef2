"""A running ptrun job's worker processes, read from /proc (Linux), for the benchmarks and tests that watch
them (resident memory, a kill at a chosen moment)."""

from __future__ import annotations

from pathlib import Path


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                out[int(entry.name)] = (ppid, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, IndexError, ValueError):  # the process ended while being read
                pass
    return out


def worker_pids(launcher: int) -> list[int]:
    """The launcher's workers: the children of its forkserver (or its spawned children, where workers spawn)."""
    procs = processes()
    servers = {pid for pid, (ppid, cmd) in procs.items() if ppid == launcher and "multiprocessing.forkserver" in cmd}
    return sorted(
        pid for pid, (ppid, cmd) in procs.items() if ppid in servers or (ppid == launcher and "spawn_main" in cmd)
    )
