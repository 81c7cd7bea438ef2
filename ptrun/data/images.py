"""The image sources in files of their own: `digits` (scikit-learn's 8x8 digits, offline) and `imagefolder`
(class folders of image files, or a hub image dataset's parquet such as ImageNet's), both producing
`pixel_values` (float32, C x H x W, normalised) and `labels` (int64); for class folders the label mapping comes
from the sorted class names, the same for both splits."""

from __future__ import annotations

import gzip
import importlib.util
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import torch
from torchvision.transforms import v2

from ptrun.config import DATA_SOURCE_SPECS, ConfigError, DataConfig
from ptrun.data.splits import EVAL_DIR_NAMES, IMAGENET_MEAN, IMAGENET_STD, DataSplits, image_batches, stratified_split

DIGITS_FILE = "digits.csv.gz"
"""The digits in scikit-learn's package: one row per image, 64 pixel values and the label."""
DEFAULT_IMAGE_SIZE = DATA_SOURCE_SPECS["imagefolder"].image[0]
IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"})
IMAGEFOLDER_LAYOUT = (
    "expected class folders (path/train/<class>/*.png and path/val/<class>/*.png, or path/<class>/*.png)"
)
"""(A hub image dataset's snapshot, train-*.parquet + validation-*.parquet with image and label columns, is read
too; the recipe vit_imagenet names ImageNet's, so the message speaks of the folders a user lays out.)"""


