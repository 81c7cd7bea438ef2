"""`data.name=hf`: your own data through the `datasets` library (local csv / json / jsonl / parquet files, a
`save_to_disk` directory, or a hub dataset id from the `datasets` cache; hf_read.py), for four tasks:

- text classification (`data.text_column`, optionally `data.text_pair_column`, and `data.label_column`):
  tokenized once into ptrun's cache (hf_tokens.py), the tokenizer's inputs plus `labels`;
- text regression (`model.task=regression`, a numeric `data.label_column`): the same rows with float32
  `labels`, one model output, evaluated by the loss (mean squared error) and the Pearson and Spearman
  correlations, as GLUE's STS-B is;
- causal language modelling (`data.text_column` without a label column, or `model.task=causal_lm`):
  `input_ids`, `attention_mask` and `labels`, packed into blocks of `data.max_length` tokens (`data.pack`);
- image classification (`data.image_column` and `data.label_column`): decoded and transformed on access
  exactly as `imagefolder`'s images (`images.image_transform`), `pixel_values` plus `labels`.

Class names come from the data (a ClassLabel's names, else the train split's sorted distinct labels).
"""

from __future__ import annotations

import datasets

from ptrun.config import DATA_SOURCE_SPECS, ConfigError, DataConfig
from ptrun.config.data import HF_TASKS
from ptrun.config.rules import either
from ptrun.data import hf_tokens
from ptrun.data.hf_read import RawSplits, read_raw
from ptrun.data.splits import DataSplits
from ptrun.data.text import load_tokenizer

HF_MAX_LENGTH = DATA_SOURCE_SPECS["hf"].max_length
"""Tokens per row when `data.max_length` is unset."""
CAUSAL_LM = "causal_lm"
REGRESSION = "regression"
LABELS = {"classification": "class labels", REGRESSION: "numeric targets"}
"""What `data.label_column` holds for each task that reads it."""


def hf_task(cfg: DataConfig, task: str | None) -> str:
    """The task the rows are made for: the model's when given, else read from the columns (a text column
    without labels is a causal-LM corpus)."""
    if task is not None:
        return task
    return CAUSAL_LM if cfg.label_column is None and cfg.text_column is not None else "classification"


def checked_task(cfg: DataConfig, task: str | None) -> str:
    """The task (`hf_task`) once the settings name what it needs: a path, a text or image column, and a label
    column unless it is a causal LM. Raises ConfigError naming the key."""
    task = hf_task(cfg, task)
    if task not in HF_TASKS:
        raise ConfigError(f"model.task={task!r} is not allowed: {either(HF_TASKS)} for data.name=hf")
    if cfg.path is None:
        raise ConfigError(
            "data.path=None is not allowed: a local data file or folder, a save_to_disk directory or "
            "a hub dataset id (org/name) for data.name=hf"
        )
    if cfg.image_column is None and cfg.text_column is None:
        raise ConfigError(
            "data.text_column=None is not allowed: the column of texts for data.name=hf (or "
            "data.image_column, the column of images)"
        )
    if task != CAUSAL_LM and cfg.label_column is None:
        raise ConfigError(
            f"data.label_column=None is not allowed: the column of {LABELS[task]} for data.name=hf "
            f"with model.task={task}"
        )
    return task


def build_hf(cfg: DataConfig, task: str | None = None) -> DataSplits:
    """The train and eval splits of `cfg.path` for `task` (`classification`, `regression` or `causal_lm`; None:
    inferred)."""
    task = checked_task(cfg, task)
    raw = read_raw(cfg, task)
    if cfg.image_column is not None:
        return image_splits(cfg, raw)
    return text_splits(cfg, raw, task)


def check_hf_source(cfg: DataConfig, task: str | None = None) -> list[str]:
    """What `build_hf` would refuse about the source itself (a missing path, split or column, an empty
    split, an eval label the train split lacks, a single class), found by reading it without tokenizing:
    `ptrun train` calls this before any worker starts. Returns the class names (empty without classes),
    which a resume must find as the run wrote them. The `datasets` cache keeps what it read, so the workers
    read it again quickly."""
    return read_raw(cfg, hf_task(cfg, task)).class_names


def text_splits(cfg: DataConfig, raw: RawSplits, task: str) -> DataSplits:
    tok = load_tokenizer(cfg.tokenizer, "hf")
    length = cfg.max_length or HF_MAX_LENGTH
    tok_id = hf_tokens.tokenizer_identity(tok)

    def tokenized(rows: datasets.Dataset, labels) -> datasets.Dataset:
        settings = dict(
            task=task,
            max_length=length,
            text=cfg.text_column,
            pair=cfg.text_pair_column,
            pack=cfg.pack if task == CAUSAL_LM else None,
            classes=raw.class_names,
        )
        key = hf_tokens.entry_key(rows._fingerprint, tok_id, **settings)
        if task == CAUSAL_LM:
            make = hf_tokens.packed_batches if cfg.pack else hf_tokens.document_batches
            batches = make(rows, tok, cfg.text_column, length)
        else:
            batches = hf_tokens.classification_batches(rows, labels, tok, cfg.text_column, cfg.text_pair_column, length)
        return hf_tokens.cached_table(key, batches)

    train, held_out = tokenized(raw.train, raw.train_labels), tokenized(raw.eval, raw.eval_labels)
    if task == CAUSAL_LM:
        return DataSplits.of_tokens(train, held_out, [], hf_tokens.LM_INPUT_NAMES, len(tok))
    inputs = hf_tokens.model_inputs(tok)
    if task == REGRESSION:  # one output, no class names
        return DataSplits.of_tokens(
            train, held_out, [], inputs, len(tok), num_classes=1, metrics=regression_eval_metrics
        )
    return DataSplits.of_tokens(train, held_out, raw.class_names, inputs, len(tok))


def image_splits(cfg: DataConfig, raw: RawSplits) -> DataSplits:
    """Images decoded and transformed on access (`set_transform`), as `imagefolder` does."""
    from ptrun.data.images import DEFAULT_IMAGE_SIZE, image_transform  # inner import: optional library (torchvision)

    size = cfg.image_size or DEFAULT_IMAGE_SIZE

    def split(rows: datasets.Dataset, labels, augment: bool) -> datasets.Dataset:
        # The stored image (bytes or a path), undecoded: the transform decodes it and names a bad file.
        images = rows.select_columns([cfg.image_column]).cast_column(cfg.image_column, datasets.Image(decode=False))
        if cfg.image_column != "image":
            images = images.rename_column(cfg.image_column, "image")
        out = images.add_column("labels", labels.tolist())
        out.set_transform(image_transform(size, augment))
        return out

    train = split(raw.train, raw.train_labels, cfg.augment)
    return DataSplits.of_images(train, split(raw.eval, raw.eval_labels, augment=False), raw.class_names, size)


def regression_eval_metrics(outputs, eval_split: datasets.Dataset) -> dict:
    """The Pearson and Spearman correlations (percent) of the predictions with the eval targets."""
    # inner import: optional library (torchmetrics: seconds to import, so only when evaluating)
    from ptrun.data.metrics import regression_metrics

    return regression_metrics(outputs, eval_split[:]["labels"])
