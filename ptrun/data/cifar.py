"""CIFAR-10 / CIFAR-100 from local files: the original python-pickle folders, a `save_to_disk` DatasetDict,
or parquet files (the Hugging Face `cifar10` / `cifar100` layout). Train is the train split, eval the test
split.

Images stay uint8 and are transformed on access (`set_transform`), like `imagefolder`: resize to
`data.image_size` (default: CIFAR's own 32), and for training with `data.augment` a random crop (padding of
1/8 of the side, the classic CIFAR crop scaled to the resolution) and a horizontal flip; then ImageNet
mean/std normalisation, as for the other image sources and the ImageNet-pretrained ViTs.
(PipeTransformer's own CIFAR code resized only and normalised with mean = std = 0.5.)
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torchvision.transforms import v2

from ptrun.config import DATA_SOURCE_SPECS, ConfigError, DataConfig
from ptrun.data.splits import EVAL_DIR_NAMES, IMAGENET_MEAN, IMAGENET_STD, DataSplits, image_batches

CIFAR_SIZE = DATA_SOURCE_SPECS["cifar10"].image[0]  # 32: the side of the stored images
PIXELS = 3 * CIFAR_SIZE * CIFAR_SIZE


class Variant:
    """Where CIFAR-10 and CIFAR-100 differ: file names, label keys and the class count."""

    def __init__(
        self,
        name: str,
        classes: int,
        folder: str,
        train: tuple[str, ...],
        test: str,
        meta: str,
        label_key: str,
        names_key: str,
        hf_labels: tuple[str, ...],
    ) -> None:
        self.name, self.classes, self.folder = name, classes, folder
        self.train, self.test, self.meta = train, test, meta
        self.label_key, self.names_key, self.hf_labels = label_key, names_key, hf_labels

    def layout(self) -> str:
        """One line describing the accepted layouts, for error messages."""
        return (
            f"expected {self.folder}/ ({', '.join(self.train[:1])}..., {self.test}, {self.meta}) or its "
            f"contents, a save_to_disk DatasetDict (train + test), or train*.parquet + test*.parquet"
        )


CIFAR10 = Variant(
    "cifar10",
    10,
    "cifar-10-batches-py",
    tuple(f"data_batch_{i}" for i in range(1, 6)),
    "test_batch",
    "batches.meta",
    "labels",
    "label_names",
    ("label",),
)
# CIFAR-100's 100 fine classes are the task; the 20 coarse super-classes are ignored.
CIFAR100 = Variant(
    "cifar100",
    100,
    "cifar-100-python",
    ("train",),
    "test",
    "meta",
    "fine_labels",
    "fine_label_names",
    ("fine_label", "label"),
)


def build_cifar10(cfg: DataConfig) -> DataSplits:
    """CIFAR-10 (10 classes, 50,000 train / 10,000 test) from `cfg.path`."""
    return _build(cfg, CIFAR10)


def build_cifar100(cfg: DataConfig) -> DataSplits:
    """CIFAR-100 with its 100 fine labels (50,000 train / 10,000 test) from `cfg.path`."""
    return _build(cfg, CIFAR100)


def _build(cfg: DataConfig, variant: Variant) -> DataSplits:
    root = Path(cfg.path).expanduser() if cfg.path is not None else None
    if root is None or not root.is_dir():
        raise ConfigError(f"data.path={cfg.path!r}: no such directory; {variant.layout()}")
    pickles = next((d for d in (root / variant.folder, root) if (d / variant.test).is_file()), None)
    if pickles is not None:
        train, test, names = _from_pickles(pickles, variant)
    elif (root / "dataset_dict.json").is_file():
        train, test, names = _from_saved(root, variant)
    elif _parquet_files(root, "train") and _parquet_files(root, "test"):
        train, test, names = _from_parquet(root, variant)
    else:
        raise ConfigError(f"data.path={cfg.path!r}: found no {variant.name} files; {variant.layout()}")
    for split, where in ((train, "train"), (test, "test")):
        labels = split.data.column("labels").to_numpy()
        if len(labels) == 0 or labels.min() < 0 or labels.max() >= variant.classes:
            raise ConfigError(
                f"data.path={cfg.path!r}: the {where} split has {len(labels)} images with labels "
                f"outside 0..{variant.classes - 1}; is this {variant.name}?"
            )
    size = cfg.image_size
    train.set_transform(_transform(size, cfg.augment))
    test.set_transform(_transform(size, augment=False))
    return DataSplits.of_images(train, test, names, size, num_classes=variant.classes)


# ---- the three layouts -------------------------------------------------------------------------------


class _DataOnlyUnpickler(pickle.Unpickler):
    """Unpickles plain data and numpy arrays, nothing else: a pickle may name any function to call while it
    loads, so a file from elsewhere must not get to name one."""

    ALLOWED = {("numpy", "ndarray"), ("numpy", "dtype")} | {
        (module, name)
        for module in ("numpy.core.multiarray", "numpy._core.multiarray")
        for name in ("_reconstruct", "scalar")
    }

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR file never does")


def _unpickle(path: Path) -> dict:
    """One file of the original distribution: a pickled dict with bytes keys (written by Python 2)."""
    with open(path, "rb") as f:
        try:
            batch = _DataOnlyUnpickler(f, encoding="bytes").load()
        except Exception as e:  # garbage makes the unpickler raise almost anything (EOFError, KeyError, ...)
            problem = " ".join(f"{type(e).__name__}: {e}".split())[:200]
            raise ConfigError(f"data.path: {str(path)!r} is not a CIFAR python pickle ({problem})") from None
    if not isinstance(batch, dict):
        raise ConfigError(
            f"data.path: {str(path)!r} is not a CIFAR python pickle (it holds a {type(batch).__name__}, not a dict)"
        )
    return batch


def _from_pickles(folder: Path, variant: Variant) -> tuple[datasets.Dataset, datasets.Dataset, list[str]]:
    """The python-pickle folder: rows of 3072 uint8 (1024 red, then green, then blue: C x H x W order)."""
    missing = [n for n in (*variant.train, variant.test) if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"data.path: {str(folder)!r} lacks {missing}; {variant.layout()}")

    def split(files: tuple[str, ...]) -> datasets.Dataset:
        batches = [_unpickle(folder / n) for n in files]
        try:
            pixels = np.concatenate([np.asarray(b[b"data"], dtype=np.uint8).reshape(-1, PIXELS) for b in batches])
            labels = np.concatenate([np.asarray(b[variant.label_key.encode()], dtype=np.int64) for b in batches])
        except KeyError as e:
            raise ConfigError(f"data.path: {str(folder)!r} pickles lack the key {e}; {variant.layout()}") from e
        except (ValueError, TypeError) as e:  # e.g. rows that are not 3,072 bytes each
            raise ConfigError(
                f"data.path: {str(folder)!r} pickles do not hold rows of {PIXELS} uint8 pixels "
                f"({' '.join(str(e).split())[:200]}); {variant.layout()}"
            ) from e
        # One fixed-size binary value per image: the transform gets cheap `bytes`, not 3,072 Python ints.
        images = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(PIXELS), len(pixels), [None, pa.py_buffer(np.ascontiguousarray(pixels))]
        )
        return datasets.Dataset(pa.table({"image": images, "labels": pa.array(labels)}))

    names = [str(i) for i in range(variant.classes)]
    if (folder / variant.meta).is_file():
        meta = _unpickle(folder / variant.meta)
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta.get(variant.names_key.encode(), names)]
    return split(variant.train), split((variant.test,)), names


def _from_saved(root: Path, variant: Variant) -> tuple[datasets.Dataset, datasets.Dataset, list[str]]:
    """A DatasetDict written by `save_to_disk` (e.g. `load_dataset("cifar10").save_to_disk(path)`)."""
    saved = datasets.load_from_disk(str(root))
    eval_name = next((n for n in ("test", *EVAL_DIR_NAMES) if n in saved), None)
    if "train" not in saved or eval_name is None:
        raise ConfigError(
            f"data.path={str(root)!r}: the saved dataset has no train and test splits; {variant.layout()}"
        )
    return (
        _hf_columns(saved["train"], variant, root),
        _hf_columns(saved[eval_name], variant, root),
        _class_names(saved["train"], variant),
    )


def _parquet_files(root: Path, split: str) -> list[Path]:
    """`split*.parquet` in `root` or one folder down (the Hub's `plain_text/train-00000-of-00001.parquet`)."""
    return sorted(root.glob(f"{split}*.parquet")) or sorted(root.glob(f"*/{split}*.parquet"))


def _from_parquet(root: Path, variant: Variant) -> tuple[datasets.Dataset, datasets.Dataset, list[str]]:
    """Parquet files written by `datasets` (`to_parquet` / the Hub); their schema carries the features."""

    def read(split: str) -> datasets.Dataset:
        return datasets.Dataset(pa.concat_tables([pq.read_table(f) for f in _parquet_files(root, split)]))

    train = read("train")
    return _hf_columns(train, variant, root), _hf_columns(read("test"), variant, root), _class_names(train, variant)


def _hf_columns(ds: datasets.Dataset, variant: Variant, where: Path) -> datasets.Dataset:
    """Keep the image and label columns of a Hugging Face CIFAR split as `image` (decoded to PIL on access)
    and `labels`."""
    image = next((c for c in ("img", "image") if c in ds.column_names), None)
    label = next((c for c in variant.hf_labels if c in ds.column_names), None)
    if image is None or label is None:
        raise ConfigError(
            f"data.path={str(where)!r}: needs an img/image column and a "
            f"{'/'.join(variant.hf_labels)} column, has {ds.column_names}; {variant.layout()}"
        )
    ds = ds.select_columns([image, label]).rename_columns({image: "image", label: "labels"})
    if not isinstance(ds.features["image"], datasets.Image):  # e.g. parquet without the datasets metadata
        ds = ds.cast_column("image", datasets.Image())
    return ds


def _class_names(ds: datasets.Dataset, variant: Variant) -> list[str]:
    """The label names a ClassLabel feature carries, else the indices as strings."""
    label = next(c for c in variant.hf_labels if c in ds.column_names)
    feature = ds.features[label]
    if isinstance(feature, datasets.ClassLabel) and feature.num_classes == variant.classes:
        return list(feature.names)
    return [str(i) for i in range(variant.classes)]


# ---- transform ---------------------------------------------------------------------------------------


def _as_tensor(image) -> torch.Tensor:
    """uint8 (3, H, W) from a raw pickle row (bytes) or a decoded PIL image."""
    if isinstance(image, bytes):
        return torch.from_numpy(np.frombuffer(image, dtype=np.uint8).reshape(3, CIFAR_SIZE, CIFAR_SIZE).copy())
    return v2.functional.pil_to_tensor(image.convert("RGB"))


def _transform(size: int, augment: bool) -> Callable[[dict], dict[str, torch.Tensor]]:
    """A batch transform for `set_transform`: images -> normalised float32 (3, size, size), labels -> int64."""
    geometry: list = [v2.Resize((size, size), antialias=True)]
    if augment:
        geometry += [v2.RandomCrop(size, padding=max(1, size // 8)), v2.RandomHorizontalFlip()]
    pipeline = v2.Compose([*geometry, v2.ToDtype(torch.float32, scale=True), v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)])

    return image_batches(pipeline, _as_tensor)
