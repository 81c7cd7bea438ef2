"""`data.name=hf` on real workers: string labels from the user's csv files keep their class indices on every
rank and across a resume (`class_names.json`, the exported model's id2label), the resume reads the tokenized
data the first run wrote, and a resume whose data names other classes is refused before any worker starts. A
classification BERT caches no deeper than its last layer's input, and trains as it does without the cache."""

from __future__ import annotations

import json

import pytest
from conftest import TINY_MODEL, assert_one_error_line, run_events, run_workers, wordpiece_tokenizer
from test_hf_data import NAMES, TOY_EVAL, TOY_TRAIN, write_source

pytestmark = [pytest.mark.dist, pytest.mark.slow]  # four launches of two workers

TINY_BERT = [
    "model=bert_base",
    "model.pretrained=null",
    *TINY_MODEL,
    "data.name=hf",
    "data.text_column=text",
    "data.label_column=topic",
    "data.max_length=16",
    "train.global_batch_size=8",
    "launcher.nproc_per_node=2",
    "launcher.max_restarts=0",
    "pipe.length=1",
    "pipe.microbatches=1",
    "freeze.policy=none",
    "auto.cache=false",
    "optim.lr=5e-4",
]


def test_string_labels_keep_their_indices_on_every_rank_and_across_a_resume(tmp_path, monkeypatch, request):
    tokenized = tmp_path / "tokenized"
    monkeypatch.setenv("PTRUN_TOKENIZED_DIR", str(tokenized))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    source = write_source("csv", tmp_path / "news", TOY_TRAIN, TOY_EVAL)
    tokenizer = wordpiece_tokenizer(tmp_path / "tokenizer", [t for t, _ in TOY_TRAIN], vocab_size=200)
    run = tmp_path / "run"
    args = [*TINY_BERT, f"data.path={source}", f"data.tokenizer={tokenizer}"]

    # Data parallelism over two workers: each maps its share of the labels (the workers agree on the classes
    # as they start, or refuse).
    run_workers([*args, "train.epochs=1"], run)
    assert json.loads((run / "class_names.json").read_text()) == NAMES
    entries = {p.name: p.stat().st_mtime_ns for p in tokenized.iterdir()}
    # train and eval, each beside its checksum; no locks
    assert sorted(entries) == sorted(n + s for n in entries if n.endswith(".arrow") for s in ("", ".sum"))
    assert len(entries) == 4

    run_workers([*args, "train.epochs=2", "train.resume=true"], run)
    assert [e["epoch"] for e in run_events(run, "epoch")] == [0, 1]
    assert json.loads((run / "class_names.json").read_text()) == NAMES
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["id2label"] == {str(i): name for i, name in enumerate(NAMES)}
    assert config["label2id"] == {name: i for i, name in enumerate(NAMES)}
    # The resume tokenized nothing: the first run's entries, unchanged, and nothing else.
    assert {p.name: p.stat().st_mtime_ns for p in tokenized.iterdir()} == entries

    # A class added to the data since: refused in one line before any worker starts, the run as it was.
    with (source / "train.csv").open("a") as f:
        f.write("a new film opened,film\n")
    before = sorted((p, p.stat().st_mtime_ns) for p in run.rglob("*"))
    cli = request.getfixturevalue("cli")  # only now: it stops this process from launching workers
    out = cli("train", *args, "train.epochs=3", "train.resume=true", f"hydra.run.dir={run}", cwd=tmp_path)
    line = assert_one_error_line(out)
    assert (
        f"data: the classes the data names now, ['business', 'film', 'sports', 'tech'], are not the run's "
        f"({run / 'class_names.json'}: ['business', 'sports', 'tech'])"
    ) in line, line
    assert sorted((p, p.stat().st_mtime_ns) for p in run.rglob("*")) == before


def test_a_classification_bert_caches_up_to_its_last_layer_and_trains_as_without_the_cache(tmp_path, monkeypatch):
    """Its last layer computes the first token's row only, so with every layer frozen the cache holds the last
    layer's input (3 of the 6 units), never the one-row outputs after it; the run trains and evaluates as the
    same run without the cache does."""
    monkeypatch.setenv("PTRUN_TOKENIZED_DIR", str(tmp_path / "tokenized"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    source = write_source("csv", tmp_path / "news", TOY_TRAIN, TOY_EVAL)
    tokenizer = wordpiece_tokenizer(tmp_path / "tokenizer", [t for t, _ in TOY_TRAIN], vocab_size=200)
    frozen = [a for a in TINY_BERT if a not in ("freeze.policy=none", "auto.cache=false")] + [
        f"data.path={source}",
        f"data.tokenizer={tokenizer}",
        "train.epochs=3",
        "freeze.policy=schedule",
        "freeze.blocks=[0,2,2]",
        "freeze.max_fraction=1.0",
        "cache.min_frozen_units=3",
        "cache.dtype=float32",
    ]
    run_workers([*frozen, "auto.cache=true"], tmp_path / "cached")
    run_workers([*frozen, "auto.cache=false"], tmp_path / "uncached")
    plans = run_events(tmp_path / "cached", "plan")
    assert [(p["frozen_units"], p["cached_units"]) for p in plans] == [(0, 0)] + [(5, 3)] * (len(plans) - 1)
    cached, uncached = run_events(tmp_path / "cached", "epoch"), run_events(tmp_path / "uncached", "epoch")
    assert cached[2]["cache"]["computed"] == 0 and cached[2]["cache"]["hits"] >= cached[2]["samples"]
    for mine, reference in zip(cached, uncached, strict=True):
        assert mine["eval"]["loss"] == pytest.approx(reference["eval"]["loss"], rel=1e-4)
