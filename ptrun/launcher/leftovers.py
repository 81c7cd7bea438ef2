"""What a run leaves in /dev/shm when everything of it was killed at once (its launcher and the janitor that
would have cleaned up, `ptrun.launcher.lifeline.Janitor`): AutoCache's memory tier. The launcher records itself as the
owner of the run's memory tier (`claim`); the next `ptrun train` on the machine removes every tier whose owner
has ended (`sweep`) and says so in one line. A tier whose owner lives (another run, another user's) or cannot
be told (another pid namespace, no record: `cache.keep`) is never touched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

OWNER_FILE = "owner.json"
"""In a memory tier's directory: the launcher that owns it (pid, start time, boot, pid namespace)."""
TIER_GLOB = "ptrun-cache-*"


def _boot_id() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return ""


def _pid_namespace() -> str:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid")
    return ""


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot, /proc's field 22); None where it does not exist (or
    /proc does not say)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def this_process() -> dict:
    """This process as an owner record."""
    return {"pid": os.getpid(), "start": start_time(os.getpid()), "boot": _boot_id(), "pidns": _pid_namespace()}


def claim(tier: Path) -> None:
    """Record this process (the launcher) as the owner of the memory tier `tier`, creating it."""
    tier.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = tier / f".{OWNER_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(this_process()))
    os.replace(tmp, tier / OWNER_FILE)


def owner_gone(owner: dict) -> bool:
    """Whether the process `owner` records has surely ended: the machine rebooted since, or no process of its
    pid and start time exists in this pid namespace. False where this cannot be told."""
    if owner.get("boot") != _boot_id():
        return bool(owner.get("boot")) and bool(_boot_id())
    if owner.get("pidns") != _pid_namespace() or not isinstance(owner.get("pid"), int):
        return False  # another container's processes are not ours to see
    if owner.get("start") is None or start_time(os.getpid()) is None:
        return False  # a system without /proc: no process can be told gone
    return start_time(owner["pid"]) != owner["start"]


def _size(tier: Path) -> int:
    """The bytes `tier`'s files hold (allocated blocks: a tmpfs file's memory)."""
    total = 0
    for path in tier.rglob("*"):
        with contextlib.suppress(OSError):
            total += path.lstat().st_blocks * 512
    return total


def sweep(root: Path) -> tuple[int, int]:
    """Remove the memory tiers under `root` (/dev/shm) that belong to this user and whose owner has ended;
    returns how many and their bytes."""
    removed = freed = 0
    for tier in root.glob(TIER_GLOB):
        try:
            if tier.is_symlink() or not tier.is_dir() or tier.stat().st_uid != os.getuid():
                continue
            owner = json.loads((tier / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # no record (a kept cache, an older ptrun's), or not readable: not ours to judge
        if not isinstance(owner, dict) or not owner_gone(owner):
            continue
        size = _size(tier)
        shutil.rmtree(tier, ignore_errors=True)
        if not tier.exists():
            removed, freed = removed + 1, freed + size
    return removed, freed


def sweep_line(removed: int, freed: int, root: Path) -> str | None:
    """The one line a sweep prints; None when it removed nothing."""
    if not removed:
        return None
    tiers = "AutoCache memory tier" if removed == 1 else "AutoCache memory tiers"
    return f"ptrun: removed {removed} {tiers} that killed runs left in {root} ({freed / 2**20:.1f} MiB freed)"
