"""SQuAD v1.1 (official JSON), tokenized with a local tokenizer directory into windows of the context
(`data.doc_stride` apart); the dataset columns are the model inputs plus `start_positions` / `end_positions`.

SQuAD evaluation needs more than tensors: which example each eval feature came from, and where each token
lies in the context. That side data is `QAEvalData` (`DataSplits.qa_eval`), indexed by eval feature (row of
`DataSplits.eval`, i.e. the `index` the batch iterator yields), so the trainer collects start/end logits per
feature and calls `postprocess_qa` -> `ptrun.data.metrics.squad_metrics`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import datasets
import numpy as np
import pyarrow.parquet as pq

from ptrun.config import ConfigError, DataConfig
from ptrun.data.splits import DataSplits
from ptrun.data.text import INPUT_NAMES, arrays_to_dataset, chunks, compact, load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


SQUAD_LAYOUT = (
    "expected SQuAD v1.1 JSON (data[].paragraphs[].qas[]): path/train-v1.1.json + "
    "path/dev-v1.1.json, or train*.json + dev*.json / validation*.json, or the hub's parquet "
    "(train-*.parquet + validation-*.parquet, in path or one folder down)"
)


@dataclass(frozen=True)
class QAEvalData:
    """What SQuAD postprocessing needs beside the logits, indexed by eval *feature* (a row of the eval
    dataset; one long context gives several overlapping features of one example)."""

    ids: list[str]
    """Per example: the SQuAD question id."""
    contexts: list[str]
    """Per example: the context paragraph the answer text is cut from."""
    answers: list[dict[str, list]]
    """Per example: the gold answers, `{"text": [...], "answer_start": [...]}` (SQuAD / torchmetrics format)."""
    feature_example: np.ndarray
    """[F] int64: the example each feature came from."""
    offsets: np.ndarray
    """[F, T, 2] int32: character span [start, end) of each token in its example's context; -1 for tokens
    outside the context (question, special tokens, padding), which can never be part of an answer."""

    def references(self) -> list[dict]:
        """The gold answers in the format `ptrun.data.metrics.squad_metrics` takes."""
        return [{"id": i, "answers": a} for i, a in zip(self.ids, self.answers, strict=True)]


def build_squad(cfg: DataConfig, tokenizer: str | None = None) -> DataSplits:
    """SQuAD v1.1 from the official JSON files in `cfg.path`: windows of `max_length` tokens (default 384)
    over each context, `doc_stride` tokens of overlap, with `start_positions` / `end_positions` (the
    [CLS] index when the answer is not inside the window) for train and eval (the eval loss), plus the
    eval side data in `DataSplits.qa_eval`."""
    tok = load_tokenizer(tokenizer or cfg.tokenizer, "squad")
    train_file, eval_file = _squad_files(cfg)
    max_length = cfg.max_length
    # both files are read before the slow tokenization, so a bad eval file fails fast
    read = read_squad_parquet if train_file.suffix == ".parquet" else read_squad
    train_examples, examples = read(train_file), read(eval_file)
    train, _, _ = qa_features(tok, train_examples, max_length, cfg.doc_stride)
    evals, feature_example, offsets = qa_features(tok, examples, max_length, cfg.doc_stride, keep_offsets=True)
    side = QAEvalData(
        ids=examples["id"],
        contexts=examples["context"],
        answers=examples["answers"],
        feature_example=feature_example,
        offsets=offsets,
    )
    return DataSplits.of_tokens(
        train,
        evals,
        ["start", "end"],
        INPUT_NAMES,
        len(tok),
        qa_eval=side,
        metrics=partial(_squad_eval_metrics, side),
    )


def _squad_eval_metrics(side: QAEvalData, outputs, eval_split: datasets.Dataset) -> dict:
    """Answers from the n-best spans of each example's windows, scored against the gold answers."""
    from ptrun.data.metrics import squad_metrics  # inner import: optional library (torchmetrics, for evaluating)

    predictions = postprocess_qa(side, outputs[..., 0].numpy(), outputs[..., 1].numpy())
    return squad_metrics(predictions, side.references())


def _squad_files(cfg: DataConfig) -> tuple[Path, Path]:
    """The train and eval JSON files in `cfg.path` (official names first)."""
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {SQUAD_LAYOUT}")

    def find(official: str, patterns: tuple[str, ...]) -> Path | None:
        if official and (root / official).is_file():
            return root / official
        return next((found[0] for p in patterns if (found := sorted(root.glob(p)))), None)

    train = find("train-v1.1.json", ("train*.json",))
    evals = find("dev-v1.1.json", ("dev*.json", "validation*.json"))
    if train is None and evals is None:  # the hub's layout (rajpurkar/squad: plain_text/train-00000-of-00001...)
        train = find("", ("train-*.parquet", "*/train-*.parquet"))
        evals = find("", ("validation-*.parquet", "*/validation-*.parquet"))
    if train is None or evals is None:
        raise ConfigError(f"data.path={cfg.path!r}: no {'train' if train is None else 'eval'} file; {SQUAD_LAYOUT}")
    return train, evals


