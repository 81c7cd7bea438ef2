"""The entries of ptrun's caches that outlive a run (tokenized data, micro-batch timings, compile costs): how
one is written, checked and rebuilt, in one place.

- An entry `NAME` is written under a temporary name and renamed into place; then its checksum, `NAME.sum`
  (the entry's name, size and XXH3-128 hash), is written the same way, last. A reader never sees half a
  file, and an entry without a matching checksum is not used.
- `fault` verifies an entry against its checksum on every read: a run killed while writing it, a damaged
  disk, a truncated file or another entry's file copied over it all show as a reason to rebuild it. The
  hash is xxHash's XXH3 (the one `datasets` fingerprints with, so it is installed with it), which reads
  about 8 GB/s: a tokenized split of 100 MB costs about 25 ms of a run's start (61 MB, 100k rows of 128
  tokens: 17 ms, on 2 CPU cores), and the bytes it reads are the ones the run maps next.
- One process at a time writes an entry: `locked` holds its file lock (`NAME.lock`) while it is checked
  again and rebuilt, so two runs rebuilding it at once do not mix their files; the other finds it whole.
  The lock file is removed once the entry exists, so the directory lists entries and their checksums only.
- `ensure` is the whole pattern for an entry made in one go; `report` is the one line that says an entry
  was found unusable and is being rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

log = logging.getLogger(__name__)

SUM_SUFFIX = ".sum"
LOCK_SUFFIX = ".lock"
HASH = "xxh3_128"


def sum_path(path: Path) -> Path:
    return path.with_name(path.name + SUM_SUFFIX)


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + LOCK_SUFFIX)


def file_checksum(path: Path) -> dict:
    """The record `NAME.sum` holds for the file at `path`."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.file_digest(f, xxhash.xxh3_128).hexdigest()
    return {"name": path.name, "bytes": size, HASH: digest}


def fault(path: Path) -> str | None:
    """Why the entry at `path` cannot be used: None when it is whole (its bytes are those its checksum
    records, under its own name); "" when there is none (a plain miss, nothing to report); else the reason,
    for `report`."""
    try:
        record = json.loads(sum_path(path).read_text())
        name, size, digest = record["name"], int(record["bytes"]), str(record[HASH])
    except FileNotFoundError:
        if not path.exists():
            return ""
        return f"it has no checksum ({sum_path(path).name}: a run ended while writing it, or an older ptrun did)"
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"its checksum {sum_path(path).name} is unreadable"
    if name != path.name:
        return f"its checksum is another entry's ({name})"
    try:
        actual = file_checksum(path)
    except FileNotFoundError:
        return ""  # removed by hand: a miss
    except OSError as e:
        return f"it cannot be read ({e.strerror})"
    if actual["bytes"] != size:
        return f"it is {actual['bytes']} bytes where its checksum says {size} (truncated or replaced)"
    if actual[HASH] != digest:
        return "its bytes differ from its checksum (damaged, or another entry's file)"
    return None


def report(what: str, path: Path, why: str, then: str) -> None:
    """The one line a run says about an unusable entry it rebuilds: `WHAT PATH is unusable: WHY; THEN`."""
    log.warning("%s %s is unusable: %s; %s", what, path, why, then)


def _temp(path: Path) -> Path:
    """A temporary name beside `path`, of this host and process (so a stale one can be told from a live one)."""
    return path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")


def _sweep(path: Path) -> None:
    """Remove the temporary files of `path` and its checksum that a process of this host left when it died (a
    run killed while writing); a live process's are kept. The caller holds the entry's lock."""
    host = socket.gethostname()
    for stale in path.parent.glob(f".{path.name}*.tmp"):
        owner, _, pid = stale.name[: -len(".tmp")].rpartition(".")
        if not owner.endswith(f".{host}") or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            stale.unlink(missing_ok=True)
        except PermissionError:  # another account's live process
            pass


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the entry's file lock: check and (re)write it inside. On leaving, the lock file is removed while
    still held once the entry and its checksum exist; after an attempt that failed it stays, so every process
    waiting to make the entry shares one lock file until one succeeds. filelock retries a lock file removed
    under a waiting process, so a waiter never holds a lock nobody else can see."""
    # `ptrun plan` imports this module (through the controller) and never locks: filelock costs it 10-25 ms
    from filelock import FileLock  # inner import: start-up

    lock = lock_path(path)
    with FileLock(str(lock)):
        _sweep(path)
        yield
        if path.exists() and sum_path(path).exists():
            lock.unlink(missing_ok=True)


def write(path: Path, fill: Callable[[Path], None]) -> None:
    """Write the entry at `path`: `fill(tmp)` writes its bytes to a temporary file, which is renamed into place,
    then its checksum. The caller holds `locked(path)`."""
    tmp, tmp_sum = _temp(path), _temp(sum_path(path))
    try:
        fill(tmp)
        tmp_sum.write_text(json.dumps({**file_checksum(tmp), "name": path.name}))
        os.replace(tmp, path)
        os.replace(tmp_sum, sum_path(path))  # last: until it is there, the entry is not used
    finally:
        tmp.unlink(missing_ok=True)
        tmp_sum.unlink(missing_ok=True)


def write_bytes(path: Path, data: bytes) -> None:
    """`write` of bytes held in memory, taking the entry's lock: for the small entries one process writes
    after measuring (two runs that measured at once write one after the other, never mixed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        write(path, lambda tmp: tmp.write_bytes(data))


def read_bytes(path: Path, what: str, then: str) -> bytes | None:
    """The bytes of the entry at `path`, verified; None when there is none, or (said in one line by `report`)
    when it is unusable. For small entries: they are read twice (checked, then read)."""
    why = fault(path)
    if why is None:
        try:
            return path.read_bytes()
        except OSError as e:
            why = f"it cannot be read ({e.strerror})"
    if why:
        report(what, path, why, then)
    return None


def ensure(path: Path, fill: Callable[[Path], None], what: str, then: str) -> bool:
    """Make `path` a whole entry: if it is not, under its lock it is checked again (another process may have
    just made it) and written by `fill`; an entry found unusable is reported in one line by the process that
    rebuilds it. True when this process wrote it."""
    if fault(path) is None:
        return False
    with locked(path):
        why = fault(path)
        if why is None:
            return False
        if why:
            report(what, path, why, then)
        write(path, fill)
        return True
