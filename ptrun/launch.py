"""Start the workers through torch.distributed.elastic (one machine or many, c10d rendezvous)."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ptrun.compat import agent_shutdown, launch_config_kwargs
from ptrun.config import ConfigError, LauncherConfig, PtrunConfig, parse_nnodes, workers_per_node
from ptrun.config.model import FAMILY_SPECS, model_family

DEFAULT_RDZV_PORT = 29400  # torch's c10d default when the endpoint names no port
JOIN_TIMEOUT_S = 900  # c10d: how long the machines of a job may take to join its rendezvous
# torch's loggers that report a failed worker (with the agent's traceback) and the shutdown of the others
ELASTIC_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.multiprocessing.spawn")
# ... and the agent's, which reports a signal it received ("Received SIGINT death signal, shutting down
# workers"; the launcher's own line says what happened and how to resume)
AGENT_LOGGER = "torch.distributed.elastic.agent.server.api"
OWN_STOP_GRACE_S = 10
"""When the agent stops its workers itself (a restart after a failure, a job re-formed because machines left
or joined, the rest of a failed group), the seconds between SIGTERM and SIGKILL. Workers that can go on stop
at a step they agree on and write a checkpoint (the re-formed job resumes there); those whose peers are gone
end on the error the lost connection raises. Either way they exit as Python processes do, releasing what
they hold: a process SIGKILLed leaves its named semaphores in /dev/shm (multiprocessing's, such as the lock
tqdm makes for `datasets`) to the launcher's resource tracker, which warns about them when it exits, and to
nobody if the launcher dies too. A worker stuck in a collective that never returns is killed after the
grace, so a re-form waits at most this long."""
ELASTIC_LOG_DIR = "elastic"
"""Under the run directory: elastic's per-attempt directories, where a failed worker's error.json lands
(empty directories are removed after the launch, so a run without failures keeps none)."""


class LaunchFailed(RuntimeError):
    """The worker group failed more often than `launcher.max_restarts` allows."""


class Diverged(RuntimeError):
    """Training diverged: the workers stopped at the step they agreed on and reported it (`report`: where, and
    the learning rate the schedule gave it; `ptrun.train.divergence`)."""

    def __init__(self, report: dict):
        super().__init__(report)
        self.report = report


class Stopped(Exception):
    """The job stopped on a signal (Ctrl-C, SIGTERM) that reached this launcher, after its workers wrote a
    checkpoint at the step they agreed on (given `launcher.stop_timeout` seconds to)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def user_cache_dir() -> Path:
    """ptrun's directory for caches that outlive a run: $XDG_CACHE_HOME/ptrun, by default ~/.cache/ptrun."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ptrun"


def check_rendezvous(lc: LauncherConfig) -> None:
    """`launcher.rdzv_endpoint` must parse, its host resolve, and a one-machine job must be able to host its
    rendezvous store (that a job of several machines names an endpoint and id they can share was checked when
    the config was resolved: `ptrun.config.check_machines`).
    torch otherwise takes a busy local port for another agent's store, connects to whatever holds it and
    waits there until the rendezvous times out (a hang, not an error). Jobs of several machines may share the
    port with an agent of the same job on this machine, so only one-machine jobs are checked."""
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname, parse_rendezvous_endpoint

    try:
        host, port = parse_rendezvous_endpoint(lc.rdzv_endpoint, default_port=DEFAULT_RDZV_PORT)
    except ValueError:
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r} is not allowed: host:port with a port "
            f"0-65535 (localhost:0 picks a free one)"
        ) from None
    # A host that does not resolve makes torch retry inside its C++ store client until the join timeout and
    # then print pages of stack frames; every machine of the job needs the name, this one included.
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        reason = e.strerror if isinstance(e, socket.gaierror) else "not a valid host name"
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r}: host {host!r} does not resolve "
            f"({reason}); use a host name or address every machine resolves, or localhost:0 "
            f"for one machine"
        ) from None
    if parse_nnodes(lc.nnodes)[1] > 1 or port == 0 or not _matches_machine_hostname(host):
        return
    # Listen on every address, as the store will (create_server sets SO_REUSEADDR like the store does: a port
    # a finished run left in TIME_WAIT is free, one another process listens on is not).
    dual = socket.has_dualstack_ipv6()
    try:
        socket.create_server(
            ("", port), family=socket.AF_INET6 if dual else socket.AF_INET, dualstack_ipv6=dual
        ).close()
    except OSError as e:
        raise ConfigError(
            f"launcher.rdzv_endpoint={lc.rdzv_endpoint!r}: port {port} is not free on this machine "
            f"({os.strerror(e.errno)}); choose a free port, or localhost:0 for any"
        ) from None


def launch_config(cfg: PtrunConfig, **overrides):
    """torch.distributed.elastic's LaunchConfig for `cfg.launcher` (c10d rendezvous); `overrides` replace
    fields (`start_method`, say). Also sets the environment restarts need."""
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
                # (a torch without this field gets it from ptrun's agent: `_ptrun_agent`).
                "shutdown_timeout": lc.stop_timeout,
                # elastic's own files under the run directory (by default a torchelastic_* directory in /tmp, kept)
                "logs_specs": DefaultLogsSpecs(log_dir=str(Path(cfg.run_dir) / ELASTIC_LOG_DIR)),
                "start_method": start_method,
                **overrides,
            }
        )
    )


WORKER_MODULES = ["ptrun.worker", "ptrun.train.trainer", "sklearn.model_selection"]
"""What every worker imports before it can start: torch, ptrun's trainer, and scikit-learn's split, which the
offline sources use; `worker_modules` adds the model's library."""


