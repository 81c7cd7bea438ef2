"""What freezing saved (`ptrun.report.savings`): the estimate on hand-made runs whose every number is worked
out below, and on real runs, where the line `ptrun train` ends with and its `savings` event equal what
`ptrun report` computes from the same `metrics.jsonl`.

The hand-made model has 6 units; on the profiled micro-batch each costs 3 s to train (forward + backward),
1 s forward alone and 2 s frozen with its input needing a gradient (forward + input gradient).
  starting layout K=2 DP=1 M=2, stages [0,3) [3,6), all training: each stage 9 s a one-sample micro-batch,
      the makespan 9 + 9 + (2 - 1) x 9 = 27, a sample 27 / M / DP = 13.5;
  half the units frozen, K=1 DP=2 M=1, one stage: 3 x 1 (frozen on the first stage: forward alone) + 3 x 3
      = 12, a sample 12 / 1 / 2 = 6, so 13.5 / 6 = 2.25 times cheaper.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_events
from ptrun.parallel.plan import Plan
from ptrun.report import load_run, write_report
from ptrun.report.savings import Savings, UnitCosts, freezing_savings, seconds_per_sample
from test_bad_input import BASE_RUN, changed, ptrun_train
from test_report import BASE, FAST, write_run

COSTS = {"time_s": [3.0] * 6, "forward_s": [1.0] * 6, "frozen_s": [2.0] * 6}


def start(t: float, **kw) -> dict:
    return {"event": "start", "time": t, "world_size": 2, "recipe": "digits_vit", "model": "vit_tiny",
            "num_units": 6, "resumed_from": None, "unit_costs": COSTS, **kw}


def plan(t: float, epoch: int, step: int, frozen: int, pp: int, dp: int, m: int, transition_s: float = 0.0,
         cached: int = 0) -> dict:
    bounds = [[0, 3], [3, 6]] if pp == 2 else [[0, 6]]
    return {"event": "plan", "time": t, "epoch": epoch, "step": step, "num_units": 6, "frozen_units": frozen,
            "pp": pp, "dp": dp, "stage_bounds": bounds, "microbatches": m, "schedule": "GPipe",
            "stages_per_rank": 1, "cached_units": cached, "replicate_first_only": False,
            "transition_s": transition_s}


def epoch(t: float, e: int, seconds: float) -> dict:
    return {"event": "epoch", "time": t, "epoch": e, "train_loss": 1.0, "samples_per_s": 100.0,
            "epoch_time_s": seconds, "lr": 1e-3, "steps": 10, "samples": 160, "eval": {}}


def test_two_segments_the_second_with_half_the_units_frozen(tmp_path):
    """Epoch 1 freezes half the units after 4 s of its 7 s loop (a 0.5 s change, then 2.5 s in the new
    layout); epoch 2 trains 3 s in that layout after a 0.25 s change at the boundary. Without freezing,
    the frozen 2.5 + 3 s would have taken 2.25 times as long; the changes would not have happened."""
    events = [start(1000.0), plan(1000.0, 0, 0, 0, 2, 1, 2),
              plan(1004.5, 0, 5, 3, 1, 2, 1, transition_s=0.5), epoch(1007.5, 0, 7.0),
              plan(1008.0, 1, 0, 3, 1, 2, 1, transition_s=0.25), epoch(1011.5, 1, 3.0)]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=7.0 + 0.25 + 3.0, unfrozen_s=4.0 + 2.5 * 2.25 + 3.0 * 2.25, froze=True)
    assert saved.saved_s == 16.375 - 10.25 and saved.speedup == 16.375 / 10.25
    assert saved.line() == "freezing saved ~6.1 s: training took 10 s; without freezing it would take ~16 s (1.60x)"


def test_a_frozen_unit_on_a_later_stage_and_the_cache_fill_are_priced():
    """Frozen units on stage 1 still back-propagate their input gradient (2 s); cached units leave the
    pipeline, and only the epoch that fills the cache runs them forward (1 s each)."""
    costs = UnitCosts(train=(3.0,) * 6, forward=(1.0,) * 6, frozen=(2.0,) * 6)
    later = Plan(6, 4, 2, 1, ((0, 3), (3, 6)), 2, "GPipe")  # stage works 3 x 1 = 3 and 2 + 3 + 3 = 8
    assert seconds_per_sample(later, costs) == (3 + 8 + 8) / 2
    cached = Plan(6, 3, 1, 2, ((0, 6),), 1, "GPipe", cached_units=3)  # 3 units of 3 s, over DP = 2
    assert seconds_per_sample(cached, costs, filled=3) == 9 / 2
    assert seconds_per_sample(cached, costs, filled=0) == (9 + 3) / 2
    assert seconds_per_sample(cached, costs, filled=1) == (9 + 2) / 2  # the cache advances from 1 unit to 3


def test_nothing_frozen_saves_nothing_and_old_runs_without_costs_have_no_estimate(tmp_path):
    base = load_run(write_run(tmp_path / "base", BASE))  # one plan event, never frozen: 4 epochs of 9 s
    assert freezing_savings(base) == Savings(36.0, 36.0, froze=False)
    assert freezing_savings(base).line() == "no layer froze: training took 36 s, as it would without freezing"
    assert freezing_savings(load_run(write_run(tmp_path / "fast", FAST))) is None  # froze, no unit costs


def test_the_report_shows_the_same_line(tmp_path, cli):
    events = [start(1000.0), plan(1000.0, 0, 0, 0, 2, 1, 2), epoch(1010.0, 0, 10.0),
              plan(1010.0, 1, 0, 3, 1, 2, 1), epoch(1014.0, 1, 4.0)]
    run_dir = write_run(tmp_path / "r", events)
    line = "freezing saved ~5.0 s: training took 14 s; without freezing it would take ~19 s (1.36x)"
    assert freezing_savings(load_run(run_dir)).line() == line  # 10 + 4 x 2.25 = 19 against 14
    assert line in write_report([run_dir], tmp_path / "out")["report"].read_text()
    out = cli("report", str(run_dir), "--out", str(tmp_path / "out2"))
    assert out.returncode == 0 and f"r: {line}" in out.stdout.splitlines()


def test_the_profile_keeps_each_units_fastest_round(monkeypatch):
    """Rounds until they span `span_s` (at most `max_rounds`), each time the fastest of all rounds; a model
    whose first round already takes longer is profiled once."""
    import torch

    from ptrun.parallel import profile

    rounds = iter([profile.UnitProfile([3.0, 1.0], [8.0, 4.0], [1.0, 1.0], [2.0, 5.0]),
                   profile.UnitProfile([2.0, 4.0], [8.0, 4.0], [1.0, 0.5], [3.0, 1.0]),
                   profile.UnitProfile([5.0, 5.0], [8.0, 4.0], [0.9, 0.9], [4.0, 4.0])])
    monkeypatch.setattr(profile, "profile_units", lambda *args, **kwargs: next(rounds))
    got = profile.fastest_profile(None, (), torch.device("cpu"), detail=True, span_s=60.0, max_rounds=3)
    assert got == profile.UnitProfile([2.0, 1.0], [8.0, 4.0], [0.9, 0.5], [2.0, 1.0])
    rounds = iter([profile.UnitProfile([3.0, 1.0], [8.0, 4.0])])
    assert profile.fastest_profile(None, (), torch.device("cpu"), span_s=0.0) == profile.UnitProfile([3.0, 1.0],
                                                                                                     [8.0, 4.0])


# ---- real runs -------------------------------------------------------------------------------------------

def finished(run_dir: Path, *overrides: str) -> tuple[str, dict, Savings]:
    """`ptrun train` with `overrides` into `run_dir`: its output, its `savings` event, and what the report
    computes from its metrics.jsonl."""
    out = ptrun_train(*overrides, f"hydra.run.dir={run_dir}", cwd=run_dir.parent)
    assert out.returncode == 0, out.stderr
    [event] = run_events(run_dir, "savings")
    assert run_events(run_dir)[-1]["event"] == "end"  # the end event stays the last
    return out.stdout, event, freezing_savings(load_run(run_dir))


@pytest.mark.slow
@pytest.mark.dist
def test_a_freezing_run_ends_with_the_estimate_the_report_computes(tmp_path):
    """The checkpoint tests' run (one worker, a block frozen and cached after the first of two epochs)."""
    stdout, event, report = finished(tmp_path / "run", *BASE_RUN)
    assert report.froze and {k: event[k] for k in report.event_fields()} == report.event_fields()
    assert stdout.splitlines()[-1] == report.line() == event["line"]
    assert report.line() in write_report([tmp_path / "run"], tmp_path / "out")["report"].read_text()
    costs = run_events(tmp_path / "run", "start")[0]["unit_costs"]
    assert {k: len(v) for k, v in costs.items()} == {"time_s": 6, "forward_s": 6, "frozen_s": 6}
    assert [p["frozen_units"] for p in run_events(tmp_path / "run", "plan")] == [0, 3]


@pytest.mark.slow
@pytest.mark.dist
def test_a_run_with_freezing_off_reports_no_saving(tmp_path):
    stdout, event, report = finished(tmp_path / "run", *changed(BASE_RUN, "auto.freeze=false"))
    assert not report.froze and report.unfrozen_s == report.train_s and report.saved_s == 0.0
    assert event["froze"] is False and event["saved_s"] == 0.0 and event["line"] == report.line()
    assert stdout.splitlines()[-1] == report.line() and report.line().startswith("no layer froze: training took ")
    assert "unit_costs" not in run_events(tmp_path / "run", "start")[0]  # nothing froze: nothing profiled
    assert json.dumps(event)  # a plain record
