"""Every way a run ends, in one place: the exceptions that carry it, the exit codes ptrun's processes end with, the
reports a worker leaves for the launcher in the launch's errors directory, and the launcher's one line for each.
File work only, without torch: the command reads it before anything heavy is imported, the workers raise its
exceptions and write its reports, and the launcher (`ptrun.launcher`) reads them and says its line.

| how the run ends | in a worker | its report | in the launcher | exit, line |
|---|---|---|---|---|
| done | `fit` returns | | `launch` returns | 0 |
| bad input | `ConfigError` | `rank*` | `ConfigError` | 2, the message |
| a signal (Ctrl-C, SIGTERM) | `Interrupted`, a checkpoint | | `Interrupted` | 130 or 143, `stopped_line` |
| diverged | `Diverged`, no checkpoint | `diverged-rank*` | `Diverged` | 1, `diverged_line` |
| no space for a file of the run | `OutOfSpace` | `fault-rank*` | `MachineFault` | 1, `no_space_line` |
| out of memory | torch's `OutOfMemoryError` | `fault-rank*` | `MachineFault` | 1, `oom_line` |
| killed by the kernel for memory | | `fault-oom-kill-rank*` (the agent) | `MachineFault` | 1, `oom_kill_line` |
| the same error at every worker's start | | `start-rank*` | `LaunchFailed` | 1, `same_start_line` |
| failures past `launcher.max_restarts` | | | `LaunchFailed` | 1, `failure_line` |
| the machines never met | | | `LaunchFailed` | 1, `rendezvous_line` |

`ConfigError` alone lives below, in `ptrun.errors`: the config's own checks raise it, long before a run.
"""

from __future__ import annotations

import contextlib
import enum
import json
import shlex
import shutil
import signal
from pathlib import Path


# ---- exit codes ------------------------------------------------------------------------------------------
class ExitCode(enum.IntEnum):
    """Every code but 0 that ptrun's processes exit with: the command (`ptrun`, the launcher) and its workers."""

    FAILED = 1
    """The launcher, after its line: training diverged, a fault of the machine, or workers that failed more
    often than `launcher.max_restarts` allows. A worker, after its report: it diverged, found a fault of the
    machine or failed at start-up (the launcher restarts nothing where the reports say a restart would fail the
    same way)."""
    BAD_INPUT = 2
    """Bad input: `ptrun` itself, and a worker that found it (a checkpoint of another model, a broken dataset
    file) after writing its one-line message into the launch's errors directory."""
    SIGINT = 128 + signal.SIGINT
    """After a stop on Ctrl-C (130): 128 + the signal, as a shell reports a process the signal ended."""
    SIGPIPE = 128 + signal.SIGPIPE
    """The reader of the output left early (`ptrun recipes | head -3`): 141, as Unix tools end."""
    SIGTERM = 128 + signal.SIGTERM
    """After a stop on SIGTERM (143), the code to requeue on: Kubeflow's training operators treat exit codes
    128-255 as retryable, and a SLURM site lists it in `RequeueExit` (or the job script requeues itself, as
    scripts/slurm/ptrun.sbatch does)."""


def stop_code(signum: int) -> ExitCode:
    """The exit code after the run stopped on signal `signum` (FAILED for one ptrun does not stop on)."""
    return ExitCode.__members__.get(signal.Signals(signum).name, ExitCode.FAILED)


# ---- the exceptions --------------------------------------------------------------------------------------
class Interrupted(Exception):
    """The run stopped on `signum` (Ctrl-C, SIGTERM). In a worker: the workers agreed to stop after it, and the
    trainer has written a checkpoint (if it could). In the launcher: the signal reached it, and its workers
    wrote their checkpoint at the step they agreed on (given `launcher.stop_timeout` seconds to)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Diverged(Exception):
    """Training diverged at `global_step` (counted from 0): the workers stopped at a step they agreed on, and
    nothing is checkpointed. The launcher's carries the workers' `report` too (where, and the learning rate the
    schedule gave it; `ptrun.train.divergence.DivergenceWatch.report`)."""

    def __init__(self, global_step: int, report: dict | None = None):
        super().__init__(global_step)
        self.global_step, self.report = global_step, report


class OutOfSpace(Exception):
    """A file of the run could not be written for want of space; every rank raises it at the same step
    (`ptrun.train.machine_faults`)."""

    def __init__(self, what: str, path: str | Path | None, needed: int = 0, free: int | None = None):
        super().__init__(f"no space left to write the {what}")
        self.what, self.path, self.needed = what, str(path) if path else None, needed
        self.free = free if free is not None or path is None else free_bytes(path)

    def report(self) -> dict:
        """What the launcher's line says (`no_space_line`)."""
        return {"kind": "no_space", "what": self.what, "path": self.path, "needed": self.needed, "free": self.free}


class MachineFault(RuntimeError):
    """The workers stopped on a fault of the machine that a restart would not cure: no space left for a file
    of the run, out of memory, or a worker the kernel killed for want of memory (`report`: what, where, and
    the numbers; `ptrun.train.machine_faults`, `ptrun.launcher.elastic_agent.oom_killed`)."""

    def __init__(self, report: dict):
        super().__init__(report)
        self.report = report


