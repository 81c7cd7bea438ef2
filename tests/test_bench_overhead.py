"""`benchmarks.overhead`: the oracle loop freezes exactly ptrun's units at ptrun's steps (its schedule read
from the run's plan events), the per-epoch comparison and its table; slow: one small round end to end, where
the oracle's trainable and optimized parameters are those of the units after ptrun's frozen prefix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import metrics
from helpers.metrics import write_run

from benchmarks import oracle_loop, overhead
from benchmarks.harness import label_rows


def plan(t: float, epoch: int, step: int, frozen: int, transition_s: float = 0.0) -> dict:
    return metrics.plan(t, epoch, 10, frozen, pp=1, dp=2, m=1, transition_s=transition_s, step=step)


def epoch(t: float, e: int, seconds: float, loss: float = 1.0) -> dict:
    return metrics.epoch(t, e, loss, samples_per_s=1.0, seconds=seconds, steps=8, samples=128)


START = {"event": "start", "time": 1000.0, "world_size": 2, "num_units": 10}
EVENTS = [
    START,
    plan(1000.0, 0, 0, 0),
    plan(1001.0, 0, 2, 3, 0.1),
    plan(1002.0, 0, 6, 5, 0.1),
    epoch(1003.0, 0, 3.0),
    plan(1003.5, 1, 0, 7, 0.5),
    epoch(1005.5, 1, 2.0, loss=0.5),
]


def test_the_schedule_is_the_runs_layout_changes(tmp_path):
    run_dir = write_run(tmp_path / "r", EVENTS)
    changes = oracle_loop.schedule(run_dir)
    assert changes == [
        {"epoch": 0, "step": 2, "frozen_units": 3},
        {"epoch": 0, "step": 6, "frozen_units": 5},
        {"epoch": 1, "step": 0, "frozen_units": 7},
    ]
    assert [oracle_loop.frozen_at(changes, 0, s) for s in range(8)] == [0, 0, 3, 3, 3, 3, 5, 5]
    assert oracle_loop.frozen_at(changes, 1, 0) == oracle_loop.frozen_at(changes, 5, 3) == 7


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra"])
def test_the_oracles_units_are_ptruns(kind):
    """Unit by unit, the parameters the oracle freezes are those of ptrun's own split of the same model."""
    sys.path.insert(0, str(Path(__file__).parent))
    import transformers
    from hf_families import tiny_config

    from ptrun.models.encoders import split_encoder

    model = transformers.AutoModelForSequenceClassification.from_config(tiny_config(kind))
    ours = oracle_loop.unit_params(model)
    theirs = split_encoder(model, "classification")
    assert len(ours) == len(theirs) == 2 * 2 + 2
    for i, (mine, unit) in enumerate(zip(ours, theirs, strict=True)):
        assert {id(p) for p in mine} == {id(p) for p in unit.parameters()}, f"unit {i}"