def read_squad(path: Path) -> dict[str, list]:
    """Flatten an official SQuAD JSON file to one row per question: id, context, question, answers."""
    try:
        articles = json.loads(Path(path).read_text(encoding="utf-8"))["data"]
        rows: dict[str, list] = {"id": [], "context": [], "question": [], "answers": []}
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    rows["id"].append(str(qa["id"]))
                    rows["context"].append(paragraph["context"])
                    # Some questions start with runs of spaces that would only waste window tokens.
                    rows["question"].append(qa["question"].lstrip())
                    rows["answers"].append(
                        {
                            "text": [a["text"] for a in qa["answers"]],
                            "answer_start": [int(a["answer_start"]) for a in qa["answers"]],
                        }
                    )
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        problem = " ".join(f"{type(e).__name__}: {e}".split())
        raise ConfigError(f"data.path: {str(path)!r} is not SQuAD JSON ({problem}); {SQUAD_LAYOUT}") from e
    if not rows["id"]:
        raise ConfigError(f"data.path: {str(path)!r} holds no questions; {SQUAD_LAYOUT}")
    if not all(a["text"] for a in rows["answers"]):
        raise ConfigError(f"data.path: {str(path)!r} has questions without answers (SQuAD v2?); {SQUAD_LAYOUT}")
    return rows


def read_squad_parquet(path: Path) -> dict[str, list]:
    """The hub's SQuAD parquet (one row per question: id, title, context, question, answers {text,
    answer_start}) as `read_squad` returns the JSON."""
    try:
        table = pq.read_table(path, columns=["id", "context", "question", "answers"])
    except Exception as e:  # a missing column or a file that is not parquet
        problem = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(f"data.path: {str(path)!r} is not SQuAD parquet ({problem}); {SQUAD_LAYOUT}") from None
    rows = table.to_pydict()
    answers = [{"text": list(a["text"]), "answer_start": [int(s) for s in a["answer_start"]]} for a in rows["answers"]]
    if not rows["id"]:
        raise ConfigError(f"data.path: {str(path)!r} holds no questions; {SQUAD_LAYOUT}")
    if not all(a["text"] for a in answers):
        raise ConfigError(f"data.path: {str(path)!r} has questions without answers (SQuAD v2?); {SQUAD_LAYOUT}")
    return {
        "id": [str(i) for i in rows["id"]],
        "context": rows["context"],
        "question": [q.lstrip() for q in rows["question"]],
        "answers": answers,
    }


def _check_window(tok: PreTrainedTokenizerBase, questions: list[str], max_length: int, doc_stride: int) -> None:
    """Every window must hold more context tokens than the stride; the tokenizer otherwise aborts the
    process with a Rust panic instead of an exception, so this is checked up front."""
    longest = max(len(ids) for ids in tok(questions, add_special_tokens=False)["input_ids"])
    room = max_length - longest - tok.num_special_tokens_to_add(pair=True)
    if room <= doc_stride:
        raise ConfigError(
            f"data.doc_stride={doc_stride} is not allowed: it must be below the context room of "
            f"data.max_length={max_length} minus the longest question ({longest} tokens) minus "
            f"special tokens = {room}"
        )


