"""Text sources: GLUE (original TSVs or parquet/json tables) and SQuAD v1.1 (official JSON), tokenized with a
local tokenizer directory (`data.tokenizer`, which the trainer fills from `model.pretrained` when unset).

Every split is padded to `data.max_length` so batches stack; the dataset columns are exactly what the trainer
reads: the model inputs `input_ids`, `attention_mask`, `token_type_ids` plus the targets (`labels` for GLUE,
`start_positions` / `end_positions` for SQuAD). Token columns are stored as int32 (int8 for the masks) to
keep large tasks (QQP, SQuAD) small in memory; the torch format returns int64 tensors.

SQuAD evaluation needs more than tensors: which example each eval feature came from, and where each token
lies in the context. That side data is `QAEvalData` (`DataSplits.qa_eval`), indexed by eval feature (row of
`DataSplits.eval`, i.e. the `index` the batch iterator yields), so the trainer collects start/end logits per
feature and calls `postprocess_qa` -> `ptrun.data.metrics.squad_metrics`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import datasets
import numpy as np
import pyarrow as pa

from ptrun.config import ConfigError, DataConfig
from ptrun.data.splits import DataSplits

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
GLUE_MAX_LENGTH = 128
SQUAD_MAX_LENGTH = 384
TOKENIZE_CHUNK = 4096
"""Examples tokenized per call: bounds the Python lists the tokenizer returns on 100k+ example tasks."""
NO_GOLD_LABEL = "-"
"""NLI rows whose annotators did not agree carry this label; they have no gold class and are skipped."""


# ---- GLUE --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GlueTask:
    """How one GLUE task is laid out on disk and what its labels mean."""

    folder: str
    """Folder of the original GLUE distribution (`SST-2`)."""
    text: tuple[str, ...]
    """Text columns under their Hugging Face names (one sentence or a pair)."""
    tsv_columns: dict[str, str]
    """Original TSV column -> Hugging Face name (text columns and `label`)."""
    class_names: tuple[str, ...]
    """Names of the classes in label order; a single name for the regression task STS-B."""
    eval_file: str = "dev.tsv"
    tsv_header: bool = True
    """CoLA's TSVs have no header row; the columns are then given by position (keys of `tsv_columns`)."""
    string_labels: bool = False
    """The TSV stores label names (NLI tasks) instead of class indices."""

    @property
    def regression(self) -> bool:
        return len(self.class_names) == 1