def test_per_epoch_overhead_and_the_whole_run(tmp_path):
    """ptrun: epoch 1 3 s, the change into epoch 2 0.5 s, epoch 2 2 s; the oracle: 2 s, 0.25 s, 1.6 s."""
    run_dir = write_run(tmp_path / "r", EVENTS)
    oracle = tmp_path / "oracle.json"
    oracle.write_text(
        json.dumps(
            {
                "num_units": 10,
                "final_train_loss": 0.5,
                "epochs": [
                    {"epoch": 0, "train_time_s": 2.0, "transition_s": 0.0},
                    {"epoch": 1, "train_time_s": 1.6, "transition_s": 0.25},
                ],
            }
        )
    )
    rows = overhead.compare(run_dir, oracle)
    assert [r["label"] for r in rows] == ["epoch 1", "epoch 2", "whole run"]
    assert [r["overhead"] for r in rows] == pytest.approx([1.5, 1.25, 5.5 / 3.85])
    assert [r["frozen"] for r in rows[:2]] == [[0, 3, 5], [7]]
    assert rows[-1]["ptrun_final_train_loss"] == rows[-1]["oracle_final_train_loss"] == 0.5
    result = {
        "recipe": "bbc_news_bert",
        "mode": "small",
        "model": "tiny",
        "repeats": 2,
        "num_units": 10,
        "schedule": oracle_loop.schedule(run_dir),
        "rows": label_rows([rows, rows], overhead.KEYS),
    }
    for row in result["rows"]:
        row["frozen"] = row["runs"][0]["frozen"]
    text = overhead.table(result)
    assert "| epoch 1 | 0/3/5 | 3.00 (3.00-3.00) | 2.00 (2.00-2.00) | 1.50x (1.50-1.50) |" in text
    assert "epoch 1 step 2: 3 of 10" in overhead.caption(result)
    # with the cache-off run beside it (epochs of 2.5 s and 1.8 s, 0.5 s between): its own overhead columns
    nocache = write_run(tmp_path / "nocache", [*EVENTS[:4], epoch(1003.0, 0, 2.5), EVENTS[5], epoch(1005.5, 1, 1.8)])
    both = overhead.merged(rows, overhead.compare(nocache, oracle))
    assert [r["nocache_overhead"] for r in both] == pytest.approx([1.25, 1.125, 4.8 / 3.85])
    keys = overhead.KEYS + ("nocache_ptrun_s", "nocache_overhead")
    result = dict(result, nocache=True, rows=label_rows([both], keys), repeats=1)
    for row in result["rows"]:
        row["frozen"] = row["runs"][0]["frozen"]
    assert "| epoch 2 | 7 | 2.00 | 1.80 | 1.60 | 1.25x | 1.12x |" in overhead.table(result)
    assert "ptrun with `auto.cache=false`" in overhead.caption(result)
    oracle.write_text(json.dumps({"num_units": 12, "epochs": []}))
    with pytest.raises(SystemExit, match="12 units"):
        overhead.compare(run_dir, oracle)


@pytest.mark.slow
@pytest.mark.dist
def test_one_small_round_end_to_end(tmp_path):
    """ptrun and the oracle on the tiny BERT, a few steps an epoch: the schedule froze units, and the oracle,
    freezing them at the same steps, ended with ptrun's last-epoch training loss."""
    overhead.main(
        ["--mode", "small", "--repeats", "1", "--out", str(tmp_path), "train.epochs=2", "train.max_steps_per_epoch=8"]
    )
    result = json.loads((tmp_path / "bench_overhead_bbc_news_bert_small.json").read_text())
    assert result["schedule"] and result["schedule"][-1]["frozen_units"] > 0
    assert [r["label"] for r in result["rows"]] == ["epoch 1", "epoch 2", "whole run"]
    assert all(r["overhead"] > 0 for r in result["rows"])
    # the oracle ends each epoch with the units after ptrun's frozen prefix training, and only those in its
    # optimizer
    import transformers

    model = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "tiny_bert", num_labels=5)
    sizes = [sum(p.numel() for p in unit) for unit in oracle_loop.unit_params(model)]
    oracle = json.loads((tmp_path / "small" / "round0" / "oracle.json").read_text())
    frozen = [oracle_loop.frozen_at(result["schedule"], e, 8) for e in (0, 1)]
    assert [e["frozen_units"] for e in oracle["epochs"]] == frozen and frozen[-1] > frozen[0] > 0
    assert [e["trainable_params"] for e in oracle["epochs"]] == [sum(sizes[f:]) for f in frozen]
    assert [e["optimizer_params"] for e in oracle["epochs"]] == [sum(sizes[f:]) for f in frozen]
    # the same task on both sides: the last epoch's loss within what their heads' different initial values
    # give (ptrun and the plain loop differ by that much without freezing too)
    whole = result["rows"][-1]["runs"][0]
    assert whole["oracle_final_train_loss"] == pytest.approx(whole["ptrun_final_train_loss"], rel=1e-2)
