"""GLUE (the original TSVs, or parquet / json tables with the Hugging Face column names), tokenized with a
local tokenizer directory (`data.tokenizer`, which `ptrun.compose.resolve` fills from `model.pretrained` when
unset). The dataset columns are the model inputs plus `labels`."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ptrun.config import ConfigError, DataConfig
from ptrun.data.splits import DataSplits
from ptrun.data.text import INPUT_NAMES, arrays_to_dataset, load_tokenizer, tokenize_texts

NO_GOLD_LABEL = "-"
"""NLI rows whose annotators did not agree carry this label; they have no gold class and are skipped."""


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
    "cola": GlueTask(
        "CoLA", ("sentence",), {"1": "label", "3": "sentence"}, ("unacceptable", "acceptable"), tsv_header=False
    ),
    "sst2": GlueTask("SST-2", ("sentence",), {"sentence": "sentence", "label": "label"}, ("negative", "positive")),
    "mrpc": GlueTask(
        "MRPC",
        ("sentence1", "sentence2"),
        {"#1 String": "sentence1", "#2 String": "sentence2", "Quality": "label"},
        ("not_equivalent", "equivalent"),
    ),
    "qqp": GlueTask(
        "QQP",
        ("question1", "question2"),
        {"question1": "question1", "question2": "question2", "is_duplicate": "label"},
        ("not_duplicate", "duplicate"),
    ),
    "stsb": GlueTask(
        "STS-B",
        ("sentence1", "sentence2"),
        {"sentence1": "sentence1", "sentence2": "sentence2", "score": "label"},
        ("similarity",),
    ),
    "mnli": GlueTask(
        "MNLI",
        ("premise", "hypothesis"),
        {"sentence1": "premise", "sentence2": "hypothesis", "gold_label": "label"},
        ("entailment", "neutral", "contradiction"),
        eval_file="dev_matched.tsv",
        string_labels=True,
    ),
    "qnli": GlueTask(
        "QNLI",
        ("question", "sentence"),
        {"question": "question", "sentence": "sentence", "label": "label"},
        ("entailment", "not_entailment"),
        string_labels=True,
    ),
    "rte": GlueTask(
        "RTE",
        ("sentence1", "sentence2"),
        {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
        ("entailment", "not_entailment"),
        string_labels=True,
    ),
    "wnli": GlueTask(
        "WNLI",
        ("sentence1", "sentence2"),
        {"sentence1": "sentence1", "sentence2": "sentence2", "label": "label"},
        ("not_entailment", "entailment"),
    ),
}
TABLE_SUFFIXES = ("parquet", "jsonl", "json")


def glue_layout(task: str) -> str:
    """The one-line description of the accepted GLUE layouts, for error messages."""
    spec = GLUE_TASKS[task]
    return (
        f"expected the GLUE TSV layout (path/{spec.folder}/train.tsv + {spec.eval_file}) or tables "
        f"(train*.parquet + validation*.parquet, or .jsonl/.json, in path or path/{task}/)"
    )


def build_glue(cfg: DataConfig, tokenizer: str | None = None) -> DataSplits:
    """GLUE task `cfg.task` from `cfg.path`: train split + dev split (MNLI: dev matched), tokenized.

    `tokenizer` overrides `cfg.tokenizer` (a local tokenizer directory). STS-B is a regression: float32
    `labels` and num_classes 1; the other tasks have int64 class indices.
    """
    spec = GLUE_TASKS[cfg.task]
    tok = load_tokenizer(tokenizer or cfg.tokenizer, "glue")
    train_rows, eval_rows = _read_glue(cfg)
    max_length = cfg.max_length

    def split(rows: datasets.Dataset) -> datasets.Dataset:
        columns = tokenize_texts(tok, [rows.data.column(c).to_pylist() for c in spec.text], max_length)
        label_type = np.float32 if spec.regression else np.int64
        columns["labels"] = rows.data.column("label").to_numpy().astype(label_type)
        return arrays_to_dataset(columns)

    return DataSplits.of_tokens(
        split(train_rows),
        split(eval_rows),
        spec.class_names,
        INPUT_NAMES,
        len(tok),
        metrics=partial(_glue_eval_metrics, cfg.task),
    )


def _glue_eval_metrics(task: str, outputs, eval_split: datasets.Dataset) -> dict:
    from ptrun.data.metrics import glue_metrics  # inner import: optional library (torchmetrics, for evaluating)

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
    spec = GLUE_TASKS[task]
    try:
        frame = pd.read_csv(
            path,
            sep="\t",
            quoting=csv.QUOTE_NONE,
            dtype=str,
            keep_default_na=False,
            header=0 if spec.tsv_header else None,
            encoding="utf-8-sig",
        )
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
        rows = datasets.Dataset(pa.concat_tables([pq.read_table(f) for f in files]))
    else:
        frames = []
        for f in files:
            try:  # Hugging Face writes JSON lines even as `.json`; a plain JSON list is accepted too
                frames.append(pd.read_json(f, lines=True))
            except ValueError:
                frames.append(pd.read_json(f))
        rows = datasets.Dataset.from_pandas(pd.concat(frames), preserve_index=False)
    missing = [c for c in (*spec.text, "label") if c not in rows.column_names]
    if missing:
        raise ConfigError(
            f"data.path: {str(files[0])!r} lacks the {task} columns {missing} "
            f"(has {rows.column_names}); {glue_layout(task)}"
        )
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
        raise ConfigError(
            f"data.path: {str(where)!r} has {task} labels {bad}; expected 0..{len(spec.class_names) - 1}"
            f" (a test split without labels?)"
        )
    return rows


# ---- tokenization helpers ----------------------------------------------------------------------------
