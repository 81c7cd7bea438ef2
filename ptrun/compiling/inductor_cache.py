"""Inductor's cache ($TORCHINDUCTOR_CACHE_DIR, which `ptrun train` puts in ~/.cache/ptrun/torchinductor) kept
usable for a run that compiles.

- The compiled graphs: torch names each entry of its FX graph and AOTAutograd caches (`fxgraph/XX/KEY/NAME`,
  `aotautograd/KEY/NAME`) by the hash of its bytes, so an entry whose bytes no longer hash to its name is
  damaged (a flipped bit, a torn write, another file). torch does not check that: it fails to unpickle one,
  logs a traceback for it, compiles again and writes a new entry beside the damaged one, which stays and
  logs its traceback on every later run. `check_entries` removes such entries before a run compiles, in one
  line (about 90 ms for 200 entries, 25 MiB, on 2 CPU cores).
- The generated modules and kernels (`XX/cHASH.py`, `.so`) carry no hash of their bytes: one that fails to
  load fails the unit's compile, naming its file. `remove_named_file` removes the file such an error names,
  so that compiling the unit once more writes it again from the graph's entry.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from filelock import FileLock

log = logging.getLogger(__name__)

HASHED = ("fxgraph/*/*/*", "aotautograd/*/*")
"""The entries named by the hash of their bytes (files starting with `.` are torch's temporary ones)."""


def cache_root() -> Path | None:
    """$TORCHINDUCTOR_CACHE_DIR, where it is set and exists (read without creating it)."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return Path(root) if root and Path(root).is_dir() else None


def damaged_entries(root: Path) -> list[Path]:
    """The graph entries under `root` whose bytes do not hash to their names."""
    # inner import: optional library (inductor; its hash names the entries)
    from torch._inductor.codecache import sha256_hash

    damaged = []
    for pattern in HASHED:
        for path in sorted(root.glob(pattern)):
            if path.name.startswith(".") or not path.is_file():
                continue
            try:
                if sha256_hash(path.read_bytes()) != path.name:
                    damaged.append(path)
            except OSError:
                damaged.append(path)
    return damaged


def check_entries(root: Path | None = None) -> list[Path]:
    """Remove the damaged graph entries of inductor's cache, saying so in one line; the ones removed. Under a
    file lock, so that of the workers of a machine one removes them and says so, and the others find none."""

    root = root or cache_root()
    if root is None:
        return []
    try:
        (root / "locks").mkdir(exist_ok=True)
        with FileLock(str(root / "locks" / "ptrun-check.lock")):
            damaged = damaged_entries(root)
            for path in damaged:
                path.unlink(missing_ok=True)
    except OSError as e:  # a cache this process cannot write: torch copes with it as it can
        log.warning("inductor's cache %s cannot be checked (%s)", root, e.strerror)
        return []
    if damaged:
        names = ", ".join(str(p.relative_to(root)) for p in damaged[:3]) + (" …" if len(damaged) > 3 else "")
        log.warning(
            "inductor's cache %s: removed %d damaged compiled-graph entries (%s): their bytes no longer hash to "
            "their names; the graphs are compiled again",
            root,
            len(damaged),
            names,
        )
    return damaged


def remove_named_file(exc: BaseException) -> tuple[Path, bool] | None:
    """The file of inductor's cache that `exc` (or an exception it chains) names, removed, and whether this
    process removed it (another worker may have first); None where it names none. A generated module or
    kernel that failed to load (`Failed to import …/cHASH.py`) is written again by the next compile from the
    graph's entry."""
    root = cache_root()
    if root is None:
        return None
    text = []
    seen: BaseException | None = exc
    while seen is not None and len(text) < 8:
        text.append(str(seen))
        seen = seen.__cause__ or seen.__context__
    # torch's own spelling of its root; only the files a compile loads (a C++ error names its .cpp: not ours)
    pattern = re.compile(re.escape(os.path.abspath(root)) + r"/[^\s'\"]+?\.(?:py|so)\b")
    for match in pattern.finditer("\n".join(text)):
        path = Path(match.group(0))
        removed = path.is_file()
        path.unlink(missing_ok=True)
        if path.suffix == ".so":
            path.with_name(path.name + ".load_ok").unlink(missing_ok=True)
        return path, removed
    return None