def qa_features(
    tok: PreTrainedTokenizerBase,
    examples: dict[str, list],
    max_length: int,
    doc_stride: int,
    keep_offsets: bool = False,
) -> tuple[datasets.Dataset, np.ndarray, np.ndarray | None]:
    """Question + context windows (`return_overflowing_tokens` with `stride=doc_stride`) with the answer's
    token span in each window, [CLS] when the window does not contain the whole answer.

    Returns the features (model inputs + `start_positions`, `end_positions`), the example of each feature,
    and with `keep_offsets` the [F, T, 2] context offsets (-1 outside the context)."""
    _check_window(tok, examples["question"], max_length, doc_stride)
    columns: dict[str, list[np.ndarray]] = {k: [] for k in (*INPUT_NAMES, "start_positions", "end_positions")}
    feature_example, all_offsets = [], []
    for part in chunks(len(examples["id"])):
        enc = tok(
            examples["question"][part],
            examples["context"][part],
            truncation="only_second",
            max_length=max_length,
            stride=doc_stride,
            return_overflowing_tokens=True,
            return_offsets_mapping=True,
            padding="max_length",
            return_token_type_ids=True,
        )
        # lists -> arrays here: transformers' return_tensors="np" is several times slower
        arrays = {k: np.asarray(enc[k]) for k in INPUT_NAMES}
        example_of = np.asarray(enc["overflow_to_sample_mapping"], dtype=np.int64) + part.start
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int32)
        # sequence_ids: None (-> nan) for special tokens and padding, 0 question, 1 context
        sequence = np.array([enc.sequence_ids(i) for i in range(len(example_of))], dtype=np.float32)
        offsets[sequence != 1] = -1
        cls_index = np.argmax(arrays["input_ids"] == tok.cls_token_id, axis=1)
        starts, ends = [], []
        for i, ex in enumerate(example_of):
            answer = examples["answers"][ex]
            cls = int(cls_index[i])
            span = answer_tokens(
                offsets[i], answer["answer_start"][0], answer["answer_start"][0] + len(answer["text"][0])
            )
            starts.append(span[0] if span else cls)
            ends.append(span[1] if span else cls)
        for k in INPUT_NAMES:
            columns[k].append(compact(k, arrays[k]))
        columns["start_positions"].append(np.asarray(starts, dtype=np.int64))
        columns["end_positions"].append(np.asarray(ends, dtype=np.int64))
        feature_example.append(example_of)
        if keep_offsets:
            all_offsets.append(offsets)
    features = arrays_to_dataset({k: np.concatenate(v) for k, v in columns.items()})
    return features, np.concatenate(feature_example), (np.concatenate(all_offsets) if keep_offsets else None)


def answer_tokens(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """First and last token of the answer characters [start_char, end_char) in one window, or None when
    the window's context does not cover them all. `offsets` is [T, 2] with -1 outside the context."""
    context = offsets[:, 0] >= 0
    if not context.any():
        return None
    first, last = np.flatnonzero(context)[[0, -1]]
    if offsets[first, 0] > start_char or offsets[last, 1] < end_char:
        return None
    # the last token starting at or before the answer, the first one ending at or after it
    start = np.flatnonzero(context & (offsets[:, 0] <= start_char))[-1]
    end = np.flatnonzero(context & (offsets[:, 1] >= end_char))[0]
    return int(start), int(end)


def postprocess_qa(
    data: QAEvalData, start_logits: np.ndarray, end_logits: np.ndarray, n_best: int = 20, max_answer_length: int = 30
) -> list[dict[str, str]]:
    """The best answer text per example from the [F, T] start/end logits of all eval features.

    In each feature, the `n_best` highest start and end logits are paired; a pair is a candidate if both
    tokens are in the context, end >= start and the span has at most `max_answer_length` tokens. The
    candidate with the largest start + end logit over all of an example's features wins; its text is cut
    from the context by the token offsets. An example without a candidate gets "".
    Returns `[{"id": ..., "prediction_text": ...}]` in example order (the `squad_metrics` format).
    """
    start_logits, end_logits = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    if start_logits.shape != data.offsets.shape[:2] or end_logits.shape != data.offsets.shape[:2]:
        raise ValueError(
            f"logits {start_logits.shape} / {end_logits.shape} do not match the eval features {data.offsets.shape[:2]}"
        )
    best: list[tuple[float, str] | None] = [None] * len(data.ids)
    for f, ex in enumerate(data.feature_example):
        for score, lo, hi in nbest_spans(start_logits[f], end_logits[f], data.offsets[f], n_best, max_answer_length)[
            :1
        ]:
            if best[ex] is None or score > best[ex][0]:
                best[ex] = (score, data.contexts[ex][lo:hi])
    return [{"id": i, "prediction_text": b[1] if b else ""} for i, b in zip(data.ids, best, strict=True)]


def nbest_spans(
    start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, n_best: int = 20, max_answer_length: int = 30
) -> list[tuple[float, int, int]]:
    """Valid answer spans of one feature as (start + end logit, context start char, end char), best first."""
    starts = np.argsort(start_logits)[::-1][:n_best]
    ends = np.argsort(end_logits)[::-1][:n_best]
    s, e = np.meshgrid(starts, ends, indexing="ij")
    ok = (offsets[s, 0] >= 0) & (offsets[e, 0] >= 0) & (e >= s) & (e - s + 1 <= max_answer_length)
    s, e = s[ok], e[ok]
    scores = start_logits[s] + end_logits[e]
    order = np.argsort(-scores, kind="stable")
    return [(float(scores[i]), int(offsets[s[i], 0]), int(offsets[e[i], 1])) for i in order]
