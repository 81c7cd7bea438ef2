"""What freezing saved (`ptrun.report.savings`): the estimate on hand-made runs whose every number is worked
out below, and on real runs, where the line `ptrun train` ends with and its `savings` event equal what
`ptrun report` computes from the same `metrics.jsonl`. The estimate is the run's own seconds per sample
while every unit trained, times every sample it trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_events
from helpers import metrics
from helpers.metrics import write_run
from test_bad_input import BASE_RUN, changed, ptrun_train
from test_report import BASE

from ptrun.report import load_run, write_report
from ptrun.report.savings import MIN_STEADY_STEPS, Savings, freezing_savings


def start(t: float, **kw) -> dict:
    return metrics.start(t, num_units=6, **kw)


def plan(
    t: float, epoch: int, step: int, frozen: int, pp: int, dp: int, m: int, transition_s: float = 0.0, cached: int = 0
) -> dict:
    return metrics.plan(
        t, epoch, 6, frozen, pp, dp, m, transition_s, step=step, cached_units=cached, replicate_first_only=False
    )


def epoch(t: float, e: int, seconds: float) -> dict:
    return metrics.epoch(t, e, 1.0, 100.0, seconds, steps=40, samples=640, lr=1e-3)


# Each test spells out its own events, alike as they look: its docstring works their numbers out by hand.


def test_two_segments_the_second_with_half_the_units_frozen(tmp_path):
    """Epochs of 40 steps x 16 samples. Epoch 1 trains every unit for 20 steps in 4 s (1/80 s a sample), then
    freezes half the units (a 0.5 s change) and trains 20 more steps in 2.5 s; epoch 2 trains its 40 steps in
    3 s after a 0.25 s change at the boundary. Without freezing, those 60 steps (960 samples) would have run
    at 1/80 s a sample; the changes would not have happened."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 2, 1, 2),
        plan(1004.5, 0, 20, 3, 1, 2, 1, transition_s=0.5),
        epoch(1007.5, 0, 7.0),
        plan(1008.0, 1, 0, 3, 1, 2, 1, transition_s=0.25),
        epoch(1011.5, 1, 3.0),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=7.0 + 0.25 + 3.0, unfrozen_s=pytest.approx(4.0 + 960 / 80), froze=True)
    assert saved.saved_s == pytest.approx(16.0 - 10.25) and saved.speedup == pytest.approx(16.0 / 10.25)
    assert saved.line() == "freezing saved ~5.8 s: training took 10 s; without freezing it would take ~16 s (1.56x)"


