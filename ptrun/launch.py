"""Start the workers through torch.distributed.elastic (one machine or many, c10d rendezvous)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import tempfile
import uuid
from pathlib import Path

from ptrun.config import ConfigError, LauncherConfig, PtrunConfig, parse_nnodes

EXIT_BAD_INPUT = 2
"""A worker's exit code for bad input it found (a checkpoint of another model, a broken dataset file), after
writing its one-line message into the launch's errors directory."""
DEFAULT_RDZV_PORT = 29400  # torch's c10d default when the endpoint names no port
# torch's loggers that report a failed worker (with the agent's traceback) and the shutdown of the others
ELASTIC_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")


class LaunchFailed(RuntimeError):
    """The worker group failed more often than `launcher.max_restarts` allows."""


def check_rendezvous(lc: LauncherConfig) -> None:
    """`launcher.rdzv_endpoint` must parse, and a one-machine job must be able to host its rendezvous store.
    torch otherwise takes a busy local port for another agent's store, connects to whatever holds it and
    waits there until the rendezvous times out (a hang, not an error). Jobs of several machines may share the
    port with an agent of the same job on this machine, so only one-machine jobs are checked."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

    try:
        host, port = parse_rendezvous_endpoint(lc.rdzv_endpoint, default_port=DEFAULT_RDZV_PORT)
    except ValueError:
        raise ConfigError(f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r} is not allowed: host:port with a port "
                          f"0-65535 (localhost:0 picks a free one)") from None
    if parse_nnodes(lc.nnodes)[1] > 1 or port == 0 or not _matches_machine_hostname(host):
        return
    # Listen on every address, as the store will (create_server sets SO_REUSEADDR like the store does: a port
    # a finished run left in TIME_WAIT is free, one another process listens on is not).
    dual = socket.has_dualstack_ipv6()
    try:
        socket.create_server(("", port), family=socket.AF_INET6 if dual else socket.AF_INET,
                             dualstack_ipv6=dual).close()
    except OSError as e:
        raise ConfigError(f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r}: port {port} is not free on this machine "
                          f"({os.strerror(e.errno)}); choose a free port, or localhost:0 for any") from None


def launch_config(cfg: PtrunConfig, **overrides):
    """torch.distributed.elastic's LaunchConfig for `cfg.launcher` (c10d rendezvous); `overrides` replace
    fields (`start_method`, say). Also sets the environment restarts need."""
    from torch.distributed.launcher.api import LaunchConfig

    # torch 2.13/2.14: restarted gloo workers fail in connectFullMesh when the agent shares its TCP store
    # with them (the store still holds the previous attempt's addresses); a separate store fixes restarts.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    lc = cfg.launcher
    min_nodes, max_nodes = parse_nnodes(lc.nnodes)
    return LaunchConfig(**{
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "nproc_per_node": lc.nproc_per_node,
        "run_id": lc.rdzv_id or f"{Path(cfg.run_dir).name}-{uuid.uuid4().hex[:8]}",
        "rdzv_backend": "c10d",
        "rdzv_endpoint": lc.rdzv_endpoint,
        # c10d: how long machines may take to join, and how long a rendezvous with MIN of them waits for more
        "rdzv_configs": {"join_timeout": 900, "last_call_timeout": lc.rdzv_last_call},
        "max_restarts": lc.max_restarts,
        "monitor_interval": lc.monitor_interval,
        **overrides,
    })


def launch(cfg: PtrunConfig, config_path: Path) -> dict:
    """Run `ptrun.worker.run_worker(config_path, errors)` on every worker; returns rank 0's result.

    Raises ConfigError when a worker found bad input (its one-line message; nothing is restarted) and
    LaunchFailed when the workers failed otherwise more often than `launcher.max_restarts` allows."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    from ptrun.worker import run_worker  # spawned workers import it by name

    # Spawned, not forked: forked workers (which would skip re-importing torch and the trainer, ~2.6 s of a
    # start here) failed elastic restarts in the full test suite (a re-formed job never came up), so the
    # workers start from a fresh interpreter, as torchrun's do.
    config = launch_config(cfg)
    lc = cfg.launcher
    # Workers that find bad input write its one-line message here (node-local, outside the run directory).
    with tempfile.TemporaryDirectory(prefix="ptrun-errors-") as tmp, _final_on_bad_input(Path(tmp)) as errors:
        try:
            results = elastic_launch(config, run_worker)(str(config_path), str(errors))
        except ChildFailedError as e:
            reports = sorted(errors.iterdir())  # named by rank: the lowest rank's report
            if reports:
                raise ConfigError(reports[0].read_text().strip()) from None
            rank, failure = next(iter(e.failures.items()))
            message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
            raise LaunchFailed(f"worker rank {rank} failed (exit code {failure.exitcode}): "
                               f"{message.strip().splitlines()[-1] if message.strip() else 'see the log above'}")
        except RendezvousError as e:  # e.g. the other machines did not join before the rendezvous timeout
            raise LaunchFailed(f"rendezvous at launcher.rdzv_endpoint={lc.rdzv_endpoint} failed: "
                               f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    return results.get(0, {}) if isinstance(results, dict) else {}


@contextlib.contextmanager
def _final_on_bad_input(errors: Path):
    """While elastic runs the workers: once one of them has reported bad input in `errors`, restarting the
    group would only fail the same way, so no restart is made (elastic restarts after any failure); and the
    agent's log of the failure (a traceback of its own) and of stopping the other workers is dropped, since
    the one-line message says what happened.

    elastic_launch builds its agent from `torch.distributed.launcher.api.LocalElasticAgent`, so a subclass is
    put there for the duration."""
    import torch.distributed.launcher.api as launcher_api

    base = launcher_api.LocalElasticAgent

    class Agent(base):  # type: ignore[misc, valid-type]
        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            if result.is_failed() and any(errors.iterdir()):
                self._remaining_restarts = 0
            return result

    def quiet(record: logging.LogRecord) -> bool:
        return not any(errors.iterdir())

    launcher_api.LocalElasticAgent = Agent
    for name in ELASTIC_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        yield errors
    finally:
        launcher_api.LocalElasticAgent = base
        for name in ELASTIC_LOGGERS:
            logging.getLogger(name).removeFilter(quiet)
