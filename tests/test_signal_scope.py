"""Signal handlers in a scope (`ptrun.signal_scope`): what ptrun and torch elastic install in a process is put
back when their block ends, and a signal elastic's handler took goes on to the handler the caller had. The
signals are real (`signal.raise_signal`), and so are elastic's handler and ptrun's worker-side recorder."""

from __future__ import annotations

import signal
import threading

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException, _terminate_process_handler

from ptrun.signal_scope import elastic_handlers_restored, elastic_signals, handlers_restored
from ptrun.train.stop import StopRequests


@pytest.fixture
def python_ctrl_c():
    """Ctrl-C as Python sets it up (KeyboardInterrupt) for the test, whatever the session started with: a suite
    started in the background by a non-interactive shell inherits SIGINT ignored."""
    found = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, found)


def test_the_handlers_found_are_back_however_the_block_ends():
    mine, sigint, sigterm = [], signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: mine.append(signum))
    try:
        with pytest.raises(RuntimeError), handlers_restored([signal.SIGINT, signal.SIGTERM]):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, _terminate_process_handler)
            raise RuntimeError("the block failed")
        assert signal.getsignal(signal.SIGINT) is sigint
        signal.raise_signal(signal.SIGTERM)
        assert mine == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, sigterm)


def test_a_block_in_another_thread_restores_nothing():
    """No handler can change outside the main thread, and none may be set there: the scope only reads."""
    failures = []

    def run():
        try:
            with handlers_restored(elastic_signals()):
                pass
        except Exception as e:  # a ValueError if it tried to set one
            failures.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert failures == []


def test_elastic_signals_follow_its_environment_variable(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_SIGNALS_TO_HANDLE", raising=False)
    assert set(elastic_signals()) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}
    monkeypatch.setenv("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGUSR1, SIGNOPE,SIGTERM")
    assert elastic_signals() == (signal.SIGUSR1, signal.SIGTERM)


def test_ctrl_c_in_elastics_handler_becomes_the_callers_keyboard_interrupt(python_ctrl_c):
    """What Ctrl-C does while an agent runs in a test session: elastic's handler raises SignalException; once
    out of the block, the session's own handler raises the KeyboardInterrupt that ends the session."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt), elastic_handlers_restored():
        signal.signal(signal.SIGINT, _terminate_process_handler)  # as elastic's process context does
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_caller_handler_that_returns_sees_the_signal_and_the_exception_goes_on():
    seen, sigterm = [], signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(SignalException), elastic_handlers_restored():
            signal.signal(signal.SIGTERM, _terminate_process_handler)
            signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, sigterm)


def test_a_worker_records_ctrl_c_and_sigterm_only_while_installed(python_ctrl_c):
    found = [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)]
    stops = StopRequests()
    with stops.installed():
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt: recorded for the next step boundary
        signal.raise_signal(signal.SIGTERM)
    assert stops.received == signal.SIGTERM
    assert [signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)] == found
    with pytest.raises(KeyboardInterrupt):  # the test session's Ctrl-C again
        signal.raise_signal(signal.SIGINT)


def test_a_boundary_stops_on_the_agreed_signal_only_where_it_stops():
    """The loop asks at each of its boundaries (one worker here: the agreement is its own word). One that does
    not stop (the epoch's last step, a checkpoint between segments) answers 0 and leaves the agreed signal for
    the next that does; after a step the answer is the poll's, and one that waits reads the signal at once."""
    stops = StopRequests()
    assert stops.at_boundary(poll=True, wait=True, stops=True) == 0
    stops.received = signal.SIGTERM
    assert stops.at_boundary(poll=True, wait=False, stops=False) == 0 and stops.agreed == signal.SIGTERM
    assert stops.at_boundary(poll=True, wait=False, stops=True) == signal.SIGTERM
    waiting = StopRequests()
    waiting.received = signal.SIGINT
    assert waiting.at_boundary(poll=False, wait=False, stops=True) == 0  # nothing read: no step, no wait
    assert waiting.at_boundary(poll=False, wait=True, stops=True) == signal.SIGINT