def test_a_resumed_epoch_counts_its_own_steps(tmp_path):
    """Resumed at step 16 of 40 (24 steps, 384 samples, in 6 s) with every unit training, then frozen for the
    next epoch (40 steps in 4 s): 1/64 s a sample, 6 + 640 / 64 = 16 s without freezing."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 16, 0, 1, 2, 1),
        {**epoch(1006.0, 0, 6.0), "resumed_at_step": 16},
        plan(1006.0, 1, 0, 3, 1, 2, 1),
        epoch(1010.0, 1, 4.0),
    ]
    assert freezing_savings(load_run(write_run(tmp_path / "r", events))) == Savings(10.0, 16.0, froze=True)


def test_nothing_frozen_saves_nothing_and_frozen_from_the_start_says_it_has_no_estimate(tmp_path):
    base = load_run(write_run(tmp_path / "base", BASE))  # one plan event, never frozen: 4 epochs of 9 s
    assert freezing_savings(base) == Savings(36.0, 36.0, froze=False)
    assert freezing_savings(base).line() == "no layer froze: training took 36 s, as it would without freezing"
    frozen = [start(1000.0), plan(1000.0, 0, 0, 3, 1, 2, 1), epoch(1005.0, 0, 5.0)]  # nothing measured unfrozen
    saved = freezing_savings(load_run(write_run(tmp_path / "frozen", frozen)))
    assert saved == Savings(5.0, None, froze=True) and saved.steady_steps == 0
    assert saved.line() == (
        "freezing: training took 5.0 s; too few steps trained every layer before the first "
        "froze (0 after the warm-up, fewer than 10) to estimate the time without freezing"
    )


def test_the_report_shows_the_same_line(tmp_path, cli):
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 2, 1, 2),
        epoch(1010.0, 0, 10.0),
        plan(1010.0, 1, 0, 3, 1, 2, 1),
        epoch(1014.0, 1, 4.0),
    ]
    run_dir = write_run(tmp_path / "r", events)
    line = "freezing saved ~6.0 s: training took 14 s; without freezing it would take ~20 s (1.43x)"
    assert freezing_savings(load_run(run_dir)).line() == line  # two epochs at the first one's 10 s
    assert line in write_report([run_dir], tmp_path / "out")["report"].read_text()
    out = cli("report", str(run_dir), "--out", str(tmp_path / "out2"))
    assert out.returncode == 0 and f"r: {line}" in out.stdout.splitlines()


def first_epoch(t: float, seconds: float, first_step_end: float, start: float = 1000.0, **kw) -> dict:
    """Epoch 0 of a process that started training at `start`: its first step ended at `first_step_end`."""
    return {**epoch(t, 0, seconds), "first_step_time": start + 0.001, "first_step_end_time": first_step_end, **kw}


def test_the_first_step_is_warm_up_counted_once_not_priced_into_the_rate(tmp_path):
    """Epoch 1 trains every unit for 20 steps (320 samples) in 5 s, of which the first step took 1 s (warm-up:
    the loop's start to the end of its update), freezes (0.1 s) and trains 20 more steps in 2 s. Steady, every
    unit training ran 304 samples in 4 s. Without freezing: the 5 s measured (warm-up and all, once) plus the
    frozen stretch's 320 samples at 4/304 s = 9.2 s. The rate with the warm-up in (5 s / 320) said 10 s."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        plan(1005.1, 0, 20, 3, 1, 2, 1, transition_s=0.1),
        first_epoch(1007.1, 7.1, first_step_end=1001.0),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=7.1, unfrozen_s=pytest.approx(5 + 320 * 4 / 304), froze=True)
    assert saved.steady_steps == 19
    assert saved.line() == "freezing saved ~2.1 s: training took 7.1 s; without freezing it would take ~9.2 s (1.30x)"


def test_a_run_that_lost_time_says_freezing_cost_it(tmp_path):
    """As above, but the frozen stretch ran its 320 samples in 5 s, slower than the 4.2 s every unit would have
    taken: training took 10.1 s against 9.2 s without freezing."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        plan(1005.1, 0, 20, 3, 1, 2, 1, transition_s=0.1),
        first_epoch(1010.1, 10.1, first_step_end=1001.0),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved.saved_s == pytest.approx(5 + 320 * 4 / 304 - 10.1) and saved.speedup < 1
    assert saved.line() == (
        "freezing cost ~0.9 s: training took 10 s, longer than the ~9.2 s it would take without freezing (0.91x)"
    )
    assert saved.event_fields()["saved_s"] == pytest.approx(saved.saved_s) and saved.event_fields()["saved_s"] < 0


def test_the_warm_up_the_epoch_records_is_left_out(tmp_path):
    """With `warm_up_steps` and `warm_up_end_time` (the end of the process's 5th step, 2.5 s after the loop
    started), the first 5 steps are warm-up: 15 steps, 240 samples, in 2.5 s are the rate (1/96 s a sample)."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        plan(1005.1, 0, 20, 3, 1, 2, 1, transition_s=0.1),
        first_epoch(1007.1, 7.1, first_step_end=1001.0, warm_up_steps=5, warm_up_end_time=1002.5),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=7.1, unfrozen_s=pytest.approx(5 + 320 / 96), froze=True)
    assert saved.steady_steps == 15


