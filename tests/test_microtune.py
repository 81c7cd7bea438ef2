"""Micro-batch auto-tuning (`pipe.microbatches=auto`): the candidates, the choice on synthetic cost tables, the
disk cache, the config, and the measurement inside a real (one-rank) trainer. No worker processes here; the
2-worker run is in test_microtune_dist.py."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from conftest import TINY, compose_config
from omegaconf import OmegaConf
from test_cache_entries import DAMAGES, damage, said

from ptrun.config import ConfigError, load_resolved
from ptrun.layout import tuning
from ptrun.layout.microtune import Length, candidates, choose, with_table


def ks_and_ms(lengths: list[Length]) -> list[tuple[int, tuple[int, ...]]]:
    return [(length.pp, length.microbatches) for length in lengths]


# ---- candidates ----------------------------------------------------------------------------------------------


def test_candidates_of_the_embedded_default():
    """K0 = 2 on 2 workers, batch 16, 1F1B: K = 2 (DP 1, 16 a replica) tries 2, 4, 8 (6, 10, 12 do not divide
    16); K = 1 (DP 2, 8 a replica) tries 1, 2, 4 of 1-6."""
    got = candidates(2, 2, 16, "1F1B")
    assert ks_and_ms(got) == [(2, (2, 4, 8)), (1, (1, 2, 4))]
    assert [(length.dp, length.per_replica, length.global_batch) for length in got] == [(1, 16, 16), (2, 8, 16)]
    assert ks_and_ms(candidates(2, 2, 16, "1F1B", shrinks=False)) == [(2, (2, 4, 8))]


def test_candidates_follow_the_halvings_and_the_batch_policy():
    fixed = candidates(8, 16, 128, "GPipe")
    assert ks_and_ms(fixed) == [(8, (8, 16, 32)), (4, (4, 8, 16)), (2, (2, 4, 8)), (1, (1, 2, 4))]
    assert {length.global_batch for length in fixed} == {128}
    # the paper's policy: each replica keeps its 64 samples, so the global batch grows with DP
    grown = candidates(8, 16, 128, "GPipe", batch_policy="fixed_per_pipeline")
    batches = [(length.per_replica, length.global_batch) for length in grown]
    assert batches == [(64, 128), (64, 256), (64, 512), (64, 1024)]
    assert ks_and_ms(grown)[-1] == (1, (1, 2, 4))
    # AutoPipe halves only an even K: 6 -> 3 and no further
    assert [length.pp for length in candidates(6, 6, 36, "GPipe")] == [6, 3]


def test_candidates_obey_the_schedule_and_fall_back_to_autopipes_pick():
    # the V schedules need M >= 2K stages' worth: K = 2 drops M = 2, K = 1 (two stages per rank) drops M = 1
    assert ks_and_ms(candidates(2, 2, 16, "ZBVZeroBubble", stages_per_rank=2)) == [(2, (4, 8)), (1, (2, 4))]
    # batch 6 on 4 workers: no multiple of K divides the replica batch at K = 4 or 2, so the one M AutoPipe
    # would pick there (the smallest the schedule takes); K = 1 (DP 4) cannot split 6 samples: not reachable
    assert ks_and_ms(candidates(4, 4, 6, "1F1B")) == [(4, (6,)), (2, (3,))]
    # pipedream runs one micro-batch: nothing to choose
    assert ks_and_ms(candidates(2, 2, 16, "pipedream")) == [(2, (1,)), (1, (1,))]
    with pytest.raises(ConfigError):  # the starting layout itself impossible
        candidates(2, 2, 1, "1F1B")


# ---- the choice on synthetic cost tables ---------------------------------------------------------------------


K2 = Length(pp=2, dp=1, per_replica=16, global_batch=16, microbatches=(2, 4, 8))
K1 = Length(pp=1, dp=2, per_replica=8, global_batch=16, microbatches=(1, 2, 4))


def test_the_fastest_wins_with_its_reason():
    costs = {(2, 2): 0.050, (2, 4): 0.040, (2, 8): 0.060, (1, 1): 0.020, (1, 2): 0.030, (1, 4): 0.040}
    got = choose([K2, K1], costs)
    assert {k: c.microbatches for k, c in got.items()} == {2: 4, 1: 1}
    assert got[2].reason == "M=4 at K=2: 400 samples/s, next best M=2 at 320 (-20%)"
    assert got[1].reason == "M=1 at K=1: 800 samples/s, next best M=2 at 533 (-33%)"


def test_within_three_percent_the_fewer_micro_batches_win():
    # M = 4 is 2.5% faster than M = 2: a tie, so M = 2; M = 8 is slower than both
    tie = {(2, 2): 0.0400, (2, 4): 0.0390, (2, 8): 0.0500}
    got = choose([K2], tie)[2]
    assert got.microbatches == 2
    assert got.reason == "M=2 at K=2: 400 samples/s, within 3% of the fastest M=4 (410, +3%): the fewer micro-batches"
    # 3.6% faster is no tie
    assert choose([K2], {**tie, (2, 4): 0.0386})[2].microbatches == 4
    # the smallest M inside the band wins, not the one nearest the fastest
    assert choose([K2], {(2, 2): 0.0405, (2, 4): 0.0401, (2, 8): 0.0400})[2].microbatches == 2
    assert choose([K2], tie, tie=0.0)[2].microbatches == 4


def test_a_length_with_one_candidate_needs_no_measurement():
    only = Length(pp=4, dp=1, per_replica=6, global_batch=6, microbatches=(6,))
    got = choose([only, K1], {(1, 1): 0.02, (1, 2): 0.01, (1, 4): 0.03})
    assert got[4].microbatches == 6 and got[4].reason == "M=6 at K=4: the only candidate"
    assert got[1].microbatches == 2
    with pytest.raises(ValueError, match="no step time for K=1, M=4"):
        choose([K1], {(1, 1): 0.02, (1, 2): 0.01})


def test_explicit_table_entries_win_at_their_length():
    choices = choose([K2, K1], {(2, 2): 0.05, (2, 4): 0.04, (2, 8): 0.06, (1, 1): 0.03, (1, 2): 0.02, (1, 4): 0.04})
    table, notes = with_table(choices, {"1": 1, 8: 16})  # keys as JSON gives them back, too
    assert table == {2: 4, 1: 1, 8: 16}
    assert notes == ["K=1 after a change: M=1 from auto.microbatch_table (measured: M=2)"]
    assert with_table(choices, {}) == ({2: 4, 1: 2}, [])


# ---- the disk cache ------------------------------------------------------------------------------------------


FIELDS = {"model": {"name": "vit"}, "world_size": 2, "host": "here"}
COSTS = {(2, 2): 0.05, (2, 4): 0.04, (2, 8): 0.06, (1, 1): 0.03, (1, 2): 0.02, (1, 4): 0.04}


def test_tune_measures_once_then_reads_the_cache(tmp_path):
    calls = []

    def measure():
        calls.append(1)
        return dict(COSTS)

    first = tuning.tune([K2, K1], FIELDS, measure_costs=measure, device=torch.device("cpu"), root=tmp_path)
    second = tuning.tune([K2, K1], FIELDS, measure_costs=measure, device=torch.device("cpu"), root=tmp_path)
    assert len(calls) == 1 and (first.source, second.source) == ("measured", "cached")
    assert second.costs == first.costs == COSTS and second.reason == first.reason
    assert {k: c.microbatches for k, c in second.choices.items()} == {2: 4, 1: 2}
    # other settings are another key: measured again, into another file
    other = tuning.tune(
        [K2, K1], {**FIELDS, "world_size": 4}, measure_costs=measure, device=torch.device("cpu"), root=tmp_path
    )
    assert other.source == "measured" and len(calls) == 2 and len(list(tmp_path.glob("*.json"))) == 2
    fields = first.event_fields()["microbatch_tuning"]
    assert fields["chosen"] == {"2": 4, "1": 2} and fields["samples_per_s"]["2"] == {"8": 266.7, "4": 400.0, "2": 320.0}


@pytest.mark.parametrize("content", ["{not json", '{"key": "0", "costs": []}', "[]", "REPLACE_KEY_BUT_DROP_A_COST"])
def test_a_corrupt_cache_file_is_ignored_with_a_warning_and_rewritten(tmp_path, caplog, content):
    path = tuning.cache_path(FIELDS, tmp_path)
    if content == "REPLACE_KEY_BUT_DROP_A_COST":  # the right key, but a candidate's time is missing
        tuning.store(path, FIELDS, {c: s for c, s in COSTS.items() if c != (1, 4)})
    else:
        path.write_text(content)
    with caplog.at_level(logging.WARNING, logger="ptrun.layout.tuning"):
        got = tuning.tune(
            [K2, K1], FIELDS, measure_costs=lambda: dict(COSTS), device=torch.device("cpu"), root=tmp_path
        )
    assert got.source == "measured"
    assert any(
        "is unusable" in r.getMessage() and "measuring again and rewriting it" in r.getMessage() for r in caplog.records
    )
    assert tuning.load(path, FIELDS, list(COSTS)) == COSTS  # rewritten, whole


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_cache_file_is_measured_again_in_one_line_to_the_same_choice(tmp_path, caplog, how):
    """A file with bytes flipped, cut short, or replaced by another key's file: one line naming it, measured
    again, the same choice as with a clean cache, and the file whole again."""
    path = tuning.cache_path(FIELDS, tmp_path)
    clean = tuning.tune([K2, K1], FIELDS, measure_costs=lambda: dict(COSTS), device=torch.device("cpu"), root=tmp_path)
    other = {**FIELDS, "world_size": 4}
    tuning.store(tuning.cache_path(other, tmp_path), other, {c: s * 2 for c, s in COSTS.items()})
    damage(path, how, tuning.cache_path(other, tmp_path))
    caplog.clear()
    got = tuning.tune([K2, K1], FIELDS, measure_costs=lambda: dict(COSTS), device=torch.device("cpu"), root=tmp_path)
    (line,) = said(caplog, path)
    assert line.startswith(f"micro-batch cache {path} is unusable: ") and line.endswith(tuning.AGAIN)
    assert got.source == "measured" and got.table == clean.table and got.reason == clean.reason
    assert tuning.load(path, FIELDS, list(COSTS)) == COSTS  # rewritten, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n + s for n in (path.name, tuning.cache_path(other, tmp_path).name) for s in ("", ".sum")
    )


def test_nothing_to_choose_measures_nothing_and_writes_nothing(tmp_path):
    only = [Length(2, 1, 16, 16, (1,)), Length(1, 2, 8, 16, (1,))]
    got = tuning.tune(
        only, FIELDS, measure_costs=lambda: pytest.fail("measured"), device=torch.device("cpu"), root=tmp_path
    )
    assert got.source == "no choice" and got.table == {2: 1, 1: 1} and not list(tmp_path.iterdir())


# ---- the config ----------------------------------------------------------------------------------------------


def test_auto_and_numbers_compose_validate_and_load_back(tmp_path):
    auto = compose_config(TINY + ["pipe.microbatches=auto"], tmp_path)
    assert auto.pipe.microbatches == "auto"
    four = compose_config(TINY + ["pipe.microbatches=4"], tmp_path)
    assert four.pipe.microbatches == 4 and isinstance(four.pipe.microbatches, int)
    for cfg, want in ((auto, "auto"), (four, 4)):
        path = tmp_path / f"{want}.yaml"
        path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        assert load_resolved(path).pipe.microbatches == want


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["pipe.microbatches=fast"],
            "pipe.microbatches='fast' is not allowed: an integer >= 1, auto, or unset (follows the pipeline length)",
        ),
        (
            ["pipe.microbatches=0"],
            "pipe.microbatches=0 is not allowed: an integer >= 1, auto, or unset (follows the pipeline length)",
        ),
        # 2 workers, K = 2, a batch of 1 sample: 1F1B needs 2 micro-batches, none divides it
        (
            ["pipe.length=2", "pipe.schedule=1F1B", "train.global_batch_size=1", "pipe.microbatches=auto"],
            "pipe.microbatches='auto' is not allowed: a count that suits 1F1B at pipe.length=2 and divides the "
            "per-replica batch 1; none does",
        ),
        # the schedule's stage rules still apply
        (
            ["pipe.schedule=DualPipeV", "pipe.microbatches=auto"],
            "pipe.stages_per_rank=1 is not allowed: 2 for DualPipeV (a V of two stages per rank)",
        ),
    ],
)
def test_bad_microbatches_is_one_line_naming_the_key(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        compose_config(TINY + ["launcher.nproc_per_node=2"] + overrides, tmp_path)
    assert str(e.value) == message


def test_the_planner_runs_auto_with_autopipes_table(tmp_path):
    """`ptrun plan` measures nothing: auto plans like the M AutoPipe's (the paper's) table gives at K0."""
    from test_simulator import paper_config

    from ptrun.sim import get_cluster
    from ptrun.sim.simulate import plan_epochs

    def plans(*extra):  # the paper's start, its micro-batches as `extra` says
        cfg, costs = paper_config("vit_imagenet", tmp_path, "pipe.length=8", *extra, start=())
        return plan_epochs(costs, get_cluster("paper"), cfg)[1]

    auto = plans("pipe.microbatches=auto")
    assert auto[0].microbatches == 16 and auto == plans("pipe.microbatches=16")


# ---- the measurement, in a real trainer on one rank ----------------------------------------------------------


def build_trainer(tmp_path, name: str, *extra: str):
    from ptrun.train.trainer import Trainer

    cfg = compose_config(
        TINY + ["launcher.nproc_per_node=1", "auto.cache=false", "model.dropout=0.1", *extra], tmp_path / name
    )
    return Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)


def test_tuning_in_the_trainer_changes_nothing_about_training(tmp_path, monkeypatch, one_rank_group):
    """The tuned trainer times K = 1 at M = 1, 2, 4 with real steps (head dropout draws random numbers), then
    holds the weights, gradients (none) and generator state of a trainer built with the chosen M. The
    recipe's auto.microbatch_table ({2: 2, 1: 1}) still wins for AutoPipe; the first layout takes the measured
    M."""
    monkeypatch.setenv(tuning.DIR_ENV, str(tmp_path / "microtune"))
    tuned = build_trainer(tmp_path, "auto", "pipe.microbatches=auto")
    rng_tuned = torch.get_rng_state()
    try:
        t = tuned.record.tuning
        assert t.source == "measured" and sorted(t.costs) == [(1, 1), (1, 2), (1, 4)]
        assert all(s > 0 for s in t.costs.values())
        chosen = t.choices[1].microbatches
        assert tuned.plan.microbatches == chosen and tuned.controller.microbatch_table == {2: 2, 1: 1}
        assert t.reason.startswith(f"M={chosen} at K=1: ")
        assert ("M=1 from auto.microbatch_table" in t.reason) == (chosen != 1)
        assert all(p.grad is None for p in tuned.layered.model.parameters())
        weights = {n: p.detach().clone() for n, p in tuned.layered.model.named_parameters()}
    finally:
        tuned.close()
    plain = build_trainer(tmp_path, "plain", f"pipe.microbatches={chosen}")
    try:
        assert plain.record.tuning is None
        assert torch.equal(torch.get_rng_state(), rng_tuned)
        for name, p in plain.layered.model.named_parameters():
            assert torch.equal(weights[name], p.detach()), name
    finally:
        plain.close()
    again = build_trainer(tmp_path, "again", "pipe.microbatches=auto")
    try:
        assert again.record.tuning.source == "cached" and again.record.tuning.costs == t.costs
        cache = json.loads(
            (tmp_path / "microtune").joinpath(again.record.tuning.cache_file.rsplit("/", 1)[-1]).read_text()
        )
        assert cache["fields"]["world_size"] == 1 and cache["fields"]["lengths"] == [[1, 1, 16, [1, 2, 4]]]
    finally:
        again.close()
