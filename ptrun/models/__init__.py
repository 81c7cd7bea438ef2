"""Models as layered units: `build_model(cfg.model, ...)` -> LayeredModel.

timm and transformers are imported only when a model of their family is built (each costs seconds).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from ptrun.config import ADAPTER_SPECS, ConfigError, ModelConfig
from ptrun.config.model import FAMILY_SPECS, is_hf_dir, model_family
from ptrun.models.adapters import add_lora
from ptrun.models.bert import build_bert
from ptrun.models.hf import build_transformers, from_directory
from ptrun.models.layered import LayeredModel, run_units
from ptrun.models.lazy import empty_meta_parameters, init_units, parameters_on_meta
from ptrun.models.weights import open_adapter, open_pretrained

__all__ = ["LayeredModel", "build_model", "model_family", "run_units"]


def build_model(
    cfg: ModelConfig,
    *,
    num_classes: int,
    img_size: int | None = None,
    in_chans: int | None = None,
    vocab_size: int | None = None,
    units: Iterable[int] | None = None,
    library_config=None,
    adapter=None,
) -> LayeredModel:
    """Build the model `cfg` names, sized by cfg where set and by the data's facts otherwise.

    Its parameters are created without storage (`ptrun.models.lazy`); `units` are then given their initial
    values: all units if None, none for `()` (a worker fills its own stages' units once it knows its
    layout, with `init_units`). The per-unit seeds are drawn from the global generator, so the same seed
    before this call gives the same model. `cfg.pretrained` (a weights file, or a Hugging Face directory of a
    supported family, `ptrun.models.hf`) is checked now, from its index, and read per unit as units are
    filled (`ptrun.models.weights`). `library_config` (a transformers config of a supported `model_type`)
    builds that model with random weights instead (tests and benchmarks). `adapter` (an AdapterConfig) wraps
    the blocks' linears in adapters, whose base weights then stay fixed (`ptrun.models.adapters`); with its
    `pretrained` (a peft adapter) the adapters and the task head start from that adapter's values.
    """
    with parameters_on_meta():
        if library_config is None and FAMILY_SPECS[model_family(cfg)].reads_images:
            from ptrun.models.vit import build_vit  # inner import: optional library (timm)

            if cfg.pretrained is not None and Path(cfg.pretrained).expanduser().is_dir():
                raise ConfigError(
                    f"model.pretrained={cfg.pretrained!r} is not allowed: ViT takes a weights file, not a directory"
                )
            layered = build_vit(cfg, num_classes=num_classes, img_size=img_size, in_chans=in_chans)
        elif library_config is not None:
            layered = build_transformers(cfg, library_config, library_config.model_type)
        elif is_hf_dir(cfg.pretrained):
            layered = from_directory(cfg, num_labels=2 if cfg.task == "qa" else (cfg.num_classes or num_classes))
        else:
            layered = build_bert(cfg, num_classes=num_classes, vocab_size=vocab_size)
        if adapter is not None and not ADAPTER_SPECS[adapter.name].trains_base:
            add_lora(layered, adapter)
    empty_meta_parameters(layered.model)
    layered.init_seed = int(torch.randint(2**40, ()).item())
    if cfg.pretrained is not None:
        layered.weights = open_pretrained(layered, cfg.pretrained)
    if adapter is not None and adapter.pretrained is not None and layered.adapters:
        layered.weights = open_adapter(layered, adapter.pretrained, layered.weights)  # its values start the run
    init_units(layered, range(len(layered.units)) if units is None else units)
    return layered
