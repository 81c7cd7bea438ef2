"""The config: the schema Hydra composes over, each field's allowed values beside it, and the checks.

Hydra composes `configs/` (the groups) and `recipes/` (the presets) on top of the schema (`schema.py`), so
an unknown key or a value of the wrong type fails at composition. `validate` then runs each group's own
checks (in the group's module: `model.py`, `data.py`, `training.py`, `pipe.py`, `freezing.py`,
`launcher.py`), the rules between groups (`cross.py`), and, unless told not to (`ptrun plan` has no data at
hand), the pass over the files the run reads. Every failure is one ConfigError line naming the key and what
is allowed. Workers never compose: they load the resolved YAML the launcher wrote (`load_resolved`).
"""

from __future__ import annotations

from ptrun.config.adapter import ADAPTER_SPECS, AdapterConfig, check_adapter
from ptrun.config.cross import (
    check_compile,
    check_model_against_data,
    check_model_fits_recipe,
    check_paths,
    check_pipedream,
    check_text,
    timm_vit_problem,
)
from ptrun.config.data import (
    DATA_SOURCE_SPECS,
    DATA_SOURCES,
    GLUE_TASKS,
    PACKAGED_TEXT_SOURCES,
    SOURCE_IMAGES,
    TEXT_MAX_LENGTH,
    TEXT_SOURCES,
    DataConfig,
    DataSource,
    check_data,
)
from ptrun.config.freezing import (
    BATCH_POLICIES,
    CACHE_AUGMENT,
    CACHE_DTYPES,
    FREEZE_POLICIES,
    AutoConfig,
    CacheConfig,
    FreezeConfig,
    check_alpha,
    check_freezing,
    check_percentile,
    check_threshold,
    inside_epochs,
)
from ptrun.config.launcher import (
    BACKENDS,
    CPU_WORKERS,
    DeviceConfig,
    LauncherConfig,
    check_devices,
    check_launcher,
    check_machines,
    only_this_machine,
    parse_nnodes,
    split_endpoint,
    workers_per_node,
)
from ptrun.config.layout_rules import (
    check_concrete,
    check_layout,
    data_parallel_width,
    replica_batch,
    width_problem,
    world_problem,
)
from ptrun.config.model import ATTENTIONS, FAMILIES, TASKS, ModelConfig, check_model
from ptrun.config.paper import PaperConfig, check_paper
from ptrun.config.pipe import (
    PARTITIONS,
    SCHEDULE_SPECS,
    SCHEDULES,
    PipeConfig,
    Schedule,
    check_pipe,
    parse_recompute,
    schedule_problem,
)
from ptrun.config.rules import check_choices, choice, choices_of, either, one_of, parse_memory, require
from ptrun.config.schema import LOGGERS, PtrunConfig, check_logger, free_form_keys, load_resolved, schema_keys
from ptrun.config.training import (
    LR_SCHEDULE_SPECS,
    LR_SCHEDULES,
    OPTIMIZER_SPECS,
    OPTIMIZERS,
    PRECISION_SPECS,
    PRECISIONS,
    CheckpointConfig,
    OptimConfig,
    TrainConfig,
    check_training,
)
from ptrun.errors import ConfigError

GROUP_CHECKS = (
    check_freezing,
    check_logger,
    check_model,
    check_model_fits_recipe,
    check_adapter,
    check_data,
    check_training,
    check_pipe,
    check_launcher,
    check_paper,
)
"""Each group's own keys, in this order (the first broken rule is the one reported); and, right after the
model's, whether the recipe can train that model at all (`cross.py`): a model from the wrong family outweighs
the keys a recipe leaves to set (`data.path`)."""


CROSS_CHECKS = (check_pipedream, check_compile, check_layout, check_text)
"""The rules between groups, after every group passed its own."""


def validate_keys(cfg) -> None:
    """Every group's rules and the rules between groups, without the pass over the files the run reads
    (`check_paths`, `check_model_against_data`): what the start checks before it fetches a hub id, so that a
    typo is not refused only after a download."""
    for check in GROUP_CHECKS + CROSS_CHECKS:
        check(cfg)


def validate(cfg, paths: bool = True) -> None:
    """Every rule the type system cannot express; raises ConfigError. `paths=False` skips the files and
    directories the run would read (the model's own sizes are still checked against its config.json when
    that is there)."""
    for check in GROUP_CHECKS + CROSS_CHECKS:
        check(cfg)
    if paths:
        check_paths(cfg)
    check_model_against_data(cfg)


__all__ = [
    "ADAPTER_SPECS",
    "AdapterConfig",
    "check_adapter",
    "ATTENTIONS",
    "BACKENDS",
    "FAMILIES",
    "check_choices",
    "choice",
    "choices_of",
    "either",
    "one_of",
    "check_concrete",
    "check_layout",
    "data_parallel_width",
    "replica_batch",
    "width_problem",
    "world_problem",
    "BATCH_POLICIES",
    "CACHE_AUGMENT",
    "CACHE_DTYPES",
    "CPU_WORKERS",
    "DATA_SOURCE_SPECS",
    "DATA_SOURCES",
    "DataSource",
    "FREEZE_POLICIES",
    "GLUE_TASKS",
    "LOGGERS",
    "LR_SCHEDULE_SPECS",
    "LR_SCHEDULES",
    "OPTIMIZER_SPECS",
    "OPTIMIZERS",
    "PACKAGED_TEXT_SOURCES",
    "PARTITIONS",
    "PRECISION_SPECS",
    "PRECISIONS",
    "SCHEDULE_SPECS",
    "SCHEDULES",
    "Schedule",
    "SOURCE_IMAGES",
    "TASKS",
    "TEXT_MAX_LENGTH",
    "TEXT_SOURCES",
    "AutoConfig",
    "CacheConfig",
    "CheckpointConfig",
    "ConfigError",
    "DataConfig",
    "DeviceConfig",
    "FreezeConfig",
    "LauncherConfig",
    "ModelConfig",
    "OptimConfig",
    "PaperConfig",
    "PipeConfig",
    "PtrunConfig",
    "TrainConfig",
    "check_alpha",
    "check_machines",
    "check_percentile",
    "check_threshold",
    "inside_epochs",
    "check_model_against_data",
    "check_paths",
    "free_form_keys",
    "load_resolved",
    "only_this_machine",
    "parse_memory",
    "parse_nnodes",
    "parse_recompute",
    "require",
    "schedule_problem",
    "schema_keys",
    "split_endpoint",
    "timm_vit_problem",
    "validate",
    "validate_keys",
    "workers_per_node",
    "check_devices",
]
