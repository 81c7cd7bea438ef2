"""PipeDream mode's pure parts: the 1F1B order each stage follows, the message header that lets a stage
allocate what it receives, and the simulator's step time without flushes."""

from __future__ import annotations

import pytest
import torch

from pipedream_cases import forward_versions
from ptrun.parallel.pipedream import _header, _parse_header, async_1f1b
from ptrun.parallel.plan import Plan
from ptrun.sim.simulate import pipeline_seconds


def test_the_1f1b_order_warms_up_alternates_and_drains():
    assert list(async_1f1b(2, range(4), lambda t: False)) == [
        ("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)]
    assert list(async_1f1b(1, range(3), lambda t: False)) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                                               ("B", 2)]
    # a segment ending at step 1: both in-flight steps finish before step 2 starts
    assert list(async_1f1b(3, range(4), lambda t: t == 1)) == [
        ("F", 0), ("F", 1), ("B", 0), ("B", 1), ("F", 2), ("F", 3), ("B", 2), ("B", 3)]
    # stage s of K runs step t with the weights of K - s - 1 updates ago, once the pipeline is full
    assert forward_versions(3, 0, 6, ()) == [{0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3},
                                             {0: 0, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4},
                                             {t: t for t in range(6)}]



def test_a_stage_that_ends_the_stream_mid_warm_up_drains_what_it_started():
    assert list(async_1f1b(4, range(2), lambda t: False)) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert list(async_1f1b(2, [], lambda t: False)) == []


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
