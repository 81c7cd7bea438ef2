"""Dataset sources: `build_datasets` turns a `DataConfig` into train/eval `datasets.Dataset`s that yield torch
tensors, held in memory when small (`memory.in_memory`).

Everything loads from local files (no downloads). The image sources are `digits` and `imagefolder`
(images.py) and `cifar10` / `cifar100` (cifar.py); the text sources `glue` (glue.py) and `squad` (squad.py) and the
packaged offline corpora (packaged_text.py) produce `input_ids`, `attention_mask`, `token_type_ids` plus
`labels` (GLUE) or `start_positions` / `end_positions` (SQuAD); `hf` (hf_source.py) reads the user's own
data through the `datasets` library, for text or image classification or a causal LM. Each returns a
`DataSplits` (splits.py).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module

from ptrun.config import DATA_SOURCE_SPECS, DataConfig
from ptrun.config.data import data_defaults
from ptrun.data import hf_source, packaged_text
from ptrun.data.memory import in_memory
from ptrun.data.splits import DataSplits, stratified_split


def build_datasets(cfg: DataConfig, task: str | None = None) -> DataSplits:
    """Build the splits of `cfg.name` for the model's `task` (`model.task`; only `hf` reads it, and infers it
    from its columns when None; `cfg.name` is one the config's validation accepted, `DATA_SOURCE_SPECS`);
    raises ConfigError for a bad `cfg.path`. The builder's module is imported here, when its source is built:
    a text run's workers do not import torchvision."""
    cfg = data_defaults(cfg)  # as resolution filled them (a config made without it)
    module, function = DATA_SOURCE_SPECS[cfg.name].builder.split(".")
    build = getattr(import_module(f"ptrun.data.{module}"), function)
    splits = build(cfg, task=task) if cfg.name == "hf" else build(cfg)
    return replace(splits, train=in_memory(splits.train), eval=in_memory(splits.eval))


def train_samples(cfg: DataConfig, task: str | None = None) -> int | None:
    """The training split's sample count, found without tokenizing, for the sources whose size follows from
    the user's files: the packaged text corpora (their stratified split) and `hf` rows (classification or
    regression, or a causal LM one document a row). None where it is not known that way (a packed causal LM's
    block count follows from its tokens; the fixed corpora's sizes are `ptrun.sim.planning`'s table)."""
    if cfg.name in packaged_text.PACKAGED_TEXT:
        _, labels = packaged_text.read_packaged_text(cfg.name, cfg.path)
        return len(stratified_split(labels, cfg, f"data.name={cfg.name}")[0])
    if cfg.name == "hf":
        task = hf_source.checked_task(cfg, task)  # the same one-line refusals as `ptrun train`
        if task == hf_source.CAUSAL_LM and cfg.pack:
            return None
        return len(hf_source.read_raw(cfg, task).train)
    return None
