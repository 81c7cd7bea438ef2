"""Freeze policies: the paper's closed form and full rule, AutoFreeze's percentile rule, the plasticity rule,
the linear baseline, the decision-epoch gate, the clamp to [current, cap], state round trips and the unit
helpers."""

from __future__ import annotations

import json
import math
import random
import statistics

import numpy as np
import pytest

from ptrun.config import ConfigError
from ptrun.freezing.counts import blocks_of_units, ceil_tol, floor_tol, frozen_units_for_blocks, percentile
from ptrun.freezing.policies import POLICIES, make_policy

PAPER = [0, 4, 7, 9, 10, 11, 11, 12]
"""The paper's schedule: L = 12, alpha = 1/3 over epochs 0..7."""


def run(policy, epochs, norms=None, start_blocks=0):
    """Call decide at every epoch boundary like the runtime does; the count in force at each epoch."""
    out, f = [], start_blocks
    for e in range(epochs):
        f = policy.decide(e, f, None if norms is None else norms[e])
        out.append(f)
    return out


# ------------------------------------------------------------------------------------------------ alpha


def test_closed_form_paper_sequence():
    p = make_policy("alpha", 12, alpha=1 / 3)
    assert [p.target(t) for t in range(8)] == PAPER
    assert run(p, 8) == PAPER


def test_closed_form_rounding_guard():
    # 10 * (1 - 0.7) evaluates to 3.0000000000000004: a bare ceil would freeze 4 blocks.
    assert math.ceil(10 * (1 - (1 - 0.3) ** 1)) == 4
    assert make_policy("alpha", 10, alpha=0.3).target(1) == 3
    assert ceil_tol(4.0000000001) == 4
    assert ceil_tol(4.01) == 5
    assert floor_tol(28.999999999999996) == 29
    # 0.29 * 100 evaluates to 28.999999999999996: the cap must still be 29.
    assert make_policy("alpha", 100, max_fraction=0.29).cap == 29


def test_monotone_and_capped_by_max_fraction():
    p = make_policy("alpha", 12, max_fraction=0.5)
    assert p.cap == 6
    assert run(p, 8) == [0, 4, 6, 6, 6, 6, 6, 6]
    # never below the current count (closed form at T = 1 is 4)
    assert make_policy("alpha", 12).decide(1, 9, None) == 9
    # a count already above the cap (a resumed run with a smaller max_fraction) is kept, not thawed
    assert p.decide(3, 8, None) == 8


def test_intervals_and_start_count_time_in_epochs():
    # Two-epoch intervals sample the same per-epoch curve at epochs 2, 4, 6 (T counts epochs, not decisions).
    assert run(make_policy("alpha", 4 * 3, every=2), 4) == [0, 7, 10, 11]
    assert run(make_policy("alpha", 12, every=2, start=1), 4) == [0, 4, 9, 11]  # T = 1, 3, 5
    p = make_policy("alpha", 12, every=3, start=2)
    assert [k for k in range(5) if p.is_decision(k)] == [1, 2, 3, 4]
    assert [p.freeze_step(k) for k in (1, 2, 3)] == [1, 4, 7]
    # Quarter-epoch intervals: the closed form at T = 0.25, 0.5, ... and the epoch values at every 4th.
    quarter = run(make_policy("alpha", 12, every=0.25), 13)
    assert quarter[::4] == PAPER[:4]
    assert quarter[:5] == [0, 2, 3, 4, 4] and quarter == sorted(quarter)
    # start counts epochs: nothing before the end of epoch 1, then the curve from there (T = 0.5 at 1.5)
    late = make_policy("alpha", 12, every=0.5, start=1)
    assert [k for k in range(6) if late.is_decision(k)] == [3, 4, 5]
    assert run(late, 6) == [0, 0, 0, 3, 4, 6]


def test_interval_zero_never_decides():
    p = make_policy("alpha", 12, alpha=0.9)
    assert not p.is_decision(0)
    assert p.decide(0, 0, None) == 0


