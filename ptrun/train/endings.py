"""The launcher's line when a run ends early: stopped on a signal (where its checkpoint is and the command that
resumes the run) or diverged (where, and the command that resumes from the newest checkpoint at a lower
learning rate). Read from the run directory's checkpoints, without torch."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

from ptrun.train.checkpoint import lookup


def stopped_line(signum: int, run_dir: Path, overrides: list[str]) -> str:
    """After the workers stopped on signal `signum` and wrote a checkpoint: where it is and the command that
    resumes the run (`overrides`: the command line's)."""
    name = signal.Signals(signum).name
    ckpt = lookup.latest_valid(run_dir)
    if ckpt is None:
        return f"stopped by {name} before the first checkpoint; nothing to resume (run dir {run_dir})"
    command = resume_command(overrides, run_dir)
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
    ckpt = lookup.latest_valid(run_dir)
    if ckpt is None:
        fresh = [o for o in kept if not o.startswith(("train.resume=", "hydra.run.dir="))]
        return (
            f"{where}; no checkpoint was written before it: start again at a lower learning rate: "
            f"{shlex.join(['ptrun', 'train', *fresh, lower])}"
        )
    return (
        f"{where}; newest good checkpoint {ckpt} ({_checkpoint_position(ckpt)}); resume from it at a lower "
        f"learning rate: {resume_command([*kept, lower], run_dir)}"
    )


def _checkpoint_position(ckpt: Path) -> str:
    """Where in the run checkpoint `ckpt` was written, in words."""
    state = json.loads((ckpt / lookup.TRAINER).read_text())
    if state["step_in_epoch"]:
        return f"in epoch {state['epoch'] + 1} after step {state['step_in_epoch']}"
    return f"before epoch {state['epoch'] + 1}"


def resume_command(overrides: list[str], run_dir: Path) -> str:
    """`ptrun train` with `overrides` continuing the run in `run_dir` from its newest checkpoint."""
    kept = [o for o in overrides if not o.startswith(("train.resume=", "hydra.run.dir="))]
    return shlex.join(["ptrun", "train", *kept, "train.resume=true", f"hydra.run.dir={run_dir}"])


def size(nbytes: int) -> str:
    """`nbytes` in words: exact, and in the unit that reads best."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes} bytes ({nbytes / scale:.1f} {unit})"
    return f"{nbytes} bytes"


def _bytes_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def no_space_line(report: dict, free: int, keep: int, run_dir: Path, overrides: list[str]) -> str:
    """After the workers stopped because a file of the run found no space (`report`: what, where, the bytes
    it needed; `free`: the bytes free there now, the partial files removed; `keep`: `checkpoint.keep`): what
    could not be written, the newest good checkpoint, the cure (none where there is room now; the older
    checkpoints' room, which `checkpoint.keep=1` gives up; or another directory) and the command that resumes
    the run."""
    where = report.get("path") or run_dir
    what = f"no space left on the disk of {where} to write the {report['what']}"
    needed = report["needed"]
    head = f"{what}: it needs {size(needed)}, {size(free)} are free there"
    ckpt = lookup.latest_valid(run_dir)
    if ckpt is None:
        return f"{head}; no checkpoint was written before it: free space there, or choose another hydra.run.dir"
    # The run goes on writing checkpoints beside the newest: room for one more is what it needs from here on.
    ahead = needed if report["what"] == "checkpoint" else needed + _bytes_of(ckpt)
    older = [c for c in lookup.list_checkpoints(run_dir) if c.name < ckpt.name]
    older_bytes = sum(_bytes_of(c) for c in older)
    kept = [o for o in overrides if not o.lstrip("+").startswith("checkpoint.keep=")]
    if free >= ahead:  # the space was found again meanwhile (another writer's files went)
        cure = f"there is room there now; resume with: {resume_command(overrides, run_dir)}"
    elif keep > 1 and older and free + older_bytes >= ahead:
        cure = (
            f"checkpoint.keep=1 is the cure: the {len(older)} older checkpoint(s) it removes on resuming hold "
            f"{size(older_bytes)}; resume with: {resume_command([*kept, 'checkpoint.keep=1'], run_dir)}"
        )
    else:
        cure = (
            f"checkpoint.keep=1 would not make room: free {size(max(ahead - free, 0))} more there, or copy "
            f"{run_dir} to a disk with room and resume there (hydra.run.dir set to the copy); resume with: "
            f"{resume_command(overrides, run_dir)}"
        )
    return f"{head}; newest good checkpoint {ckpt} ({_checkpoint_position(ckpt)}); {cure}"


def oom_kill_line(report: dict, run_dir: Path, overrides: list[str]) -> str:
    """After the kernel killed a worker for want of memory (`report`: its rank, pid, peak resident memory and
    where the machine said so): that, and the command that resumes the run from the newest checkpoint."""
    head = (
        f"the kernel killed worker rank {report['rank']} (pid {report['pid']}) for want of memory (said by "
        f"{report['source']}); its peak resident memory was {size(report['peak'])}; so no restart, which "
        f"would run out the same way: run fewer workers on this machine (launcher.nproc_per_node), a "
        f"smaller train.global_batch_size, or free the machine's memory"
    )
    ckpt = lookup.latest_valid(run_dir)
    if ckpt is None:
        return f"{head}; no checkpoint was written before it"
    return f"{head}; newest good checkpoint {ckpt}; resume with: {resume_command(overrides, run_dir)}"
