"""`ptrun train [overrides]`: a single run, or a Hydra sweep.

A single run's config is composed and resolved ONCE here (`ptrun.compose.resolve`: composed, SLURM's layout
applied, validated, defaults filled; then `for_this_machine`: this machine checked and its `auto` values
filled); the start creates the run directory (`hydra.run.dir`) as Hydra would, writes the resolved YAML to a
private file and launches the workers, which only read that file (rank 0 copies it to RUN_DIR/config.yaml once the
run has started). Hydra's own app runs only a sweep (`-m`: one job per point, each resolved from what Hydra
composed for it) and the flags that print (`--help`, `--cfg`, ...). Bad input ends with one line on stderr
naming the key or file and what is allowed, exit code 2, and the run directory as it was (docs/errors.md
lists the cases).
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ptrun.cli_args import fail
from ptrun.compose import (
    CONFIG_DIR,
    Resolved,
    entries,
    for_launch,
    for_this_machine,
    register_schema,
    resolve,
    settle,
    typed,
)
from ptrun.config import ConfigError
from ptrun.config.adapter import adapter_settings
from ptrun.config.launcher import visible_gpus
from ptrun.config.paper import quick_try
from ptrun.train import run_end
from ptrun.train.run_end import Diverged, Interrupted, LaunchFailed, MachineFault

# Hydra flags that a single run does not take: a sweep, or printing instead of running. Hydra's app handles them.
HYDRA_FLAGS = {
    "-h",
    "--help",
    "--hydra-help",
    "-c",
    "--cfg",
    "-i",
    "--info",
    "-p",
    "--package",
    "-sc",
    "--shell-completion",
    "--resolve",
    "-m",
    "--multirun",
}


def checked_start(overrides: list[str]) -> Resolved:
    """A single run's config, resolved once and for this machine, with what the workers would otherwise find
    out first checked now (the run directory can be made; an `hf` source's columns and labels), so bad input
    fails before anything is created. Once the config itself is good, the workers' server starts importing
    their modules, beside the checks that read files (a refused start ends it with the command: no worker has
    started)."""
    from ptrun.launcher.worker_server import start_worker_server

    try:
        start = for_this_machine(resolve(overrides, os.environ))
        cfg = start.cfg
        _check_run_dir_path(cfg.run_dir)
        hint = quick_try(cfg, visible_gpus(cfg.launcher))
        if hint:
            print(hint, file=sys.stderr, flush=True)
        start_worker_server(cfg)
        if cfg.data.name == "hf":  # its columns and labels, read before any worker starts
            from ptrun.data.hf_source import check_hf_source
            from ptrun.train.class_names import check_resumed_classes  # inner import: start-up

            class_names = check_hf_source(cfg.data, cfg.model.task)
            if cfg.train.resume:
                check_resumed_classes(class_names, cfg.run_dir)
    except ConfigError as e:
        fail(str(e))
    return start


def _check_run_dir_path(path: str) -> None:
    """The start creates the run directory and its missing parents: the nearest of them that exists must be a
    directory we may write into (making it would otherwise fail with a traceback). Permission bits do not tell
    (root passes them, and /proc or a read-only mount refuse anyway), so a directory of a name of its own is made
    where the first missing one would go, and removed again: a probe that leaves nothing behind and never
    touches the run directory itself, which the agent of another machine sharing it may be making now."""
    target = Path(path).expanduser()
    chain = (target, *target.parents)
    nearest = next(p for p in chain if p.exists())  # "/" or "." at the latest
    problem = f"{nearest} is a file" if not nearest.is_dir() else None
    if problem is None and not os.access(nearest, os.W_OK | os.X_OK):
        problem = f"{nearest} is not writable"
    if problem is None and nearest != target:
        first_missing = chain[chain.index(nearest) - 1]
        try:
            os.rmdir(tempfile.mkdtemp(prefix=f".{first_missing.name}.probe-", dir=nearest))
        except OSError as e:
            problem = f"{first_missing} cannot be created: {e.strerror}"
    if problem is not None:
        raise ConfigError(f"hydra.run.dir={path!r} is not allowed: a directory to create or write into ({problem})")


def _check_run_dir(run_dir: Path, resume: bool, adapter: dict | None = None) -> None:
    """Never start over an existing run by accident, and never resume from nothing or from broken checkpoints
    alone."""
    from ptrun.train.checkpoint import lookup  # no torch: the workers' server has not started yet

    existing = lookup.list_checkpoints(run_dir)
    if existing and not resume:
        raise ConfigError(
            f"run directory {run_dir} already holds a run; continue it with train.resume=true "
            f"or choose another hydra.run.dir"
        )
    # An explicit resume needs something to resume (a restart after a failure, by contrast, may find no
    # checkpoint yet and starts over: the worker decides that).
    if resume and not existing:
        raise ConfigError(
            f"train.resume=true: {run_dir} holds no checkpoint to resume from; leave train.resume "
            f"off to start a new run, or set hydra.run.dir to the run to continue"
        )
    if resume and all(lookup.verify(c) is not None for c in existing):
        raise ConfigError(
            f"train.resume=true: no valid checkpoint to resume from: {lookup.verify(existing[-1])}; "
            f"restore it, or start a new run in another hydra.run.dir"
        )
    newest = lookup.latest_valid(run_dir) if resume else None
    problem = lookup.adapter_problem(newest, adapter or {"name": "none"}) if newest is not None else None
    if problem is not None:
        raise ConfigError(problem)


SWEEP_JOBS: list[tuple[Path, list[str]]] = []
"""(run directory, the sweep's overrides) of each job of a `-m` sweep, in order, for its closing summary."""


def hydra_job(cfg: DictConfig) -> None:
    """Hydra's task function, for the jobs Hydra's app starts: each point of a `-m` sweep (or a run that a
    Hydra flag sent through the app). The job's config is the one Hydra composed for it, resolved here."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir).resolve()  # Hydra created it
    overrides = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        SWEEP_JOBS.append((run_dir, overrides))
    created_now = not any(run_dir.iterdir())
    try:
        OmegaConf.resolve(cfg)
        cfg.run_dir = str(run_dir)
        start = for_this_machine(settle(typed(cfg), overrides, os.environ))
    except ConfigError as e:
        _fail_start(str(e), run_dir, created_now)
    launch_run(start, run_dir, overrides, created_now)


def launch_run(start: Resolved, run_dir: Path, overrides: list[str], created_now: bool) -> None:
    """Start the workers on `start` in `run_dir` (created: `created_now` says whether by this start) once the
    run directory and the rendezvous are checked; `overrides` make the command a stopped run resumes with."""
    from ptrun.launcher.launch import launch
    from ptrun.launcher.rendezvous import check_rendezvous
    from ptrun.launcher.worker_server import start_worker_server

    typed_cfg = replace(start.cfg, run_dir=str(run_dir))
    try:
        if start.slurm_note is not None:
            print(start.slurm_note, flush=True)
        _check_run_dir(run_dir, typed_cfg.train.resume, adapter_settings(typed_cfg.adapter))
        # The workers' server imports their modules beside the launcher's own imports (the rendezvous check is
        # the first to import torch); a single run started it already (`checked_start`), a sweep's job here.
        start_worker_server(typed_cfg)
        check_rendezvous(typed_cfg.launcher)
        # The layout's `auto` values made numbers, for the workers and config.yaml (torch is imported by now).
        typed_cfg, choice = for_launch(typed_cfg)
    except ConfigError as e:
        _fail_start(str(e), run_dir, created_now)
    if choice is not None:
        print(choice.summary(), flush=True)
    # The workers read the resolved config from a private copy; rank 0 writes it to RUN_DIR/config.yaml once
    # the run has started, so a start that fails on bad input leaves the run directory as it was.
    with tempfile.TemporaryDirectory(prefix="ptrun-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(OmegaConf.to_yaml(OmegaConf.structured(typed_cfg)))
        try:
            launch(typed_cfg, config_path)
        except ConfigError as e:  # bad input a worker found
            _fail_start(str(e), run_dir, created_now)
        except LaunchFailed as e:
            fail(str(e), code=run_end.ExitCode.FAILED)
        except Diverged as e:
            fail(run_end.diverged_line(e.report, typed_cfg.optim.lr, run_dir, overrides), code=run_end.ExitCode.FAILED)
        except MachineFault as e:  # a full disk or an exhausted memory: a restart would fail the same way
            fail(fault_line(e.report, typed_cfg, run_dir, overrides), code=run_end.ExitCode.FAILED)
        except Interrupted as e:  # Ctrl-C or SIGTERM reached the launcher (and so its workers)
            _stopped(e.signum, run_dir, overrides)


def fault_line(report: dict, cfg, run_dir: Path, overrides: list[str]) -> str:
    """The line after a fault of the machine (`report`, a worker's or the agent's): a file that found no space,
    a worker out of memory, or one the kernel killed for want of memory."""
    if report["kind"] == "no_space":
        free = run_end.free_bytes(report.get("path") or run_dir)  # now, with the partial files removed
        return run_end.no_space_line(report, free, cfg.checkpoint.keep, run_dir, overrides)
    if report["kind"] == "oom_kill":
        return run_end.oom_kill_line(report, run_dir, overrides)
    from ptrun.launcher.memory_advice import keys_that_fit  # the planner's memory model: torch

    return run_end.oom_line(report, keys_that_fit(cfg, report), run_dir, overrides)


def _stopped(signum: int, run_dir: Path, overrides: list[str]) -> NoReturn:  # noqa: F821
    """After the workers stopped on a signal: one line saying where the checkpoint is and the command that
    resumes the run, and the exit code for that signal (130 after Ctrl-C; 143 after SIGTERM, which
    schedulers can requeue on)."""
    print(f"ptrun: {run_end.stopped_line(signum, run_dir, overrides)}", file=sys.stderr, flush=True)
    raise SystemExit(run_end.stop_code(signum))


def _fail_start(message: str, run_dir: Path, created_now: bool) -> NoReturn:  # noqa: F821
    """Bad input: the one-line error, and the run directory created for this start removed again (if nothing
    was written into it)."""
    if created_now and run_dir.is_dir() and not any(run_dir.iterdir()):
        run_dir.rmdir()
    fail(message)


def run_train(args: list[str]) -> None:
    try:
        register_schema()
    except ConfigError as e:
        fail(str(e))
    # Hydra's app parses it (a free-form mapping's entries as it takes them); the workers and trackers see it as
    # the command
    sys.argv = ["ptrun train", *entries(args)]
    if HYDRA_FLAGS.intersection(args):
        import hydra

        app = hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base=None)(hydra_job)
        app()
        if SWEEP_JOBS:
            print_sweep_summary(SWEEP_JOBS)
        return
    start = checked_start(args)
    # The run directory and its missing parents, as Hydra makes `hydra.run.dir` for its job (configs/train.yaml
    # asks Hydra for nothing else there: no `.hydra/`, no job log); a start that fails on bad input removes
    # it again while it is empty.
    run_dir = Path(start.cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    launch_run(start, run_dir, list(args), created_now=not any(run_dir.iterdir()))


def print_sweep_summary(jobs: list[tuple[Path, list[str]]]) -> None:
    """After a sweep: one line per point (the overrides that vary across points, final eval, time,
    speedup over the first point)."""
    from ptrun.report import ReportError, load_run
    from ptrun.report.summary import sweep_table

    try:
        runs = [load_run(run_dir) for run_dir, _ in jobs]
    except ReportError as e:
        print(f"ptrun: no sweep summary: {e}", file=sys.stderr)
        return
    print("\nsweep summary (`ptrun report " + str(jobs[0][0].parent) + "` draws the figures):")
    varying = [
        o
        for o in dict.fromkeys(o for _, overrides in jobs for o in overrides)
        if not all(o in overrides for _, overrides in jobs)
    ]
    print(sweep_table(runs, [" ".join(o for o in overrides if o in varying) for _, overrides in jobs]))
