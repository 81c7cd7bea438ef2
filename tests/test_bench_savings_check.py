"""`benchmarks.savings_check`: the savings line's estimate against a measured run without freezing. Its
agreement is not asserted (on a shared machine two identical runs differ by more than the 10% it is held
to: docs/results.md); what is: one round end to end, and the arithmetic of its rows."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_MODEL
from helpers.metrics import write_run
from test_report_savings import epoch, first_epoch, plan, start

from benchmarks import savings_check
from ptrun.report import load_run
from ptrun.report.savings import freezing_savings


def test_a_round_compares_the_estimate_with_the_measured_run(tmp_path):
    """The freezing run: 20 steps with every unit (5 s, the first 1 s), 20 frozen (2 s): estimate 5 + 320 x
    4/304 s. The run without freezing: 40 steps in 9 s, its first 1 s: 8 s over 624 samples, against the
    freezing run's 4 s over 304 in the same epoch."""
    on = write_run(
        tmp_path / "on",
        [
            start(1000.0),
            plan(1000.0, 0, 0, 0, 1, 2, 1),
            plan(1005.1, 0, 20, 3, 1, 2, 1, transition_s=0.1),
            first_epoch(1007.1, 7.1, first_step_end=1001.0),
        ],
    )
    off = write_run(
        tmp_path / "off",
        [start(1000.0), plan(1000.0, 0, 0, 0, 1, 2, 1), first_epoch(1009.0, 9.0, first_step_end=1001.0)],
    )
    row = savings_check.measure({savings_check.FREEZING: on, savings_check.OFF: off})
    estimate = 5 + 320 * 4 / 304
    assert row["estimate_s"] == pytest.approx(estimate) and row["measured_s"] == 9.0
    assert row["error"] == pytest.approx(estimate / 9 - 1) and row["steady_steps"] == 19
    assert row["rate_ratio"] == pytest.approx((4 / 304) / (8 / 624))
    assert row["first_rate_estimate_s"] == pytest.approx(10.0)
    assert row["line"] == freezing_savings(load_run(on)).line()
    assert row["range_s"] is None and row["in_range"] is None  # one steady stretch: the line gives no range


def test_a_round_says_whether_the_measured_run_fell_in_the_line_s_range(tmp_path):
    """The freezing run trains every unit for epochs 1-3 (10, 4 and 6 s; 40 steps each), then 1 epoch frozen:
    20 s measured and 640 samples at epochs 2-3's 10/1280 s a sample, estimate 25 s; at epoch 2's rate 24 s, at
    epoch 3's 26 s. A run without freezing of 25.5 s falls in that range, one of 27 s not."""
    # spelled out, as test_report_savings.py's are: the docstring works these numbers out by hand
    on = [
        start(1000.0),
        plan(1000.0, 0, 0, 0, 1, 2, 1),
        first_epoch(1010.0, 10.0, first_step_end=1002.0),
        plan(1010.0, 1, 0, 0, 1, 2, 1),
        epoch(1014.0, 1, 4.0),
        plan(1014.0, 2, 0, 0, 1, 2, 1),
        epoch(1020.0, 2, 6.0),
        plan(1020.0, 3, 0, 3, 1, 2, 1),
        epoch(1022.0, 3, 2.0),
    ]
    on_dir = write_run(tmp_path / "on", on)
    for measured, inside in ((25.5, True), (27.0, False)):
        off = write_run(
            tmp_path / f"off{measured}",
            [start(1000.0), plan(1000.0, 0, 0, 0, 1, 2, 1), epoch(1000.0 + measured, 0, measured)],
        )
        row = savings_check.measure({savings_check.FREEZING: on_dir, savings_check.OFF: off})
        assert row["estimate_s"] == pytest.approx(25.0) and row["range_s"] == pytest.approx([24.0, 26.0])
        assert row["in_range"] is inside
        assert savings_check.span_cell(row) == f"24.00-26.00 ({'in' if inside else 'out'})"


@pytest.mark.slow
@pytest.mark.dist
def test_one_round_end_to_end(tmp_path, monkeypatch):
    """digits_vit, small and short, freezing from its third epoch: the estimate exists, priced on at least an
    epoch of steady steps (the second's), and the table shows it."""
    monkeypatch.setattr(
        "sys.argv",
        [
            "savings_check.py",
            "--recipe",
            "digits_vit",
            "--repeats",
            "1",
            "--out",
            str(tmp_path),
            "train.epochs=4",
            "freeze.start=2",
            *TINY_MODEL,
        ],
    )
    savings_check.main()
    result = json.loads((tmp_path / "check_savings_digits_vit.json").read_text())
    [r] = result["rows"][0]["runs"]
    assert r["estimate_s"] > 0 and r["measured_s"] > 0 and r["steady_steps"] >= 90 and r["rate_ratio"] > 0
    assert r["line"].startswith(("freezing saved ~", "freezing cost ~"))
    assert f"{r['estimate_s']:.2f}" in savings_check.table(result)
