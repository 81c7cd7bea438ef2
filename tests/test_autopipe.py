"""AutoPipe / AutoDP: the compression rule, start_max, DP = world / K, micro-batch picks, batch policies,
and the shape of the boundaries. Exact layouts use the `params` partitioner (an exact min-max, so each
expected layout can be checked by hand); the paper's greedy partitioner is checked for the K decisions."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ptrun.config import ConfigError
from ptrun.freezing.counts import frozen_units_for_blocks
from ptrun.freezing.policies import make_policy
from ptrun.layout.autopipe import next_plan, starting_max, unfrozen_plan
from ptrun.layout.microbatches import PAPER_MICROBATCHES, batch_sizes, min_microbatches, pick_microbatches
from ptrun.layout.partition import partition, stage_sums, weighted_costs
from ptrun.layout.plan import Plan, even_bounds

EQUAL = [1.0] * 18
"""8 blocks of equal halves: embedding, 16 halves, head, each costing 1."""
EQUAL_UNITS = len(EQUAL)


def start_plan(schedule="GPipe", world=8, pp=4, m=4, spr=1, units=EQUAL_UNITS):
    """A starting layout: everything trains, the units split evenly (`pipe.partition=uniform`), DP = world / K."""
    return Plan(
        num_units=units,
        frozen_units=0,
        pp=pp,
        dp=world // pp,
        stage_bounds=even_bounds(units, pp * spr),
        microbatches=m,
        schedule=schedule,
        stages_per_rank=spr,
    ).check()


def plan_after(blocks, method="params", **kw):
    args = dict(world_size=8, start_max=starting_max(EQUAL, 4, 1, method), global_batch=64, partition_method=method)
    args.update(kw)
    return next_plan(start_plan(), frozen_units_for_blocks(blocks), EQUAL, **args)


# ------------------------------------------------------------------------------------- compression rule


def test_starting_max():
    assert starting_max(EQUAL, 4, 1, "params") == 5.0  # 18 units over 4 stages: 5 5 4 4
    assert starting_max(EQUAL, 4, 2, "params") == 3.0  # over 8 stages
    assert starting_max([1.0, 2.0, 3.0, 4.0], 2, 1, "params") == 6.0  # (1+2+3 | 4) beats (1+2 | 3+4)
    assert starting_max(EQUAL, 4, 1, "uniform") == 5.0


@pytest.mark.parametrize("method", ["params", "pipetransformer"])
@pytest.mark.parametrize("blocks,pp", [(0, 4), (4, 4), (5, 2), (7, 2), (8, 1)])
def test_halving_decisions(method, blocks, pp):
    # K = 2 needs the weighted total near 2 x 5: 5 frozen blocks (11 units at 1/6 + 7 active = 8.83).
    # K = 1 needs it <= 5: only all 8 blocks (17/6 + 1 = 3.83); 7 blocks leave 15/6 + 3 = 5.5.
    plan = plan_after(blocks, method)
    assert (plan.pp, plan.dp) == (pp, 8 // pp)
    assert max(stage_sums(plan.stage_bounds, weighted_costs(EQUAL, plan.frozen_units))) <= 5.0


def test_start_max_comparison_is_at_most():
    # All blocks frozen: the one-stage layout costs exactly fsum(17 x 1/6 + 1).
    total = math.fsum(weighted_costs(EQUAL, 17))
    args = dict(world_size=8, global_batch=64, partition_method="params")
    assert next_plan(start_plan(), 17, EQUAL, start_max=total, **args).pp == 1
    assert next_plan(start_plan(), 17, EQUAL, start_max=total - 1e-6, **args).pp == 2
    # below even the two-stage layout's largest stage (2.0): K stays
    assert next_plan(start_plan(), 17, EQUAL, start_max=1.99, **args).pp == 4


def test_paper_sequence_with_alpha_freezing():
    # L = 12 on 16 ranks, K0 = 8, equal unit costs, the paper's closed-form freezing.
    costs = [1.0] * 26
    policy = make_policy("alpha", 12)
    start_max = starting_max(costs, 8, 1, "params")
    assert start_max == 4.0
    plan, frozen, seen = start_plan("1F1B", world=16, pp=8, m=16, units=26), 0, []
    for epoch in range(8):
        frozen = policy.decide(epoch, frozen, None)
        plan = next_plan(
            plan,
            frozen_units_for_blocks(frozen),
            costs,
            world_size=16,
            start_max=start_max,
            global_batch=256,
            partition_method="params",
        )
        seen.append((frozen, plan.pp, plan.dp))
    assert seen == [(0, 8, 2), (4, 8, 2), (7, 4, 4), (9, 4, 4), (10, 4, 4), (11, 2, 8), (11, 2, 8), (12, 2, 8)]


def test_micro_batch_tuning_times_the_unfrozen_layouts_autopipe_would_build():
    """At the starting length its own stages; at a shorter one every unit placed anew, DP = world / K; nothing
    frozen or cached, whatever the starting plan held."""
    first = replace(start_plan(pp=4, m=4), frozen_units=3, cached_units=0)
    costs = [float(c) for c in range(1, EQUAL_UNITS + 1)]
    same = unfrozen_plan(first, 4, 8, method="params", param_costs=costs, partition_kwargs={})
    assert (same.pp, same.dp, same.microbatches, same.stage_bounds) == (4, 2, 8, first.stage_bounds)
    assert same.frozen_units == same.cached_units == 0
    short = unfrozen_plan(first, 2, 2, method="params", param_costs=costs, partition_kwargs={})
    bounds = tuple(tuple(b) for b in partition("params", 2, num_units=EQUAL_UNITS, param_costs=costs))
    assert (short.pp, short.dp, short.microbatches, short.stage_bounds, short.frozen_units) == (2, 4, 2, bounds, 0)


def test_dp_is_world_over_k():
    plan = next_plan(
        start_plan(world=16), 17, EQUAL, world_size=16, start_max=5.0, global_batch=64, partition_method="params"
    )
    assert (plan.pp, plan.dp, plan.world_size) == (1, 16, 16)
    # an elastic restart on 12 ranks: K = 4 -> 1 gives 12 replicas
    assert (
        next_plan(start_plan(), 17, EQUAL, world_size=12, start_max=5.0, global_batch=48, partition_method="params").dp
        == 12
    )
    with pytest.raises(ConfigError):  # K = 4 does not divide 6 ranks
        next_plan(start_plan(), 0, EQUAL, world_size=6, start_max=5.0, global_batch=48)


# -------------------------------------------------------------------------------------------- boundaries


def test_frozen_prefix_lands_on_stage_zero():
    # 1 block frozen: 3 units at 1/6 (0.5), then 15 at 1. Max 4 forces stage 0 to hold exactly 3 active.
    plan = plan_after(1)
    assert plan.stage_bounds == ((0, 6), (6, 10), (10, 14), (14, 18))
    assert plan.stage_of_unit(plan.frozen_units - 1) == 0
    # 5 blocks, K = 2: 11 frozen + 3 active (4.83) | 4 active (4.0) beats 11 + 2 (3.83) | 5 (5.0)
    assert plan_after(5).stage_bounds == ((0, 14), (14, 18))
    for blocks in range(9):
        for method in ("params", "pipetransformer"):
            b = plan_after(blocks, method).stage_bounds
            assert b[0][0] == 0 and b[-1][1] == 18
            assert all(hi == lo for (_, hi), (lo, _) in zip(b, b[1:], strict=False))
            # the frozen units fill stages 0..s in order: only stage s may mix frozen and active units
            frozen = frozen_units_for_blocks(blocks)
            mixed = [s for s, (lo, hi) in enumerate(b) if lo < frozen < hi]
            assert len(mixed) <= 1
            assert all(hi <= frozen for lo, hi in b[: mixed[0]]) if mixed else True


def test_compress_off_keeps_k_and_moves_boundaries():
    plan = plan_after(8, compress=False)
    assert (plan.pp, plan.dp, plan.microbatches, plan.frozen_units) == (4, 2, 4, 17)
    assert plan.stage_bounds != start_plan().stage_bounds
    # 17 frozen units (2.83) over 3 stages and the head alone: the largest stage is exactly 1.0
    assert max(stage_sums(plan.stage_bounds, weighted_costs(EQUAL, 17))) == 1.0
    assert plan.stage_bounds == partition("params", 4, num_units=18, param_costs=EQUAL, frozen_units=17)


def test_stages_per_rank_carry_over():
    # Interleaved 1F1B, 2 stages per rank: start_max over 8 stages is 3; all blocks frozen fits 2 stages.
    start = start_plan("Interleaved1F1B", spr=2, m=8)
    plan = next_plan(
        start,
        17,
        EQUAL,
        world_size=8,
        start_max=starting_max(EQUAL, 4, 2, "params"),
        global_batch=64,
        partition_method="params",
    )
    assert (plan.pp, plan.stages_per_rank, plan.num_stages, plan.dp) == (1, 2, 2, 8)
    # 12 frozen (2.0) | 5 frozen + head (1.83); 11 | 6 + head ties at 2.0 and earlier stages take more
    assert plan.stage_bounds == ((0, 12), (12, 18))
    assert plan.microbatches == 4  # paper's 4 at K = 1; per-replica batch 8


# ------------------------------------------------------------------------------------------ micro-batches


def test_paper_table():
    assert PAPER_MICROBATCHES == {8: 16, 4: 16, 2: 16, 1: 4}
    assert [pick_microbatches(k, 64, "GPipe") for k in (8, 4, 2, 1)] == [16, 16, 16, 4]
    assert pick_microbatches(16, 128, "GPipe") == 64  # not in the table: GPipe's 4K


def test_profiled_table_overrides_per_length():
    assert pick_microbatches(4, 64, "GPipe", {4: 8}) == 8
    assert pick_microbatches(4, 64, "GPipe", {"4": 8}) == 8  # a table read back from JSON
    assert pick_microbatches(2, 64, "GPipe", {4: 8}) == 16  # K = 2 not profiled: the paper's
    with pytest.raises(ConfigError):
        pick_microbatches(4, 64, "GPipe", {4: 0})


def test_divisibility_fallback():
    assert pick_microbatches(4, 24, "GPipe") == 12  # 16 does not divide 24
    assert pick_microbatches(2, 10, "GPipe") == 10
    assert pick_microbatches(1, 6, "GPipe") == 3
    assert pick_microbatches(8, 7, "GPipe") == 7


def test_schedule_minimums():
    assert min_microbatches("GPipe", 8) == 1
    assert min_microbatches("1F1B", 8) == 8
    assert min_microbatches("Interleaved1F1B", 4, 2) == 4  # a multiple of K
    assert min_microbatches("DualPipeV", 4, 2) == 8
    assert pick_microbatches(8, 12, "1F1B") == 12
    with pytest.raises(ConfigError):
        pick_microbatches(8, 6, "1F1B")  # no divisor of 6 reaches 8 stages
    # target 4 is below DualPipeV's 2K = 8: the smallest acceptable count above it
    assert pick_microbatches(4, 24, "DualPipeV", {4: 4}, stages_per_rank=2) == 8
    # 1F1B takes 9 (>= K, divides 36); the interleaved schedules need a multiple of K: 4 (12 is above 10)
    assert pick_microbatches(4, 36, "1F1B", {4: 10}) == 9
    assert pick_microbatches(4, 36, "Interleaved1F1B", {4: 10}, stages_per_rank=2) == 4


def test_microbatches_kept_unless_layout_changes():
    assert plan_after(0).microbatches == 4  # the starting M (not the table's 16): nothing changed
    assert plan_after(5).microbatches == 16  # K = 2, per-replica 16: the paper's 16
    assert plan_after(8).microbatches == 4  # K = 1, per-replica 8: the paper's 4


# ---------------------------------------------------------------------------------------- batch policies


def test_batch_sizes():
    assert batch_sizes(4, batch_policy="fixed_global", global_batch=64) == (16, 64)
    assert batch_sizes(4, batch_policy="fixed_per_pipeline", per_pipeline_batch=32) == (32, 128)
    with pytest.raises(ConfigError):
        batch_sizes(3, batch_policy="fixed_global", global_batch=64)
    with pytest.raises(ConfigError):
        batch_sizes(4, batch_policy="fixed_per_pipeline")
    with pytest.raises(ConfigError):
        batch_sizes(4, batch_policy="doubling", global_batch=64)


def test_fixed_global_vs_fixed_per_pipeline():
    assert plan_after(5, global_batch=48).microbatches == 12  # per-replica 48 / 4 = 12
    per_pipe = plan_after(5, global_batch=None, batch_policy="fixed_per_pipeline", per_pipeline_batch=8)
    assert (per_pipe.pp, per_pipe.microbatches) == (2, 8)
    # global 36 splits over 4 replicas but not 8: fixed_global stops at K = 2, per-pipeline goes to 1
    assert plan_after(8, global_batch=36).pp == 2
    assert plan_after(8, batch_policy="fixed_per_pipeline", per_pipeline_batch=18).pp == 1


def test_bad_inputs():
    with pytest.raises(ConfigError):
        next_plan(start_plan(), 0, EQUAL[:-1], world_size=8, start_max=5.0, global_batch=64)
    with pytest.raises(ConfigError):  # the head must train
        next_plan(start_plan(), 18, EQUAL, world_size=8, start_max=5.0, global_batch=64)


# ------------------------------------------------------------------------------------------- AutoCache


def test_a_cached_prefix_runs_in_no_stage_and_costs_nothing():
    shorter = False
    for blocks in range(1, 8):
        f = frozen_units_for_blocks(blocks)
        plain = plan_after(blocks)
        cached = plan_after(blocks, cached_units=f)
        assert cached.cached_units == f and cached.stage_bounds[0][0] == 0
        assert cached.active_range(0) == (f, cached.stage_bounds[0][1])
        # the units after the prefix are split exactly as the partitioner splits them on their own
        active = [(max(lo, f) - f, hi - f) for lo, hi in cached.stage_bounds]
        assert active == [
            tuple(b) for b in partition("params", cached.num_stages, num_units=18 - f, param_costs=EQUAL[f:])
        ]
        assert cached.pp <= plain.pp
        shorter |= cached.pp < plain.pp
    assert shorter  # a prefix that is never run lets AutoPipe shorten the pipeline sooner


def test_plan_rejects_a_cache_beyond_the_frozen_prefix_or_the_first_stage():
    from dataclasses import replace

    plan = plan_after(2)
    assert plan.frozen_units == 5
    with pytest.raises(ConfigError, match="cached units 6"):
        replace(plan, cached_units=6).check()
    tight = replace(plan, frozen_units=plan.stage_bounds[0][1], cached_units=plan.stage_bounds[0][1])
    with pytest.raises(ConfigError, match="leaves the first stage a unit"):
        tight.check()


def caching_config():
    """The default config with AutoCache on and a global batch of 64."""
    from ptrun.config import PtrunConfig

    cfg = PtrunConfig(run_dir="unused")
    cfg.auto.cache = True
    cfg.train.global_batch_size = 64
    return cfg


def test_controller_caches_from_the_threshold_and_respects_fixed_stages():
    from ptrun.auto.controller import Controller

    cfg = caching_config()
    first = start_plan()
    controller = Controller(cfg, 8, EQUAL, first)
    assert controller.min_cache_units == 5  # a quarter of 8 blocks: the embedding and 2 blocks
    assert controller.plan_for(first, 1, 8).cached_units == 0
    assert controller.plan_for(first, 2, 8).cached_units == 5
    cfg.auto.pipe = False
    fixed = Controller(cfg, 8, EQUAL, first).plan_for(first, 7, 8)
    assert fixed.stage_bounds == first.stage_bounds and fixed.frozen_units == 15
    assert fixed.cached_units == first.stage_bounds[0][1] - 1  # the first stage keeps one unit to run


def test_the_cache_stops_where_the_model_keeps_only_the_first_token():
    from ptrun.auto.controller import Controller, start
    from ptrun.config import ModelConfig
    from ptrun.models import build_model

    cfg = caching_config()
    first = start_plan()
    capped = Controller(cfg, 8, EQUAL, first, max_cached_units=15)  # units 15, 16 return the first token only
    assert capped.plan_for(first, 7, 8).cached_units == 15 and capped.plan_for(first, 6, 8).cached_units == 13
    assert Controller(cfg, 8, EQUAL, first).plan_for(first, 7, 8).cached_units == 15  # uncapped: one unit a stage
    bert = build_model(ModelConfig(name="bert-tiny", depth=4, embed_dim=32, num_heads=2, vocab_size=100), num_classes=3)
    cfg.pipe.length, cfg.pipe.microbatches = 1, 1
    assert start(cfg, bert, 1).max_cached_units == bert.sequence_units == 7  # embed, 3 layers: its input


def test_a_prefix_too_long_for_the_pipeline_is_cached_shorter_not_dropped():
    from ptrun.auto.controller import Controller

    cfg = caching_config()
    cfg.auto.dp = False  # K stays 4: 4 stages need 4 uncached units
    first = start_plan()
    plan = Controller(cfg, 8, EQUAL, first).plan_for(first, 8, 8)  # 17 of 18 units frozen
    assert plan.pp == 4 and plan.frozen_units == 17
    assert plan.cached_units == 18 - 4  # one uncached unit per stage, the rest served by the cache
