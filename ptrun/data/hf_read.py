"""`data.name=hf`, the reading half: `data.path` resolved to the source's raw train and eval splits (Arrow
tables the `datasets` library memory-maps from its cache), the configured columns checked, and the labels
turned into class indices. Nothing here tokenizes (hf_tokens.py) or transforms images (hf_source.py).

`data.path` is, in this order: a `save_to_disk` directory (it holds `dataset_dict.json` or `state.json`);
a .csv / .json / .jsonl / .parquet file (its rows are the train split); a folder of such files (the
`datasets` folder rules: files named `train*`, `validation*`, `test*` become those splits); else a hub
dataset id `org/name` with `data.config_name`, read from the `datasets` cache when HF_HUB_OFFLINE=1 or
HF_DATASETS_OFFLINE=1 (downloaded into it otherwise). The caches are found from the environment at the
call (HF_DATASETS_CACHE, else HF_HOME/datasets), so a run honours the variables it was started with.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
from datasets.packaged_modules.cache.cache import Cache
from datasets.utils import logging as datasets_logging

from ptrun.config import ConfigError, DataConfig
from ptrun.config.data import HF_FILE_SUFFIXES
from ptrun.data.splits import stratified_split

EVAL_SPLIT_NAMES = ("validation", "test")
"""The source's own splits taken for evaluation when `data.eval_split` is unset, in this order."""
BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
TRUE_WORDS = {"1", "ON", "YES", "TRUE"}
NO_DATA = re.compile(r'Instruction "[^"]+" corresponds to no data')
"""How `datasets` refuses a split without rows (a csv of its header alone, say)."""


@dataclass(frozen=True)
class RawSplits:
    """The raw train and eval rows of a `data.name=hf` source, before tokenization or image transforms."""

    train: datasets.Dataset
    eval: datasets.Dataset
    class_names: list[str]
    """Classes in label order; empty without `data.label_column` and for a regression."""
    train_labels: np.ndarray | None
    """The train rows' targets: int64 class indices (classification) or float32 values (regression); None
    without `data.label_column`."""
    eval_labels: np.ndarray | None


def offline() -> bool:
    """Whether the hub may not be reached: HF_DATASETS_OFFLINE, else HF_HUB_OFFLINE, as `datasets` reads them."""
    value = os.environ.get("HF_DATASETS_OFFLINE", os.environ.get("HF_HUB_OFFLINE", ""))
    return value.upper() in TRUE_WORDS


