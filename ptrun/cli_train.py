"""`ptrun train [overrides]`: a single run, or a Hydra sweep.

A single run's config is finished in one pass (`ptrun.launcher.start.finished_config`: composed and resolved
once, made for this machine, its run directory, data source and rendezvous checked, the layout's `auto` values
made numbers); then the start creates the run directory (`hydra.run.dir`) as Hydra would, writes the finished
YAML to a private file and launches the workers, which only read that file (rank 0 copies it to
RUN_DIR/config.yaml once the run has started). Hydra's own app runs only a sweep (`-m`: one job per point, each
finished by the same pass from what Hydra composed for it) and the flags that print (`--help`, `--cfg`, ...).
Bad input ends with one line on stderr naming the key or file and what is allowed, exit code 2, and the run
directory as it was (docs/errors.md lists the cases).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ptrun.cli_args import fail
from ptrun.compose import CONFIG_DIR, entries, register_schema, typed
from ptrun.config import ConfigError, PtrunConfig
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


SWEEP_JOBS: list[tuple[Path, list[str]]] = []
"""(run directory, the sweep's overrides) of each job of a `-m` sweep, in order, for its closing summary."""


def hydra_job(cfg: DictConfig) -> None:
    """Hydra's task function, for the jobs Hydra's app starts: each point of a `-m` sweep (or a run that a
    Hydra flag sent through the app). The job's config is the one Hydra composed for it, finished here as a
    single run's is (`finished_config`)."""
    # inner import: start-up
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from ptrun.launcher.start import finished_config

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir).resolve()  # Hydra created it
    overrides = list(hydra_cfg.overrides.task)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        SWEEP_JOBS.append((run_dir, overrides))
    created_now = not any(run_dir.iterdir())
    try:
        OmegaConf.resolve(cfg)
        cfg.run_dir = str(run_dir)
        finished = finished_config(overrides, os.environ, job=typed(cfg))
    except ConfigError as e:
        _fail_start(str(e), run_dir, created_now)
    launch_run(finished, run_dir, overrides, created_now)


def launch_run(cfg: PtrunConfig, run_dir: Path, overrides: list[str], created_now: bool) -> None:
    """Start the workers on the finished config `cfg` in `run_dir` (created: `created_now` says whether by this
    start); `overrides` make the command a stopped run resumes with."""
    from ptrun.launcher.launch import launch  # inner import: start-up

    # The workers read the resolved config from a private copy; rank 0 writes it to RUN_DIR/config.yaml once
    # the run has started, so a start that fails on bad input leaves the run directory as it was.
    with tempfile.TemporaryDirectory(prefix="ptrun-") as tmp:
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        try:
            launch(cfg, config_path)
        except ConfigError as e:  # bad input a worker found
            _fail_start(str(e), run_dir, created_now)
        except LaunchFailed as e:
            fail(str(e), code=run_end.ExitCode.FAILED)
        except Diverged as e:
            fail(run_end.diverged_line(e.report, cfg.optim.lr, run_dir, overrides), code=run_end.ExitCode.FAILED)
        except MachineFault as e:  # a full disk or an exhausted memory: a restart would fail the same way
            fail(fault_line(e.report, cfg, run_dir, overrides), code=run_end.ExitCode.FAILED)
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
    from ptrun.launcher.memory_advice import keys_that_fit  # inner import: start-up

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
        import hydra  # inner import: start-up

        app = hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base=None)(hydra_job)
        app()
        if SWEEP_JOBS:
            print_sweep_summary(SWEEP_JOBS)
        return
    from ptrun.launcher.start import finished_config  # inner import: start-up

    try:
        cfg = finished_config(args, os.environ)
    except ConfigError as e:
        fail(str(e))
    # The run directory and its missing parents, as Hydra makes `hydra.run.dir` for its job (configs/train.yaml
    # asks Hydra for nothing else there: no `.hydra/`, no job log), once the config is checked; a start that
    # fails on bad input a worker found removes it again while it is empty.
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    launch_run(cfg, run_dir, list(args), created_now=not any(run_dir.iterdir()))


def print_sweep_summary(jobs: list[tuple[Path, list[str]]]) -> None:
    """After a sweep: one line per point (the overrides that vary across points, final eval, time,
    speedup over the first point)."""
    # inner import: start-up
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
