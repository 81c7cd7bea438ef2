"""Dataset sources: each turns a `DataConfig` into train/eval `datasets.Dataset`s that yield torch tensors.

Everything loads from local files (no downloads). The image sources (`digits`, `imagefolder` here;
`cifar10`, `cifar100` in cifar.py) produce the columns `pixel_values` (float32, C x H x W, normalised) and
`labels` (int64); for class folders the label mapping comes from the sorted class names and is the same for
both splits. The text sources (`glue`, `squad` in text.py) produce `input_ids`, `attention_mask`,
`token_type_ids` plus `labels` (GLUE) or `start_positions` / `end_positions` (SQuAD).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import datasets
import numpy as np
import torch
from torchvision.transforms import v2

from ptrun.config import ConfigError, DataConfig
from ptrun.data.memory import in_memory

if TYPE_CHECKING:
    from ptrun.data.text import QAEvalData

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DEFAULT_IMAGE_SIZE = 224
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
EVAL_DIR_NAMES = ("val", "validation", "test")
IMAGEFOLDER_LAYOUT = ("expected class folders (path/train/<class>/*.png and path/val/<class>/*.png, "
                      "or path/<class>/*.png)")


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
    qa_eval: QAEvalData | None = None
    """SQuAD only: what turns the eval features' start/end logits into answer texts (see text.py)."""
    metrics: Callable[[torch.Tensor, datasets.Dataset], dict] | None = None
    """The task's own eval metrics (GLUE's per task, SQuAD's exact match and F1), from every eval output in
    sample order and the eval split; None: the trainer reports the loss (and top-1) only."""


def build_datasets(cfg: DataConfig) -> DataSplits:
    """Build the splits of `cfg.name`; raises ConfigError for an unknown source or a bad `cfg.path`."""
    # imported here: both modules import DataSplits from this one
    from ptrun.data import cifar, packaged_text, text

    builders = {"digits": _digits, "imagefolder": _imagefolder, "cifar10": cifar.build_cifar10,
                "cifar100": cifar.build_cifar100, "glue": text.build_glue, "squad": text.build_squad,
                **{name: packaged_text.build_packaged_text for name in packaged_text.PACKAGED_TEXT}}
    if cfg.name not in builders:
        raise ConfigError(f"data.name={cfg.name!r} is not allowed: one of {', '.join(builders)}")
    splits = builders[cfg.name](cfg)
    return replace(splits, train=in_memory(splits.train), eval=in_memory(splits.eval))


def _stratified_split(labels: Sequence[int], cfg: DataConfig, where: str) -> tuple[np.ndarray, np.ndarray]:
    """Train and eval positions into `labels`, stratified by class and fixed by `cfg.split_seed`."""
    from sklearn.model_selection import train_test_split  # ~2 s to import: only sources that split pay it

    positions = np.arange(len(labels))
    try:
        train, held_out = train_test_split(positions, test_size=cfg.eval_fraction, random_state=cfg.split_seed,
                                           stratify=labels)
    except ValueError as e:  # too few samples per class for a stratified split
        raise ConfigError(f"data.eval_fraction={cfg.eval_fraction!r}: cannot split {where} stratified ({e})") from e
    # sorted so each split keeps the source's order; the epoch sampler does the shuffling
    return np.sort(train), np.sort(held_out)


