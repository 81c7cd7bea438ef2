"""Start the workers through torch.distributed.elastic (one machine or many, c10d rendezvous): elastic's
LaunchConfig for a run, the launch, and what its end means (a result, bad input a worker found, divergence, a stop
on a signal, a failure). Before it the rendezvous endpoint is checked (`rendezvous.py`); the workers start from the
server that imported their modules (`worker_server.py`), under ptrun's agent (`elastic_agent.py`)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

from ptrun.compat import launch_config_kwargs
from ptrun.config import ConfigError, PtrunConfig, parse_nnodes, workers_per_node
from ptrun.launcher import leftovers
from ptrun.launcher.elastic_agent import elastic_logs_to, ptrun_agent, quiet_agent_on_signals
from ptrun.launcher.lifeline import Janitor
from ptrun.launcher.worker_server import start_worker_server, worker_environment
from ptrun.signal_scope import elastic_signals, handlers_restored
from ptrun.train import run_end
from ptrun.train.run_end import Diverged, Interrupted, LaunchFailed, MachineFault

JOIN_TIMEOUT_S = 900  # c10d: how long the machines of a job may take to join its rendezvous
ELASTIC_LOG_DIR = "elastic"
"""Under the run directory: elastic's per-attempt directories, where a failed worker's error.json lands
(empty directories are removed after the launch, so a run without failures keeps none)."""


def launch_config(cfg: PtrunConfig, **overrides):
    """torch.distributed.elastic's LaunchConfig for `cfg.launcher` (c10d rendezvous); `overrides` replace
    fields (`start_method`, say). Also sets the environment restarts need."""
    # inner import: start-up (torch)
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    worker_environment()
    start_method = overrides.pop("start_method", None) or start_worker_server(cfg)
    lc = cfg.launcher
    min_nodes, max_nodes = parse_nnodes(lc.nnodes)
    return LaunchConfig(
        **launch_config_kwargs(
            {
                "min_nodes": min_nodes,
                "max_nodes": max_nodes,
                "nproc_per_node": workers_per_node(lc),  # `auto` resolved on this machine
                "run_id": lc.rdzv_id or f"{Path(cfg.run_dir).name}-{uuid.uuid4().hex[:8]}",
                "rdzv_backend": "c10d",
                "rdzv_endpoint": lc.rdzv_endpoint,
                # c10d: how long machines may take to join, and how long a rendezvous with MIN of them waits for more
                "rdzv_configs": {"join_timeout": JOIN_TIMEOUT_S, "last_call_timeout": lc.rdzv_last_call},
                "max_restarts": lc.max_restarts,
                "monitor_interval": lc.monitor_interval,
                # After Ctrl-C / SIGTERM the workers finish their step and write a checkpoint; then they are killed
                # (a torch without this field gets it from ptrun's agent: `ptrun.launcher.elastic_agent.ptrun_agent`).
                "shutdown_timeout": lc.stop_timeout,
                # elastic's own files under the run directory (by default a torchelastic_* directory in /tmp, kept)
                "logs_specs": DefaultLogsSpecs(log_dir=str(Path(cfg.run_dir) / ELASTIC_LOG_DIR)),
                "start_method": start_method,
                **overrides,
            }
        )
    )


def say_waiting(config) -> None:
    """Before a rendezvous of several machines, one line on stderr: what the launcher waits for, where and for
    how long (a silent wait looks like a hang). `config` is `launch_config`'s."""
    if config.max_nodes <= 1:
        return
    if config.min_nodes > 1:
        wait, what = config.rdzv_configs["join_timeout"], f"{config.min_nodes} machines"
        if config.max_nodes > config.min_nodes:
            what = f"at least {what} (up to {config.max_nodes})"
    else:  # an elastic job that may start alone: it waits last_call_timeout for others
        wait, what = config.rdzv_configs["last_call_timeout"], f"up to {config.max_nodes} machines"
    print(
        f"ptrun: waiting up to {wait} s for {what} to join at {config.rdzv_endpoint} (run the same command on each)",
        file=sys.stderr,
        flush=True,
    )