def test_later_epochs_with_every_unit_training_give_the_rate(tmp_path):
    """Epoch 1 (10 s, its first step 2 s) is slow beyond its first step; epochs 2 and 3 train every unit at
    4 s each (1,280 samples in 8 s: an epoch's samples or more), epoch 4 trains frozen in 2 s. Without
    freezing: the 18 s measured plus 640 samples at 8/1280 s = 22 s (epoch 1's steps after the first in the
    rate: ~23.4 s; every epoch's rate: 24 s)."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        first_epoch(1010.0, 10.0, first_step_end=1002.0),
        plan(1010.0, 1, 0, 0, 1, 2, 1),
        epoch(1014.0, 1, 4.0),
        plan(1014.0, 2, 0, 0, 1, 2, 1),
        epoch(1018.0, 2, 4.0),
        plan(1018.0, 3, 0, 3, 1, 2, 1),
        epoch(1020.0, 3, 2.0),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=20.0, unfrozen_s=pytest.approx(22.0), froze=True)
    assert saved.steady_steps == 80
    assert saved.line() == "freezing saved ~2.0 s: training took 20 s; without freezing it would take ~22 s (1.10x)"


def test_the_line_gives_the_estimate_at_its_slowest_and_fastest_steady_stretch(tmp_path):
    """Epochs of 40 steps: epoch 1 (warm-up), then epochs 2-4 train every unit in 4, 5 and 6 s (1,920 samples in
    15 s), epoch 5 trains frozen in 2 s. Without freezing: the 25 s measured plus 640 samples at 15/1920 s = 30 s;
    at the fastest stretch's rate (4 s an epoch) 29 s, at the slowest's (6 s) 31 s."""
    events = [start(1000.0), plan(1000.0, 0, 0, 0, 1, 2, 1), first_epoch(1010.0, 10.0, first_step_end=1002.0)]
    t = 1010.0
    for e, seconds in ((1, 4.0), (2, 5.0), (3, 6.0)):
        events += [plan(t, e, 0, 0, 1, 2, 1), epoch(t + seconds, e, seconds)]
        t += seconds
    events += [plan(t, 4, 0, 3, 1, 2, 1), epoch(t + 2.0, 4, 2.0)]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=27.0, unfrozen_s=pytest.approx(30.0), froze=True)
    assert saved.unfrozen_range_s == pytest.approx((29.0, 31.0))
    assert saved.line() == (
        "freezing saved ~3.0 s: training took 27 s; without freezing it would take ~30 s (29-31 s "
        "at its steady stretches' slowest and fastest) (1.11x)"
    )
    assert saved.event_fields()["unfrozen_range_s"] == pytest.approx([29.0, 31.0])


@pytest.mark.parametrize("unfrozen_steps", [10, 11])
def test_too_few_steady_steps_give_no_estimate(tmp_path, unfrozen_steps):
    """Every unit trained for `unfrozen_steps` steps, the first of them warm-up: 9 steady steps are too few to
    price the frozen ones (the line says so, the event has no estimate); 10 are enough."""
    events = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        plan(1000.0 + unfrozen_steps, 0, unfrozen_steps, 3, 1, 2, 1),
        first_epoch(1040.0, 40.0, first_step_end=1001.0),
    ]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved.steady_steps == unfrozen_steps - 1
    if unfrozen_steps - 1 < MIN_STEADY_STEPS:
        assert saved.unfrozen_s is None and saved.saved_s is None and saved.speedup is None
        assert saved.line() == (
            "freezing: training took 40 s; too few steps trained every layer before the first "
            "froze (9 after the warm-up, fewer than 10) to estimate the time without freezing"
        )
        assert {k: saved.event_fields()[k] for k in ("unfrozen_time_s", "saved_s", "speedup")} == dict.fromkeys(
            ("unfrozen_time_s", "saved_s", "speedup")
        )
    else:  # 1 s a step throughout: 40 steps without freezing
        assert saved.unfrozen_s == pytest.approx(40.0) and saved.line().startswith("freezing saved ~0.0 s")


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
    assert [p["frozen_units"] for p in run_events(tmp_path / "run", "plan")] == [0, 3]


@pytest.mark.slow
@pytest.mark.dist
def test_a_run_with_freezing_off_reports_no_saving(tmp_path):
    stdout, event, report = finished(tmp_path / "run", *changed(BASE_RUN, "auto.freeze=false"))
    assert not report.froze and report.unfrozen_s == report.train_s and report.saved_s == 0.0
    assert event["froze"] is False and event["saved_s"] == 0.0 and event["line"] == report.line()
    assert stdout.splitlines()[-1] == report.line() and report.line().startswith("no layer froze: training took ")
    assert json.dumps(event)  # a plain record
