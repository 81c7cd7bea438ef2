"""Finding and checking checkpoints on disk (`store.py` writes and reads them): file work only,
without torch, so `ptrun train` checks a run directory before anything heavy is imported."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from ptrun.config.adapter import RESUME_FREE

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


def adapter_problem(ckpt: Path, settings: dict) -> str | None:
    """Why a run with the adapter keys `settings` (`ptrun.config.adapter.adapter_settings`) cannot resume from
    `ckpt` (None when it can). A checkpoint of adapters holds no base weights, one of full fine-tuning no
    adapters, so the two never resume each other; and adapters trained with other settings (a rank, a scale,
    targets, an init) would go on as another model than the one they began as. Every key the checkpoint
    recorded is compared, but those a resume may change (`RESUME_FREE`, what the export writes)."""

    try:
        model = json.loads((ckpt / TRAINER).read_text())["model"]
        saved = model.get("adapter", "none")
        recorded = model.get("adapter_settings") or {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # the worker's own check names an unreadable trainer.json
    adapter = settings["name"]
    if saved != adapter:
        return (
            f"adapter={adapter!r} is not allowed: checkpoint {ckpt} is of a run with adapter={saved}; resume with "
            f"adapter={saved} or start a new run in another hydra.run.dir"
        )
    for key, value in settings.items():
        if key in recorded and key not in RESUME_FREE and recorded[key] != value:
            was = recorded[key]
            return (
                f"adapter.{key}={value!r} is not allowed: checkpoint {ckpt} is of a run with adapter.{key}={was!r}; "
                f"resume with adapter.{key}={_override(was)} or start a new run in another hydra.run.dir"
            )
    return None


def _override(value) -> str:
    """`value` as a command line writes it (`null`, `true`, `[query,value]`)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)
