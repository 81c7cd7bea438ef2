"""What freezing saved (`ptrun.report.savings`): the estimate on hand-made runs whose every number is worked
out below, and on real runs, where the line `ptrun train` ends with and its `savings` event equal what
`ptrun report` computes from the same `metrics.jsonl`. The estimate is the run's own seconds per sample
while every unit trained, times every sample it trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_events
from ptrun.report import load_run, write_report
from ptrun.report.savings import Savings, freezing_savings
from test_bad_input import BASE_RUN, changed, ptrun_train
from test_report import BASE, FAST, write_run

def start(t: float, **kw) -> dict:
    return {"event": "start", "time": t, "world_size": 2, "recipe": "digits_vit", "model": "vit_tiny",
            "num_units": 6, "resumed_from": None, **kw}


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
    """Epochs of 10 steps x 16 samples. Epoch 1 trains every unit for 5 steps in 4 s (0.05 s a sample), then
    freezes half the units (a 0.5 s change) and trains 5 more steps in 2.5 s; epoch 2 trains its 10 steps in
    3 s after a 0.25 s change at the boundary. Without freezing, those 15 steps (240 samples) would have run
    at 0.05 s a sample; the changes would not have happened."""
    events = [start(1000.0), plan(1000.0, 0, 0, 0, 2, 1, 2),
              plan(1004.5, 0, 5, 3, 1, 2, 1, transition_s=0.5), epoch(1007.5, 0, 7.0),
              plan(1008.0, 1, 0, 3, 1, 2, 1, transition_s=0.25), epoch(1011.5, 1, 3.0)]
    saved = freezing_savings(load_run(write_run(tmp_path / "r", events)))
    assert saved == Savings(train_s=7.0 + 0.25 + 3.0, unfrozen_s=pytest.approx(4.0 + 240 * 0.05), froze=True)
    assert saved.saved_s == pytest.approx(16.0 - 10.25) and saved.speedup == pytest.approx(16.0 / 10.25)
    assert saved.line() == "freezing saved ~5.8 s: training took 10 s; without freezing it would take ~16 s (1.56x)"


def test_a_resumed_epoch_counts_its_own_steps(tmp_path):
    """Resumed at step 4 of 10 (6 steps, 96 samples, in 6 s) with every unit training, then frozen for the
    next epoch (10 steps in 4 s): 0.0625 s a sample, 6 + 160 x 0.0625 = 16 s without freezing."""
    events = [start(1000.0), plan(1000.0, 0, 4, 0, 1, 2, 1), {**epoch(1006.0, 0, 6.0), "resumed_at_step": 4},
              plan(1006.0, 1, 0, 3, 1, 2, 1), epoch(1010.0, 1, 4.0)]
    assert freezing_savings(load_run(write_run(tmp_path / "r", events))) == Savings(10.0, 16.0, froze=True)


def test_nothing_frozen_saves_nothing_and_frozen_from_the_start_has_no_estimate(tmp_path):
    base = load_run(write_run(tmp_path / "base", BASE))  # one plan event, never frozen: 4 epochs of 9 s
    assert freezing_savings(base) == Savings(36.0, 36.0, froze=False)
    assert freezing_savings(base).line() == "no layer froze: training took 36 s, as it would without freezing"
    frozen = [start(1000.0), plan(1000.0, 0, 0, 3, 1, 2, 1), epoch(1005.0, 0, 5.0)]  # nothing measured unfrozen
    assert freezing_savings(load_run(write_run(tmp_path / "frozen", frozen))) is None


def test_the_report_shows_the_same_line(tmp_path, cli):
    events = [start(1000.0), plan(1000.0, 0, 0, 0, 2, 1, 2), epoch(1010.0, 0, 10.0),
              plan(1010.0, 1, 0, 3, 1, 2, 1), epoch(1014.0, 1, 4.0)]
    run_dir = write_run(tmp_path / "r", events)
    line = "freezing saved ~6.0 s: training took 14 s; without freezing it would take ~20 s (1.43x)"
    assert freezing_savings(load_run(run_dir)).line() == line  # two epochs at the first one's 10 s
    assert line in write_report([run_dir], tmp_path / "out")["report"].read_text()
    out = cli("report", str(run_dir), "--out", str(tmp_path / "out2"))
    assert out.returncode == 0 and f"r: {line}" in out.stdout.splitlines()


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
