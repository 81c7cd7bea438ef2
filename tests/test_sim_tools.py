"""The simulator's tools as modules: `benchmarks.simulator_check` (the simulator against measured runs) and
`benchmarks.cpu_costs` (this machine's profile and preset constants), each run through its `main` on the smallest
input that exercises it, checked on the JSON it writes."""

from __future__ import annotations

import json

import pytest
from conftest import compose_config, write_config
from helpers.metrics import write_simulated

from ptrun.sim import costs_from_config, get_cluster, load_profile
from ptrun.sim.simulate import simulate_one


def fake_runs(root, slower: float) -> None:
    """A `benchmarks/speedup.py` output of one round with two combinations of a 2-epoch digits job: each run's config
    and metrics, its epochs measured at `slower` x what the simulator predicts with nothing else on the machine."""
    cluster = get_cluster("this_machine")
    for name, extra in (("baseline", ["auto.freeze=false", "auto.cache=false"]), ("all_four", [])):
        run = root / "round0" / name
        cfg = compose_config(["recipe=digits_vit", "train.epochs=2", *extra], run)
        write_config(cfg)
        records = simulate_one(costs_from_config(cfg.model, cfg.data), cluster, cfg, 1437)
        write_simulated(run, records, slower)


@pytest.mark.slow
def test_validate_writes_every_calibration_mode(tmp_path, capsys):
    from benchmarks import simulator_check

    fake_runs(tmp_path / "runs", slower=1.25)
    out = tmp_path / "report.json"
    args = ["--runs", str(tmp_path / "runs"), "--profile", "none", "--calibrate", "baseline", "--out", str(out)]
    assert simulator_check.main(args) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert {"command", "runs", "profile", "cluster", "tolerance", "calibrate", "modes"} <= set(doc)
    assert doc["profile"] is None and doc["calibrate"] == "baseline" and set(doc["modes"]) == set(simulator_check.MODES)
    for mode, report in doc["modes"].items():
        combos = {c["combination"]: c for c in report["combinations"]}
        assert list(combos) == ["baseline", "all_four"], mode
        for c in combos.values():
            assert len(c["epochs"]) == 2 and all(e["plan_matches"] for e in c["epochs"]) and not c["notes"]
            assert all(e["predicted_s"] > 0 and e["measured_s"] > 0 for e in c["epochs"])
    # nothing fitted: every epoch 1.25 x as slow as predicted; fitted on the baseline: its total comes out
    none = doc["modes"]["none"]["combinations"]
    assert [e["error"] for c in none for e in c["epochs"]] == pytest.approx([1 / 1.25 - 1] * 4)
    baseline = doc["modes"]["baseline"]["combinations"][0]
    assert baseline["background_load"] > 0 and baseline["total"]["error"] == pytest.approx(0, abs=1e-6)


def test_validate_reports_a_bad_runs_directory_and_exits_0(tmp_path, capsys):
    from benchmarks import simulator_check

    assert simulator_check.main(["--runs", str(tmp_path), "--profile", "none"]) == 0
    assert "no round*/COMBINATION/metrics.jsonl" in capsys.readouterr().err


@pytest.mark.dist
@pytest.mark.slow
def test_measure_writes_a_profile_the_planner_reads(tmp_path, capsys):
    """Two gloo workers, one pass of one repeat on micro-batches of 2: the profile `ptrun plan --profile`
    reads, and the preset's constants."""
    from benchmarks import cpu_costs

    out = tmp_path / "costs.json"
    cpu_costs.main(["--out", str(out), "--passes", "1", "--repeats", "1", "--batch", "2", "recipe=digits_vit"])
    assert f"wrote {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    cfg = compose_config(["recipe=digits_vit"], tmp_path / "cfg")
    base = costs_from_config(cfg.model, cfg.data)
    costs = load_profile(out, base)  # accepted as it is
    assert doc["batch"] == 2 and doc["workers"] == 2 and doc["passes"] == 1
    for key in ("time_s", "forward_s", "frozen_s", "update_s", "activation_bytes", "params"):
        assert len(doc[key]) == base.num_units and all(v >= 0 for v in doc[key]), key
    assert all(t > 0 for t in doc["time_s"]) and costs.fb_seconds == tuple(t / 2 for t in doc["time_s"])
    assert doc["params"] == list(base.params)  # the analytic sizes are the built model's
    c = doc["cluster"]
    assert set(c) == {
        "cores_per_node",
        "microbatch_overhead_s",
        "link_latency_s",
        "intra_gbs",
        "loader_batch_s",
        "loader_samples_s",
        "cache_batch_s",
        "cache_sample_s",
        "cache_write_sample_s",
    }
    assert 0 < c["cores_per_node"] <= 2 and c["link_latency_s"] >= 0 and c["cache_write_sample_s"] > 0
