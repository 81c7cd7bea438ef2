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

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa

from ptrun.config import ConfigError, DataConfig
from ptrun.config.data import HF_FILE_SUFFIXES
from ptrun.data.splits import stratified_split

EVAL_SPLIT_NAMES = ("validation", "test")
"""The source's own splits taken for evaluation when `data.eval_split` is unset, in this order."""
BUILDERS = {".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
TRUE_WORDS = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class RawSplits:
    """The raw train and eval rows of a `data.name=hf` source, before tokenization or image transforms."""

    train: datasets.Dataset
    eval: datasets.Dataset
    class_names: list[str]
    """Classes in label order; empty without `data.label_column`."""
    train_labels: np.ndarray | None
    """int64 class indices of the train rows (None without `data.label_column`)."""
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
    """The train and eval rows of `cfg.path` with the columns `cfg` names checked; `task` is `classification`
    or `causal_lm` (which splits without labels). Raises ConfigError in one line for what the user can fix."""
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
                raise ConfigError(f"data.{key}={column!r}: the {where} split of data.path={cfg.path!r} has no such "
                                  f"column; it has {rows.column_names}")
    if len(train) == 0:
        raise ConfigError(f"data.train_split={cfg.train_split!r}: the split of data.path={cfg.path!r} has no rows")
    if cfg.label_column is None:
        if held_out is None:
            train, held_out = seeded_split(train, cfg)
        return RawSplits(train, held_out, [], None, None)

    class_names, train_labels = class_indices(train, cfg.label_column, None, cfg)
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
    from datasets.utils import logging as datasets_logging

    bars, level = datasets.is_progress_bar_enabled(), datasets_logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets_logging.set_verbosity_error()
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
    try:
        if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json", "state.json")):
            loaded = datasets.load_from_disk(str(path))
            return dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        if path.is_file():
            if path.suffix not in BUILDERS:
                raise ConfigError(f"data.path={cfg.path!r}: not a {' / '.join(HF_FILE_SUFFIXES)} file")
            return dict(datasets.load_dataset(BUILDERS[path.suffix], data_files={"train": str(path)},
                                              cache_dir=str(datasets_cache())))
        if path.is_dir():
            if not any(f.suffix in BUILDERS for f in path.rglob("*") if f.is_file()):
                raise ConfigError(f"data.path={cfg.path!r}: the folder holds no {' / '.join(HF_FILE_SUFFIXES)} "
                                  f"files and is not a save_to_disk directory")
            return dict(datasets.load_dataset(str(path), cache_dir=str(datasets_cache())))
        return load_hub(cfg)
    except ConfigError:
        raise
    except Exception as e:  # a malformed file: the library's words, on one line
        raise ConfigError(f"data.path={cfg.path!r}: cannot read it ({one_line(e)})") from e


def load_hub(cfg: DataConfig) -> dict[str, datasets.Dataset]:
    """Hub dataset `cfg.path` (`org/name`): from the `datasets` cache when offline, else through
    `load_dataset` (which downloads what the cache lacks)."""
    cache = datasets_cache()
    if not offline():
        return dict(datasets.load_dataset(cfg.path, cfg.config_name, cache_dir=str(cache)))
    from datasets.packaged_modules.cache.cache import Cache  # what load_dataset itself reads offline

    try:
        builder = Cache(cache_dir=str(cache), repo_id=cfg.path, dataset_name=cfg.path.split("/")[-1],
                        config_name=cfg.config_name, version="auto", hash="auto")
    except ValueError as e:
        text = str(e)
        if "Available configs" in text or "multiple" in text:
            raise ConfigError(f"data.config_name={cfg.config_name!r}: the datasets cache {str(cache)!r} holds "
                              f"{cfg.path} in other configurations ({one_line(e)})") from None
        raise ConfigError(f"data.path={cfg.path!r}: not a local file or folder, and not in the datasets cache "
                          f"{str(cache)!r} (offline: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE is set); load it once "
                          f"online, or give a local path") from None
    return dict(builder.as_dataset())


def pick_split(splits: dict[str, datasets.Dataset], name: str, key: str, path: str) -> datasets.Dataset:
    if name not in splits:
        raise ConfigError(f"{key}={name!r}: data.path={path!r} has the splits {sorted(splits)}")
    return splits[name]


def column_values(rows: datasets.Dataset, column: str) -> pa.ChunkedArray | pa.Array:
    """One column of `rows` as Arrow (following a `select`'s indices), without converting every value."""
    return rows.select_columns([column]).with_format("arrow")[:][column]


def class_indices(rows: datasets.Dataset, column: str, class_names: list[str] | None,
                  cfg: DataConfig) -> tuple[list[str], np.ndarray]:
    """(class names, int64 class index per row). A ClassLabel column keeps its names; other values (strings,
    integers) are named by their text and ordered by value (numbers numerically). With `class_names` given
    (the train split's), a value outside them is refused in one line."""
    feature = rows.features[column]
    values = column_values(rows, column)
    if values.null_count:
        raise ConfigError(f"data.label_column={column!r}: {values.null_count} rows of data.path={cfg.path!r} have "
                          f"no label")
    if isinstance(feature, datasets.ClassLabel):
        names = class_names or list(feature.names)
        index = np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)
        bad = sorted(set(index[(index < 0) | (index >= len(names))].tolist()))
        if bad:
            raise ConfigError(f"data.label_column={column!r}: data.path={cfg.path!r} has labels {bad[:5]} outside "
                              f"its {len(names)} class names (a test split without labels?)")
        return names, index
    if pa.types.is_floating(values.type) or pa.types.is_integer(values.type) or pa.types.is_boolean(values.type):
        raw = np.asarray(values.to_numpy(zero_copy_only=False))
        distinct = np.unique(raw)
        if np.issubdtype(raw.dtype, np.floating) and not np.all(distinct == np.round(distinct)):
            raise ConfigError(f"data.label_column={column!r}: data.path={cfg.path!r} has fractional labels "
                              f"(class labels are strings or integers)")
        as_text = [str(v) for v in (distinct.astype(np.int64) if raw.dtype.kind == "f" else distinct).tolist()]
        keys = raw.astype(np.int64) if raw.dtype.kind == "f" else raw
    else:
        keys = np.asarray(values.to_pylist(), dtype=object).astype(str)
        distinct = np.unique(keys)
        as_text = distinct.tolist()
    names = class_names if class_names is not None else as_text
    lookup = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(as_text) - set(lookup))
    if unknown:
        raise ConfigError(f"data.label_column={column!r}: the eval split has labels {unknown[:5]} that the train "
                          f"split lacks (train has {names[:10]})")
    index_of_distinct = np.array([lookup[t] for t in as_text], dtype=np.int64)
    positions = np.searchsorted(np.unique(keys), keys)
    return list(names), index_of_distinct[positions]


def seeded_split(rows: datasets.Dataset, cfg: DataConfig) -> tuple[datasets.Dataset, datasets.Dataset]:
    """A plain train/eval split of unlabelled rows (a causal-LM corpus), fixed by `split_seed`; each side
    keeps the source's order."""
    n = len(rows)
    n_eval = max(1, round(n * cfg.eval_fraction))
    if n_eval >= n:
        raise ConfigError(f"data.eval_fraction={cfg.eval_fraction!r}: data.path={cfg.path!r} has {n} rows, too few "
                          f"to hold out {n_eval} (give data.eval_split, or more rows)")
    order = np.random.default_rng(cfg.split_seed).permutation(n)
    return rows.select(np.sort(order[n_eval:])), rows.select(np.sort(order[:n_eval]))


def one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]
