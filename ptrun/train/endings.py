"""The launcher's line when a run ends early: stopped on a signal (where its checkpoint is and the command that
resumes the run) or diverged (where, and the command that resumes from the newest checkpoint at a lower
learning rate). Read from the run directory's checkpoints, without torch."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from ptrun.train import checkpoint_files


def stopped_line(signum: int, run_dir: Path, overrides: list[str]) -> str:
    """After the workers stopped on signal `signum` and wrote a checkpoint: where it is and the command that
    resumes the run (`overrides`: the command line's)."""
    name = signal.Signals(signum).name
    ckpt = checkpoint_files.latest_valid(run_dir)
    if ckpt is None:
        return f"stopped by {name} before the first checkpoint; nothing to resume (run dir {run_dir})"
    command = _resume_command(overrides, run_dir)
    return f"stopped by {name} {_checkpoint_position(ckpt)}; checkpoint {ckpt}; resume with: {command}"


def diverged_line(report: dict, lr: float, run_dir: Path, overrides: list[str]) -> str:
    """After the workers stopped on divergence (`report`: the step, and why; `lr`: `optim.lr`): the line saying
    where, and the command that resumes from the newest checkpoint, which precedes it, at a tenth of the
    learning rate (or starts again at it, before the first checkpoint)."""
    lower = f"optim.lr={lr / 10:g}"
    kept = [o for o in overrides if not o.lstrip("+").startswith("optim.lr=")]
    where = (
        f"training diverged in epoch {report['epoch'] + 1}, step {report['step'] + 1} (global step "
        f"{report['global_step'] + 1}): {report['why']}, at optim.lr={lr:g} (the schedule's {report['lr']:.3g} "
        f"there); nothing was exported, and no checkpoint written after it"
    )
    ckpt = checkpoint_files.latest_valid(run_dir)
    if ckpt is None:
        fresh = [o for o in kept if not o.startswith(("train.resume=", "hydra.run.dir="))]
        return (
            f"{where}; no checkpoint was written before it: start again at a lower learning rate: "
            f"{shlex.join(['ptrun', 'train', *fresh, lower])}"
        )
    return (
        f"{where}; newest good checkpoint {ckpt} ({_checkpoint_position(ckpt)}); resume from it at a lower "
        f"learning rate: {_resume_command([*kept, lower], run_dir)}"
    )


def _checkpoint_position(ckpt: Path) -> str:
    """Where in the run checkpoint `ckpt` was written, in words."""
    state = json.loads((ckpt / checkpoint_files.TRAINER).read_text())
    if state["step_in_epoch"]:
        return f"in epoch {state['epoch'] + 1} after step {state['step_in_epoch']}"
    return f"before epoch {state['epoch'] + 1}"


def _resume_command(overrides: list[str], run_dir: Path) -> str:
    """`ptrun train` with `overrides` continuing the run in `run_dir` from its newest checkpoint."""
    kept = [o for o in overrides if not o.startswith(("train.resume=", "hydra.run.dir="))]
    return shlex.join(["ptrun", "train", *kept, "train.resume=true", f"hydra.run.dir={run_dir}"])
