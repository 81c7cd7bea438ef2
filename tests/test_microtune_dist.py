"""`pipe.microbatches=auto` in a real 2-worker job: it measures the candidates, says what it chose and why in
the first plan event, a second run reads the disk cache instead of measuring, and tuning changes nothing
about training (the same weights, bit for bit, as a run given the chosen M)."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import TINY, final_params, run_events, run_workers

from ptrun.layout.tuning import DIR_ENV

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

# A 2-stage 1F1B pipeline (DP 1, 16 samples a step): candidates M = 2, 4, 8. Head dropout draws random
# numbers, so a tuning that left the generators moved would train differently.
RUN = TINY + [
    "launcher.nproc_per_node=2",
    "pipe.length=2",
    "pipe.schedule=1F1B",
    "train.epochs=2",
    "train.max_steps_per_epoch=3",
    "model.dropout=0.1",
    "auto.cache=false",
    "train.export=false",
    "checkpoint.every_epochs=2",
]


def plans(run_dir) -> list[dict]:
    return run_events(run_dir, "plan")


def test_auto_tunes_once_per_machine_and_trains_like_the_chosen_m(tmp_path, monkeypatch):
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "microtune"))  # the workers inherit it
    run_workers(RUN + ["pipe.microbatches=auto"], tmp_path / "auto")
    first, *later = plans(tmp_path / "auto")
    tuning, m = first["microbatch_tuning"], first["microbatches"]
    assert tuning["source"] == "measured" and tuning["seconds"] > 0
    assert set(tuning["samples_per_s"]) == {"2"} and set(tuning["samples_per_s"]["2"]) == {"2", "4", "8"}
    assert m in (2, 4, 8) and tuning["chosen"] == {"2": m}
    rates = {int(k): v for k, v in tuning["samples_per_s"]["2"].items()}
    # the fastest, or one within 3% of it with fewer micro-batches
    assert rates[m] >= max(rates.values()) / 1.03 - 0.1 and all(rates[x] <= rates[m] + 0.1 for x in rates if x < m)
    # the reason prints the unrounded rate to 0 decimals, the event keeps it to 1: they may differ by one
    shown = re.match(rf"M={m} at K=2: (\d+) samples/s", first["microbatches_reason"])
    assert shown and abs(int(shown[1]) - rates[m]) <= 0.55
    assert later and all("microbatch_tuning" not in p and p["microbatches"] == m for p in later)
    assert len(list((tmp_path / "microtune").glob("*.json"))) == 1

    run_workers(RUN + ["pipe.microbatches=auto"], tmp_path / "cached")
    again = plans(tmp_path / "cached")[0]
    assert again["microbatch_tuning"]["source"] == "cached"
    assert again["microbatch_tuning"]["samples_per_s"] == tuning["samples_per_s"] and again["microbatches"] == m

    run_workers(RUN + [f"pipe.microbatches={m}"], tmp_path / "fixed")
    assert "microbatch_tuning" not in plans(tmp_path / "fixed")[0]
    want = final_params(tmp_path / "fixed")
    for run in ("auto", "cached"):
        got = final_params(tmp_path / run)
        assert set(got) == set(want)
        for name in want:
            assert torch.equal(got[name], want[name]), f"{run}: {name}"
