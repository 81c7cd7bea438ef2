"""Stopping on Ctrl-C or SIGTERM at a step boundary that every worker agrees on.

A terminal's Ctrl-C reaches the launcher and every worker at once; a scheduler's SIGTERM (SLURM before a time
limit or a preemption, Kubernetes before evicting a pod) may reach only some of them, and each worker notices
it between two different steps. Stopping where each one noticed would leave them in different steps of one
collective program and hang the job. So a worker's signal handler only records the signal, and the workers
agree on it with an all-reduce (MAX) of the signal number over all workers, on the host through gloo. The
all-reduce is started at one step boundary and read at the next, so its latency hides behind a step's
compute; every worker reads the same value at the same boundary, so all stop after the same step and write
one consistent checkpoint.

The same all-reduce carries what a worker's host knows of divergence (`divergence`, a
`ptrun.train.divergence.DivergenceWatch`, where the host learns it a step or more late): the workers then stop
together by raising Diverged, without a checkpoint. It also carries a write one worker made alone that found no
space (metrics.jsonl, train.log: `ptrun.train.machine_faults.note`): the workers then stop together by raising
OutOfSpace, without a checkpoint either (there is no room for one).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import torch
import torch.distributed as dist

from ptrun.signal_scope import handlers_restored
from ptrun.train import machine_faults
from ptrun.train.divergence import DivergenceWatch
from ptrun.train.run_end import Diverged, OutOfSpace

SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals the workers stop on at a step they agree on (`ptrun.train.run_end.Interrupted`, with the exit code
for each: `ptrun.train.run_end.stop_code`)."""


class StopRequests:
    """Records SIGINT / SIGTERM in this worker (inside `installed()`) and turns them into a decision that
    every worker of the process group shares (`poll()`)."""

    def __init__(self):
        self.received = 0  # the signal this worker received (0: none)
        self.agreed = 0  # the signal the workers agreed to stop on (0: go on)
        self.divergence = DivergenceWatch()  # what this worker has seen of the gradient norm
        self._pending: tuple[dist.Work, torch.Tensor] | None = None
        self._group = None  # the world's gloo group (None: the default group, when that is gloo)

    def connect(self) -> None:
        """Collective, once the default process group exists: with nccl, a gloo group over the same ranks, so
        the flag is a host tensor (reading a device tensor each step would make the host wait for the GPU)."""
        if dist.is_initialized() and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequests]:
        """While the block runs, Python's KeyboardInterrupt (and SIGTERM's default, which ends the process at
        once) are replaced by a record of the signal; when it ends, however it ends, the handlers it found are
        back (a program that runs the loop in its own process keeps its own). Main thread only, as Python
        requires."""
        with handlers_restored(SIGNALS):
            for signum in SIGNALS:
                signal.signal(signum, self._record)
            yield self

    def _record(self, signum: int, frame) -> None:
        self.received = max(self.received, signum)

    def poll(self) -> int:
        """Collective over the world group, at a step boundary: the signal every worker agreed to stop on,
        else 0 (Diverged if they agreed training diverged, OutOfSpace if a worker found no space). Reads the
        all-reduce started at the previous boundary and starts the next one."""
        if self.settle():
            return self.agreed
        self._start()
        return self.agreed

    def _start(self) -> None:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            self.agreed = self.received
            self._check(self.divergence.flag, int(machine_faults.noted() is not None))
            return
        full = int(machine_faults.noted() is not None)
        flag = torch.tensor([self.received, self.divergence.flag, full], dtype=torch.int64)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True), flag)

    def settle(self) -> int:
        """Collective: wait for the all-reduce in flight (before a collective program that must not overlap
        it, or at the end); the agreed signal, else 0 (Diverged if they agreed training diverged)."""
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            self._pending = None
            self.agreed = self.agreed or int(flag[0])
            self._check(int(flag[1]), int(flag[2]))
        return self.agreed

    def now(self) -> int:
        """Collective, blocking: the agreed signal including what arrived up to this call (at an epoch
        boundary or a checkpoint, where a wait of one all-reduce is nothing); Diverged if any step so far
        diverged on any worker (the device's word read now)."""
        self.divergence.read_now()
        self.settle()
        self._start()
        return self.settle()

    def at_boundary(self, poll: bool, wait: bool, stops: bool) -> int:
        """Collective, at one of the training loop's boundaries: where the boundary `stops`, the signal the
        workers agreed to stop on there (0: go on; always 0 where it does not stop); Diverged or OutOfSpace
        where they agreed on those. After a step of a synchronous runtime (`poll`) the stop is what the
        all-reduce started a step before says (`poll`); every word up to now is read (`now`) where the
        boundary `wait`s, or before the checkpoint of a polled stop."""
        polled = self.poll() if poll else 0
        if wait or (polled and stops):
            agreed = self.now()
            polled = polled if poll else agreed
        return polled if stops else 0

    @staticmethod
    def _check(diverged: int, full: int) -> None:
        if diverged:
            raise Diverged(diverged - 1)
        if full:  # the rank that found no space says what and where; the others only that a peer did
            raise machine_faults.noted() or OutOfSpace("run's files on another worker", None)