def datasets_cache() -> Path:
    """The `datasets` cache directory this process's environment names."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "datasets"


def read_raw(cfg: DataConfig, task: str) -> RawSplits:
    """The train and eval rows of `cfg.path` with the columns `cfg` names checked; `task` is `classification`,
    `regression` (a numeric label column) or `causal_lm` (which splits without labels). Raises ConfigError in
    one line for what the user can fix."""
    splits = load_source(cfg)
    train = pick_split(splits, cfg.train_split, "data.train_split", cfg.path)
    eval_name = cfg.eval_split or next((n for n in EVAL_SPLIT_NAMES if n in splits and n != cfg.train_split), None)
    held_out = pick_split(splits, eval_name, "data.eval_split", cfg.path) if eval_name is not None else None
    wanted = [(k, getattr(cfg, k)) for k in ("text_column", "text_pair_column", "label_column", "image_column")]
    for where, rows in (("train", train), ("eval", held_out)):
        if rows is None:
            continue
        for key, column in wanted:
            if column is not None and column not in rows.column_names:
                raise ConfigError(
                    f"data.{key}={column!r}: the {where} split of data.path={cfg.path!r} has no such "
                    f"column; it has {rows.column_names}"
                )
    for name, rows in ((cfg.train_split, train), (eval_name, held_out)):
        if rows is not None and len(rows) == 0:
            raise empty_split(cfg, name)
    if cfg.label_column is None:
        if held_out is None:
            train_pos, eval_pos = seeded_split(len(train), cfg)
            train, held_out = train.select(train_pos), train.select(eval_pos)
        return RawSplits(train, held_out, [], None, None)

    if task == "regression":
        train_targets = regression_targets(train, cfg.label_column, "train", cfg)
        if held_out is None:
            train_pos, eval_pos = seeded_split(len(train), cfg)
            train, held_out = train.select(train_pos), train.select(eval_pos)
            return RawSplits(train, held_out, [], train_targets[train_pos], train_targets[eval_pos])
        return RawSplits(
            train, held_out, [], train_targets, regression_targets(held_out, cfg.label_column, "eval", cfg)
        )

    class_names, train_labels = class_indices(train, cfg.label_column, None, cfg)
    present = np.unique(train_labels)
    if len(present) < 2:
        raise ConfigError(
            f"data.label_column={cfg.label_column!r}: the train split of data.path={cfg.path!r} has "
            f"one class ({class_names[present[0]]!r}); classification needs two or more"
        )
    if held_out is None:
        train_pos, eval_pos = stratified_split(train_labels, cfg, f"the labels of data.path={cfg.path!r}")
        train, held_out = train.select(train_pos), train.select(eval_pos)
        return RawSplits(train, held_out, class_names, train_labels[train_pos], train_labels[eval_pos])
    _, eval_labels = class_indices(held_out, cfg.label_column, class_names, cfg)
    return RawSplits(train, held_out, class_names, train_labels, eval_labels)


@contextmanager
def quiet():
    """`datasets` without its progress bars and notes (a bad-input start must print one line, and a run's
    output is ptrun's)."""
    bars, level = datasets.is_progress_bar_enabled(), datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)  # a file it cannot read is our one line
    try:
        yield
    finally:
        datasets_logging.set_verbosity(level)
        if bars:
            datasets.enable_progress_bars()


def load_source(cfg: DataConfig) -> dict[str, datasets.Dataset]:
    """Every split of `cfg.path`, by name."""
    with quiet():
        return _load_source(cfg)


def _load_source(cfg: DataConfig) -> dict[str, datasets.Dataset]:
    path = Path(cfg.path).expanduser()
    saved = path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json"))
    try:
        if saved:
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        if path.is_file():
            if path.suffix not in BUILDERS:
                raise ConfigError(f"data.path={cfg.path!r}: not a {' / '.join(HF_FILE_SUFFIXES)} file")
            return dict(
                datasets.load_dataset(
                    BUILDERS[path.suffix], data_files={"train": str(path)}, cache_dir=str(datasets_cache())
                )
            )
        if path.is_dir():
            if not data_files(path):
                raise ConfigError(
                    f"data.path={cfg.path!r}: the folder holds no {' / '.join(HF_FILE_SUFFIXES)} "
                    f"files and is not a save_to_disk directory"
                )
            return dict(datasets.load_dataset(str(path), cache_dir=str(datasets_cache())))
        return load_hub(cfg)
    except ConfigError:
        raise
    except Exception as e:  # a malformed file: the library's words, on one line
        empty = saved_split_without_rows(path) if saved else None
        if empty is not None:  # `datasets` saves a split without rows but cannot load it back
            raise empty_split(cfg, empty) from None
        # A folder fails as a whole: the first of its files that fails alone is the one to name.
        file, problem = (first_unreadable(path) if path.is_dir() and not saved else None) or (None, e)
        raise unreadable(cfg, path, file, problem) from None


