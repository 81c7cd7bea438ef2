"""Signal handlers in a scope: whatever ptrun (or torch elastic, for ptrun) installs in a process is put back when
its block ends, so a caller that goes on (a Python program calling `ptrun.launcher.launch.launch`, a test session) keeps
its own handlers: Ctrl-C raises its KeyboardInterrupt again, SIGTERM ends it again.

torch elastic's agent takes over SIGTERM, SIGINT, SIGHUP and SIGQUIT when it starts its workers (its handler
raises `SignalException`) and never gives them back."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Iterator

ELASTIC_SIGNALS_DEFAULT = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""What elastic's process context handles unless TORCHELASTIC_SIGNALS_TO_HANDLE names others (as it reads it)."""


def elastic_signals() -> tuple[signal.Signals, ...]:
    """The signals elastic's agent will take over in this process (those it names that this platform has)."""
    names = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE", ELASTIC_SIGNALS_DEFAULT).split(",")
    found = (getattr(signal, name.strip(), None) for name in names)
    return tuple(dict.fromkeys(s for s in found if isinstance(s, signal.Signals)))


@contextlib.contextmanager
def handlers_restored(signums: Iterable[int]) -> Iterator[None]:
    """When the block ends, however it ends, each of `signums` has the handler it had when it began. Only a
    handler that changed is set again, so a block in another thread (where none can change) restores nothing;
    a handler installed outside Python (getsignal says None) cannot be set again and is left."""
    found = [(signum, signal.getsignal(signum)) for signum in signums]
    try:
        yield
    finally:
        for signum, handler in found:
            if handler is not None and signal.getsignal(signum) is not handler:
                signal.signal(signum, handler)


@contextlib.contextmanager
def elastic_handlers_restored() -> Iterator[None]:
    """Around an `elastic_launch` in this process: elastic's signals get back the handlers they had, and a
    signal that its handler turned into a SignalException leaving the block goes on to the handler it would
    have reached without elastic (Python's KeyboardInterrupt for SIGINT, SIGTERM's default end of the process,
    a caller's own), as if elastic had never taken it. Where that handler returns, the SignalException goes
    on."""
    from torch.distributed.elastic.multiprocessing.api import SignalException  # inner import: start-up

    try:
        with handlers_restored(elastic_signals()):
            yield
    except SignalException as e:
        signal.raise_signal(e.sigval)
        raise
