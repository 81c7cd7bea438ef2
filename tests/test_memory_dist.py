"""A worker holds its own stages, not the model: how its resident memory grows with the model.

A random-init BERT at hidden 768 trains 2 steps (64 tokens, batch 8, freezing and AutoCache off, no export,
1% of the texts held out so that the one evaluation is short) at 12 and at 24 layers (+85 M parameters), once
as one worker that holds everything (K = 1) and once as a 4-stage pipeline on 4 workers (K = 4, the recipe's
time-balanced stages, so the start measures every unit's profile). Each run's epoch event gives every
worker's parameter bytes and peak resident memory (the kernel's high-water mark), and its first plan event
each worker's resident memory once started and the parameter storage workers keep outside their stages: none.

Each K = 4 worker's growth is judged against its own share of the added parameters, read from the run (the
stages are balanced by measured times, so on a busy machine a worker may hold 4 of the 12 added layers, not
3): it grows as the single worker does, times that share. The texts are tokenized before the runs, so
that no run pays for tokenizing in its resident memory. A worker that kept what the start's profile filled
(every unit in turn, left behind in the host allocator) grows by the other workers' added parameters too:
once started, the bound sits halfway between the two. The peak, an allocator's high-water mark, is noisier
(0.9-1.4 times the worker's share measured on a busy machine): its bound is the other workers' added
parameters besides the share, which a worker holding their gradients or optimizer state would pass. Every
bound is made of the measured quantities, not of this machine's.
"""

from __future__ import annotations

import pytest
from conftest import compose_config, run_events, run_workers

from benchmarks.memory_growth import RUN as MEASURED

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

RUN = [*MEASURED, "launcher.max_restarts=0", "train.max_steps_per_epoch=2", "data.eval_fraction=0.01"]
"""What `benchmarks/memory_growth.py` measures, shorter: the optimizer's state is allocated by the first
step, so the second's peak is the training's; a failing worker fails the test."""
DEPTHS = (12, 24)
ADDED_PARAM_BYTES = 85e6 * 4
"""The 12 layers' parameters added from 12 to 24 layers, in fp32."""


def measured(tmp_path, workers: int) -> dict[str, list[int]]:
    """Per rank, the bytes by which each worker's held parameters (`held`), resident memory once started
    (`started`) and peak resident memory over the training (`peak`) grow from 12 to 24 layers at
    K = `workers`; every plan event says no worker kept parameter storage outside its stages."""
    runs = []
    for depth in DEPTHS:
        run_dir = tmp_path / f"k{workers}-depth{depth}"
        run_workers(
            [*RUN, f"model.depth={depth}", f"launcher.nproc_per_node={workers}", f"pipe.length={workers}"], run_dir
        )
        plans = run_events(run_dir, "plan")
        assert plans and all(p["unheld_param_bytes"] == 0 for p in plans), plans
        (epoch,) = run_events(run_dir, "epoch")
        memory = epoch["memory"]
        assert len(memory["peak_rss_bytes"]) == len(plans[0]["rss_bytes"]) == workers
        runs.append({"held": memory["param_bytes"], "started": plans[0]["rss_bytes"], "peak": memory["peak_rss_bytes"]})
    small, large = runs
    return {key: [b - a for a, b in zip(small[key], large[key], strict=True)] for key in small}


def tokenize_beforehand(tmp_path) -> None:
    """Fill ptrun's tokenized-data cache with the runs' texts, as a run does: the run that tokenizes them
    keeps what tokenizing left in its resident memory and the runs after it read the cache, so on a cold
    cache the first run would start larger than the others and the growths would compare unlike runs."""
    from ptrun.data import build_datasets

    cfg = compose_config([*RUN, f"model.depth={DEPTHS[0]}"], tmp_path / "data")
    build_datasets(cfg.data, task=cfg.model.task)


def test_a_pipeline_worker_grows_by_its_stages_share_of_the_model(tmp_path):
    tokenize_beforehand(tmp_path)
    one = measured(tmp_path, 1)
    four = measured(tmp_path, 4)
    (added,), (one_started,), (one_peak,) = one["held"], one["started"], one["peak"]
    assert added > 0.95 * ADDED_PARAM_BYTES, added
    assert one_started > 0.9 * added, (one_started, added)  # the single worker holds the added layers' parameters
    assert sum(four["held"]) == added, (four["held"], added)  # the stages hold each added parameter once
    mib = 2**20
    for rank, (held, started, peak) in enumerate(zip(four["held"], four["started"], four["peak"], strict=True)):
        share = held / added
        others = (1 - share) * added  # the other stages' added parameters
        # once started a worker holds parameters alone: halfway between its share and keeping the others' too
        kept = others / 2
        assert started <= share * one_started + kept, (
            f"once started, K = 4 rank {rank} (holding {share:.2f} of the added parameters) grew "
            f"{started / mib:.0f} MiB, the single worker {one_started / mib:.0f} MiB: at most "
            f"{(share * one_started + kept) / mib:.0f} MiB"
        )
        # its peak, a high-water mark, moves by its allocator's whims (0.9-1.4 times its share of the single
        # worker's growth, measured); one that held the others' gradients or optimizer state grew by more
        # than their parameters besides
        assert peak <= share * one_peak + others, (
            f"at its peak, K = 4 rank {rank} (holding {share:.2f} of the added parameters) grew "
            f"{peak / mib:.0f} MiB, the single worker {one_peak / mib:.0f} MiB: at most "
            f"{(share * one_peak + others) / mib:.0f} MiB"
        )