GLUE_TASKS = {
    "cola": GlueTask("CoLA", ("sentence",), {"1": "label", "3": "sentence"}, ("unacceptable", "acceptable"),
                     tsv_header=False),
    "sst2": GlueTask("SST-2", ("sentence",), {"sentence": "sentence", "label": "label"}, ("negative", "positive")),
    "mrpc": GlueTask("MRPC", ("sentence1", "sentence2"),
                     {"#1 String": "sentence1", "#2 String": "sentence2", "Quality": "label"},
                     ("not_equivalent", "equivalent")),
    "qqp": GlueTask("QQP", ("question1", "question2"),
                    {"question1": "question1", "question2": "question2", "is_duplicate": "label"},
                    ("not_duplicate", "duplicate")),
    "stsb": GlueTask("STS-B", ("sentence1", "sentence2"),
                     {"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"}, ("similarity",)),
    "mnli": GlueTask("MNLI", ("premise", "hypothesis"),
                     {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
                     ("entailment", "neutral", "contradiction"), eval_file="dev_matched.tsv", string_labels=True),
    "qnli": GlueTask("QNLI", ("question", "sentence"), {"question": "question", "sentence": "sentence",
                                                        "label": "label"},
                     ("entailment", "not_entailment"), string_labels=True),
    "rte": GlueTask("RTE", ("sentence1", "sentence2"),
                    {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
                    ("entailment", "not_entailment"), string_labels=True),
    "wnli": GlueTask("WNLI", ("sentence1", "sentence2"),
                     {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
                     ("not_entailment", "entailment")),
}
TABLE_SUFFIXES = ("parquet", "jsonl", "json")


def glue_layout(task: str) -> str:
    """The one-line description of the accepted GLUE layouts, for error messages."""
    spec = GLUE_TASKS[task]
    return (f"expected the GLUE TSV layout (path/{spec.folder}/train.tsv + {spec.eval_file}) or tables "
            f"(train*.parquet + validation*.parquet, or .jsonl/.json, in path or path/{task}/)")


def build_glue(cfg: DataConfig, tokenizer: str | None = None) -> DataSplits:
    """GLUE task `cfg.task` from `cfg.path`: train split + dev split (MNLI: dev matched), tokenized.

    `tokenizer` overrides `cfg.tokenizer` (a local tokenizer directory). STS-B is a regression: float32
    `labels` and num_classes 1; the other tasks have int64 class indices.
    """
    if cfg.task not in GLUE_TASKS:
        raise ConfigError(f"data.task={cfg.task!r} is not allowed: one of {', '.join(GLUE_TASKS)} for data.name=glue")
    spec = GLUE_TASKS[cfg.task]
    tok = load_tokenizer(tokenizer or cfg.tokenizer, "glue")
    train_rows, eval_rows = _read_glue(cfg)
    max_length = cfg.max_length or GLUE_MAX_LENGTH

    def split(rows: datasets.Dataset) -> datasets.Dataset:
        columns = tokenize_texts(tok, [rows.data.column(c).to_pylist() for c in spec.text], max_length)
        label_type = np.float32 if spec.regression else np.int64
        columns["labels"] = rows.data.column("label").to_numpy().astype(label_type)
        return arrays_to_dataset(columns)

    return DataSplits(train=split(train_rows), eval=split(eval_rows), num_classes=len(spec.class_names),
                      class_names=list(spec.class_names), input_names=INPUT_NAMES, image_size=None,
                      in_chans=None, vocab_size=len(tok), metrics=partial(_glue_eval_metrics, cfg.task))


def _glue_eval_metrics(task: str, outputs, eval_split: datasets.Dataset) -> dict:
    from ptrun.data.metrics import glue_metrics  # torchmetrics: seconds to import, so only when evaluating

    return glue_metrics(task, outputs, eval_split[:]["labels"])


def _read_glue(cfg: DataConfig) -> tuple[datasets.Dataset, datasets.Dataset]:
    """The raw train and eval rows of `cfg.task` (text columns under Hugging Face names + `label`)."""
    task, spec = cfg.task, GLUE_TASKS[cfg.task]
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {glue_layout(task)}")
    # The task's own folder first, so a GLUE root holding every task picks the right one.
    for folder in (root / spec.folder, root / task, root):
        if (folder / "train.tsv").is_file() and (folder / spec.eval_file).is_file():
            return _read_glue_tsv(folder / "train.tsv", task), _read_glue_tsv(folder / spec.eval_file, task)
        for suffix in TABLE_SUFFIXES:
            train, evals = _table_files(folder, suffix, task)
            if train and evals:
                return _read_glue_table(train, task), _read_glue_table(evals, task)
    raise ConfigError(f"data.path={cfg.path!r}: found no {task} train and eval files; {glue_layout(task)}")


def _table_files(folder: Path, suffix: str, task: str) -> tuple[list[Path], list[Path]]:
    """Train and eval table files with `suffix` in `folder` (Hugging Face names: `validation-00000-of-...`).

    MNLI has two eval splits; the matched one is GLUE's MNLI-m (mismatched must not be mixed in)."""
    evals = ("validation_matched", "dev_matched") if task == "mnli" else ("validation", "dev")
    train = sorted(folder.glob(f"train*.{suffix}"))
    eval_files = next((found for name in evals if (found := sorted(folder.glob(f"{name}*.{suffix}")))), [])
    return train, eval_files


def _read_glue_tsv(path: Path, task: str) -> datasets.Dataset:
    """One original GLUE TSV. Quoting is off (csv.QUOTE_NONE): QQP and MNLI sentences contain bare quotes
    that a CSV reader would take as field delimiters, merging rows."""
    import pandas as pd

    spec = GLUE_TASKS[task]
    try:
        frame = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False,
                            header=0 if spec.tsv_header else None, encoding="utf-8-sig")
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        raise ConfigError(f"data.path: cannot read {str(path)!r} as a GLUE TSV ({' '.join(str(e).split())})") from e
    if not spec.tsv_header:
        frame.columns = [str(c) for c in frame.columns]
    missing = [c for c in spec.tsv_columns if c not in frame.columns]
    if missing:
        raise ConfigError(f"data.path: {str(path)!r} lacks the {task} columns {missing}; {glue_layout(task)}")
    frame = frame[list(spec.tsv_columns)].rename(columns=spec.tsv_columns)
    if spec.string_labels:
        frame = frame[frame["label"] != NO_GOLD_LABEL]
        names = {name: i for i, name in enumerate(spec.class_names)}
        unknown = sorted(set(frame["label"]) - set(names))
        if unknown:
            raise ConfigError(f"data.path: {str(path)!r} has {task} labels {unknown[:5]}; expected {list(names)}")
        frame["label"] = frame["label"].map(names)
    else:
        frame["label"] = pd.to_numeric(frame["label"], errors="coerce")
        if frame["label"].isna().any():
            raise ConfigError(f"data.path: {str(path)!r} has non-numeric {task} labels")
    rows = datasets.Dataset.from_pandas(frame, preserve_index=False)
    return _check_labels(rows, task, path)


def _read_glue_table(files: list[Path], task: str) -> datasets.Dataset:
    """Parquet or json(l) files with the Hugging Face `glue` columns (labels already class indices)."""
    spec = GLUE_TASKS[task]
    if files[0].suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = datasets.Dataset(pa.concat_tables([pq.read_table(f) for f in files]))
    else:
        import pandas as pd

        frames = []
        for f in files:
            try:  # Hugging Face writes JSON lines even as `.json`; a plain JSON list is accepted too
                frames.append(pd.read_json(f, lines=True))
            except ValueError:
                frames.append(pd.read_json(f))
        rows = datasets.Dataset.from_pandas(pd.concat(frames), preserve_index=False)
    missing = [c for c in (*spec.text, "label") if c not in rows.column_names]
    if missing:
        raise ConfigError(f"data.path: {str(files[0])!r} lacks the {task} columns {missing} "
                          f"(has {rows.column_names}); {glue_layout(task)}")
    return _check_labels(rows.select_columns([*spec.text, "label"]), task, files[0])


def _check_labels(rows: datasets.Dataset, task: str, where: Path) -> datasets.Dataset:
    """Class labels must be class indices: a test split (label -1) or a wrong task would otherwise train on
    garbage targets."""
    spec = GLUE_TASKS[task]
    labels = rows.data.column("label").to_numpy().astype(np.float64)
    if len(labels) == 0:
        raise ConfigError(f"data.path: {str(where)!r} has no rows")
    if not spec.regression and not np.isin(labels, np.arange(len(spec.class_names))).all():
        bad = sorted(set(labels[~np.isin(labels, np.arange(len(spec.class_names)))].tolist()))[:5]
        raise ConfigError(f"data.path: {str(where)!r} has {task} labels {bad}; expected 0..{len(spec.class_names) - 1}"
                          f" (a test split without labels?)")
    return rows


# ---- tokenization helpers ----------------------------------------------------------------------------

def load_tokenizer(path: str | None, source: str) -> "PreTrainedTokenizerBase":
    """A fast tokenizer from a local directory (`AutoTokenizer.from_pretrained`; never downloads)."""
    if path is None:
        raise ConfigError(f"data.tokenizer=None: data.name={source} needs a local tokenizer directory "
                          f"(data.tokenizer, or model.pretrained as a Hugging Face directory)")
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise ConfigError(f"data.tokenizer={path!r}: no such directory (a saved Hugging Face tokenizer)")
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.tokenizer={path!r}: not a Hugging Face tokenizer directory "
                          f"({' '.join(str(e).split())[:200]})") from e
    if not tok.is_fast:  # offsets and overflowing windows (SQuAD) need the Rust tokenizer
        raise ConfigError(f"data.tokenizer={path!r}: not a fast (tokenizers-backed) tokenizer")
    return tok


def _chunks(n: int, size: int = TOKENIZE_CHUNK) -> Iterator[slice]:
    for lo in range(0, n, size):
        yield slice(lo, min(n, lo + size))


def tokenize_texts(tok: "PreTrainedTokenizerBase", texts: Sequence[Sequence[str]],
                   max_length: int) -> dict[str, np.ndarray]:
    """Tokenize single sentences (`texts` = [sentences]) or pairs ([firsts, seconds]), truncated and padded to
    `max_length`: the three model inputs as [N, max_length] arrays."""
    parts: dict[str, list[np.ndarray]] = {k: [] for k in INPUT_NAMES}
    for part in _chunks(len(texts[0])):
        enc = tok(*[list(t[part]) for t in texts], truncation=True, max_length=max_length,
                  padding="max_length", return_token_type_ids=True)
        for k in INPUT_NAMES:  # lists -> arrays here: transformers' return_tensors="np" is several times slower
            parts[k].append(np.asarray(enc[k]))
    return {k: _compact(k, np.concatenate(v)) for k, v in parts.items()}


def _compact(name: str, values: np.ndarray) -> np.ndarray:
    """Smallest integer type that holds a token column (ids need int32; masks and segments fit int8)."""
    return values.astype(np.int32 if name == "input_ids" else np.int8)


def arrays_to_dataset(columns: dict[str, np.ndarray]) -> datasets.Dataset:
    """A torch-formatted Dataset from equal-length arrays; 2-D arrays become fixed-size list columns.

    Built from Arrow buffers directly: `Dataset.from_dict` would walk every token as a Python object."""
    arrow = {}
    for name, values in columns.items():
        flat = pa.array(np.ascontiguousarray(values).reshape(-1))
        arrow[name] = pa.FixedSizeListArray.from_arrays(flat, values.shape[1]) if values.ndim == 2 else flat
    return datasets.Dataset(pa.table(arrow)).with_format("torch")


# ---- SQuAD v1.1 --------------------------------------------------------------------------------------

SQUAD_LAYOUT = ("expected SQuAD v1.1 JSON (data[].paragraphs[].qas[]): path/train-v1.1.json + "
                "path/dev-v1.1.json, or train*.json + dev*.json / validation*.json")


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
        return [{"id": i, "answers": a} for i, a in zip(self.ids, self.answers)]


def build_squad(cfg: DataConfig, tokenizer: str | None = None) -> DataSplits:
    """SQuAD v1.1 from the official JSON files in `cfg.path`: windows of `max_length` tokens (default 384)
    over each context, `doc_stride` tokens of overlap, with `start_positions` / `end_positions` (the
    [CLS] index when the answer is not inside the window) for train and eval (the eval loss), plus the
    eval side data in `DataSplits.qa_eval`."""
    tok = load_tokenizer(tokenizer or cfg.tokenizer, "squad")
    train_file, eval_file = _squad_files(cfg)
    max_length = cfg.max_length or SQUAD_MAX_LENGTH
    # both files are read before the slow tokenization, so a bad eval file fails fast
    train_examples, examples = read_squad(train_file), read_squad(eval_file)
    train, _, _ = qa_features(tok, train_examples, max_length, cfg.doc_stride)
    evals, feature_example, offsets = qa_features(tok, examples, max_length, cfg.doc_stride, keep_offsets=True)
    side = QAEvalData(ids=examples["id"], contexts=examples["context"], answers=examples["answers"],
                      feature_example=feature_example, offsets=offsets)
    return DataSplits(train=train, eval=evals, num_classes=2, class_names=["start", "end"],
                      input_names=INPUT_NAMES, image_size=None, in_chans=None, vocab_size=len(tok), qa_eval=side,
                      metrics=partial(_squad_eval_metrics, side))


def _squad_eval_metrics(side: QAEvalData, outputs, eval_split: datasets.Dataset) -> dict:
    """Answers from the n-best spans of each example's windows, scored against the gold answers."""
    from ptrun.data.metrics import squad_metrics  # torchmetrics: seconds to import, so only when evaluating

    predictions = postprocess_qa(side, outputs[..., 0].numpy(), outputs[..., 1].numpy())
    return squad_metrics(predictions, side.references())


def _squad_files(cfg: DataConfig) -> tuple[Path, Path]:
    """The train and eval JSON files in `cfg.path` (official names first)."""
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {SQUAD_LAYOUT}")

    def find(official: str, patterns: tuple[str, ...]) -> Path | None:
        if (root / official).is_file():
            return root / official
        return next((found[0] for p in patterns if (found := sorted(root.glob(p)))), None)

    train = find("train-v1.1.json", ("train*.json",))
    evals = find("dev-v1.1.json", ("dev*.json", "validation*.json"))
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
                    rows["answers"].append({"text": [a["text"] for a in qa["answers"]],
                                            "answer_start": [int(a["answer_start"]) for a in qa["answers"]]})
    except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as e:
        problem = " ".join(f"{type(e).__name__}: {e}".split())
        raise ConfigError(f"data.path: {str(path)!r} is not SQuAD JSON ({problem}); {SQUAD_LAYOUT}") from e
    if not rows["id"]:
        raise ConfigError(f"data.path: {str(path)!r} holds no questions; {SQUAD_LAYOUT}")
    if not all(a["text"] for a in rows["answers"]):
        raise ConfigError(f"data.path: {str(path)!r} has questions without answers (SQuAD v2?); {SQUAD_LAYOUT}")
    return rows


def _check_window(tok: "PreTrainedTokenizerBase", questions: list[str], max_length: int, doc_stride: int) -> None:
    """Every window must hold more context tokens than the stride; the tokenizer otherwise aborts the
    process with a Rust panic instead of an exception, so this is checked up front."""
    longest = max(len(ids) for ids in tok(questions, add_special_tokens=False)["input_ids"])
    room = max_length - longest - tok.num_special_tokens_to_add(pair=True)
    if room <= doc_stride:
        raise ConfigError(f"data.doc_stride={doc_stride} is not allowed: it must be below the context room of "
                          f"data.max_length={max_length} minus the longest question ({longest} tokens) minus "
                          f"special tokens = {room}")


def qa_features(tok: "PreTrainedTokenizerBase", examples: dict[str, list], max_length: int, doc_stride: int,
                keep_offsets: bool = False) -> tuple[datasets.Dataset, np.ndarray, np.ndarray | None]:
    """Question + context windows (`return_overflowing_tokens` with `stride=doc_stride`) with the answer's
    token span in each window, [CLS] when the window does not contain the whole answer.

    Returns the features (model inputs + `start_positions`, `end_positions`), the example of each feature,
    and with `keep_offsets` the [F, T, 2] context offsets (-1 outside the context)."""
    _check_window(tok, examples["question"], max_length, doc_stride)
    columns: dict[str, list[np.ndarray]] = {k: [] for k in (*INPUT_NAMES, "start_positions", "end_positions")}
    feature_example, all_offsets = [], []
    for part in _chunks(len(examples["id"])):
        enc = tok(examples["question"][part], examples["context"][part], truncation="only_second",
                  max_length=max_length, stride=doc_stride, return_overflowing_tokens=True,
                  return_offsets_mapping=True, padding="max_length", return_token_type_ids=True)
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
            span = answer_tokens(offsets[i], answer["answer_start"][0],
                                 answer["answer_start"][0] + len(answer["text"][0]))
            starts.append(span[0] if span else cls)
            ends.append(span[1] if span else cls)
        for k in INPUT_NAMES:
            columns[k].append(_compact(k, arrays[k]))
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


def postprocess_qa(data: QAEvalData, start_logits: np.ndarray, end_logits: np.ndarray, n_best: int = 20,
                   max_answer_length: int = 30) -> list[dict[str, str]]:
    """The best answer text per example from the [F, T] start/end logits of all eval features.

    In each feature, the `n_best` highest start and end logits are paired; a pair is a candidate if both
    tokens are in the context, end >= start and the span has at most `max_answer_length` tokens. The
    candidate with the largest start + end logit over all of an example's features wins; its text is cut
    from the context by the token offsets. An example without a candidate gets "".
    Returns `[{"id": ..., "prediction_text": ...}]` in example order (the `squad_metrics` format).
    """
    start_logits, end_logits = np.asarray(start_logits, np.float64), np.asarray(end_logits, np.float64)
    if start_logits.shape != data.offsets.shape[:2] or end_logits.shape != data.offsets.shape[:2]:
        raise ValueError(f"logits {start_logits.shape} / {end_logits.shape} do not match the eval features "
                         f"{data.offsets.shape[:2]}")
    best: list[tuple[float, str] | None] = [None] * len(data.ids)
    for f, ex in enumerate(data.feature_example):
        for score, lo, hi in nbest_spans(start_logits[f], end_logits[f], data.offsets[f], n_best,
                                         max_answer_length)[:1]:
            if best[ex] is None or score > best[ex][0]:
                best[ex] = (score, data.contexts[ex][lo:hi])
    return [{"id": i, "prediction_text": b[1] if b else ""} for i, b in zip(data.ids, best)]


def nbest_spans(start_logits: np.ndarray, end_logits: np.ndarray, offsets: np.ndarray, n_best: int = 20,
                max_answer_length: int = 30) -> list[tuple[float, int, int]]:
    """Valid answer spans of one feature as (start + end logit, context start char, end char), best first."""
    starts = np.argsort(start_logits)[::-1][:n_best]
    ends = np.argsort(end_logits)[::-1][:n_best]
    s, e = np.meshgrid(starts, ends, indexing="ij")
    ok = (offsets[s, 0] >= 0) & (offsets[e, 0] >= 0) & (e >= s) & (e - s + 1 <= max_answer_length)
    s, e = s[ok], e[ok]
    scores = start_logits[s] + end_logits[e]
    order = np.argsort(-scores, kind="stable")
    return [(float(scores[i]), int(offsets[s[i], 0]), int(offsets[e[i], 1])) for i in order]
