"""A Hydra sweep (`ptrun train -m`) of real runs ends with a summary table, and `ptrun report` takes the
sweep directory."""

from __future__ import annotations

import pytest
from conftest import TINY, run_events, run_ptrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # a sweep of two real runs and a report


def test_a_sweep_ends_with_one_summary_row_per_point_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    args = [
        *TINY,
        "train.epochs=1",
        "train.max_steps_per_epoch=2",
        "checkpoint.every_epochs=0",
        f"hydra.sweep.dir={sweep}",
        "optim.lr=1e-3,2e-3",
    ]
    out = run_ptrun("train", "-m", *args, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ") and "optim.lr=" in line]
    assert [r.split("|")[2].strip() for r in rows] == ["optim.lr=0.001", "optim.lr=0.002"]
    for n, row in enumerate(rows):
        end = run_events(sweep / str(n), "end")[0]
        assert f"top1 {end['final_eval']['top1']:.2f}" in row  # the table shows each run's own result
    assert rows[0].split("|")[5].strip() == "1.00x"
    report = run_ptrun("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = (sweep / "report" / "report.md").read_text()
    assert "| sweep/0 |" in text and "| sweep/1 |" in text
