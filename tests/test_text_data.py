"""Real-workload sources on tiny fixtures written to tmp_path: GLUE (TSV, parquet, jsonl), SQuAD (official
JSON, doc-stride windows, answer positions, postprocessing) and CIFAR-10/100 (pickle, parquet, save_to_disk)."""

import json
import os
import pickle
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pytest
import torch
from conftest import wordpiece_tokenizer

from ptrun.config import ConfigError, DataConfig
from ptrun.data import build_datasets
from ptrun.data.metrics import squad_metrics
from ptrun.data.splits import IMAGENET_MEAN, IMAGENET_STD
from ptrun.data.squad import QAEvalData, postprocess_qa

SST2_ROWS = [
    ("a gripping , funny and moving film", 1),
    ("the plot is dull and the acting is worse", 0),
    ('"masterpiece" is not the word', 0),  # a leading bare quote: only readable with quoting off
    ("wonderful performances all around", 1),
    ("i never want to see it again", 0),
    ("a charming little story", 1),
    ("too long by an hour", 0),
    ("the best film of the year", 1),
    ("flat characters and a silly ending", 0),
    ("smart , warm and beautifully made", 1),
]
MRPC_ROWS = [
    (1, "the company said profits rose", "profits rose , the company said"),
    (0, "the storm hit the coast on monday", "shares fell sharply in early trading"),
    (1, "he resigned on friday", "on friday he stepped down"),
]
MNLI_ROWS = [
    ("a man is playing a guitar", "a man plays music", "entailment"),
    ("a dog runs in the park", "a cat sleeps indoors", "contradiction"),
    ("the woman is reading", "the woman reads a novel", "neutral"),
    ("kids play outside", "children are outdoors", "-"),  # no gold label: dropped
]
FILLER = (
    "river stone cloud maple window lantern harbor meadow pebble violin candle orchard "
    "compass feather glacier tulip canyon marble saddle beacon"
).split()


