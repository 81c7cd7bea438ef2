"""Stage partitioners: balance on known vectors, exact optima against brute force, frozen weighting, the
paper's greedy rule on a hand-worked vector, layout validity for every method, and one-line config errors."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys

import pytest

from ptrun.config import ConfigError
from ptrun.layout.partition import (
    FROZEN_COST,
    PARTITIONERS,
    explicit,
    min_max,
    partition,
    pipedream,
    pipetransformer,
    stage_sums,
    stage_times,
    uniform,
    weighted_costs,
)
from ptrun.layout.plan import even_bounds


def assert_layout(bounds, num_units: int, num_stages: int) -> None:
    """Contiguous, non-empty, integer half-open ranges from 0 to num_units, one per stage."""
    assert isinstance(bounds, tuple) and len(bounds) == num_stages
    assert bounds[0][0] == 0 and bounds[-1][1] == num_units
    for lo, hi in bounds:
        assert type(lo) is int and type(hi) is int and lo < hi
    for (_, hi), (lo, _) in zip(bounds, bounds[1:], strict=False):
        assert hi == lo


def all_layouts(n: int, s: int):
    """Every way to put s - 1 cuts between n units."""
    for cuts in itertools.combinations(range(1, n), s - 1):
        edges = (0, *cuts, n)
        yield tuple(zip(edges, edges[1:], strict=False))


def brute_best(n: int, s: int, stage_cost):
    """The documented optimum by enumeration: min largest stage, then leximax, then earlier stages larger."""

    def key(b):
        return tuple(sorted(stage_cost(b), reverse=True)), tuple(-hi for _, hi in b)

    return min(all_layouts(n, s), key=key)


def random_costs(rng: random.Random, n: int) -> list[float]:
    # Small integers give many ties (exercising the tie-break); floats give generic cases.
    if rng.random() < 0.5:
        return [float(rng.randint(0, 4)) for _ in range(n)]
    return [rng.uniform(0.0, 10.0) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------
# Balance on known vectors


@pytest.mark.parametrize(
    "costs, s, expect",
    [
        ([1, 1, 1, 1], 2, ((0, 2), (2, 4))),
        ([4, 1, 1, 1, 1], 2, ((0, 1), (1, 5))),
        # ViT-like with equal halves: embed 0.5, eight halves of 1, head 0.5. Into 2: 4.5 | 4.5.
        ([0.5] + [1] * 8 + [0.5], 2, ((0, 5), (5, 10))),
        # Into 4 the only layout with largest stage 2.5 is [.5,1,1] [1,1] [1,1] [1,1,.5].
        ([0.5] + [1] * 8 + [0.5], 4, ((0, 3), (3, 5), (5, 7), (7, 10))),
        # ViT-like with attention:MLP = 1:2 (4d^2 vs 8d^2 params): 0.25 + (1 + 2) * 2 = 6.25 on each side.
        ([0.25] + [1, 2] * 4 + [0.25], 2, ((0, 5), (5, 10))),
        ([3], 1, ((0, 1),)),
        ([1, 5, 1], 3, ((0, 1), (1, 2), (2, 3))),
    ],
)
def test_min_max_known(costs, s, expect):
    assert min_max(costs, s) == expect


@pytest.mark.parametrize("n, s", [(10, 4), (7, 3), (8, 8), (5, 1), (25, 8)])
def test_equal_costs_give_even_bounds(n, s):
    # The second tie-break (earlier stages larger) is chosen so equal costs reproduce the default layout.
    assert uniform(n, s) == even_bounds(n, s)
    assert min_max([2.0] * n, s) == even_bounds(n, s)
    assert pipedream([1.0] * n, [0.0] * n, s, 1.0) == even_bounds(n, s)


def test_min_max_prefers_the_most_balanced_optimum():
    # Bottleneck 10 is forced by the last unit; the five ones could go 1|4 (lexicographically smallest
    # boundaries) but the leximax tie-break keeps the second-largest stage small: 3|2.
    assert min_max([1, 1, 1, 1, 1, 10], 3) == ((0, 3), (3, 5), (5, 6))


# ---------------------------------------------------------------------------------------------------------
# Exact optima against brute force


def test_min_max_matches_brute_force():
    rng = random.Random(1234)
    for _ in range(300):
        n = rng.randint(1, 9)
        s = rng.randint(1, n)
        costs = random_costs(rng, n)
        got = min_max(costs, s)
        assert_layout(got, n, s)
        want = brute_best(n, s, lambda b, costs=costs: stage_sums(b, costs))
        best = min(max(stage_sums(b, costs)) for b in all_layouts(n, s))
        assert max(stage_sums(got, costs)) == pytest.approx(best, rel=1e-12, abs=1e-12), (costs, s)
        assert got == want, (costs, s)  # the documented tie-break, not just the bottleneck


def test_pipedream_matches_brute_force():
    rng = random.Random(99)
    for _ in range(300):
        n = rng.randint(1, 9)
        s = rng.randint(1, n)
        compute = random_costs(rng, n)
        activation = random_costs(rng, n)
        bandwidth = rng.choice([0.5, 1.0, 4.0, math.inf])
        got = pipedream(compute, activation, s, bandwidth)
        assert_layout(got, n, s)

        def times(b, compute=compute, activation=activation, bandwidth=bandwidth):
            return stage_times(b, compute, activation, bandwidth)

        best = min(max(times(b)) for b in all_layouts(n, s))
        assert max(times(got)) == pytest.approx(best, rel=1e-12, abs=1e-12), (compute, activation, s, bandwidth)
        assert got == brute_best(n, s, times), (compute, activation, s, bandwidth)


def test_pipedream_avoids_cutting_a_large_activation():
    compute, activation = [1, 1, 1, 1], [0, 10, 0, 0]
    # Balanced compute would cut after unit 1 and pay 10 to send its output: 2 + 10 = 12.
    assert min_max(compute, 2) == ((0, 2), (2, 4))
    assert max(stage_times(((0, 2), (2, 4)), compute, activation, 1.0)) == 12
    # PipeDream cuts elsewhere: 3 | 1 or 1 | 3 (bottleneck 3), earlier stage larger on the tie.
    got = pipedream(compute, activation, 2, 1.0)
    assert got == ((0, 3), (3, 4))
    assert max(stage_times(got, compute, activation, 1.0)) == 3
    # With free transfers it is the plain min-max.
    assert pipedream(compute, activation, 2, math.inf) == ((0, 2), (2, 4))


def test_stage_times_and_sums():
    b = ((0, 2), (2, 3), (3, 5))
    assert stage_sums(b, [1, 2, 3, 4, 5]) == [3, 3, 9]
    # Each stage but the last pays activation[hi - 1] / bandwidth.
    assert stage_times(b, [1, 2, 3, 4, 5], [10, 20, 30, 40, 50], 10.0) == [3 + 2, 3 + 3, 9]


def test_min_max_at_the_documented_size_is_a_valid_layout_no_worse_than_even():
    rng = random.Random(7)
    costs = [rng.uniform(0, 1) for _ in range(100)]
    got = min_max(costs, 32)  # 100 units on 32 stages (exactness on small sizes: the brute-force tests)
    assert_layout(got, 100, 32)
    even = [(i * 100 // 32, (i + 1) * 100 // 32) for i in range(32)]
    assert max(stage_sums(got, costs)) <= max(stage_sums(tuple(even), costs))


# ---------------------------------------------------------------------------------------------------------
# Frozen weighting


def test_weighted_costs():
    assert weighted_costs([6, 12, 18, 24], 2) == [6 * FROZEN_COST, 12 * FROZEN_COST, 18, 24]
    assert weighted_costs([6, 12], 0) == [6, 12]
    assert weighted_costs([6, 12], 2, frozen_weight=0.5) == [3, 6]
    assert FROZEN_COST == pytest.approx(1 / 6)
    with pytest.raises(ConfigError):
        weighted_costs([1, 2], 3)


def test_freezing_moves_the_first_boundary_right():
    costs = [1.0] * 10
    assert partition("params", 2, num_units=10, param_costs=costs) == ((0, 5), (5, 10))
    # Weighted: four units of 1/6 then six of 1. Stage 0 = 4/6 + 3 = 3.67 vs 3 beats 4/6 + 2 | 4.
    assert partition("params", 2, num_units=10, param_costs=costs, frozen_units=4) == ((0, 7), (7, 10))
    assert partition("time", 2, num_units=10, time_costs=costs, frozen_units=4) == ((0, 7), (7, 10))


@pytest.mark.parametrize("s", [2, 3])
@pytest.mark.parametrize("method", ["params", "time", "pipetransformer", "pipedream"])
def test_freezing_lets_stage_zero_take_more_units(method, s):
    # ViT-like: embed, six blocks of (attention 1, MLP 2), head. With enough active units left to fill the
    # later stages, each deeper freeze makes the prefix cheaper, so stage 0 must reach further.
    costs = [0.5] + [1.0, 2.0] * 6 + [0.5]
    n = len(costs)
    kw = dict(num_units=n, param_costs=costs, time_costs=costs, activation=[0.1] * n, bandwidth=1.0)
    prev = partition(method, s, **kw)[0][1]
    for frozen in (3, 5, 7):
        got = partition(method, s, frozen_units=frozen, **kw)
        assert_layout(got, n, s)
        assert got[0][1] > prev, (method, frozen, got)  # each deeper freeze moves stage 0's end right
        prev = got[0][1]


# ---------------------------------------------------------------------------------------------------------
# The paper's greedy rule


def test_pipetransformer_hand_worked():
    # costs [1, 1, 2, 2, 1, 1] into 3. Mean unit 8/6, so normalised x = [.75, .75, 1.5, 1.5, .75, .75].
    # Stage 0: left sum 6 over 3 stages -> mean 2; variance of x = E[x^2] - 1 = 6.75/6 - 1 = .125;
    #   limit 2.125: take .75, 1.5 (ok), 3.0 (over) -> (0, 2).
    # Stage 1: left [1.5, 1.5, .75, .75], sum 4.5 over 2 -> 2.25; mean unit 1.125,
    #   variance 5.625/4 - 1.125^2 = .140625; limit 2.390625: take 1.5, then 3.0 is over -> (2, 3).
    # Stage 2 takes the rest -> (3, 6). Raw sums 2, 2, 4 (the optimum's largest is 4 too).
    assert pipetransformer([1, 1, 2, 2, 1, 1], 3) == ((0, 2), (2, 3), (3, 6))


def test_pipetransformer_variance_slack_lets_a_stage_overshoot():
    # [5, 5, 1, 9] into 2: x = [1, 1, .2, 1.8], mean_0 = 2, variance 5.28/4 - 1 = .32, limit 2.32.
    # Stage 0 takes 1, 2, 2.2 and stops before 4.0 -> (0, 3): raw 11 | 9. The rule is a heuristic; the
    # exact min-max is 10 | 10. Without the variance term stage 0 would stop at 2.0 = the mean.
    assert pipetransformer([5, 5, 1, 9], 2) == ((0, 3), (3, 4))
    assert min_max([5, 5, 1, 9], 2) == ((0, 2), (2, 4))


@pytest.mark.parametrize(
    "costs, s, expect",
    [
        ([1, 1, 1, 1], 2, ((0, 2), (2, 4))),  # "below" read as "not above": equal units fill their fair share
        ([0.1] * 6, 3, ((0, 2), (2, 4), (4, 6))),  # the same through float rounding (0.1 is inexact)
        ([4, 1, 1, 1, 1], 2, ((0, 1), (1, 5))),
        # A huge first unit: stage 0 may exceed its limit with its first unit but must leave one unit per stage.
        ([100, 1, 1, 1], 3, ((0, 2), (2, 3), (3, 4))),
        ([0, 0, 0], 2, ((0, 2), (2, 3))),  # all-zero costs fall back to the even layout
    ],
)
def test_pipetransformer_known(costs, s, expect):
    assert pipetransformer(costs, s) == expect


def test_pipetransformer_is_scale_free():
    rng = random.Random(5)
    for _ in range(50):
        n = rng.randint(2, 12)
        s = rng.randint(1, n)
        costs = [rng.uniform(0.1, 5) for _ in range(n)]
        base = pipetransformer(costs, s)
        for scale in (1e-6, 3.0, 1e6):  # parameters vs megabytes vs bytes must not change the layout
            assert pipetransformer([c * scale for c in costs], s) == base


# ---------------------------------------------------------------------------------------------------------
# Every method gives a valid layout


@pytest.mark.parametrize("method", PARTITIONERS)
def test_every_method_returns_a_valid_layout(method):
    rng = random.Random(hash(method) % 1000)
    for _ in range(150):
        n = rng.randint(1, 14)
        s = rng.randint(1, n)
        frozen = rng.randint(0, n - 1)
        stages = None
        if method == "explicit":
            cuts = sorted(rng.sample(range(1, n), s - 1))
            stages = [[lo, hi] for lo, hi in zip([0, *cuts], [*cuts, n], strict=True)]
        got = partition(
            method,
            s,
            num_units=n,
            param_costs=random_costs(rng, n),
            time_costs=random_costs(rng, n),
            activation=random_costs(rng, n),
            bandwidth=rng.choice([1.0, 100.0]),
            frozen_units=frozen,
            stages=stages,
        )
        assert_layout(got, n, s)
        if stages is not None:
            assert got == tuple(map(tuple, stages))


def test_dispatch_uses_the_right_cost_vector():
    params, times = [1, 1, 1, 9], [9, 1, 1, 1]
    kw = dict(num_units=4, param_costs=params, time_costs=times, activation=[0] * 4, bandwidth=1.0)
    assert partition("params", 2, **kw) == ((0, 3), (3, 4))
    assert partition("pipetransformer", 2, **kw) == ((0, 3), (3, 4))
    assert partition("time", 2, **kw) == ((0, 1), (1, 4))
    assert partition("pipedream", 2, **kw) == ((0, 1), (1, 4))
    assert partition("uniform", 2, **kw) == ((0, 2), (2, 4))


# ---------------------------------------------------------------------------------------------------------
# Explicit layouts and errors


def test_explicit_accepts_valid_lists():
    assert explicit([[0, 3], [3, 10]], 10) == ((0, 3), (3, 10))
    assert explicit(((0, 10),), 10) == ((0, 10),)


@pytest.mark.parametrize(
    "stages",
    [
        [[0, 3], [4, 10]],  # gap
        [[0, 4], [3, 10]],  # overlap
        [[0, 0], [0, 10]],  # empty range
        [[0, 5]],  # does not reach the end
        [[1, 10]],  # does not start at 0
        [[0, 5], [5, 11]],  # past the end
        [[0, 5.0], [5.0, 10]],  # floats
        [[0, True], [True, 10]],  # bools
        [[0, 1, 2], [2, 10]],  # not a pair
        [[0, 5], 10],  # not a list of pairs
        [],
        "0-10",
        None,
    ],
)
def test_explicit_rejects_bad_lists(stages):
    with pytest.raises(ConfigError) as e:
        explicit(stages, 10)
    msg = str(e.value)
    assert msg.startswith("pipe.stages=") and "\n" not in msg and "0..10" in msg


def test_explicit_message_example():
    with pytest.raises(
        ConfigError,
        match=r"^pipe\.stages=\[\[0, 3\], \[4, 10\]\] must be contiguous non-empty "
        r"\[lo, hi\) ranges covering units 0\.\.10$",
    ):
        explicit([[0, 3], [4, 10]], 10)


def test_explicit_stage_count_must_match():
    with pytest.raises(ConfigError, match=r"pipe\.stages has 2 ranges .* 3 stages"):
        partition("explicit", 3, num_units=10, stages=[[0, 3], [3, 10]])
    with pytest.raises(ConfigError, match="pipe.stages"):
        partition("explicit", 2, num_units=10)


def one_line_error(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        fn(*args, **kwargs)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_unknown_method():
    msg = one_line_error(partition, "greedy", 2, num_units=4, param_costs=[1] * 4)
    assert "pipe.partition='greedy'" in msg and all(m in msg for m in PARTITIONERS)


@pytest.mark.parametrize("method", PARTITIONERS)
def test_more_stages_than_units(method):
    msg = one_line_error(
        partition,
        method,
        5,
        num_units=4,
        param_costs=[1] * 4,
        time_costs=[1] * 4,
        activation=[1] * 4,
        bandwidth=1.0,
        stages=[[0, 1], [1, 2], [2, 3], [3, 4]],
    )
    assert "pipe.partition" in msg and "at most 4 stages" in msg


def test_direct_calls_reject_bad_stage_counts():
    for fn, args in [
        (uniform, (3, 4)),
        (min_max, ([1, 1, 1], 4)),
        (pipetransformer, ([1, 1, 1], 4)),
        (pipedream, ([1, 1, 1], [1, 1, 1], 4, 1.0)),
        (min_max, ([1, 1, 1], 0)),
    ]:
        assert "pipe.partition" in one_line_error(fn, *args)


@pytest.mark.parametrize(
    "method, kwargs, needle",
    [
        ("params", dict(time_costs=[1] * 4), "parameter costs"),
        ("pipetransformer", dict(time_costs=[1] * 4), "parameter costs"),
        ("time", dict(param_costs=[1] * 4), "time costs"),
        ("pipedream", dict(time_costs=[1] * 4, bandwidth=1.0), "activation sizes"),
        ("pipedream", dict(activation=[1] * 4, bandwidth=1.0), "time costs"),
        ("pipedream", dict(time_costs=[1] * 4, activation=[1] * 4), "bandwidth"),
        ("params", dict(param_costs=[1] * 3), "3 entries for 4 units"),
        ("params", dict(param_costs=[1, -1, 1, 1]), ">= 0"),
        ("time", dict(time_costs=[1, math.nan, 1, 1]), ">= 0"),
        ("pipedream", dict(time_costs=[1] * 4, activation=[1] * 4, bandwidth=0.0), "bandwidth > 0"),
    ],
)
def test_missing_or_bad_costs(method, kwargs, needle):
    msg = one_line_error(partition, method, 2, num_units=4, **kwargs)
    assert msg.startswith(f"pipe.partition={method}") and needle in msg


@pytest.mark.parametrize("method", ["uniform", "params", "time", "pipetransformer", "pipedream"])
def test_one_stage_holds_every_unit_without_costs(method):
    """A one-stage start (data parallelism alone) needs no profile: every method gives the whole model."""
    assert partition(method, 1, num_units=5) == ((0, 5),)


def test_a_one_stage_start_measures_no_profile(tmp_path):
    """The start profiles the units only when a time-based partitioner has stages to balance: a one-stage
    start returns before it touches the model or the data (both None here)."""
    from conftest import compose_config

    from ptrun.train.startup import measure_profile

    cfg = compose_config(["pipe.partition=time", "pipe.length=1"], tmp_path)
    assert measure_profile(cfg, None, None, None, 2, None) == (None, None)
    with pytest.raises(AttributeError):  # two stages do profile: they read the data
        measure_profile(compose_config(["pipe.partition=time", "pipe.length=2"], tmp_path), None, None, None, 2, None)


def test_module_does_not_import_torch():
    code = "import sys, ptrun.layout.partition; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