def _digits(cfg: DataConfig) -> DataSplits:
    """scikit-learn's 1,797 8x8 handwritten digits (ships with scikit-learn, so always available offline)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.from_numpy(digits.images).float().unsqueeze(1)  # (N, 1, 8, 8), values 0..16
    if cfg.image_size is not None and cfg.image_size != images.shape[-1]:
        images = torch.nn.functional.interpolate(images, size=(cfg.image_size, cfg.image_size), mode="bilinear",
                                                 align_corners=False)
    labels = digits.target.astype(np.int64)
    train_pos, eval_pos = _stratified_split(labels, cfg, "the digits")
    # one scalar mean/std from the train split only, so eval statistics never leak into preprocessing
    mean, std = images[train_pos].mean(), images[train_pos].std()
    images = ((images - mean) / std).numpy()

    size = images.shape[-1]
    class_names = [str(c) for c in digits.target_names]
    features = datasets.Features({"pixel_values": datasets.Array3D((1, size, size), "float32"),
                                  "labels": datasets.ClassLabel(names=class_names)})

    def split(pos: np.ndarray) -> datasets.Dataset:
        data = {"pixel_values": images[pos], "labels": labels[pos]}
        return datasets.Dataset.from_dict(data, features=features).with_format("torch")

    return DataSplits(train=split(train_pos), eval=split(eval_pos), num_classes=len(class_names),
                      class_names=class_names, input_names=("pixel_values",), image_size=size, in_chans=1)


def _imagefolder(cfg: DataConfig) -> DataSplits:
    """Class folders of image files: `path/train/<class>/*` + `path/val/<class>/*`, or `path/<class>/*`.

    With a `train` folder but no eval folder, `train` is split by `eval_fraction`. Images are decoded and
    transformed on access (`set_transform`), so nothing is preprocessed up front.
    """
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {IMAGEFOLDER_LAYOUT}")
    eval_dir = next((root / n for n in EVAL_DIR_NAMES if (root / n).is_dir()), None)
    train_dir = root / "train" if (root / "train").is_dir() else root
    if eval_dir is not None and train_dir == root:  # otherwise `val` would silently become a class
        raise ConfigError(f"data.path={cfg.path!r}: has {eval_dir.name}/ but no train/; {IMAGEFOLDER_LAYOUT}")

    train_classes = _class_files(train_dir)
    if not train_classes:
        raise ConfigError(f"data.path={cfg.path!r}: found no images; {IMAGEFOLDER_LAYOUT}")
    class_names = sorted(train_classes)
    train_paths, train_labels = _labelled(train_classes, class_names)

    if eval_dir is not None:
        eval_classes = _class_files(eval_dir)
        unknown = sorted(set(eval_classes) - set(class_names))
        if not eval_classes or unknown:
            problem = f"classes {unknown} are not in train" if unknown else "found no images"
            raise ConfigError(f"data.path={cfg.path!r}: {eval_dir.name}/ {problem}; {IMAGEFOLDER_LAYOUT}")
        eval_paths, eval_labels = _labelled(eval_classes, class_names)
    else:
        train_pos, eval_pos = _stratified_split(train_labels, cfg, f"the images in {str(train_dir)!r}")
        eval_paths, eval_labels = [train_paths[i] for i in eval_pos], [train_labels[i] for i in eval_pos]
        train_paths, train_labels = [train_paths[i] for i in train_pos], [train_labels[i] for i in train_pos]

    size = cfg.image_size or DEFAULT_IMAGE_SIZE
    # Decoded by the transform (`_decode_image`), so a file that is not a readable image is named in a
    # one-line error instead of failing deep inside `datasets` mid-epoch.
    features = datasets.Features({"image": datasets.Image(decode=False),
                                  "labels": datasets.ClassLabel(names=class_names)})

    def split(paths: list[str], labels: list[int], augment: bool) -> datasets.Dataset:
        ds = datasets.Dataset.from_dict({"image": paths, "labels": labels}, features=features)
        ds.set_transform(_image_transform(size, augment))
        return ds

    return DataSplits(train=split(train_paths, train_labels, cfg.augment),
                      eval=split(eval_paths, eval_labels, augment=False),
                      num_classes=len(class_names), class_names=class_names, input_names=("pixel_values",),
                      image_size=size, in_chans=3)


def _class_files(directory: Path) -> dict[str, list[str]]:
    """Class name -> sorted image files (searched recursively) for each sub-folder that holds images.

    Hidden folders and folders without images are not classes (e.g. `.ipynb_checkpoints`, a stray `README`).
    """
    classes = {}
    for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        files = sorted(str(f) for f in sub.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file())
        if files:
            classes[sub.name] = files
    return classes


def _labelled(class_files: dict[str, list[str]], class_names: list[str]) -> tuple[list[str], list[int]]:
    """Flatten class -> files into parallel (paths, labels) lists under the shared label mapping."""
    paths, labels = [], []
    for name, files in class_files.items():
        paths += files
        labels += [class_names.index(name)] * len(files)
    return paths, labels


def _image_transform(size: int, augment: bool) -> Callable[[dict], dict[str, torch.Tensor]]:
    """A batch transform for `set_transform`: PIL images -> normalised (3, size, size) float32 tensors."""
    geometry = ([v2.RandomResizedCrop(size, scale=(0.08, 1.0), antialias=True), v2.RandomHorizontalFlip()]
                if augment else [v2.Resize((size, size), antialias=True)])
    pipeline = v2.Compose([v2.ToImage(), *geometry, v2.ToDtype(torch.float32, scale=True),
                           v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    def transform(batch: dict) -> dict[str, torch.Tensor]:
        out = {"labels": torch.as_tensor(batch["labels"], dtype=torch.int64)}
        if "image" in batch:  # absent when only the labels are read (AutoCache serves the inputs)
            out["pixel_values"] = torch.stack([pipeline(_decode_image(image)) for image in batch["image"]])
        return out

    return transform


_IMAGE = datasets.Image()  # datasets' own decoder (EXIF orientation applied), as `Image()` features decode


def _decode_image(value: dict):
    """One image file (`{"path", "bytes"}`) as an RGB PIL image; a file that does not decode is bad input."""
    try:
        return _IMAGE.decode_example(value).convert("RGB")
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...: the file's fault
        problem = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(f"data.path: {value['path']!r} is not a readable image ({problem}); replace or remove "
                          f"it") from None
