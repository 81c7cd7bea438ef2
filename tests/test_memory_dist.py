"""A worker holds its own stages, not the model: how its peak resident memory grows with the model.

A random-init BERT at hidden 768 trains 4 steps (64 tokens, batch 8, freezing and AutoCache off, no export) at
12 and at 24 layers (+85 M parameters), once as one worker that holds everything (K = 1) and once as a
4-stage pipeline on 4 workers (K = 4, the recipe's time-balanced stages, so the start measures every unit's
profile). The largest K = 4 worker's growth over the single worker's is about 1/4 where a worker holds its
stages only; a worker that kept a whole model's worth (the start's profile fills every unit in turn, and the
host allocator kept what each left behind) grows by about a third. Each run's epoch event gives every
worker's peak resident memory (the kernel's high-water mark: deterministic enough to assert, unlike time),
and its first plan event each worker's resident memory once started and the parameter storage workers keep
outside their stages: none.
"""

from __future__ import annotations

import pytest
from conftest import run_events, run_workers

from benchmarks.memory_growth import RUN as MEASURED

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

RUN = [*MEASURED, "launcher.max_restarts=0"]
"""What `benchmarks/memory_growth.py` measures, once: a failing worker fails the test."""
MAX_GROWTH_RATIO = 0.35
"""A quarter of the model's growth per worker at K = 4, with room for what each process allocates besides: the
peak is an allocator's high-water mark, which measured 0.22-0.33 over rounds of the same runs."""


MAX_START_GROWTH_RATIO = 0.5
"""The same, of resident memory once started (before a step): parameters only, a quarter of them at K = 4 and
the few MiB each unit's start-up measurement leaves; a worker that kept what the start filled grows by more
than the single worker."""


def growth(tmp_path, workers: int) -> tuple[int, int]:
    """Bytes by which the largest worker's resident memory grows from 12 to 24 layers at K = `workers`: once
    started, and at its peak over the training; every plan event says no worker kept parameter storage
    outside its stages."""
    started, peaks = [], []
    for depth in (12, 24):
        run_dir = tmp_path / f"k{workers}-depth{depth}"
        run_workers(
            [*RUN, f"model.depth={depth}", f"launcher.nproc_per_node={workers}", f"pipe.length={workers}"], run_dir
        )
        plans = run_events(run_dir, "plan")
        assert plans and all(p["unheld_param_bytes"] == 0 for p in plans), plans
        started.append(max(plans[0]["rss_bytes"]))
        (epoch,) = run_events(run_dir, "epoch")
        assert len(epoch["memory"]["peak_rss_bytes"]) == workers
        peaks.append(max(epoch["memory"]["peak_rss_bytes"]))
    return started[1] - started[0], peaks[1] - peaks[0]


def test_a_pipeline_worker_grows_by_its_stages_share_of_the_model(tmp_path):
    one_started, one = growth(tmp_path, 1)
    four_started, four = growth(tmp_path, 4)
    assert one_started > 0.9 * 85e6 * 4, one_started  # the single worker holds the added layers' parameters
    mib = 2**20
    assert four_started <= MAX_START_GROWTH_RATIO * one_started, (
        f"once started, a K = 4 worker grew {four_started / mib:.0f} MiB, the single worker "
        f"{one_started / mib:.0f} MiB ({four_started / one_started:.2f}x, at most {MAX_START_GROWTH_RATIO}x)"
    )
    assert four <= MAX_GROWTH_RATIO * one, (
        f"at its peak, a K = 4 worker grew {four / mib:.0f} MiB, the single worker {one / mib:.0f} MiB "
        f"({four / one:.2f}x, at most {MAX_GROWTH_RATIO}x)"
    )
