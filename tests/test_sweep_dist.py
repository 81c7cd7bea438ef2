"""A Hydra sweep (`ptrun train -m`) of real runs ends with a summary table, and `ptrun report` takes the
sweep directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import TINY

pytestmark = pytest.mark.dist


def test_a_sweep_ends_with_one_summary_row_per_point_and_reports(tmp_path):
    sweep = tmp_path / "sweep"
    args = [*TINY, "train.epochs=1", "train.max_steps_per_epoch=2", "checkpoint.every_epochs=0",
            f"hydra.sweep.dir={sweep}", "optim.lr=1e-3,2e-3"]
    out = subprocess.run([sys.executable, "-m", "ptrun.cli", "train", "-m", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [l for l in out.stdout.splitlines() if l.startswith("| ") and "optim.lr=" in l]
    assert [r.split("|")[2].strip() for r in rows] == ["optim.lr=0.001", "optim.lr=0.002"]
    for n, row in enumerate(rows):
        events = [json.loads(l) for l in (sweep / str(n) / "metrics.jsonl").read_text().splitlines()]
        end = next(e for e in events if e["event"] == "end")
        assert f"top1 {end['final_eval']['top1']:.2f}" in row  # the table shows each run's own result
    assert rows[0].split("|")[5].strip() == "1.00x"
    report = subprocess.run([sys.executable, "-m", "ptrun.cli", "report", str(sweep)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = (sweep / "report" / "report.md").read_text()
    assert "| sweep/0 |" in text and "| sweep/1 |" in text
