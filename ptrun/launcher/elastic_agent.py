"""ptrun's elastic agent, put in the place of torch's while elastic runs the workers: it makes no restart once the
workers' reports say a restart would fail the same way (bad input, divergence, a full disk or an exhausted
memory, every worker's same start-up error),
passes a Ctrl-C / SIGTERM on as "stop at a checkpoint", gives its own stops a short grace, leaves no worker
exception files behind, and keeps elastic's logs quiet where the launcher's one line says what happened."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from ptrun.compat import agent_shutdown
from ptrun.launcher.lifeline import named_semaphores
from ptrun.launcher.oom_watch import OomWatch
from ptrun.train import run_end

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


START_REPORT_WAIT_S = 10
"""After a worker failed at start-up, how long the agent waits for the other workers of its machine to fail
the same way before it decides whether to restart them (they run the same code, seconds apart at most)."""


def oom_killed(errors: Path, failures: dict, watch) -> bool:
    """Whether a worker of `failures` (global rank -> elastic's ProcessFailure) died of SIGKILL where the machine
    says it killed it for want of memory (`watch`, a `ptrun.launcher.oom_watch.OomWatch`); its report is written."""
    for rank, failure in failures.items():
        if failure.exitcode != -signal.SIGKILL:
            continue
        source = watch.killed(failure.pid)
        if source is not None:
            report = {"kind": "oom_kill", "rank": rank, "pid": failure.pid, "peak": watch.peak.get(failure.pid, 0)}
            run_end.write_report(errors, "oom_kill", rank, {**report, "source": source})
            return True
    return False


def same_start_failure(errors: Path, local_workers: int, restarts: bool = True) -> bool:
    """Whether every worker of this machine failed at start-up with the same error: a bug that a restart
    would only repeat. Otherwise (a worker killed, a peer lost, errors that differ) the reports are logged and
    removed (where elastic `restarts`, one line each on the terminal; the tracebacks in train.log), and elastic
    restarts the group as for any fault."""
    deadline = time.monotonic() + START_REPORT_WAIT_S
    while 0 < len(run_end.reports(errors, "start")) < local_workers and time.monotonic() < deadline:
        time.sleep(0.1)
    reports = [json.loads(p.read_text()) for p in run_end.reports(errors, "start")]
    if len(reports) == local_workers and len({r["line"] for r in reports}) == 1:
        return True
    for path, report in zip(run_end.reports(errors, "start"), reports, strict=True):
        worker = path.name[len("start-") :]
        if restarts:  # one line on the terminal; the traceback goes to train.log (`elastic_logs_to`)
            print(f"ptrun: {worker} failed at start-up, so the workers restart: {report['line']}", file=sys.stderr)
        logging.getLogger(__name__).error("%s failed at start-up:\n%s", worker, report["traceback"])
        path.unlink(missing_ok=True)
    return False


@contextlib.contextmanager
def quiet_agent_on_signals():
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


@contextlib.contextmanager
def elastic_logs_to(log_file: Path):
    """While the block runs, what elastic logs of its workers (a failure with the worker's traceback, the others
    being stopped) and ptrun's agent of a start-up failure goes to `log_file` (the run's train.log), not to
    the terminal, where the launcher's one line says what happened. Installed after the filters that drop
    records: what they drop goes nowhere (a start that failed on bad input leaves no train.log)."""
    handler = logging.FileHandler(log_file, delay=True)  # opened by the first record: most runs write none
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def divert(record: logging.LogRecord) -> bool:
        with contextlib.suppress(OSError):  # a run directory that cannot take it: the record is dropped
            handler.handle(record)
        return False

    loggers = [logging.getLogger(name) for name in (*ELASTIC_LOGGERS, AGENT_LOGGER, __name__)]
    for logger in loggers:
        logger.addFilter(divert)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(divert)
        handler.close()


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
    import torch.distributed.launcher.api as launcher_api  # inner import: start-up

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
def ptrun_agent(errors: Path, stop_timeout: float, janitor=None, log: Path | None = None):
    """While elastic runs the workers, ptrun's agent:
    - once a worker has reported bad input, divergence or a fault of the machine in `errors` (or the kernel
      killed one for want of memory: `oom_killed`), or every worker of the machine the same error at start-up
      (`same_start_failure`), makes no restart (elastic restarts after any failure, which would only
      fail the same way), and drops the agent's log of the failure (a traceback of its own) and of stopping
      the other workers, since the one-line message says what happened;
    - before a restart after a failure none of these explains, says in one line which worker failed and how
      (`ptrun.train.run_end.failure_line`; its traceback goes to the run's train.log, `log`);
    - gives `janitor` (a `ptrun.launcher.lifeline.Janitor`) the named semaphores of each worker group's queues, which
      it unlinks if the launcher is killed with multiprocessing's resource tracker (a process group's SIGKILL);
    - tells its workers how often their group started before on this machine (`run_worker`'s `group_start`):
      a group restarted because machines joined resumes like one restarted after a failure;
    - passes on to the workers the Ctrl-C / SIGTERM it received itself, which they take for "stop at a
      checkpoint" (ptrun/train/stop.py), and waits `launcher.stop_timeout` for them. Its own stops (the rest
      of a failed group, a restart, a job re-formed for machines that left or joined) send SIGTERM too, but
      wait only `OWN_STOP_GRACE_S` before SIGKILL (see there).

    elastic_launch builds its agent from `torch.distributed.launcher.api.LocalElasticAgent`, so a subclass is
    put there for the duration."""
    from torch.distributed.elastic.multiprocessing.api import SignalException  # inner import: start-up

    watch = OomWatch()

    def make(base):
        class Agent(_TidyAgent, base):  # type: ignore[misc, valid-type]
            signalled = False
            group_starts = 0

            def _start_workers(self, worker_group):
                # Elastic counts only failures as restarts (TORCHELASTIC_RESTART_COUNT), not a re-form for machines
                # that joined, after which the workers must resume from the newest checkpoint too: they are told
                # how often this machine's group started before, as the worker function's last argument.
                spec = worker_group.spec
                self.base_args = getattr(self, "base_args", spec.args)
                spec.args = (*self.base_args, self.group_starts)
                self.group_starts += 1
                started = super()._start_workers(worker_group)
                if janitor is not None:
                    janitor.unlink_when_gone(named_semaphores(self._pcontext))
                return started

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
                watch.sample(w.id for w in worker_group.workers if w.id is not None)
                result = super()._monitor_workers(worker_group)
                if not result.is_failed():
                    return result
                said = bool(run_end.reports(errors, "start"))  # `same_start_failure` says those
                if (
                    run_end.reports(errors, "bad_input", "diverged", "fault", "oom_kill")
                    or oom_killed(errors, result.failures, watch)
                    or same_start_failure(errors, worker_group.spec.local_world_size, self._remaining_restarts > 0)
                ):
                    self._remaining_restarts = 0
                elif self._remaining_restarts > 0 and not said and log is not None:
                    rank, failure = min(result.failures.items())
                    print(
                        f"ptrun: {run_end.failure_line(rank, failure, log)}; the workers restart "
                        f"({self._remaining_restarts} restart(s) left)",
                        file=sys.stderr,
                        flush=True,
                    )
                return result

        return Agent

    def quiet(record: logging.LogRecord) -> bool:
        # once a worker reported, or the kernel killed one for want of memory, the launcher's line says it
        return not any(errors.iterdir()) and not watch.seen()

    for name in ELASTIC_LOGGERS:
        logging.getLogger(name).addFilter(quiet)
    try:
        with _elastic_agent(make):
            yield errors
    finally:
        watch.close()
        for name in ELASTIC_LOGGERS:
            logging.getLogger(name).removeFilter(quiet)
