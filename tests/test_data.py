"""Dataset sources (digits, imagefolder), their errors, and per-replica batch iteration with prefetch."""

import threading
from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image

from ptrun.config import ConfigError, DataConfig
from ptrun.data import EpochSampler, build_datasets, iterate_batches
from ptrun.data.images import read_digits
from ptrun.data.loader import PREFETCH_THREAD_NAME
from ptrun.data.splits import stratified_split

CLASSES = ["cat", "dog", "emu"]


# ---- digits ----


def test_digits_split_is_stratified_deterministic_and_normalised():
    splits = build_datasets(DataConfig(name="digits", eval_fraction=0.25, split_seed=0))
    assert len(splits.train) + len(splits.eval) == 1797
    assert len(splits.eval) == pytest.approx(0.25 * 1797, abs=1)
    assert (splits.num_classes, splits.class_names) == (10, [str(c) for c in range(10)])
    assert (splits.input_names, splits.image_size, splits.in_chans) == (("pixel_values",), 8, 1)

    train = splits.train[:]
    assert train["pixel_values"].shape == (len(splits.train), 1, 8, 8)
    assert train["pixel_values"].dtype == torch.float32 and train["labels"].dtype == torch.int64
    assert abs(train["pixel_values"].mean().item()) < 1e-4
    assert train["pixel_values"].std().item() == pytest.approx(1.0, abs=1e-3)
    train_share = Counter(train["labels"].tolist())
    eval_share = Counter(splits.eval[:]["labels"].tolist())
    for c in range(10):  # stratified: every class is held out in (about) the same proportion
        assert eval_share[c] / (train_share[c] + eval_share[c]) == pytest.approx(0.25, abs=0.02)

    again = build_datasets(DataConfig(name="digits", eval_fraction=0.25, split_seed=0))
    other = build_datasets(DataConfig(name="digits", eval_fraction=0.25, split_seed=1))
    assert torch.equal(again.eval[:]["pixel_values"], splits.eval[:]["pixel_values"])
    assert not torch.equal(other.eval[:]["pixel_values"], splits.eval[:]["pixel_values"])


def test_digits_resize():
    splits = build_datasets(DataConfig(name="digits", image_size=16))
    assert splits.image_size == 16
    assert splits.train[0]["pixel_values"].shape == (1, 16, 16)
    assert abs(splits.train[:]["pixel_values"].mean().item()) < 1e-4


def test_digits_are_scikit_learns_digits():
    """The digits are read from scikit-learn's file without importing it: the same pixels and labels as
    `load_digits`."""
    from sklearn.datasets import load_digits

    pixels, labels = read_digits()
    digits = load_digits()
    assert np.array_equal(pixels, digits.data) and np.array_equal(labels, digits.target)
    assert labels.dtype == np.int64 and pixels.dtype == np.float64


SPLIT_LABELS = {
    "digits": lambda rng: read_digits()[1],
    "uneven": lambda rng: rng.choice(5, size=203, p=[0.5, 0.2, 0.15, 0.1, 0.05]),
    "tied": lambda rng: np.repeat(np.arange(7), 3),  # equal remainders: ties broken by the generator
    "strings": lambda rng: rng.choice(["neg", "neu", "pos"], size=61),
}


@pytest.mark.parametrize("labels", SPLIT_LABELS)
@pytest.mark.parametrize("fraction,seed", [(0.2, 0), (0.25, 1), (0.33, 7), (0.5, 3), (0.1, 42)])
def test_stratified_split_is_scikit_learns_index_for_index(labels, fraction, seed):
    """The split ptrun makes in numpy is `train_test_split(..., stratify=labels)`'s, index for index, so runs
    split their data as they always did."""
    from sklearn.model_selection import train_test_split

    y = SPLIT_LABELS[labels](np.random.default_rng(seed))
    positions = np.arange(len(y))
    try:
        want = train_test_split(positions, test_size=fraction, random_state=seed, stratify=y)
    except ValueError:  # too few samples for scikit-learn: ptrun refuses it too
        with pytest.raises(ConfigError, match="cannot split the labels stratified"):
            stratified_split(y, DataConfig(eval_fraction=fraction, split_seed=seed), "the labels")
        return
    train, held_out = stratified_split(y, DataConfig(eval_fraction=fraction, split_seed=seed), "the labels")
    assert np.array_equal(train, np.sort(want[0])) and np.array_equal(held_out, np.sort(want[1]))


@pytest.mark.parametrize("labels", [[0, 0, 0, 1], [0, 1, 2, 0, 1, 2]])
def test_a_split_too_small_to_stratify_is_refused_in_one_line(labels):
    with pytest.raises(ConfigError, match=r"data.eval_fraction=0.2: cannot split the labels stratified \("):
        stratified_split(labels, DataConfig(eval_fraction=0.2, split_seed=0), "the labels")


# ---- imagefolder ----


def write_images(folder, per_class: int, size=(10, 6)) -> None:
    """PNGs whose uniform red channel encodes the class index, so labels can be checked from the pixels."""
    for label, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.zeros((size[1], size[0], 3), dtype=np.uint8)
            pixels[..., 0] = 60 * label
            pixels[..., 1] = 20 * i
            pixels[..., 2] = np.linspace(0, 255, size[0], dtype=np.uint8)  # texture, so crops and flips show
            Image.fromarray(pixels).save(folder / name / f"{i}.png")


def red_class(pixel_values: torch.Tensor) -> int:
    """Undo the ImageNet normalisation of the red channel and decode the class index written above."""
    red = pixel_values[0].mean().item() * 0.229 + 0.485
    return round(red * 255 / 60)


@pytest.fixture
def split_folders(tmp_path):
    write_images(tmp_path / "train", per_class=4)
    write_images(tmp_path / "val", per_class=2)
    return tmp_path