def worker_modules(cfg: PtrunConfig) -> list[str]:
    """`WORKER_MODULES` and the library that builds `cfg.model` (`Family.preload`)."""
    return [*WORKER_MODULES, *FAMILY_SPECS[model_family(cfg.model)].preload]


def worker_environment() -> None:
    """What the workers' environment needs before the first of them (or the forkserver) starts."""
    # torch 2.13/2.14: restarted gloo workers fail in connectFullMesh when the agent shares its TCP store
    # with them (the store still holds the previous attempt's addresses); a separate store fixes restarts.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # Importing torch._dynamo (timm and the pipelining schedules do) creates torch's compile cache, by
    # default /tmp/torchinductor_USER; a cache that should outlive the run belongs with the user's caches.
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_cache_dir() / "torchinductor"))


def start_worker_server(cfg: PtrunConfig) -> str:
    """The workers' start method, with their server started now: `ptrun train` calls this as soon as the
    config is checked, so the server imports `worker_modules` while the launcher reads the data file it
    checks, imports elastic and forms the rendezvous (seconds of every start); `launch_config` calls it again
    (then it is running); `ptrun train` stops it as it ends (`stop_worker_server`).

    Workers are forked from a forkserver that imported the modules once; spawned where the platform has no
    forkserver. Not forked from the launcher: forked workers failed elastic restarts in the full test suite
    (a re-formed job never came up); the forkserver is a fresh single-threaded process that only imported
    modules (no CUDA, no threads, no process group), so its children start as clean as spawned ones. Every
    restart and every later launch here (a test session's) reuses it, with the modules of the first."""
    worker_environment()
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(worker_modules(cfg))
    try:
        forkserver.ensure_running()
    except OSError:  # its Unix socket lives under TMPDIR, whose path may be too long for one (~107 bytes)
        return "spawn"
    return "forkserver"