class LaunchFailed(RuntimeError):
    """The worker group failed more often than `launcher.max_restarts` allows, or every worker failed at
    start-up with the same error."""


def free_bytes(path: str | Path) -> int:
    """The bytes free to this user on the file system that holds `path` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


# ---- the reports in the launch's errors directory ---------------------------------------------------------
REPORTS = {
    "bad_input": "rank",  # the one-line message
    "start": "start-rank",  # the line and the traceback of an error at start-up
    "diverged": "diverged-rank",  # where (`ptrun.train.divergence.DivergenceWatch.report`)
    "fault": "fault-rank",  # no space, out of memory (`OutOfSpace.report`, `ptrun.train.machine_faults.memory_report`)
    "oom_kill": "fault-oom-kill-rank",  # the agent's, for a worker the kernel killed for want of memory
}
"""Each report's file name before the rank: one file per rank that found it (`rank00003`), so the lowest rank's
comes first. Every report but `start`'s tells ptrun's agent to restart nothing."""


def write_report(errors: str | Path, kind: str, rank: int, report: str | dict) -> None:
    """`report` (a line, or what a line says) in the launch's errors directory `errors`, where the agent sees it
    before this worker exits and the launcher reads it for its line."""
    text = report if isinstance(report, str) else json.dumps(report)
    Path(errors, f"{REPORTS[kind]}{rank:05d}").write_text(text)


def reports(errors: Path, *kinds: str) -> list[Path]:
    """The reports of `kinds` in `errors`, lowest rank first."""
    return sorted(p for kind in kinds for p in errors.glob(f"{REPORTS[kind]}[0-9]*"))


# ---- the launcher's lines ---------------------------------------------------------------------------------
def _checkpoints():
    """`ptrun.train.checkpoint.lookup`, which each line reads the run's checkpoints with."""
    # `ptrun --help` imports this module for its exit codes alone, and the lookup brings hashlib and logging
    from ptrun.train.checkpoint import lookup  # inner import: start-up

    return lookup


def stopped_line(signum: int, run_dir: Path, overrides: list[str]) -> str:
    """After the workers stopped on signal `signum` and wrote a checkpoint: where it is and the command that
    resumes the run (`overrides`: the command line's)."""
    lookup = _checkpoints()
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
    lookup = _checkpoints()
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
    lookup = _checkpoints()
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
    lookup = _checkpoints()
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
    lookup = _checkpoints()
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


def oom_line(report: dict, keys: list[str], run_dir: Path, overrides: list[str]) -> str:
    """After a worker ran out of memory (`report`, `ptrun.train.machine_faults.memory_report`): where, the device's
    memory, the keys that would fit (`keys`, the planner's: `ptrun.launcher.memory_advice.keys_that_fit`) and
    the command that resumes the run with the first of them."""
    lookup = _checkpoints()
    head = (
        f"out of memory on {report['device']} in a {report['where']}: {size(report['used'])} of "
        f"{size(report['total'])} in use"
        + (f", {size(report['requested'])} more asked for" if report["requested"] else "")
        + "; no restart, which would run out the same way"
    )
    advice = (
        f"keys that would fit, by the planner's memory model: {', '.join(keys)}"
        if keys
        else "no single key fits by the planner's memory model: use more workers or devices with more memory"
    )
    ckpt = lookup.latest_valid(run_dir)
    if ckpt is None:
        return f"{head}; {advice}; no checkpoint was written before it"
    if keys:  # the first key, in place of the command line's own value of it
        first = keys[0].split(" ")[0]
        overrides = [o for o in overrides if o.lstrip("+").split("=")[0] != first.split("=")[0]] + [first]
    return f"{head}; {advice}; newest good checkpoint {ckpt}; resume with: {resume_command(overrides, run_dir)}"


def failure_line(rank: int, failure, log: Path) -> str:
    """What the launcher says of a worker that failed otherwise (`failure`, elastic's ProcessFailure): the
    signal that killed it, from outside ptrun, or the last line of its exception (naming the file or the
    resource where the exception does), whose traceback is in the run's train.log `log`
    (`ptrun.launcher.elastic_agent.elastic_logs_to`)."""
    if failure.exitcode < 0:
        with contextlib.suppress(ValueError):
            name = signal.Signals(-failure.exitcode).name
            return f"worker rank {rank} (pid {failure.pid}) was killed by {name}, from outside ptrun"
    message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
    last = message.strip().splitlines()[-1] if message.strip() else ""
    return f"worker rank {rank} failed (exit code {failure.exitcode}): {last or 'no message'}" + (
        f" (traceback in {log})" if log.is_file() else ""
    )


def same_start_line(report: Path) -> str:
    """After every worker failed at start-up with the same error (`report`, a `start` report)."""
    line = json.loads(report.read_text())["line"]
    return f"every worker failed at start-up with the same error, so no restart: {line}"


def rendezvous_line(endpoint: str, error: BaseException) -> str:
    """After the rendezvous at `endpoint` failed with `error` (the other machines did not join in time, say)."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"rendezvous at launcher.rdzv_endpoint={endpoint} failed: {type(error).__name__}: {first}"