def test_imagefolder_train_val_layout(split_folders):
    splits = build_datasets(DataConfig(name="imagefolder", path=str(split_folders), image_size=32))
    assert (splits.class_names, splits.num_classes) == (CLASSES, 3)
    assert (splits.image_size, splits.in_chans, splits.input_names) == (32, 3, ("pixel_values",))
    assert (len(splits.train), len(splits.eval)) == (12, 6)
    batch = splits.train[[0, 5, 11]]
    assert batch["pixel_values"].shape == (3, 3, 32, 32) and batch["pixel_values"].dtype == torch.float32
    assert batch["labels"].dtype == torch.int64
    for ds in (splits.train, splits.eval):
        for i in range(len(ds)):
            sample = ds[i]
            assert red_class(sample["pixel_values"]) == sample["labels"].item()


def test_imagefolder_validation_name_and_default_size(tmp_path):
    write_images(tmp_path / "train", per_class=2)
    write_images(tmp_path / "validation", per_class=1)
    splits = build_datasets(DataConfig(name="imagefolder", path=str(tmp_path)))
    assert len(splits.eval) == 3
    assert splits.image_size == 224 and splits.eval[0]["pixel_values"].shape == (3, 224, 224)


def test_imagefolder_flat_layout_is_split_stratified(tmp_path):
    write_images(tmp_path, per_class=5)
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "notes").mkdir()  # no images: not a class
    cfg = DataConfig(name="imagefolder", path=str(tmp_path), eval_fraction=0.2, split_seed=3, image_size=8)
    splits = build_datasets(cfg)
    assert splits.class_names == CLASSES
    assert (len(splits.train), len(splits.eval)) == (12, 3)
    assert sorted(splits.eval[:]["labels"].tolist()) == [0, 1, 2]
    for i in range(len(splits.train)):
        assert red_class(splits.train[i]["pixel_values"]) == splits.train[i]["labels"].item()
    assert torch.equal(build_datasets(cfg).eval[:]["pixel_values"], splits.eval[:]["pixel_values"])


def test_augment_changes_only_the_train_transform(split_folders):
    plain = build_datasets(DataConfig(name="imagefolder", path=str(split_folders), image_size=16))
    augmented = build_datasets(DataConfig(name="imagefolder", path=str(split_folders), image_size=16, augment=True))
    assert torch.equal(plain.eval[:]["pixel_values"], augmented.eval[:]["pixel_values"])
    assert torch.equal(plain.train[:]["pixel_values"], plain.train[:]["pixel_values"])
    torch.manual_seed(0)
    first = augmented.train[:]["pixel_values"]
    assert first.shape == (12, 3, 16, 16)
    assert not torch.equal(first, augmented.train[:]["pixel_values"])  # random crops differ per access


@pytest.mark.parametrize("layout", ["missing", "empty", "no_images", "val_without_train"])
def test_bad_imagefolder_paths_raise_a_one_line_config_error(tmp_path, layout):
    path = tmp_path / "data"
    if layout != "missing":
        path.mkdir()
    if layout == "no_images":
        (path / "cat").mkdir()
        (path / "cat" / "readme.txt").write_text("not an image")
    if layout == "val_without_train":
        write_images(path / "val", per_class=1)
    with pytest.raises(ConfigError) as error:
        build_datasets(DataConfig(name="imagefolder", path=str(path)))
    message = str(error.value)
    assert "\n" not in message and repr(str(path)) in message and "<class>" in message


# ---- iterate_batches ----


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == PREFETCH_THREAD_NAME and t.is_alive()]


@pytest.fixture(scope="module")
def digits():
    return build_datasets(DataConfig(name="digits")).train


def test_batches_follow_the_sampler(digits):
    sampler = EpochSampler(len(digits), 8, seed=4)
    steps = list(iterate_batches(digits, sampler, epoch=2, replica=1, dp=2))
    assert [s for s, _ in steps] == list(range(sampler.steps_per_epoch))
    for step, batch in steps:
        ids, weight = sampler.replica_batch(2, step, 1, 2)
        assert set(batch) == {"pixel_values", "labels", "weight", "index"}
        assert torch.equal(batch["index"], ids) and torch.equal(batch["weight"], weight)
        assert torch.equal(batch["labels"], digits[ids.tolist()]["labels"])
        assert batch["pixel_values"].shape == (4, 1, 8, 8)
    assert not prefetch_threads()


def test_start_and_max_steps(digits):
    sampler = EpochSampler(len(digits), 16, seed=0)
    assert [s for s, _ in iterate_batches(digits, sampler, 0, 0, 1, start_step=3, max_steps=7)] == [3, 4, 5, 6]
    assert [s for s, _ in iterate_batches(digits, sampler, 0, 0, 1, max_steps=10_000)] == list(
        range(sampler.steps_per_epoch)
    )


def test_closing_early_stops_the_prefetch_thread(digits):
    batches = iterate_batches(digits, EpochSampler(len(digits), 4, seed=0), epoch=0, replica=0, dp=1)
    assert next(batches)[0] == 0
    assert prefetch_threads()
    batches.close()
    assert not prefetch_threads()


def test_loading_errors_surface_in_the_consumer():
    class Broken:
        def __getitem__(self, ids):
            raise RuntimeError("unreadable sample")

    with pytest.raises(RuntimeError, match="unreadable sample"):
        list(iterate_batches(Broken(), EpochSampler(10, 2, seed=0), epoch=0, replica=0, dp=1))
    with pytest.raises(ValueError, match="divisible"):
        list(iterate_batches(Broken(), EpochSampler(10, 4, seed=0), epoch=0, replica=0, dp=3))
    assert not prefetch_threads()