def squad_articles() -> list[dict]:
    """Ten questions in official SQuAD v1.1 JSON; the last paragraph is long enough for several windows and
    asks for one answer near its start and one near its end."""
    short = [
        ("The capital of France is Paris.", "What is the capital of France?", "Paris"),
        ("Water boils at one hundred degrees.", "At what temperature does water boil?", "one hundred degrees"),
        ("The Nile is the longest river in Africa.", "Which river is the longest in Africa?", "The Nile"),
        ("Mozart wrote the opera Don Giovanni in 1787.", "When was Don Giovanni written?", "1787"),
        ("Bees make honey from nectar.", "What do bees make honey from?", "nectar"),
        ("The violin has four strings.", "How many strings does a violin have?", "four"),
        ("Penguins live mostly in the southern hemisphere.", "Where do penguins live?", "the southern hemisphere"),
        ("Gold is a soft yellow metal.", "What kind of metal is gold?", "soft yellow"),
    ]
    paragraphs = [
        {"context": c, "qas": [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": c.index(a)}]}]}
        for i, (c, q, a) in enumerate(short)
    ]
    words = [FILLER[i % len(FILLER)] for i in range(60)]
    long_context = (
        "Alice founded the zebra society. "
        + " ".join(words)
        + ". Later the society adopted a golden retriever named Biscuit."
    )
    paragraphs.append(
        {
            "context": long_context,
            "qas": [
                {
                    "id": "q8",
                    "question": "Who founded the society?",
                    "answers": [{"text": "Alice", "answer_start": long_context.index("Alice")}],
                },
                {
                    "id": "q9",
                    "question": "What dog did the society adopt?",
                    "answers": [
                        {"text": "golden retriever", "answer_start": long_context.index("golden retriever")},
                        {
                            "text": "a golden retriever named Biscuit",
                            "answer_start": long_context.index("a golden retriever"),
                        },
                    ],
                },
            ],
        }
    )
    return [{"title": "tiny", "paragraphs": paragraphs}]


def corpus() -> list[str]:
    """Every text of the fixtures, so the tiny vocabulary has whole-word tokens for them."""
    texts = (
        [s for s, _ in SST2_ROWS]
        + [t for row in MRPC_ROWS for t in row[1:]]
        + [t for row in MNLI_ROWS for t in row[:2]]
    )
    for p in squad_articles()[0]["paragraphs"]:
        texts += [p["context"]] + [qa["question"] for qa in p["qas"]]
    return texts


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def train_tokenizer(path) -> str:
    """A tiny BERT WordPiece tokenizer trained offline on the fixture texts, saved as a HF directory."""
    return wordpiece_tokenizer(path, corpus(), vocab_size=1000)


def write_tsv(path, header: list[str] | None, rows) -> None:
    """A GLUE-style TSV written by hand (no quoting, like the originals)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = (["\t".join(header)] if header else []) + ["\t".join(str(v) for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def as_decoded(tok, text: str) -> str:
    """`text` as decoding its tokens spells it (lower case, the tokenizer's spacing around punctuation)."""
    return tok.decode(tok(text, add_special_tokens=False)["input_ids"])


def glue(path, task, tokenizer_dir, **kw):
    return build_datasets(DataConfig(name="glue", task=task, path=str(path), tokenizer=tokenizer_dir, **kw))


# ---- GLUE ----


def test_sst2_tsv_is_tokenized_padded_and_labelled(tmp_path, tokenizer_dir, tok):
    write_tsv(tmp_path / "SST-2" / "train.tsv", ["sentence", "label"], SST2_ROWS)
    write_tsv(tmp_path / "SST-2" / "dev.tsv", ["sentence", "label"], SST2_ROWS[:4])
    splits = glue(tmp_path, "sst2", tokenizer_dir, max_length=16)
    assert (len(splits.train), len(splits.eval)) == (10, 4)
    assert (splits.num_classes, splits.class_names) == (2, ["negative", "positive"])
    assert splits.input_names == ("input_ids", "attention_mask", "token_type_ids")
    assert (splits.image_size, splits.in_chans, splits.vocab_size) == (None, None, len(tok))
    batch = splits.train[:]
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}
    assert batch["input_ids"].shape == (10, 16) and batch["input_ids"].dtype == torch.int64
    assert batch["labels"].tolist() == [label for _, label in SST2_ROWS]
    assert batch["labels"].dtype == torch.int64
    for i, (sentence, _) in enumerate(SST2_ROWS):
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert tok.decode(ids, skip_special_tokens=True) == as_decoded(tok, sentence)
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
    assert not batch["token_type_ids"].any()  # single sentences: all segment 0
    assert (batch["attention_mask"].sum(1) < 16).all()  # padded, not truncated at this length
    # the quotes are kept as text and did not swallow the following rows
    assert tok.decode(batch["input_ids"][2], skip_special_tokens=True).startswith('" masterpiece "')


def test_truncation_to_max_length(tmp_path, tokenizer_dir):
    write_tsv(tmp_path / "train.tsv", ["sentence", "label"], SST2_ROWS)
    write_tsv(tmp_path / "dev.tsv", ["sentence", "label"], SST2_ROWS)
    batch = glue(tmp_path, "sst2", tokenizer_dir, max_length=6).train[:]
    assert batch["input_ids"].shape == (10, 6)
    assert batch["attention_mask"][1].tolist() == [1] * 6  # the 9-word sentence fills the window


def test_sst2_parquet_and_jsonl_equal_the_tsv(tmp_path, tokenizer_dir):
    write_tsv(tmp_path / "tsv" / "SST-2" / "train.tsv", ["sentence", "label"], SST2_ROWS)
    write_tsv(tmp_path / "tsv" / "SST-2" / "dev.tsv", ["sentence", "label"], SST2_ROWS[:4])
    frame = pd.DataFrame(SST2_ROWS, columns=["sentence", "label"]).assign(idx=range(10))
    (tmp_path / "hub" / "sst2").mkdir(parents=True)
    frame.to_parquet(tmp_path / "hub" / "sst2" / "train-00000-of-00001.parquet")
    frame[:4].to_parquet(tmp_path / "hub" / "sst2" / "validation-00000-of-00001.parquet")
    frame[:4].to_parquet(tmp_path / "hub" / "sst2" / "test-00000-of-00001.parquet")  # not an eval split
    (tmp_path / "jsonl").mkdir()
    frame.to_json(tmp_path / "jsonl" / "train.jsonl", orient="records", lines=True)
    frame[:4].to_json(tmp_path / "jsonl" / "validation.jsonl", orient="records", lines=True)

    tsv = glue(tmp_path / "tsv", "sst2", tokenizer_dir, max_length=12)
    for other in (
        glue(tmp_path / "hub", "sst2", tokenizer_dir, max_length=12),
        glue(tmp_path / "jsonl", "sst2", tokenizer_dir, max_length=12),
    ):
        assert set(other.train.column_names) == set(tsv.train.column_names)  # `idx` is dropped
        for name in tsv.train.column_names:
            assert torch.equal(other.train[:][name], tsv.train[:][name])
            assert torch.equal(other.eval[:][name], tsv.eval[:][name])


def test_mrpc_pairs_get_two_segments(tmp_path, tokenizer_dir, tok):
    header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
    rows = [(q, 100 + i, 200 + i, a, b) for i, (q, a, b) in enumerate(MRPC_ROWS)]
    write_tsv(tmp_path / "MRPC" / "train.tsv", header, rows)
    write_tsv(tmp_path / "MRPC" / "dev.tsv", header, rows[:2])
    splits = glue(tmp_path, "mrpc", tokenizer_dir, max_length=24)
    batch = splits.train[:]
    assert batch["labels"].tolist() == [1, 0, 1]
    for i, (_, first, second) in enumerate(MRPC_ROWS):
        ids, segments = batch["input_ids"][i], batch["token_type_ids"][i]
        real = batch["attention_mask"][i].bool()
        assert tok.decode(ids[real & (segments == 0)], skip_special_tokens=True) == as_decoded(tok, first)
        assert tok.decode(ids[real & (segments == 1)], skip_special_tokens=True) == as_decoded(tok, second)


def test_mnli_string_labels_and_dev_matched(tmp_path, tokenizer_dir):
    header = ["index", "promptID", "pairID", "genre", "sentence1", "sentence2", "label1", "gold_label"]
    rows = [(i, 0, 0, "fiction", p, h, g, g) for i, (p, h, g) in enumerate(MNLI_ROWS)]
    write_tsv(tmp_path / "MNLI" / "train.tsv", header, rows)
    write_tsv(tmp_path / "MNLI" / "dev_matched.tsv", header, rows[:2])
    write_tsv(tmp_path / "MNLI" / "dev_mismatched.tsv", header, rows[2:])
    splits = glue(tmp_path, "mnli", tokenizer_dir, max_length=24)
    assert splits.class_names == ["entailment", "neutral", "contradiction"] and splits.num_classes == 3
    assert splits.train[:]["labels"].tolist() == [0, 2, 1]  # the "-" row is gone
    assert splits.eval[:]["labels"].tolist() == [0, 2]


def test_cola_tsv_without_header(tmp_path, tokenizer_dir, tok):
    rows = [("gj04", label, "*" if label == 0 else "", sentence) for sentence, label in SST2_ROWS[:3]]
    write_tsv(tmp_path / "CoLA" / "train.tsv", None, rows)
    write_tsv(tmp_path / "CoLA" / "dev.tsv", None, rows[:1])
    splits = glue(tmp_path, "cola", tokenizer_dir, max_length=16)
    assert splits.class_names == ["unacceptable", "acceptable"]
    assert splits.train[:]["labels"].tolist() == [1, 0, 0] and len(splits.eval) == 1
    first = splits.train[0]
    assert tok.decode(first["input_ids"], skip_special_tokens=True) == as_decoded(tok, SST2_ROWS[0][0])


def test_stsb_is_a_float_regression_target(tmp_path, tokenizer_dir):
    rows = [
        {"sentence1": a, "sentence2": b, "label": s, "idx": i}
        for i, (a, b, s) in enumerate(
            [
                ("a man plays music", "a man is playing a guitar", 3.8),
                ("a dog runs in the park", "a cat sleeps indoors", 0.25),
            ]
        )
    ]
    (tmp_path / "stsb").mkdir()
    for name in ("train.jsonl", "validation.jsonl"):
        (tmp_path / "stsb" / name).write_text("\n".join(json.dumps(r) for r in rows))
    splits = glue(tmp_path, "stsb", tokenizer_dir)
    assert splits.num_classes == 1
    labels = splits.train[:]["labels"]
    assert labels.dtype == torch.float32 and labels.tolist() == pytest.approx([3.8, 0.25])
    assert splits.train[:]["input_ids"].shape == (2, 128)  # the GLUE default max_length


@pytest.mark.parametrize(
    "problem", ["missing_dir", "empty_dir", "no_eval", "test_labels", "no_tokenizer", "bad_tokenizer", "wrong_columns"]
)
def test_bad_glue_setups_raise_one_line_config_errors(tmp_path, tokenizer_dir, problem):
    data = tmp_path / "glue"
    tokenizer, task = tokenizer_dir, "sst2"
    if problem != "missing_dir":
        data.mkdir()
    if problem in ("no_eval", "no_tokenizer", "bad_tokenizer"):
        write_tsv(data / "SST-2" / "train.tsv", ["sentence", "label"], SST2_ROWS)
    if problem in ("no_tokenizer", "bad_tokenizer"):
        write_tsv(data / "SST-2" / "dev.tsv", ["sentence", "label"], SST2_ROWS)
    if problem == "test_labels":  # a Hub test split has label -1
        pd.DataFrame({"sentence": ["x", "y"], "label": [-1, -1]}).to_parquet(data / "train.parquet")
        pd.DataFrame({"sentence": ["x"], "label": [-1]}).to_parquet(data / "validation.parquet")
    if problem == "wrong_columns":
        pd.DataFrame({"text": ["x"], "label": [0]}).to_parquet(data / "train.parquet")
        pd.DataFrame({"text": ["x"], "label": [0]}).to_parquet(data / "validation.parquet")
    tokenizer = {"no_tokenizer": None, "bad_tokenizer": str(tmp_path)}.get(problem, tokenizer)
    with pytest.raises(ConfigError) as error:
        glue(data, task, tokenizer)
    message = str(error.value)
    assert "\n" not in message
    expected = {
        "missing_dir": "SST-2/train.tsv",
        "empty_dir": "SST-2/train.tsv",
        "no_eval": "dev.tsv",
        "test_labels": "[-1.0]",
        "no_tokenizer": "data.tokenizer=None",
        "bad_tokenizer": "not a Hugging Face tokenizer",
        "wrong_columns": "['sentence']",
    }[problem]
    assert expected in message


# ---- SQuAD ----


@pytest.fixture
def squad_dir(tmp_path):
    articles = squad_articles()
    (tmp_path / "train-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    (tmp_path / "dev-v1.1.json").write_text(json.dumps({"version": "1.1", "data": articles}))
    return tmp_path


def squad(path, tokenizer_dir, max_length=32, doc_stride=8):
    return build_datasets(
        DataConfig(name="squad", path=str(path), tokenizer=tokenizer_dir, max_length=max_length, doc_stride=doc_stride)
    )


def find(ids: list[int], part: list[int]) -> int | None:
    """Position of the token list `part` inside `ids`, or None."""
    return next((i for i in range(len(ids) - len(part) + 1) if ids[i : i + len(part)] == part), None)


def test_squad_windows_point_exactly_at_the_answer(squad_dir, tokenizer_dir, tok):
    splits = squad(squad_dir, tokenizer_dir)
    examples = [qa | {"context": p["context"]} for p in squad_articles()[0]["paragraphs"] for qa in p["qas"]]
    side = splits.qa_eval
    assert splits.num_classes == 2 and splits.vocab_size == len(tok)
    assert set(splits.train.column_names) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "start_positions",
        "end_positions",
    }
    assert set(splits.eval.column_names) == set(splits.train.column_names)  # no strings for the trainer
    assert len(splits.train) == len(splits.eval) == len(side.feature_example)
    counts = np.bincount(side.feature_example, minlength=10)
    assert (counts[:8] == 1).all() and (counts[8:] >= 3).all()  # the long paragraph is windowed
    batch = splits.train[:]
    assert batch["input_ids"].shape == (len(splits.train), 32)
    answered = 0
    for f in range(len(splits.train)):
        ex = examples[side.feature_example[f]]
        ids = batch["input_ids"][f].tolist()
        question_end = ids.index(tok.sep_token_id)
        answer = ex["answers"][0]["text"]
        want = tok(answer, add_special_tokens=False)["input_ids"]
        at = find(ids[question_end + 1 :], want)
        start, end = batch["start_positions"][f].item(), batch["end_positions"][f].item()
        if at is None:  # the window does not hold the whole answer: both point at [CLS]
            assert (start, end) == (0, 0)
            continue
        answered += 1
        assert (start, end) == (question_end + 1 + at, question_end + at + len(want))
        assert tok.decode(ids[start : end + 1]) == answer.lower()
        # eval offsets cut the same answer out of the raw context
        lo, hi = side.offsets[f, start, 0], side.offsets[f, end, 1]
        assert ex["context"][lo:hi] == answer
    assert answered >= 10 and answered < len(splits.train)  # some windows of the long context miss it
    # consecutive windows of one example overlap by doc_stride context tokens
    long_features = np.flatnonzero(side.feature_example == 8)
    first, second = side.offsets[long_features[0]], side.offsets[long_features[1]]
    shared = {tuple(o) for o in first if o[0] >= 0} & {tuple(o) for o in second if o[0] >= 0}
    assert len(shared) == 8


def test_squad_offsets_mark_only_context_tokens(squad_dir, tokenizer_dir, tok):
    splits = squad(squad_dir, tokenizer_dir)
    side, batch = splits.qa_eval, splits.eval[:]
    segments, real = batch["token_type_ids"], batch["attention_mask"].bool()
    is_sep = batch["input_ids"] == tok.sep_token_id
    in_context = torch.from_numpy(side.offsets[..., 0] >= 0)
    assert torch.equal(in_context, (segments == 1) & real & ~is_sep)
    assert side.ids == [f"q{i}" for i in range(10)]
    assert side.references()[9]["answers"]["text"] == ["golden retriever", "a golden retriever named Biscuit"]


def word_offsets(context: str, words: list[str | None], length: int = 10) -> list[list[int]]:
    """Offsets of a window: None marks a non-context token ([CLS], question, [SEP]), padded to `length`."""
    spans = [[context.index(w), context.index(w) + len(w)] if w else [-1, -1] for w in words]
    return spans + [[-1, -1]] * (length - len(spans))


def test_postprocess_picks_the_best_valid_span():
    context0, context1 = "alpha beta gamma delta epsilon zeta", "one two three"
    question = [None, None, None, None]  # [CLS] q q [SEP]
    side = QAEvalData(
        ids=["a", "b"],
        contexts=[context0, context1],
        answers=[{"text": ["x"], "answer_start": [0]}] * 2,
        feature_example=np.array([0, 0, 1]),
        offsets=np.array(
            [
                word_offsets(context0, question + ["alpha", "beta", "gamma", "delta", None]),
                word_offsets(context0, question + ["gamma", "delta", "epsilon", "zeta", None]),
                word_offsets(context1, [None, None, None, "one", "two", "three", None]),
            ]
        ),
    )
    start, end = np.zeros((3, 10)), np.zeros((3, 10))
    # feature 0: the top span lies in the question, the next has its end before its start; "beta gamma" is
    # its best valid span (8)
    start[0, 1], end[0, 2] = 50, 50
    start[0, 7], end[0, 7], end[0, 4], start[0, 4] = 30, -50, 30, -50
    start[0, 5], end[0, 6] = 4, 4
    # feature 1 (same example): "gamma .. zeta" scores 14 but has 4 tokens, "gamma delta epsilon" 13 with 3
    # tokens; "epsilon zeta" scores 12
    start[1, 4], end[1, 7], start[1, 6], end[1, 6] = 7, 7, 5, 6
    start[2, 4], end[2, 5] = 1, 1

    predictions = postprocess_qa(side, start, end, max_answer_length=2)
    assert predictions == [{"id": "a", "prediction_text": "epsilon zeta"}, {"id": "b", "prediction_text": "two three"}]
    assert postprocess_qa(side, start, end, max_answer_length=3)[0]["prediction_text"] == "gamma delta epsilon"
    longer = postprocess_qa(side, start, end, max_answer_length=30)
    assert longer[0]["prediction_text"] == "gamma delta epsilon zeta"
    # only the single best start and end per feature: feature 0's lie in the question, feature 1's pair is
    # too long, so example "a" has no candidate at all
    assert postprocess_qa(side, start, end, n_best=1, max_answer_length=2)[0]["prediction_text"] == ""


def test_postprocess_of_gold_logits_scores_100(squad_dir, tokenizer_dir):
    """Logits peaked on the train-style answer positions recover every gold answer exactly."""
    splits = squad(squad_dir, tokenizer_dir)
    side, batch = splits.qa_eval, splits.eval[:]
    shape = side.offsets.shape[:2]
    start_logits, end_logits = np.zeros(shape), np.zeros(shape)
    rows = np.arange(shape[0])
    start_logits[rows, batch["start_positions"].numpy()] = 10
    end_logits[rows, batch["end_positions"].numpy()] = 10
    predictions = postprocess_qa(side, start_logits, end_logits)
    assert squad_metrics(predictions, side.references()) == {"exact_match": 100.0, "f1": 100.0}
    with pytest.raises(ValueError, match="do not match"):
        postprocess_qa(side, start_logits[:-1], end_logits[:-1])


@pytest.mark.parametrize("problem", ["missing_dir", "no_dev", "not_squad", "stride_too_long"])
def test_bad_squad_setups_raise_one_line_config_errors(tmp_path, tokenizer_dir, problem):
    data = tmp_path / "squad"
    if problem != "missing_dir":
        data.mkdir()
        (data / "train-v1.1.json").write_text(json.dumps({"data": squad_articles()}))
    if problem == "not_squad":
        (data / "dev-v1.1.json").write_text(json.dumps({"data": [{"title": "x", "paragraphs": [{"text": "y"}]}]}))
    if problem == "stride_too_long":
        (data / "dev-v1.1.json").write_text(json.dumps({"data": squad_articles()}))
    with pytest.raises(ConfigError) as error:
        squad(data, tokenizer_dir, max_length=32, doc_stride=24 if problem == "stride_too_long" else 8)
    message = str(error.value)
    assert "\n" not in message
    expected = {
        "missing_dir": "dev-v1.1.json",
        "no_dev": "no eval file",
        "not_squad": "KeyError",
        "stride_too_long": "data.doc_stride=24",
    }[problem]
    assert expected in message


# ---- CIFAR ----


def cifar_images(n: int, first_label: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Random HWC uint8 images whose top-left red pixel encodes the label, to check label order."""
    images = np.random.default_rng(seed).integers(0, 256, (n, 32, 32, 3), dtype=np.uint8)
    labels = [(first_label + i) % 10 for i in range(n)]
    images[:, 0, 0, 0] = np.array(labels) * 20
    return images, labels


def pickle_batch(
    path, images: np.ndarray, labels: list[int], key: bytes = b"labels", extra: dict | None = None
) -> None:
    """One file of the original python distribution: rows of R, G, B planes (C x H x W)."""
    rows = images.transpose(0, 3, 1, 2).reshape(len(images), -1)
    with open(path, "wb") as f:
        pickle.dump({b"data": rows, key: labels, **(extra or {})}, f)


def denormalise(pixel_values: torch.Tensor) -> np.ndarray:
    """Back to HWC uint8-valued floats (undoing the ImageNet normalisation)."""
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    return ((pixel_values * std + mean) * 255).permute(1, 2, 0).numpy()


@pytest.fixture
def cifar10_dir(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    train = [cifar_images(2, 2 * i, seed=i) for i in range(5)]
    for i, (images, labels) in enumerate(train):
        pickle_batch(folder / f"data_batch_{i + 1}", images, labels)
    pickle_batch(folder / "test_batch", *cifar_images(3, 7, seed=9))
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"class{i}".encode() for i in range(10)]}, f)
    return tmp_path, np.concatenate([t[0] for t in train]), sum((t[1] for t in train), [])


def test_cifar10_pickles(cifar10_dir):
    root, images, labels = cifar10_dir
    splits = build_datasets(DataConfig(name="cifar10", path=str(root)))
    assert (splits.num_classes, splits.class_names[:2]) == (10, ["class0", "class1"])
    assert (splits.image_size, splits.in_chans, splits.input_names) == (32, 3, ("pixel_values",))
    assert (len(splits.train), len(splits.eval)) == (10, 3)
    batch = splits.train[:]
    assert batch["pixel_values"].shape == (10, 3, 32, 32) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == labels
    for i in range(10):  # channel order and normalisation: the exact pixels come back
        np.testing.assert_allclose(denormalise(batch["pixel_values"][i]), images[i], atol=1e-3)
    assert splits.eval[:]["labels"].tolist() == [7, 8, 9]
    # the contents of the folder work as the path too
    inner = build_datasets(DataConfig(name="cifar10", path=str(root / "cifar-10-batches-py")))
    assert torch.equal(inner.train[:]["pixel_values"], batch["pixel_values"])


def test_cifar_resize_and_train_only_augmentation(cifar10_dir):
    root = str(cifar10_dir[0])
    plain = build_datasets(DataConfig(name="cifar10", path=root, image_size=48))
    augmented = build_datasets(DataConfig(name="cifar10", path=root, image_size=48, augment=True))
    assert plain.image_size == 48 and plain.train[0]["pixel_values"].shape == (3, 48, 48)
    assert torch.equal(plain.eval[:]["pixel_values"], augmented.eval[:]["pixel_values"])
    torch.manual_seed(0)
    first = augmented.train[:]["pixel_values"]
    assert first.shape == (10, 3, 48, 48)
    assert not torch.equal(first, augmented.train[:]["pixel_values"])  # new crops / flips per access
    assert torch.equal(plain.train[:]["pixel_values"], plain.train[:]["pixel_values"])


def test_cifar100_pickles_use_the_fine_labels(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    images = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    pickle_batch(folder / "train", images, [99, 0, 50, 7], key=b"fine_labels", extra={b"coarse_labels": [1, 2, 3, 4]})
    pickle_batch(folder / "test", images[:2], [3, 4], key=b"fine_labels", extra={b"coarse_labels": [0, 0]})
    with open(folder / "meta", "wb") as f:
        pickle.dump(
            {b"fine_label_names": [f"fine{i}".encode() for i in range(100)], b"coarse_label_names": [b"coarse"] * 20}, f
        )
    splits = build_datasets(DataConfig(name="cifar100", path=str(tmp_path)))
    assert splits.num_classes == 100 and splits.class_names[99] == "fine99"
    assert splits.train[:]["labels"].tolist() == [99, 0, 50, 7]
    assert splits.eval[:]["labels"].tolist() == [3, 4]
    np.testing.assert_allclose(denormalise(splits.eval[1]["pixel_values"]), images[1], atol=1e-3)


def hf_cifar(
    images: np.ndarray, labels: list[int], image_col: str, label_col: str, classes: int, extra: dict | None = None
) -> datasets.Dataset:
    """A split in the Hugging Face cifar10 / cifar100 format (PNG-encoded Image column + ClassLabel)."""
    features = {image_col: datasets.Image(), label_col: datasets.ClassLabel(names=[f"c{i}" for i in range(classes)])}
    data = {image_col: list(images), label_col: labels}
    for name, values in (extra or {}).items():
        features[name], data[name] = datasets.Value("int64"), values
    return datasets.Dataset.from_dict(data, features=datasets.Features(features))


def test_cifar10_parquet(tmp_path):
    images, labels = cifar_images(6, 0, seed=1)
    (tmp_path / "plain_text").mkdir()
    hf_cifar(images[:4], labels[:4], "img", "label", 10).to_parquet(tmp_path / "plain_text" / "train-00000.parquet")
    hf_cifar(images[4:], labels[4:], "img", "label", 10).to_parquet(tmp_path / "plain_text" / "test-00000.parquet")
    splits = build_datasets(DataConfig(name="cifar10", path=str(tmp_path)))
    assert splits.class_names == [f"c{i}" for i in range(10)]
    assert splits.train[:]["labels"].tolist() == labels[:4] and splits.eval[:]["labels"].tolist() == labels[4:]
    for i in range(4):
        np.testing.assert_allclose(denormalise(splits.train[i]["pixel_values"]), images[i], atol=1e-3)


def test_cifar100_saved_dataset_dict(tmp_path):
    images = np.random.default_rng(2).integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    dd = datasets.DatasetDict(
        train=hf_cifar(images, [5, 95, 42], "img", "fine_label", 100, {"coarse_label": [1, 2, 3]}),
        test=hf_cifar(images[:1], [61], "img", "fine_label", 100, {"coarse_label": [0]}),
    )
    dd.save_to_disk(str(tmp_path / "saved"))
    splits = build_datasets(DataConfig(name="cifar100", path=str(tmp_path / "saved"), image_size=16))
    assert splits.train[:]["labels"].tolist() == [5, 95, 42] and splits.eval[:]["labels"].tolist() == [61]
    assert splits.train[:]["pixel_values"].shape == (3, 3, 16, 16)
    assert set(splits.train[:]) == {"pixel_values", "labels"}


@pytest.mark.parametrize("problem", ["missing_dir", "empty_dir", "missing_batch", "cifar100_labels_as_10"])
def test_bad_cifar_paths_raise_one_line_config_errors(tmp_path, cifar10_dir, problem):
    root = cifar10_dir[0]
    name, path = "cifar10", root
    if problem == "missing_dir":
        path = tmp_path / "nope"
    if problem == "empty_dir":
        path = tmp_path / "empty"
        path.mkdir()
    if problem == "missing_batch":
        (root / "cifar-10-batches-py" / "data_batch_3").unlink()
    if problem == "cifar100_labels_as_10":  # CIFAR-100 fine labels read as CIFAR-10
        folder = tmp_path / "c100"
        folder.mkdir()
        pickle_batch(folder / "data_batch_1", *cifar_images(1, 0, 0), key=b"labels")
        for i in range(2, 6):
            pickle_batch(folder / f"data_batch_{i}", *cifar_images(1, 0, 0))
        pickle_batch(folder / "test_batch", cifar_images(1, 0, 0)[0], [42])
        path = folder
    with pytest.raises(ConfigError) as error:
        build_datasets(DataConfig(name=name, path=str(path)))
    message = str(error.value)
    assert "\n" not in message
    expected = {
        "missing_dir": "cifar-10-batches-py/",
        "empty_dir": "train*.parquet",
        "missing_batch": "['data_batch_3']",
        "cifar100_labels_as_10": "outside 0..9",
    }[problem]
    assert expected in message


class _RunsCode:
    """A pickle that calls a function while it loads: what a hostile file would do."""

    def __reduce__(self):
        return (Path.touch, (Path(os.environ["PTRUN_PICKLE_CANARY"]),))


def test_cifar_pickle_that_names_a_function_is_refused_unrun(tmp_path, cifar10_dir, monkeypatch):
    root = cifar10_dir[0] / "cifar-10-batches-py"
    canary = tmp_path / "canary"
    monkeypatch.setenv("PTRUN_PICKLE_CANARY", str(canary))
    with open(root / "data_batch_2", "wb") as f:
        pickle.dump({b"data": _RunsCode(), b"labels": [0]}, f)
    with pytest.raises(ConfigError, match=r"is not a CIFAR python pickle \(UnpicklingError: it names pathlib"):
        build_datasets(DataConfig(name="cifar10", path=str(cifar10_dir[0])))
    assert not canary.exists()  # the function was never called
