"""The paper's workload recipes end to end on real workers, shrunk to a tiny BERT and tiny local fixtures:
SQuAD (question answering, EM / F1 from the n-best spans) and SST-2 (GLUE accuracy), each as a 2-stage
pipeline."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_MODEL, run_events, run_workers
from test_text_data import SST2_ROWS, squad_articles, train_tokenizer, write_tsv

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # every test launches workers

TINY_BERT = [
    *TINY_MODEL,
    "model.pretrained=null",
    "launcher.nproc_per_node=2",
    "launcher.max_restarts=0",
    "launcher.nnodes=1",
    "pipe.length=2",
    "pipe.microbatches=2",
    "pipe.schedule=GPipe",
    "freeze.policy=none",
    "train.epochs=1",
    "train.max_steps_per_epoch=2",
    "train.global_batch_size=4",
    "train.pipeline_batch_size=null",
    "optim.lr=1e-3",
]


def test_the_squad_recipe_trains_two_steps_as_a_2_stage_pipeline(tmp_path):
    data = tmp_path / "squad"
    data.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        (data / name).write_text(json.dumps({"version": "1.1", "data": squad_articles()}))
    tokenizer = train_tokenizer(tmp_path / "tokenizer")
    run = tmp_path / "run"
    run_workers(
        [
            "recipe=bert_squad",
            *TINY_BERT,
            f"data.path={data}",
            f"data.tokenizer={tokenizer}",
            "data.max_length=48",
            "data.doc_stride=16",
        ],
        run,
    )
    (epoch,) = run_events(run, "epoch")
    assert epoch["steps"] == 2 and epoch["samples"] == 8
    ev = epoch["eval"]
    assert set(ev) == {"loss", "exact_match", "f1"}
    assert 0 <= ev["exact_match"] <= ev["f1"] <= 100  # EM never exceeds F1 on the same predictions


@pytest.mark.slow  # the squad run stays fast
def test_the_sst2_recipe_trains_and_reports_glue_accuracy(tmp_path):
    data = tmp_path / "glue"
    for split in ("train", "dev"):
        write_tsv(data / "SST-2" / f"{split}.tsv", ["sentence", "label"], SST2_ROWS)
    tokenizer = train_tokenizer(tmp_path / "tokenizer")
    run = tmp_path / "run"
    run_workers(
        ["recipe=bert_sst2", *TINY_BERT, f"data.path={data}", f"data.tokenizer={tokenizer}", "data.max_length=32"], run
    )
    (epoch,) = run_events(run, "epoch")
    ev = epoch["eval"]
    assert {"accuracy", "score", "top1"} <= set(ev)
    assert ev["accuracy"] == pytest.approx(ev["top1"])  # torchmetrics' accuracy = ptrun's own count
    correct = ev["accuracy"] / 100 * len(SST2_ROWS)
    assert correct == pytest.approx(round(correct))

    # The exported model loads with transformers alone and holds the run's final weights.
    import torch
    from conftest import final_params
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(run / "model")
    exported = dict(model.named_parameters())
    final = final_params(run)
    assert set(final) <= set(exported)
    for name, value in final.items():
        assert torch.equal(exported[name], value), name
    assert (
        AutoTokenizer.from_pretrained(run / "model")("a fine film")["input_ids"]
        == AutoTokenizer.from_pretrained(tokenizer)("a fine film")["input_ids"]
    )


@pytest.mark.slow  # the squad run stays fast
def test_the_glue_recipe_trains_stsb_as_a_regression(tmp_path):
    """STS-B: one real-valued output per pair, squared error, Pearson / Spearman; the eval loss is the mean
    squared error of the scores the metrics were computed from."""
    data = tmp_path / "glue" / "stsb"
    data.mkdir(parents=True)
    pairs = [
        ("a man plays music", "a man is playing a guitar", 3.8),
        ("a dog runs in the park", "a cat sleeps", 0.25),
        ("the film was great", "the film was wonderful", 4.6),
        ("kids play outside", "the kids are outdoors", 4.0),
        ("the woman reads", "a man cooks", 0.5),
        ("a bird sings", "a bird is singing", 5.0),
        ("stocks fell today", "it rained today", 1.0),
        ("he runs fast", "he is running quickly", 4.2),
    ]
    rows = [{"sentence1": a, "sentence2": b, "label": s, "idx": i} for i, (a, b, s) in enumerate(pairs)]
    for name in ("train.jsonl", "validation.jsonl"):
        (data / name).write_text("\n".join(json.dumps(r) for r in rows))
    tokenizer = train_tokenizer(tmp_path / "tokenizer")
    run = tmp_path / "run"
    run_workers(
        [
            "recipe=bert_glue",
            *TINY_BERT,
            "data.task=stsb",
            "model.task=regression",
            f"data.path={tmp_path / 'glue'}",
            f"data.tokenizer={tokenizer}",
            "data.max_length=24",
        ],
        run,
    )
    (epoch,) = run_events(run, "epoch")
    ev = epoch["eval"]
    assert {"loss", "pearson", "spearmanr", "score"} <= set(ev) and "top1" not in ev
    assert -100 <= ev["pearson"] <= 100 and ev["score"] == pytest.approx((ev["pearson"] + ev["spearmanr"]) / 2)
    assert 0 < ev["loss"] < 30  # squared error of 0..5 scores
