"""Finding and checking checkpoints on disk (`ptrun.train.checkpoint` writes and loads them): file work only,
without torch, so `ptrun train` checks a run directory before anything heavy is imported."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

log = logging.getLogger("ptrun.train.checkpoint")

MANIFEST = "manifest.json"
TRAINER = "trainer.json"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoint directories, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))


def verify(ckpt: Path) -> str | None:
    """None if every file matches the manifest, else what is wrong (one line)."""
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text())
        for name, meta in manifest["files"].items():
            path = ckpt / name
            if not path.is_file():
                return f"{path} is missing"
            if path.stat().st_size != meta["bytes"] or sha256_of(path) != meta["sha256"]:
                return f"{path} does not match its checksum"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{ckpt / MANIFEST} is unreadable ({e.__class__.__name__})"
    return None


def latest_valid(run_dir: str | Path) -> Path | None:
    """The newest checkpoint that passes `verify`; newer broken ones are reported and skipped."""
    for ckpt in reversed(list_checkpoints(run_dir)):
        problem = verify(ckpt)
        if problem is None:
            return ckpt
        log.warning("skipping checkpoint %s: %s", ckpt.name, problem)
    return None
