"""What every data source returns (`DataSplits`) and what several share: the stratified train/eval split and
ImageNet's normalisation. The bottom of `ptrun.data`: the source modules import it, it imports none of them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import datasets
import numpy as np

from ptrun.config import ConfigError, DataConfig

if TYPE_CHECKING:
    import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
EVAL_DIR_NAMES = ("val", "validation", "test")
"""Folder names of a held-out split under `data.path`, in the order they are looked for."""


@dataclass(frozen=True)
class DataSplits:
    """The train and eval splits of one source plus what the model needs to know about its inputs."""

    train: datasets.Dataset
    eval: datasets.Dataset
    num_classes: int
    class_names: list[str]
    input_names: tuple[str, ...]
    """Model input keys of a batch (`("pixel_values",)` for images); `labels` is the target."""
    image_size: int | None
    """H == W of `pixel_values`."""
    in_chans: int | None
    vocab_size: int | None = None
    """Tokenizer vocabulary size of a text source (the BERT embedding rows); None for images."""
    qa_eval: Any = None
    """SQuAD only: what turns the eval features' start/end logits into answer texts (`ptrun.data.squad.QAEvalData`;
    typed loosely so that this module, the bottom of `ptrun.data`, names no source)."""
    metrics: Callable[[torch.Tensor, datasets.Dataset], dict] | None = None
    """The task's own eval metrics (GLUE's per task, SQuAD's exact match and F1), from every eval output in
    sample order and the eval split; None: the trainer reports the loss (and top-1) only."""

    @classmethod
    def of_tokens(
        cls,
        train,
        eval,
        class_names: Sequence[str],
        input_names,
        vocab_size: int,
        num_classes: int | None = None,
        **more,
    ) -> DataSplits:
        """A text source's splits: token inputs (`input_names`) of a vocabulary of `vocab_size`, and no images;
        as many classes as names unless `num_classes` says otherwise (a regression's one output, a language
        model's none). `more`: the optional fields (`metrics`, `qa_eval`)."""
        classes = len(class_names) if num_classes is None else num_classes
        return cls(
            train,
            eval,
            classes,
            list(class_names),
            tuple(input_names),
            image_size=None,
            in_chans=None,
            vocab_size=vocab_size,
            **more,
        )

    @classmethod
    def of_images(
        cls, train, eval, class_names: Sequence[str], size: int, chans: int = 3, num_classes: int | None = None
    ) -> DataSplits:
        """An image source's splits: `pixel_values` of `chans` channels, `size` pixels square."""
        classes = len(class_names) if num_classes is None else num_classes
        return cls(train, eval, classes, list(class_names), ("pixel_values",), image_size=size, in_chans=chans)

    @property
    def model_sizes(self) -> dict[str, int | None]:
        """What `ptrun.models.build_model` reads of the data: the classes, the images' size and channels, the
        vocabulary."""
        return {
            "num_classes": self.num_classes,
            "img_size": self.image_size,
            "in_chans": self.in_chans,
            "vocab_size": self.vocab_size,
        }


def first_sample(data: DataSplits, input_names) -> tuple:
    """The first training sample's model inputs, batched (shapes and dtypes for the start's estimates)."""
    probe = dict(data.train[[0]])
    return tuple(probe[k] for k in input_names if k in probe)


def stratified_split(labels: Sequence[int], cfg: DataConfig, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Train and eval positions into `labels`, stratified by class and fixed by `cfg.split_seed`: the split
    scikit-learn's `train_test_split(..., stratify=labels, random_state=seed)` makes, index for index, in numpy
    (importing scikit-learn costs every worker about 2 s)."""
    classes, label_of, counts = np.unique(np.asarray(labels), return_inverse=True, return_counts=True)
    n_eval = math.ceil(cfg.eval_fraction * len(label_of))
    n_train = len(label_of) - n_eval
    smaller, side = min((n_eval, "eval"), (n_train, "train"))
    problem = (
        f"class {classes[counts.argmin()].item()!r} has one sample; each class needs two"
        if counts.min() < 2
        else f"the {side} split would hold {smaller} samples, fewer than the {len(classes)} classes"
        if smaller < len(classes)
        else None
    )
    if problem is not None:
        raise ConfigError(f"data.eval_fraction={cfg.eval_fraction!r}: cannot split {where} stratified ({problem})")
    rng = np.random.RandomState(cfg.split_seed)  # scikit-learn's generator, drawn from in its order
    by_class = np.split(np.argsort(label_of, kind="stable"), np.cumsum(counts)[:-1])
    train_per_class = _approximate_mode(counts, n_train, rng)
    eval_per_class = _approximate_mode(counts - train_per_class, n_eval, rng)
    train, held_out = [], []
    for members, n_t, n_e in zip(by_class, train_per_class, eval_per_class, strict=True):
        shuffled = members[rng.permutation(len(members))]
        train.append(shuffled[:n_t])
        held_out.append(shuffled[n_t : n_t + n_e])
    # sorted so each split keeps the source's order; the epoch sampler does the shuffling
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(held_out))


def _approximate_mode(class_counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of `n_draws` each class gets: its share rounded down, the rest to the largest remainders, ties
    broken by `rng` (scikit-learn's `_approximate_mode`, the same arithmetic in the same order, so the same
    draws)."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need = int(n_draws - floored.sum())
    remainder = continuous - floored
    for value in np.sort(np.unique(remainder))[::-1]:
        if need <= 0:
            break
        (tied,) = np.where(remainder == value)
        add_now = min(len(tied), need)
        floored[rng.choice(tied, size=add_now, replace=False)] += 1
        need -= add_now
    return floored.astype(int)


def image_batches(pipeline: Callable, decode: Callable) -> Callable[[dict], dict[str, torch.Tensor]]:
    """A batch transform for `set_transform`: each stored image decoded (`decode`) and transformed
    (`pipeline`) into `pixel_values`, the labels as int64."""

    import torch  # inner import: start-up (the start's check of a user's files reads splits without torch)

    def transform(batch: dict) -> dict[str, torch.Tensor]:
        out = {"labels": torch.as_tensor(batch["labels"], dtype=torch.int64)}
        if "image" in batch:  # absent when only the labels are read (AutoCache serves the inputs)
            out["pixel_values"] = torch.stack([pipeline(decode(image)) for image in batch["image"]])
        return out

    return transform