def test_full_rule_inside_epochs_keeps_the_paper_pace():
    """Quarter-epoch decisions (without gradients) follow alpha's curve in time: the count at each epoch's
    end is the epoch-boundary rule's, not a block per decision (6 blocks: 2, 4 after epochs 1 and 2)."""
    quarter = make_policy("pipetransformer", 6, every=0.25)
    assert quarter.rate == pytest.approx(1 - (2 / 3) ** 0.25)
    counts = run(quarter, 9)
    assert counts == [0, 1, 2, 2, 2, 3, 3, 4, 4]  # ceil(6 (1 - (2/3)^t)) at t = 0, 0.25, ..., 2
    assert counts[4] == make_policy("pipetransformer", 6).decide(1, 0, None) == 2
    # the state carries the fraction across a resume
    resumed = make_policy("pipetransformer", 6, every=0.25)
    resumed.load_state_dict(json.loads(json.dumps(quarter.state_dict())))
    assert resumed.decide(9, 4, None) == quarter.decide(9, 4, None)
    # the gradient term holds the count back (bound 3, block 0 has the smallest norm); the next decision
    # goes on from the actual count: 1 + rate * 11 = 3.02, rounded up
    held = make_policy("pipetransformer", 12, every=0.5)
    assert held.decide(1, 0, [0.0] + [1.0] * 11) == 1
    assert held.decide(2, 1, [9.0] * 5 + [0.5] + [1.0] * 6) == 4


# ------------------------------------------------------------------------------------- pipetransformer


def test_full_rule_without_gradients_is_the_rounded_recursion():
    # ceil(F + alpha (L - F)) on the actual count: one step ahead of the closed form at T = 6.
    assert run(make_policy("pipetransformer", 12), 8) == [0, 4, 7, 9, 10, 11, 12, 12]


def test_full_rule_stops_at_smallest_gradient_layer():
    p = make_policy("pipetransformer", 12)
    norms = [5.0, 0.5, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 9.5, 10.0, 11.0, 12.0]
    # argmin is block 1, below the alpha bound 4: freeze blocks 0 and 1
    assert p.decide(1, 0, norms) == 2
    # argmin above the bound: the bound wins
    high = [5.0, 4.0, 3.0, 4.0, 6.0, 7.0, 8.0, 9.0, 9.5, 0.1, 11.0, 12.0]
    assert p.decide(1, 0, high) == 4


