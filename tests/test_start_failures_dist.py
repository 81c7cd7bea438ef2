"""A failure at start-up, for real: when every worker raises the same error before its first step (a bug, which
a restart would only repeat) the launcher restarts nothing and prints one line, the workers' error, with exit
code 1; when only one worker fails, elastic restarts the group as for any fault and the run finishes. (A
killed worker still restarts and resumes bit for bit: test_faults_dist.)"""

from __future__ import annotations

import json

import pytest
from conftest import TINY, run_events, run_ptrun

pytestmark = [pytest.mark.dist, pytest.mark.slow]

SHORT = [
    *TINY,
    "train.epochs=1",
    "train.max_steps_per_epoch=3",
    "launcher.nproc_per_node=2",
    "launcher.max_restarts=3",
    "train.export=false",
]


def test_the_same_error_on_every_worker_is_one_line_and_no_restart(tmp_path):
    run_dir = tmp_path / "run"
    planned = json.dumps([{"point": "start", "raise": "a planned bug"}] * 4)  # every attempt would fail
    out = run_ptrun("train", *SHORT, f"hydra.run.dir={run_dir}", cwd=tmp_path, env={"PTRUN_KILL_AT": planned})
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(
        "ptrun: error: every worker failed at start-up with the same error, so no restart: "
        "TypeError: a planned bug (fault_injection.py:"
    ), lines[0]
    assert not list(run_dir.glob("elastic/*/attempt_1")), "restarted"


def test_one_failed_worker_is_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    planned = json.dumps([{"point": "start", "rank": 1, "raise": "only on rank 1, once"}])
    out = run_ptrun("train", *SHORT, f"hydra.run.dir={run_dir}", cwd=tmp_path, env={"PTRUN_KILL_AT": planned})
    assert out.returncode == 0, out.stderr
    # the failure in one line before the restart; its traceback in train.log, never on the terminal
    said = [line for line in out.stderr.splitlines() if "only on rank 1, once" in line]
    assert len(said) == 1 and said[0].startswith("ptrun: rank00001 failed at start-up, so the workers restart: ")
    assert "Traceback" not in out.stderr and "only on rank 1, once" in (run_dir / "train.log").read_text()
    assert len(run_events(run_dir, "end")) == 1
