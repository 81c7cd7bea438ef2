"""PipeDream mode's pure parts: the 1F1B order each stage follows, the message header that lets a stage
allocate what it receives, and the simulator's step time without flushes."""

from __future__ import annotations

import pytest
import torch
from pipedream_cases import forward_versions, order_1f1b

from ptrun.layout.plan import Plan
from ptrun.parallel.pipedream import _header, _parse_header
from ptrun.sim.simulate import pipeline_seconds


def test_the_1f1b_order_warms_up_alternates_and_drains():
    assert list(order_1f1b(2, range(4), ())) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    assert list(order_1f1b(1, range(3), ())) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    # a segment ending at step 1: both in-flight steps finish before step 2 starts
    assert list(order_1f1b(3, range(4), (1,))) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("B", 1),
        ("F", 2),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    # stage s of K runs step t with the weights of K - s - 1 updates ago, once the pipeline is full
    assert forward_versions(3, 0, 6, ()) == [
        {0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3},
        {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4},
        {t: t for t in range(6)},
    ]


def test_a_stage_that_ends_the_stream_mid_warm_up_drains_what_it_started():
    assert list(order_1f1b(4, range(2), ())) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert list(order_1f1b(2, [], ())) == []


def test_the_header_carries_version_dtypes_and_shapes():
    tensors = (torch.zeros(2, 5, 8, dtype=torch.bfloat16), torch.zeros(2, 1, 1, 5), torch.zeros(3, dtype=torch.bool))
    version, specs = _parse_header(_header(tensors, 41))
    assert version == 41
    assert specs == [(torch.bfloat16, (2, 5, 8)), (torch.float32, (2, 1, 1, 5)), (torch.bool, (3,))]
    with pytest.raises(ValueError, match="at most 4 tensors"):
        _header(tuple(torch.zeros(1) for _ in range(5)), 0)


def test_without_flushes_a_step_takes_the_slowest_stage_not_the_bubble():
    bounds = ((0, 7), (7, 14))
    flushing = Plan(14, 0, 2, 1, bounds, 1, "GPipe").check()
    async_ = Plan(14, 0, 2, 1, bounds, 1, "pipedream").check()
    assert pipeline_seconds(async_, [0.6, 1.0]) == pytest.approx(1.0)  # the slowest stage sets the pace
    assert pipeline_seconds(flushing, [0.6, 1.0]) >= 1.6 - 1e-9  # a flushed step passes both stages in turn
    # "2-1": a replica's step is the input stage's time, or the shared stage running both replicas' batches
    replicated = Plan(14, 0, 2, 2, bounds, 1, "pipedream", replicate_first_only=True).check()
    assert pipeline_seconds(replicated, [1.0, 0.3]) == pytest.approx(1.0)
    assert pipeline_seconds(replicated, [1.0, 0.6]) == pytest.approx(1.2)


def test_a_replicated_first_stage_places_replicas_then_one_shared_rank_per_stage():
    from ptrun.config import ConfigError
    from ptrun.layout.plan import Plan, even_bounds

    shape = dict(num_units=6, frozen_units=0, pp=3, dp=2, stage_bounds=even_bounds(6, 3), replicate_first_only=True)
    plan = Plan(**shape, microbatches=1, schedule="pipedream").check()
    assert plan.world_size == 4  # "2-1-1"
    assert [plan.coords(r) for r in range(4)] == [(0, 0), (1, 0), (0, 1), (0, 2)]
    assert [plan.lanes(r) for r in range(4)] == [[0], [1], [0, 1], [0, 1]]
    assert plan.pipeline_ranks(1) == [1, 2, 3] and plan.pipeline_ranks(0) == [0, 2, 3]
    assert [plan.stage_ranks(s) for s in range(3)] == [[0, 1], [2], [3]]
    assert Plan.from_dict(plan.to_dict()) == plan
    with pytest.raises(ConfigError, match="stage replication needs pipedream"):
        Plan(**shape, microbatches=3, schedule="1F1B").check()