def stop_worker_server() -> None:
    """End the workers' server this process started, at once (its workers have ended, or none started), where
    closing its pipe would have it finish what it is importing, then tear its libraries down first; nothing
    without one."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's instance, which `ensure_running` started
    if getattr(server, "_forkserver_pid", None) is None:
        return
    os.kill(server._forkserver_pid, signal.SIGKILL)
    server._stop()  # reaps it and removes its socket file


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
    """Run `ptrun.worker.run_worker(config_path, errors)` on every worker; returns rank 0's result.

    Raises ConfigError when a worker found bad input (its one-line message; nothing is restarted), Diverged
    when training diverged (nothing is restarted either), Stopped when a signal reached this process, and
    LaunchFailed when the workers failed otherwise more often than `launcher.max_restarts` allows."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    from ptrun.worker import run_worker  # the workers import it by name

    logs = Path(cfg.run_dir) / ELASTIC_LOG_DIR
    existed = logs.exists()
    config = launch_config(cfg)
    say_waiting(config)
    lc = cfg.launcher
    # Workers that find bad input write its one-line message here (node-local, outside the run directory).
    with (
        tempfile.TemporaryDirectory(prefix="ptrun-errors-") as tmp,
        _ptrun_agent(Path(tmp), lc.stop_timeout) as errors,
        _quiet_agent_on_signals(),
        _pruned(logs),
        _no_cache_left(cfg),
    ):
        signum, results = 0, {}
        try:
            # The environment goes along: a forkserver's children inherit the one it started with.
            results = elastic_launch(config, run_worker)(str(config_path), str(errors), dict(os.environ))
        except SignalException as e:
            signum = int(e.sigval)
        except ChildFailedError as e:
            reports = config_reports(errors)  # named by rank: the lowest rank's report
            if reports:
                if not existed:  # a start that failed on bad input leaves the run directory as it was
                    shutil.rmtree(logs, ignore_errors=True)
                raise ConfigError(reports[0].read_text().strip()) from None
            diverged = diverged_reports(errors)
            if diverged:
                raise Diverged(json.loads(diverged[0].read_text())) from None
            starts = start_reports(errors)
            if starts:
                raise LaunchFailed(
                    f"every worker failed at start-up with the same error, so no restart: "
                    f"{json.loads(starts[0].read_text())['line']}"
                )
            rank, failure = next(iter(e.failures.items()))
            message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
            raise LaunchFailed(
                f"worker rank {rank} failed (exit code {failure.exitcode}): "
                f"{message.strip().splitlines()[-1] if message.strip() else 'see the log above'}"
            )
        except RendezvousError as e:  # e.g. the other machines did not join before the rendezvous timeout
            raise LaunchFailed(
                f"rendezvous at launcher.rdzv_endpoint={lc.rdzv_endpoint} failed: "
                f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            )
    if signum:
        # Raised outside the handler, with the agent's frames collected: they hold its worker queues, whose
        # semaphores the resource tracker would otherwise report as leaked at exit.
        gc.collect()
        raise Stopped(signum)
    return results.get(0, {}) if isinstance(results, dict) else {}


START_REPORT_WAIT_S = 10
"""After a worker failed at start-up, how long the agent waits for the other workers of its machine to fail
the same way before it decides whether to restart them (they run the same code, seconds apart at most)."""


def config_reports(errors: Path) -> list[Path]:
    """The bad-input reports workers wrote in `errors` (`ptrun.worker`), lowest rank first."""
    return sorted(errors.glob("rank*"))


def diverged_reports(errors: Path) -> list[Path]:
    """The reports of workers that stopped because training diverged (`ptrun.worker`), lowest rank first."""
    return sorted(errors.glob("diverged-rank*"))


def start_reports(errors: Path) -> list[Path]:
    """The start-up failure reports workers wrote in `errors` (`ptrun.worker.report_start_failure`)."""
    return sorted(errors.glob("start-rank*"))


def same_start_failure(errors: Path, local_workers: int) -> bool:
    """Whether every worker of this machine failed at start-up with the same error: a bug that a restart
    would only repeat. Otherwise (a worker killed, a peer lost, errors that differ) the reports are logged and
    removed, and elastic restarts the group as for any fault."""
    deadline = time.monotonic() + START_REPORT_WAIT_S
    while 0 < len(start_reports(errors)) < local_workers and time.monotonic() < deadline:
        time.sleep(0.1)
    reports = [json.loads(p.read_text()) for p in start_reports(errors)]
    if len(reports) == local_workers and len({r["line"] for r in reports}) == 1:
        return True
    for path, report in zip(start_reports(errors), reports):
        logging.getLogger(__name__).error("%s failed at start-up:\n%s", path.name[len("start-") :], report["traceback"])
        path.unlink(missing_ok=True)
    return False


@contextlib.contextmanager
def _no_cache_left(cfg: PtrunConfig):
    """After the launch, however it ended: the node's AutoCache memory tier (in /dev/shm) goes unless
    `cache.keep`. Workers remove it when a run ends; this covers workers that were killed or failed."""
    try:
        yield
    finally:
        if cfg.auto.cache and not cfg.cache.keep:
            from ptrun.auto.autocache import cache_dirs

            shutil.rmtree(cache_dirs(cfg.cache, cfg.run_dir)[1], ignore_errors=True)


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