def saved_split_without_rows(path: Path) -> str | None:
    """The first split of the `save_to_disk` directory `path` that was saved without rows (its state.json
    lists no data file), if any."""
    if (path / "state.json").is_file():  # one Dataset: it stands for the train split
        folders = {"train": path}
    else:
        try:
            folders = {name: path / name for name in json.loads((path / "dataset_dict.json").read_text())["splits"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None
    for name, folder in folders.items():
        try:
            state = json.loads((folder / "state.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(state, dict) and not state.get("_data_files"):
            return name
    return None


def data_files(folder: Path) -> list[Path]:
    """The data files of `folder` as `datasets` reads a folder: those it has a builder for, hidden ones left
    out."""
    return sorted(
        f
        for f in folder.rglob("*")
        if f.suffix in BUILDERS
        and f.is_file()
        and not any(part.startswith((".", "__")) for part in f.relative_to(folder).parts)
    )


def first_unreadable(folder: Path) -> tuple[Path, Exception] | None:
    """The first data file of `folder` that `datasets` cannot read on its own, and its error; None when each
    reads (what failed was the folder's files together: columns that differ, say)."""
    for file in data_files(folder):
        try:
            datasets.load_dataset(
                BUILDERS[file.suffix], data_files={"train": str(file)}, cache_dir=str(datasets_cache())
            )
        except Exception as e:
            return file, e
    return None


def unreadable(cfg: DataConfig, path: Path, file: Path | None, e: BaseException) -> ConfigError:
    """The one line for a source `datasets` could not read: `file` of the folder `path`, or `path` itself."""
    what = "it" if file is None else str(file.relative_to(path))
    if isinstance(e, ValueError) and NO_DATA.search(str(e)):  # `datasets` builds no split without rows
        return ConfigError(
            f"data.path={cfg.path!r}: {'the file' if file is None else what} has no rows; give it "
            f"rows{'' if file is None else ', or remove it'}"
        )
    return ConfigError(f"data.path={cfg.path!r}: cannot read {what} ({one_line(root_cause(e))})")


def empty_split(cfg: DataConfig, name: str) -> ConfigError:
    """The one line for split `name` of the source without rows (a `save_to_disk` directory's: `datasets`
    builds none from files)."""
    key, value = (
        ("data.train_split", cfg.train_split) if name == cfg.train_split else ("data.eval_split", cfg.eval_split)
    )
    return ConfigError(
        f"{key}={value!r}: the {name!r} split of data.path={cfg.path!r} has no rows; give it rows, "
        f"or name another split"
    )


def load_hub(cfg: DataConfig) -> dict[str, datasets.Dataset]:
    """Hub dataset `cfg.path` (`org/name`): from the `datasets` cache when offline, else through
    `load_dataset` (which downloads what the cache lacks)."""
    cache = datasets_cache()
    if not offline():
        return dict(datasets.load_dataset(cfg.path, cfg.config_name, cache_dir=str(cache)))
    try:  # what load_dataset itself reads offline
        builder = Cache(
            cache_dir=str(cache),
            repo_id=cfg.path,
            dataset_name=cfg.path.split("/")[-1],
            config_name=cfg.config_name,
            version="auto",
            hash="auto",
        )
    except ValueError as e:
        text = str(e)
        if "Available configs" in text or "multiple" in text:
            raise ConfigError(
                f"data.config_name={cfg.config_name!r}: the datasets cache {str(cache)!r} holds "
                f"{cfg.path} in other configurations ({one_line(e)})"
            ) from None
        raise ConfigError(
            f"data.path={cfg.path!r}: not a local file or folder, and not in the datasets cache "
            f"{str(cache)!r} (offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set); load it once "
            f"online, or give a local path"
        ) from None
    return dict(builder.as_dataset())


def pick_split(splits: dict[str, datasets.Dataset], name: str, key: str, path: str) -> datasets.Dataset:
    if name not in splits:
        raise ConfigError(f"{key}={name!r}: data.path={path!r} has the splits {sorted(splits)}")
    return splits[name]


def column_values(rows: datasets.Dataset, column: str) -> pa.ChunkedArray | pa.Array:
    """One column of `rows` as Arrow (following a `select`'s indices), without converting every value."""
    return rows.select_columns([column]).with_format("arrow")[:][column]


def class_indices(
    rows: datasets.Dataset, column: str, class_names: list[str] | None, cfg: DataConfig
) -> tuple[list[str], np.ndarray]:
    """(class names, int64 class index per row). A ClassLabel column keeps its names; other values (strings,
    integers) are named by their text and ordered by value (numbers numerically). With `class_names` given
    (the train split's), each row's label is matched by name: a ClassLabel with the same names maps as it
    stands, one with other names (or plain values) through its names, and a label outside `class_names` is
    refused in one line."""
    feature = rows.features[column]
    values = column_values(rows, column)
    if values.null_count:
        raise ConfigError(
            f"data.label_column={column!r}: {values.null_count} rows of data.path={cfg.path!r} have no label"
        )
    if isinstance(feature, datasets.ClassLabel):
        index = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
        bad = sorted(set(index[(index < 0) | (index >= feature.num_classes)].tolist()))
        if bad:
            raise ConfigError(
                f"data.label_column={column!r}: data.path={cfg.path!r} has labels {bad[:5]} outside "
                f"its {feature.num_classes} class names (a test split without labels?)"
            )
        if class_names is None or list(feature.names) == list(class_names):
            return list(feature.names), index
        keys = np.asarray(feature.names, dtype=object)[index].astype(str)  # another split's names: by name
    elif pa.types.is_floating(values.type) or pa.types.is_integer(values.type) or pa.types.is_boolean(values.type):
        keys = np.asarray(values.to_numpy(zero_copy_only=False))
        if keys.dtype.kind == "f":
            if not np.all(keys == np.round(keys)):
                raise ConfigError(
                    f"data.label_column={column!r}: data.path={cfg.path!r} has fractional labels "
                    f"(class labels are strings or integers; model.task=regression for numbers)"
                )
            keys = keys.astype(np.int64)
    else:
        keys = np.asarray(values.to_pylist(), dtype=object).astype(str)
    distinct, row_of = np.unique(keys, return_inverse=True)  # numbers in numeric order, strings in text order
    as_text = [str(v) for v in distinct.tolist()]
    names = class_names if class_names is not None else as_text
    lookup = {name: i for i, name in enumerate(names)}
    unknown = [t for t in as_text if t not in lookup]
    if unknown:
        raise ConfigError(
            f"data.label_column={column!r}: the eval split has labels {unknown[:5]} that the train "
            f"split lacks (train has {names[:10]})"
        )
    return list(names), np.array([lookup[t] for t in as_text], dtype=np.int64)[row_of.reshape(-1)]


def regression_targets(rows: datasets.Dataset, column: str, where: str, cfg: DataConfig) -> np.ndarray:
    """The float32 target of every row for `model.task=regression`: the label column must hold numbers, every
    one finite."""
    values = column_values(rows, column)
    kind = values.type
    if isinstance(rows.features[column], datasets.ClassLabel) or not (
        pa.types.is_floating(kind) or pa.types.is_integer(kind)
    ):
        first = next((v for v in values.to_pylist() if v is not None), None)
        shown = (
            "class labels"
            if isinstance(rows.features[column], datasets.ClassLabel)
            else f"text such as {str(first)[:40]!r}"
            if pa.types.is_string(kind) or pa.types.is_large_string(kind)
            else f"{kind} values"
        )
        raise ConfigError(
            f"data.label_column={column!r}: the {where} split of data.path={cfg.path!r} holds "
            f"{shown}; model.task=regression needs numbers"
        )
    targets = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float64)
    missing = int(values.null_count) or int((~np.isfinite(targets)).sum())
    if missing:
        raise ConfigError(
            f"data.label_column={column!r}: {missing} rows of the {where} split of "
            f"data.path={cfg.path!r} have no finite target"
        )
    return targets.astype(np.float32)


def seeded_split(n: int, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray]:
    """Train and eval positions of a plain split of `n` rows without classes (a causal-LM corpus, regression
    targets), fixed by `split_seed`; each side keeps the source's order."""
    n_eval = max(1, round(n * cfg.eval_fraction))
    if n_eval >= n:
        raise ConfigError(
            f"data.eval_fraction={cfg.eval_fraction!r}: data.path={cfg.path!r} has {n} rows, too few "
            f"to hold out {n_eval} (give data.eval_split, or more rows)"
        )
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    return np.sort(order[n_eval:]), np.sort(order[:n_eval])


def root_cause(e: BaseException) -> BaseException:
    """The exception `e` was raised from, and so on down (`datasets` wraps a parser's error in
    DatasetGenerationError: the parser's says what is wrong)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]