def build_digits(cfg: DataConfig) -> DataSplits:
    """scikit-learn's 1,797 8x8 handwritten digits (ships with scikit-learn, so always available offline)."""
    pixels, labels = read_digits()
    images = torch.from_numpy(pixels.reshape(-1, 8, 8)).float().unsqueeze(1)  # (N, 1, 8, 8), values 0..16
    if cfg.image_size is not None and cfg.image_size != images.shape[-1]:
        images = torch.nn.functional.interpolate(
            images, size=(cfg.image_size, cfg.image_size), mode="bilinear", align_corners=False
        )
    train_pos, eval_pos = stratified_split(labels, cfg, "the digits")
    # one scalar mean/std from the train split only, so eval statistics never leak into preprocessing
    mean, std = images[train_pos].mean(), images[train_pos].std()
    images = ((images - mean) / std).numpy()

    size = images.shape[-1]
    class_names = [str(c) for c in range(10)]
    features = datasets.Features(
        {"pixel_values": datasets.Array3D((1, size, size), "float32"), "labels": datasets.ClassLabel(names=class_names)}
    )

    def split(pos: np.ndarray) -> datasets.Dataset:
        data = {"pixel_values": images[pos], "labels": labels[pos]}
        return datasets.Dataset.from_dict(data, features=features).with_format("torch")

    return DataSplits.of_images(split(train_pos), split(eval_pos), class_names, size, chans=1)


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """The digits' pixels (N x 64, float64) and labels (int64), read from the file scikit-learn ships, as its
    `load_digits` reads it, without importing scikit-learn (about 2 s of every worker's start)."""
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    path = Path(spec.submodule_search_locations[0] if spec else "sklearn") / "datasets" / "data" / DIGITS_FILE
    if not path.is_file():
        raise ConfigError(f"data.name=digits reads scikit-learn's {DIGITS_FILE}, not found at {path}")
    with gzip.open(path, "rt", encoding="utf-8") as text:
        table = np.loadtxt(text, delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def build_imagefolder(cfg: DataConfig) -> DataSplits:
    """Class folders of image files: `path/train/<class>/*` + `path/val/<class>/*`, or `path/<class>/*`.

    With a `train` folder but no eval folder, `train` is split by `eval_fraction`. Images are decoded and
    transformed on access (`set_transform`), so nothing is preprocessed up front.
    """
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {IMAGEFOLDER_LAYOUT}")
    if _parquet(root, "train") and _parquet(root, "validation"):
        return _parquet_splits(cfg, root)
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
        train_pos, eval_pos = stratified_split(train_labels, cfg, f"the images in {str(train_dir)!r}")
        eval_paths, eval_labels = [train_paths[i] for i in eval_pos], [train_labels[i] for i in eval_pos]
        train_paths, train_labels = [train_paths[i] for i in train_pos], [train_labels[i] for i in train_pos]

    size = cfg.image_size
    # Decoded by the transform (`_decode_image`), so a file that is not a readable image is named in a
    # one-line error instead of failing deep inside `datasets` mid-epoch.
    features = datasets.Features(
        {"image": datasets.Image(decode=False), "labels": datasets.ClassLabel(names=class_names)}
    )

    def split(paths: list[str], labels: list[int], augment: bool) -> datasets.Dataset:
        ds = datasets.Dataset.from_dict({"image": paths, "labels": labels}, features=features)
        ds.set_transform(image_transform(size, augment))
        return ds

    train = split(train_paths, train_labels, cfg.augment)
    return DataSplits.of_images(train, split(eval_paths, eval_labels, augment=False), class_names, size)


def _parquet(root: Path, split: str) -> list[Path]:
    """A hub image dataset's parquet files of `split` (ILSVRC/imagenet-1k: `data/train-00000-of-00294.parquet`),
    in `root` or one folder down."""
    return sorted(root.glob(f"{split}-*.parquet")) or sorted(root.glob(f"*/{split}-*.parquet"))


def _parquet_splits(cfg: DataConfig, root: Path) -> DataSplits:
    """The train and validation parquet of a hub image dataset (an `image` column of stored images and a
    ClassLabel `label`, as `datasets` writes them), memory-mapped (`datasets` converts the parquet to Arrow in
    its cache once, for ImageNet far more than memory holds) and transformed on access as class folders are."""

    def split(name: str, augment: bool) -> datasets.Dataset:
        files = [str(f) for f in _parquet(root, name)]
        try:
            rows = datasets.Dataset.from_parquet(files)
        except Exception as e:  # not parquet, or unreadable: the library's words, on one line
            problem = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            raise ConfigError(f"data.path={cfg.path!r}: cannot read its {name} parquet ({problem})") from None
        if not {"image", "label"} <= set(rows.column_names):
            raise ConfigError(
                f"data.path={cfg.path!r}: its {name} parquet needs image and label columns, has "
                f"{rows.column_names}; {IMAGEFOLDER_LAYOUT}"
            )
        rows = rows.select_columns(["image", "label"]).rename_column("label", "labels")
        rows = rows.cast_column("image", datasets.Image(decode=False))
        rows.set_transform(image_transform(size, augment))
        return rows

    size = cfg.image_size or DEFAULT_IMAGE_SIZE
    train, held_out = split("train", cfg.augment), split("validation", augment=False)
    feature = train.features["labels"]
    names = (
        list(feature.names)
        if isinstance(feature, datasets.ClassLabel)
        else [str(i) for i in range(max(train.data.column("labels").to_numpy()) + 1)]
    )
    return DataSplits.of_images(train, held_out, names, size)


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


def image_transform(size: int, augment: bool) -> Callable[[dict], dict[str, torch.Tensor]]:
    """The batch transform (for `datasets.Dataset.set_transform`) of every image source read from files:
    `imagefolder` and `data.name=hf` with `data.image_column`. It takes a batch of stored images (column
    `image`, each `{"path", "bytes"}` as an undecoded `datasets.Image` holds it) and `labels`, and returns
    `pixel_values`, float32 [B, 3, size, size] normalised with ImageNet's mean and std, and `labels` (int64).
    Each image is decoded to RGB by `datasets`' own decoder; one that does not decode raises a ConfigError
    naming the file. `augment`: a random resized crop (8-100 % of the area) and a horizontal flip, for
    training; otherwise a plain resize."""
    geometry = (
        [v2.RandomResizedCrop(size, scale=(0.08, 1.0), antialias=True), v2.RandomHorizontalFlip()]
        if augment
        else [v2.Resize((size, size), antialias=True)]
    )
    pipeline = v2.Compose(
        [v2.ToImage(), *geometry, v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    )

    return image_batches(pipeline, _decode_image)


_IMAGE = datasets.Image()  # datasets' own decoder (EXIF orientation applied), as `Image()` features decode


def _decode_image(value: dict):
    """One image file (`{"path", "bytes"}`) as an RGB PIL image; a file that does not decode is bad input."""
    try:
        return _IMAGE.decode_example(value).convert("RGB")
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError...: the file's fault
        problem = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise ConfigError(
            f"data.path: {value['path']!r} is not a readable image ({problem}); replace or remove it"
        ) from None
