"""The whole config: one field per group (each group's dataclass lives with its allowed values and checks in
its own module), the logger, and the run directory; the list of every key, and the resolved YAML the
workers load."""

from __future__ import annotations

import functools
import os
import typing
from dataclasses import dataclass, field, fields

from omegaconf import MISSING, OmegaConf

from ptrun.config.adapter import AdapterConfig
from ptrun.config.data import DataConfig
from ptrun.config.freezing import AutoConfig, CacheConfig, FreezeConfig
from ptrun.config.launcher import DeviceConfig, LauncherConfig
from ptrun.config.model import ModelConfig
from ptrun.config.paper import PaperConfig
from ptrun.config.pipe import PipeConfig
from ptrun.config.rules import check_choices, choice, either
from ptrun.config.training import CheckpointConfig, OptimConfig, TrainConfig
from ptrun.installed import LOGGER_SPECS, check_installed

LOGGERS = tuple(LOGGER_SPECS)
"""`logger` (`ptrun.installed.LOGGER_SPECS`)."""


@dataclass
class PtrunConfig:
    """The whole run. `recipe` names the preset that was applied (informational)."""

    recipe: str | None = None
    """The preset applied from `recipes/` (set by choosing `recipe=NAME`)."""
    model: ModelConfig = field(default_factory=ModelConfig)
    adapter: AdapterConfig = field(default_factory=AdapterConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    pipe: PipeConfig = field(default_factory=PipeConfig)
    freeze: FreezeConfig = field(default_factory=FreezeConfig)
    auto: AutoConfig = field(default_factory=AutoConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    paper: PaperConfig = field(default_factory=PaperConfig)
    logger: str = choice("jsonl", LOGGERS, wording=either)
    """Where metrics go besides the terminal: `jsonl` (RUN_DIR/metrics.jsonl, always written) and also
    `tensorboard` (TensorBoard scalars in RUN_DIR: `tensorboard --logdir runs`), `wandb` (a Weights & Biases
    run, files in RUN_DIR/wandb; `WANDB_MODE=offline` sends nothing) or `mlflow` (an MLflow run in
    $MLFLOW_TRACKING_URI, else in RUN_DIR/mlflow.db). wandb and mlflow need `pip install 'ptrun[trackers]'`;
    see docs/trackers.md."""
    run_dir: str = MISSING
    """Where the resolved config, log, metrics and checkpoints go (`hydra.run.dir`)."""


def check_logger(cfg) -> None:
    check_choices(cfg)
    if LOGGER_SPECS[cfg.logger].modules():
        check_installed(cfg.logger)  # here, not in the workers: a missing package is one line, not a crash


def _leaves(cls: type = PtrunConfig, prefix: str = ""):
    """(dotted key, its group's class, field name) of every field of the schema that is not a group of fields."""
    for f in fields(cls):
        default = f.default_factory() if callable(f.default_factory) else None  # type: ignore[misc]
        if default is not None and hasattr(default, "__dataclass_fields__"):
            yield from _leaves(type(default), f"{prefix}{f.name}.")
        else:
            yield prefix + f.name, cls, f.name


def schema_keys(cls: type = PtrunConfig) -> list[str]:
    """Every dotted key of the schema, e.g. `train.epochs`."""
    return [key for key, _, _ in _leaves(cls)]


def free_form_keys(cls: type = PtrunConfig) -> list[str]:
    """The keys whose value is a mapping of the user's own entries (`auto.microbatch_table`): any key goes
    under them, where every other key must be the schema's."""
    return [key for key, group, name in _leaves(cls) if typing.get_origin(_hints(group)[name]) is dict]


_hints = functools.cache(typing.get_type_hints)
"""A group's type hints, read once (only `free_form_keys` needs them: `schema_keys` stays cheap at start-up)."""


def load_resolved(path: str | os.PathLike) -> PtrunConfig:
    """Load the resolved YAML written by the launcher, typed by the schema (workers call this)."""
    merged = OmegaConf.merge(OmegaConf.structured(PtrunConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)  # type: ignore[return-value]