@contextlib.contextmanager
def _quiet_agent_on_signals():
    """Once the agent has received a signal, drop its warnings about it and about passing it on to the
    workers: the launcher's own line says what happened and how to resume."""
    signalled = False

    def quiet(record: logging.LogRecord) -> bool:
        nonlocal signalled
        signalled = signalled or "death signal" in record.getMessage()
        return not signalled

    loggers = [logging.getLogger(name) for name in (AGENT_LOGGER, *ELASTIC_LOGGERS)]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _TidyAgent:
    """Mixed into elastic's agent: when it stops a worker group (a restart, or the end), it removes the files
    torch.multiprocessing pickles a raising worker's exception into (in the temp directory, never removed by
    torch). The agent has read them into the failure it reports by then."""

    def _shutdown(self, *args, **kwargs):
        workers = getattr(self._pcontext, "_pc", None)
        try:
            return super()._shutdown(*args, **kwargs)  # type: ignore[misc]
        finally:
            for name in getattr(workers, "error_files", None) or []:
                with contextlib.suppress(OSError):
                    os.unlink(name)


@contextlib.contextmanager
def _elastic_agent(make):
    """While the block runs, `elastic_launch` builds its agent from `make(LocalElasticAgent)`, a subclass (it
    takes the class from `torch.distributed.launcher.api`)."""
    import torch.distributed.launcher.api as launcher_api

    base = launcher_api.LocalElasticAgent
    launcher_api.LocalElasticAgent = make(base)
    try:
        yield
    finally:
        launcher_api.LocalElasticAgent = base


def tidy_agent():
    """While the block runs, `elastic_launch` builds an agent that leaves no worker exception files behind
    (`_TidyAgent`): for launches of other entry points than ptrun's workers (the soak benchmark)."""
    return _elastic_agent(lambda base: type("TidyAgent", (_TidyAgent, base), {}))


@contextlib.contextmanager
def _ptrun_agent(errors: Path, stop_timeout: float):
    """While elastic runs the workers, ptrun's agent:
    - once a worker has reported bad input or divergence in `errors`, or every worker of the machine the same
      error at start-up (`same_start_failure`), makes no restart (elastic restarts after any failure, which would only
      fail the same way), and drops the agent's log of the failure (a traceback of its own) and of stopping
      the other workers, since the one-line message says what happened;
    - passes on to the workers the Ctrl-C / SIGTERM it received itself, which they take for "stop at a
      checkpoint" (ptrun/train/stop.py), and waits `launcher.stop_timeout` for them. Its own stops (the rest
      of a failed group, a restart, a job re-formed for machines that left or joined) send SIGTERM too, but
      wait only `OWN_STOP_GRACE_S` before SIGKILL (see there).

    elastic_launch builds its agent from `torch.distributed.launcher.api.LocalElasticAgent`, so a subclass is
    put there for the duration."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    def make(base):
        class Agent(_TidyAgent, base):  # type: ignore[misc, valid-type]
            signalled = False

            def _invoke_run(self, *args, **kwargs):
                try:
                    return super()._invoke_run(*args, **kwargs)
                except SignalException:
                    self.signalled = True
                    raise

            def _shutdown(self, death_sig=signal.SIGTERM, timeout=None):
                if not self.signalled:  # a stop of the agent's own: a restart, a re-form, a failed group's end
                    death_sig, timeout = signal.SIGTERM, OWN_STOP_GRACE_S
                elif timeout is None:  # a torch whose agent passes no timeout (before 2.12)
                    timeout = stop_timeout
                agent_shutdown(self, super()._shutdown, base, death_sig, timeout)

            def _monitor_workers(self, worker_group):
                result = super()._monitor_workers(worker_group)
                if result.is_failed() and (
                    config_reports(errors)
                    or diverged_reports(errors)
                    or same_start_failure(errors, worker_group.spec.local_world_size)
                ):
                    self._remaining_restarts = 0
                return result

        return Agent

    def quiet(record: logging.LogRecord) -> bool:
        return not any(errors.iterdir())

    for name in ELASTIC_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        with _elastic_agent(make):
            yield errors
    finally:
        for name in ELASTIC_LOGGERS:
            logging.getLogger(name).removeFilter(quiet)
