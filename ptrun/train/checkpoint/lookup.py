"""Finding and checking checkpoints on disk (`store.py` writes and reads them): file work only,
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


def adapter_problem(ckpt: Path, adapter: str) -> str | None:
    """Why a run with `adapter.name=adapter` cannot resume from `ckpt` (None when it can): a checkpoint of
    adapters holds no base weights, one of full fine-tuning no adapters, so the two never resume each other."""
    try:
        saved = json.loads((ckpt / TRAINER).read_text())["model"].get("adapter", "none")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # the worker's own check names an unreadable trainer.json
    if saved == adapter:
        return None
    return (
        f"adapter={adapter!r} is not allowed: checkpoint {ckpt} is of a run with adapter={saved}; resume with "
        f"adapter={saved} or start a new run in another hydra.run.dir"
    )