def launch(cfg: PtrunConfig, config_path: Path) -> dict:
    """Run `ptrun.launcher.worker.run_worker(config_path, errors)` on every worker; returns rank 0's result.

    Raises ConfigError when a worker found bad input (its one-line message; nothing is restarted), Diverged
    when training diverged and MachineFault on a fault of the machine (nothing is restarted either), Interrupted
    when a signal reached this process, and LaunchFailed when the workers failed otherwise more often than
    `launcher.max_restarts` allows. The signal handlers elastic's agent installs are restored when it ends."""
    # inner import: start-up
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    from ptrun.launcher.worker import run_worker  # the workers import it by name

    logs = Path(cfg.run_dir) / ELASTIC_LOG_DIR
    existed = logs.exists()
    config = launch_config(cfg)
    say_waiting(config)
    lc = cfg.launcher
    # Workers that find bad input write its one-line message here (node-local, outside the run directory).
    with (
        _janitor() as janitor,
        tempfile.TemporaryDirectory(prefix="ptrun-errors-") as tmp,
        ptrun_agent(Path(tmp), lc.stop_timeout, janitor, Path(cfg.run_dir) / "train.log") as errors,
        quiet_agent_on_signals(),
        elastic_logs_to(Path(cfg.run_dir) / "train.log"),
        _pruned(logs),
        _no_cache_left(cfg, janitor),
    ):
        signum, results = 0, {}
        try:
            # The environment goes along: a forkserver's children inherit the one it started with. The handlers
            # elastic installs are back when it returns (its SignalException is caught below either way): a
            # program that goes on after the launch (a test session, a caller of this function) keeps its own.
            with handlers_restored(elastic_signals()):
                results = elastic_launch(config, run_worker)(str(config_path), str(errors), dict(os.environ))
        except SignalException as e:
            signum = int(e.sigval)
        except ChildFailedError as e:
            reports = run_end.reports(errors, "bad_input")  # named by rank: the lowest rank's report
            if reports:
                if not existed:  # a start that failed on bad input leaves the run directory as it was
                    shutil.rmtree(logs, ignore_errors=True)
                raise ConfigError(reports[0].read_text().strip()) from None
            diverged = run_end.reports(errors, "diverged")
            if diverged:
                report = json.loads(diverged[0].read_text())
                raise Diverged(report["global_step"], report) from None
            faults = [json.loads(p.read_text()) for p in run_end.reports(errors, "fault", "oom_kill")]
            if faults:  # the rank that found the fault says where (a peer of a full disk's writer only that it was)
                raise MachineFault(
                    next((f for f in faults if f.get("path") or f["kind"] != "no_space"), faults[0])
                ) from None
            starts = run_end.reports(errors, "start")
            if starts:
                raise LaunchFailed(run_end.same_start_line(starts[0])) from None
            rank, failure = next(iter(e.failures.items()))
            raise LaunchFailed(run_end.failure_line(rank, failure, Path(cfg.run_dir) / "train.log")) from None
        except RendezvousError as e:  # e.g. the other machines did not join before the rendezvous timeout
            raise LaunchFailed(run_end.rendezvous_line(lc.rdzv_endpoint, e)) from None
    if signum:
        # Raised outside the handler, with the agent's frames collected: they hold its worker queues, whose
        # semaphores the resource tracker would otherwise report as leaked at exit.
        gc.collect()
        raise Interrupted(signum)
    return results.get(0, {}) if isinstance(results, dict) else {}


@contextlib.contextmanager
def _janitor():
    """A `ptrun.launcher.lifeline.Janitor` for the launch: what the launcher registers with it is removed if the
    launcher is killed."""
    janitor = Janitor()
    try:
        yield janitor
    finally:
        janitor.close()


@contextlib.contextmanager
def _no_cache_left(cfg: PtrunConfig, janitor):
    """While the launch runs and after it, however it ends: the node's AutoCache memory tier (in /dev/shm) goes
    unless `cache.keep`. Workers remove it when a run ends; the launcher covers workers that were killed or
    failed, and `janitor` a launcher that was killed. Before it, what earlier runs killed with their janitors
    left is swept (`ptrun.launcher.leftovers`), in one line."""
    from ptrun.auto.autocache import cache_dirs, shared_memory_root  # inner import: start-up (torch)

    root = shared_memory_root()
    line = leftovers.sweep_line(*leftovers.sweep(root), root)
    if line:
        print(line, file=sys.stderr, flush=True)
    tier = cache_dirs(cfg.cache, cfg.run_dir)[1] if cfg.auto.cache and not cfg.cache.keep else None
    if tier is not None:
        leftovers.claim(tier)
        janitor.remove_when_gone(tier)
    try:
        yield
    finally:
        if tier is not None:
            shutil.rmtree(tier, ignore_errors=True)


@contextlib.contextmanager
def _pruned(root: Path):
    """Remove the empty directories under `root` (and `root` itself, if empty) when the block ends."""
    try:
        yield
    finally:
        # Bottom-up; os.walk skips what vanishes meanwhile (the agents of several machines may share `root`
        # on a shared file system and prune it at the same time).
        for folder, _, _ in os.walk(root, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only empty ones go
