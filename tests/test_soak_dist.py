"""The soak, short (benchmarks/soak.py runs the long one): 30 layout transitions of the real Trainer on 2 real
worker processes, cycling K = 2 / DP = 1 -> a frozen prefix -> K = 1 / DP = 2 with a cached prefix, and one
elastic restart (a worker SIGKILLs itself; the group resumes from the checkpoint). After warm-up no worker
gains a file descriptor or a thread, and private memory stays within the script's bound."""

from __future__ import annotations

import logging

import pytest

from benchmarks import soak

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # soak


def test_transitions_and_a_restart_leak_nothing(tmp_path, monkeypatch):
    # pytest keeps the log records it captures; the agent's record of the killed worker holds a traceback and
    # through it the dead worker group's pipes, which would count as descriptors the agent leaked.
    monkeypatch.setattr(logging.getLogger("torch.distributed.elastic"), "propagate", False)
    # forkserver: the workers skip their ~10 s of imports at each (re)start, which keeps this test short
    result = soak.soak(tmp_path, transitions=30, restarts=1, checkpoint_every=5, start_method="forkserver")
    assert result["problems"] == [], soak.table(result)
    rows = result["rows"]
    assert [(r["attempt"], r["rank"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # attempt 0 dies after transition 12; attempt 1 resumes at the checkpoint of transition 10
    assert [(r["from"], r["to"]) for r in rows] == [(0, 12), (0, 12), (10, 30), (10, 30)]
    judged = [r for r in rows if r["judged"]]
    assert judged, soak.table(result)
    for r in judged:
        assert r["fds"]["growth"] <= 0 and r["threads"]["growth"] <= 0 and r["os_threads"]["growth"] <= 0, r
        assert r["private_mib"]["growth"] <= result["memory_limit_mib_per_100"], r
    # the cycle really changes the layout: pipeline and data-parallel widths, freezing and caching
    plans = result["plans"]
    assert [(p["pp"], p["dp"]) for p in plans] == [(2, 1), (2, 1), (1, 2)]
    assert [p["frozen_units"] > 0 for p in plans] == [False, True, True]
    assert [p["cached_units"] > 0 for p in plans] == [False, False, True]
