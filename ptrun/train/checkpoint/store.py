"""Writing and reading one checkpoint's files (the directory layout is the package's docstring): the
parameters and optimizer state of a rank's stages, the random number generators' states, a mid-epoch
checkpoint's sums, the trainer's state and the manifest, written last."""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ptrun.config import ConfigError
from ptrun.train import fault_injection, machine_faults
from ptrun.train.checkpoint.lookup import MANIFEST, TRAINER, checkpoint_root, list_checkpoints, sha256_of

log = logging.getLogger(__name__)


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def rng_states() -> dict[str, torch.Tensor]:
    """This process's torch generator states (CPU, and the current GPU's)."""
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def save(
    run_dir: str | Path,
    *,
    global_step: int,
    named_params: dict[str, torch.Tensor],
    optim_state: dict[str, dict[str, torch.Tensor]],
    writer: bool,
    stage: int,
    trainer_state: dict[str, Any],
    keep: int,
    progress: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Collective over all ranks. `writer` ranks (one per stage) write their stage's tensors and every rank
    its generator states; rank 0 then writes `progress` (if any), trainer.json and the manifest, and renames
    the directory into place. Where any rank's write finds no space, every rank raises OutOfSpace after the
    same collective, with the partial directory removed and the checkpoints before it as they were."""
    root = checkpoint_root(run_dir)
    final = root / f"step_{global_step:08d}"
    tmp = root / f".tmp_step_{global_step:08d}"
    rank = dist.get_rank()
    tensors = {n: t.detach().cpu().contiguous() for n, t in named_params.items()} if writer else {}
    optim = {n: {k: v.detach().cpu() for k, v in s.items()} for n, s in optim_state.items()} if writer else {}
    rng = rng_states()
    # what this rank writes, summed over the ranks for the line that says how much the checkpoint needs
    written = [*tensors.values(), *rng.values(), *((progress or {}).values() if rank == 0 else [])]
    nbytes = sum(_bytes(t) for t in written)
    nbytes += sum(_bytes(t) for s in optim.values() for t in s.values())

    def settle(error: BaseException | None) -> None:
        """In place of a barrier: every rank learns whether any rank's write failed, and raises alike."""
        machine_faults.settle_write(error, "checkpoint", final, nbytes, cleanup=lambda: shutil.rmtree(tmp, True))

    error = None
    if rank == 0:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        except OSError as e:
            error = e
    settle(error)
    try:
        if writer:
            save_file(tensors, str(tmp / f"params-stage{stage}.safetensors"))
            with open(tmp / f"optim-stage{stage}.pt", "wb") as f:  # a full disk is the OSError, not torch's own
                torch.save(optim, f)
        save_file(rng, str(tmp / f"rng-rank{rank}.safetensors"))
        fault_injection.reached("checkpoint", global_step)
    except Exception as e:
        error = e
    settle(error)
    if rank == 0:
        try:
            _complete(tmp, final, progress, trainer_state)
            for old in list_checkpoints(run_dir)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        except Exception as e:
            error = e
    settle(error)
    return final


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _complete(tmp: Path, final: Path, progress: dict[str, torch.Tensor] | None, trainer_state: dict) -> None:
    """Rank 0's part of a checkpoint, once every rank's files are in `tmp`: the epoch's sums so far, the
    trainer's state, the manifest, and `tmp` renamed to `final`."""
    if progress:
        save_file({k: v.detach().cpu().contiguous() for k, v in progress.items()}, str(tmp / "progress.safetensors"))
    _write_json(tmp / TRAINER, trainer_state)
    files = sorted(p.name for p in tmp.iterdir())
    _write_json(
        tmp / MANIFEST,
        {
            "format": 1,
            "files": {name: {"sha256": sha256_of(tmp / name), "bytes": (tmp / name).stat().st_size} for name in files},
        },
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def load_extra(ckpt: Path, name: str) -> dict[str, torch.Tensor] | None:
    """A small safetensors file of the checkpoint (`progress`, `rng-rank3`), or None if it was not written."""
    path = ckpt / f"{name}.safetensors"
    return load_file(str(path)) if path.is_file() else None


def unreadable(ckpt: Path, e: Exception) -> ConfigError:
    """The one line for a checkpoint whose files cannot be read: a user-facing error naming it, not a
    traceback."""
    return ConfigError(f"checkpoint {ckpt}: cannot read ({e.__class__.__name__}: {str(e).splitlines()[0][:120]})")


def trainer_state(ckpt: Path) -> dict[str, Any]:
    """The trainer's state the checkpoint was written with (trainer.json): epoch, step, plan, controller."""
    try:
        return json.loads((ckpt / TRAINER).read_text())
    except Exception as e:  # an unreadable file is a user-facing error naming it, not a traceback
        raise unreadable(ckpt, e) from None


def param_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    """Every parameter's shape in the checkpoint, read from the files' indexes (no values)."""
    shapes: dict[str, tuple[int, ...]] = {}
    try:
        for f in sorted(ckpt.glob("params-stage*.safetensors")):
            with safe_open(str(f), framework="pt") as handle:
                shapes.update({k: tuple(handle.get_slice(k).get_shape()) for k in handle.keys()})
    except Exception as e:  # any unreadable file is a user-facing error naming it, not a traceback
        raise unreadable(ckpt, e) from None
    return shapes


def load(
    ckpt: Path, names: Collection[str] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]], dict[str, Any]]:
    """(the parameters by name, their optimizer state by parameter name, trainer state): all of them, or only
    `names`' (a worker reads the units it holds: other tensors' bytes are not read, and each stage's
    optimizer file is memory-mapped and filtered, so at most one file's worth is ever touched)."""
    params: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, torch.Tensor]] = {}
    try:
        for f in sorted(ckpt.glob("params-stage*.safetensors")):
            with safe_open(str(f), framework="pt") as handle:
                params.update({k: handle.get_tensor(k) for k in handle.keys() if names is None or k in names})
        for f in sorted(ckpt.glob("optim-stage*.pt")):
            saved = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
            optim.update(
                {n: {k: v.clone() for k, v in s.items()} for n, s in saved.items() if names is None or n in names}
            )
            del saved
        state = json.loads((ckpt / TRAINER).read_text())
    except Exception as e:  # any unreadable file is a user-facing error naming it, not a traceback
        raise unreadable(ckpt, e) from None
    return params, optim, state