def test_full_rule_progresses_when_argmin_is_the_boundary():
    p = make_policy("pipetransformer", 12)
    # 3 frozen (their norms are 0 and ignored); the first active block 3 has the smallest norm
    norms = [0.0, 0.0, 0.0, 0.2, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert p.decide(1, 3, norms) == 4
    norms[4] = 0.1  # now block 4: freeze through it
    assert p.decide(1, 3, norms) == 5
    # ties go to the lowest block
    assert p.decide(1, 3, [0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.5] + [2.0] * 5) == 6
    # a non-finite norm never wins the argmin
    assert p.decide(1, 3, [0.0, 0.0, 0.0, math.nan, 3.0, 0.7, 2.0] + [2.0] * 5) == 6
    # bound = ceil(3 + 9/3) = 6 caps a late argmin
    assert p.decide(1, 3, [0.0] * 3 + [9.0] * 8 + [0.1]) == 6


def test_grad_norms_length_checked():
    with pytest.raises(ValueError):
        make_policy("pipetransformer", 12).decide(1, 0, [1.0] * 11)


# ------------------------------------------------------------------------------------------ autofreeze


def test_autofreeze_median_rule():
    p = make_policy("autofreeze", 6)
    e0 = [10.0] * 6
    e1 = [9.0, 9.5, 8.0, 5.0, 6.0, 4.0]  # changes 0.1 0.05 0.2 0.5 0.4 0.6 -> median 0.3 -> block 3
    e2 = [0.0, 0.0, 0.0, 4.9, 3.0, 3.9]  # active 3..5: 0.02 0.5 0.025 -> median 0.025 -> block 4
    assert p.decide(1, 0, e0) == 0  # first decision: nothing to compare with
    assert p.decide(2, 0, e1) == 3
    assert p.decide(3, 3, e2) == 4


def test_autofreeze_needs_consecutive_epochs():
    p = make_policy("autofreeze", 6)
    assert p.decide(1, 0, [10.0] * 6) == 0
    assert p.decide(2, 0, None) == 0  # not collected: the chain breaks
    assert p.decide(3, 0, [9.0, 9.5, 8.0, 5.0, 6.0, 4.0]) == 0
    # epoch 3's norms (from epoch 2) were recorded: epoch 4 compares epochs 3 and 2
    assert p.decide(4, 0, [8.91, 14.25, 12.0, 7.5, 9.0, 6.0]) == 1  # 0.01 then 0.5 x 5: median 0.5 -> block 1
    # a skipped boundary (no call at epoch 5): epoch 6's norms (epoch 5) are not compared with epoch 3's
    # (against them block 1 would change 0.01 and blocks 2..5 0.5: the rule would answer 2)
    assert p.decide(6, 1, [8.91, 14.3925, 18.0, 11.25, 13.5, 9.0]) == 1
    assert p.decide(7, 1, [8.91, 14.3925, 18.0, 16.875, 27.0, 27.0]) == 3  # 0 0 0.5 1 2 -> block 3


def test_autofreeze_observes_before_start():
    # start = 1 with half-epoch intervals: interval 2 (t = 1) is no decision but its norms are recorded, so
    # interval 3 compares intervals 2 and 1.
    p = make_policy("autofreeze", 4, every=0.5, start=1)
    assert p.decide(1, 0, [1.0, 1.0, 1.0, 1.0]) == 0
    assert p.decide(2, 0, [4.0, 4.0, 4.0, 4.0]) == 0  # not a decision
    assert p.decide(3, 0, [4.0, 4.2, 6.0, 8.0]) == 2  # 0 0.05 0.5 1 -> median 0.275 -> block 2


def median_rule(changes_by_interval: list[list[float]], frozen: int = 0) -> list[int]:
    """AutoFreeze's rule as it was written before the percentile (statistics.median over the active blocks'
    relative changes), for norms given per interval: the count at each interval."""
    out, prev = [], None
    for k, norms in enumerate(changes_by_interval):
        if k >= 1:  # interval 0 never decides
            active = range(frozen, len(norms))
            change = {block: abs(norms[block] - prev[block]) / prev[block] for block in active}
            median = statistics.median(change.values())
            frozen = max(frozen, next(block for block in active if change[block] >= median))
        prev = norms
        out.append(frozen)
    return out


def test_percentile_is_numpy_linear_and_the_median_exactly_at_50():
    rng = random.Random(0)
    for n in range(1, 14):
        for _ in range(50):
            values = [rng.lognormvariate(-2, 1.5) for _ in range(n)]
            assert percentile(values, 50) == statistics.median(values)  # bit for bit
            q = rng.uniform(0.5, 100)
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert percentile([3.0, 1.0, 2.0, 4.0], 100) == 4.0
    assert percentile([0.0, 10.0], 70) == pytest.approx(7.0)
    # numpy answers nan between two infinities; the threshold stays within its neighbours
    assert percentile([1.0, math.inf, math.inf], 70) == math.inf
    assert percentile([1.0, 2.0, math.inf], 50) == 2.0


def test_autofreeze_at_50_is_the_median_rule_and_70_freezes_more():
    # per block; sorted 0.05 0.1 0.2 0.35 0.5 0.6: the median 0.275 stops at block 3, the 70th percentile
    # (rank 3.5) 0.425 at block 4, the 100th 0.6 at block 5
    changes = [0.1, 0.05, 0.2, 0.35, 0.5, 0.6]
    e0 = [10.0] * 6
    e1 = [10.0 * (1 - c) for c in changes]
    assert [make_policy("autofreeze", 6, percentile=q).decide(2, 0, e1) for q in (50, 70)] == [0, 0]  # no history
    counts = {}
    for q in (50, 70, 100):
        p = make_policy("autofreeze", 6, percentile=q)
        p.decide(1, 0, e0)
        counts[q] = p.decide(2, 0, e1)
    assert counts == {50: 3, 70: 4, 100: 5}
    # 50 decides as the median rule did, interval after interval, on random norms
    rng = random.Random(1)
    for _ in range(20):
        norms = [[rng.uniform(0.5, 2.0) for _ in range(8)] for _ in range(6)]
        p, f, got = make_policy("autofreeze", 8, percentile=50), 0, []
        for k, n in enumerate(norms):
            f = p.decide(k, f, n)
            got.append(f)
        assert got == median_rule(norms)
        assert got == run(make_policy("autofreeze", 8), 6, norms)  # the default is 50
    with pytest.raises(ConfigError, match="freeze.percentile=0"):
        make_policy("autofreeze", 6, percentile=0)


# ------------------------------------------------------------------------------------------ plasticity


def test_plasticity_freezes_the_settled_prefix():
    p = make_policy("plasticity", 5, threshold=0.3)
    assert p.measure == "weight_change"
    assert p.decide(1, 0, [10.0, 8.0, 6.0, 4.0, 2.0]) == 0  # first measurement: every block at its peak
    assert p.peaks == [10.0, 8.0, 6.0, 4.0, 2.0]
    # blocks 0, 1 and 3 fell below 0.3 x their peak; block 2 did not (0.3 x 6 = 1.8): the prefix is 0, 1
    assert p.decide(2, 0, [2.9, 2.3, 1.9, 1.0, 5.0]) == 2
    assert p.peaks == [10.0, 8.0, 6.0, 4.0, 5.0]  # the peak of block 4 rose
    # 1.7 < 0.3 x 6 and 1.1 < 0.3 x 4 settle blocks 2 and 3; block 4 (1.6, not below 0.3 x 5) trains on
    assert p.decide(3, 2, [0.0, 0.0, 1.7, 1.1, 1.6]) == 4
    assert p.decide(4, 4, [0.0, 0.0, 0.0, 0.0, 1.4]) == 5
    # a frozen block never thaws, whatever is measured
    assert p.decide(5, 5, [9.0] * 5) == 5


def test_plasticity_needs_a_measurement_and_a_finite_value():
    p = make_policy("plasticity", 3)
    assert p.decide(1, 0, None) == 0 and p.peaks == [None] * 3  # nothing measured (a resume cut the interval)
    assert p.decide(2, 0, [1.0, 1.0, 1.0]) == 0
    assert p.decide(3, 0, None) == 0
    assert p.decide(4, 0, [math.inf, 0.1, 0.1]) == 0  # a non-finite value never settles and is no peak
    assert p.peaks == [1.0, 1.0, 1.0]
    assert p.decide(5, 0, [0.1, 0.1, 0.5]) == 2
    # a block that has only ever read 0 has not settled: below 0.3 x 0 is nothing
    q = make_policy("plasticity", 2)
    q.decide(1, 0, [0.0, 1.0])
    assert q.decide(2, 0, [0.0, 0.1]) == 0


def test_plasticity_respects_the_cap_and_start():
    p = make_policy("plasticity", 6, max_fraction=0.5)
    p.decide(1, 0, [1.0] * 6)
    assert p.decide(2, 0, [0.1] * 6) == 3  # every block settled; the cap is 3
    late = make_policy("plasticity", 4, every=0.5, start=1)
    assert late.decide(1, 0, [1.0] * 4) == 0
    assert late.decide(2, 0, [0.1] * 4) == 0  # no decision before epoch 1 ends, but the peaks are kept
    assert late.peaks == [1.0] * 4
    assert late.decide(3, 0, [0.2, 0.2, 0.5, 0.2]) == 2


def test_plasticity_state_round_trip_through_json():
    a = make_policy("plasticity", 4, threshold=0.5)
    a.decide(1, 0, [4.0, 2.0, math.inf, 1.0])
    state = json.loads(json.dumps(a.state_dict()))
    assert state == {"policy": "plasticity", "num_blocks": 4, "peaks": [4.0, 2.0, None, 1.0]}
    b = make_policy("plasticity", 4, threshold=0.5)
    b.load_state_dict(state)
    later = [1.0, 0.5, 3.0, 0.9]
    assert b.decide(2, 0, later) == a.decide(2, 0, later) == 2
    with pytest.raises(ValueError):
        make_policy("autofreeze", 4).load_state_dict(state)
    with pytest.raises(ConfigError, match="freeze.threshold=1"):
        make_policy("plasticity", 4, threshold=1.0)


# --------------------------------------------------------------------------------------- linear, none


def test_linear_ramp():
    assert run(make_policy("linear", 12, total_epochs=7, max_fraction=0.5), 7) == [0, 1, 2, 3, 4, 5, 6]
    assert run(make_policy("linear", 12, total_epochs=10, start=2), 10) == [0, 0, 0, 1, 3, 5, 6, 8, 10, 12]
    # no ramp length: never freezes
    assert run(make_policy("linear", 12, total_epochs=3, start=2), 3) == [0, 0, 0]
    with pytest.raises(ConfigError):
        make_policy("linear", 12)


def test_none_never_freezes():
    p = make_policy("none", 12)
    assert run(p, 6, norms=[[0.1] * 12] * 6) == [0] * 6
    assert p.decide(3, 5, None) == 5  # and never thaws


# ---------------------------------------------------------------------------------------- state, misc


def test_state_round_trip_through_json():
    a = make_policy("autofreeze", 6)
    a.decide(1, 0, [10.0, 10.0, 10.0, 10.0, 10.0, math.inf])
    state = json.loads(json.dumps(a.state_dict()))
    assert state == {"policy": "autofreeze", "num_blocks": 6, "prev_norms": [10.0] * 5 + ["inf"], "prev_interval": 0}
    b = make_policy("autofreeze", 6)
    b.load_state_dict(state)
    assert b.prev_norms == a.prev_norms and b.prev_interval == 0
    e1 = [9.0, 9.5, 8.0, 5.0, 6.0, 4.0]
    assert b.decide(2, 0, e1) == a.decide(2, 0, e1) == 3
    assert make_policy("alpha", 12).state_dict() == {"policy": "alpha", "num_blocks": 12}
    with pytest.raises(ValueError):
        make_policy("alpha", 12).load_state_dict(state)
    with pytest.raises(ValueError):
        make_policy("autofreeze", 7).load_state_dict(state)


def test_make_policy_rejects_bad_parameters():
    assert sorted(POLICIES) == ["alpha", "autofreeze", "linear", "none", "pipetransformer", "plasticity", "schedule"]
    for bad in (
        dict(name="fast"),
        dict(name="alpha", alpha=0.0),
        dict(name="alpha", alpha=1.0),
        dict(name="alpha", every=0),
        dict(name="alpha", max_fraction=1.5),
        dict(name="alpha", start=-1),
        dict(name="autofreeze", percentile=100.5),
        dict(name="plasticity", threshold=0.0),
    ):
        with pytest.raises(ConfigError):
            make_policy(num_blocks=12, **bad)


def test_unit_helpers():
    assert [frozen_units_for_blocks(f) for f in (0, 1, 4, 12)] == [0, 3, 9, 25]
    assert [blocks_of_units(u) for u in (0, 1, 2, 3, 4, 9, 25)] == [0, 0, 0, 1, 1, 4, 12]
    # every block frozen still leaves the head, the last of a 12-block model's 26 units (embedding, 24 halves,
    # head), training
    assert frozen_units_for_blocks(12) == 26 - 1
    assert all(blocks_of_units(frozen_units_for_blocks(f)) == f for f in range(30))


def test_schedule_policy_follows_its_list_and_holds_the_last_count():
    from ptrun.config import FREEZE_POLICIES

    assert sorted(FREEZE_POLICIES) == sorted(POLICIES)  # the config accepts exactly the implemented policies
    policy = make_policy("schedule", 6, blocks=[0, 2, 4])
    frozen, seen = 0, []
    for epoch in range(6):
        frozen = policy.decide(epoch, frozen)
        seen.append(frozen)
    assert seen == [0, 2, 4, 4, 4, 4]
    assert make_policy("schedule", 6, blocks=[0, 5], max_fraction=0.5).decide(1, 0) == 3  # capped
    for bad in ([], [0, 7], [-1]):
        with pytest.raises(ConfigError):
            make_policy("schedule", 6, blocks=bad)
