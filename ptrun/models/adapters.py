"""LoRA adapters on the layered units, through peft (`adapter=lora`).

peft's `inject_adapter_in_model` wraps the chosen linear modules of the library model in place (each becomes a
`peft.tuners.lora.Linear` holding the original module as `base_layer` beside its `lora_A` / `lora_B`), once,
while the model's parameters are still on the meta device. The units hold the library's modules that contain
those linears (an attention, an MLP), never a linear itself, so each unit runs its adapters through the
library's own forward, the encoders' first-token tail included (the family's cross-attention forward reads
`self.query` & co., which are then the wrapped modules). Each wrapped linear adds its adapter's output in one
kernel (`ptrun.models.lora_linear`). The adapters' parameters are the units' like any other: a worker gives
storage and values only to its own stages' units, adapters included, and a unit's adapters are drawn from the
unit's own seed (peft's rule for `adapter.init`: A Kaiming-uniform or gaussian, B zero). DoRA's magnitudes,
which peft computes from the base weight as it wraps a module (here on the meta device), are computed again once
a unit holds its real values (`dora_magnitudes`).

The base weights never train (`LayeredModel.fixed`); the adapters and the task head (`HEAD_MODULES`, as
peft's sequence-classification task keeps its classifier trainable) do. So the units below the lowest adapter
that trains take no gradient, and freezing a unit whose adapters converged cuts the backward pass there.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ptrun.config.adapter import BLOCK_LINEARS, HEAD_MODULES, AdapterConfig, lora_alpha, wraps
from ptrun.config.adapter_layers import adapted_blocks, check_layers_range, peft_layers
from ptrun.errors import ConfigError

ADAPTER_NAME = "default"
"""peft's name for the one adapter (what `PeftModel.from_pretrained` loads by default)."""


def lora_config(adapter: AdapterConfig, family: str, targets: list[str], num_blocks: int):
    """peft's LoraConfig of `adapter` for the modules named `targets` (full names in the library model, in
    the blocks `adapter.layers` names: written as peft's `layers_to_transform` too, which peft does not apply
    to full names)."""
    from peft import LoraConfig  # inner import: optional library

    return LoraConfig(
        r=adapter.r,
        lora_alpha=lora_alpha(adapter),
        lora_dropout=adapter.dropout,
        target_modules=targets,
        layers_to_transform=peft_layers(adapter.layers, num_blocks),
        fan_in_fan_out=BLOCK_LINEARS[family].conv1d,
        use_rslora=adapter.rslora,
        use_dora=adapter.dora,
        init_lora_weights=adapter.init,
    )


def block_targets(layered, adapter: AdapterConfig) -> list[str]:
    """The full names of the modules in the blocks' units that `adapter.targets` names, in the blocks
    `adapter.layers` names; a ConfigError listing the blocks' linear modules where it names none."""
    family = layered.family
    if family not in BLOCK_LINEARS:
        raise ConfigError(
            f"adapter.name={adapter.name!r} is not allowed: peft cannot wrap a {family!r} model here; "
            f"LoRA wraps {', '.join(BLOCK_LINEARS)}"
        )
    check_layers_range(adapter.layers, layered.num_blocks)
    adapted = set(adapted_blocks(adapter.layers, layered.num_blocks))
    name_of = {id(m): n for n, m in layered.model.named_modules()}
    found, linears = [], []
    for u, unit in enumerate(layered.units[1:-1]):
        for module in unit.modules():
            name = name_of.get(id(module))
            if name is None or not _is_linear(module):
                continue
            linears.append(name)
            if wraps(adapter, name) and u // 2 in adapted:  # units 1 + 2b and 2 + 2b are block b's halves
                if any(child is module for child in unit.children()):
                    raise RuntimeError(f"{family}: unit holds {name} itself; an adapter needs its parent")
                found.append(name)
    if not found:
        raise ConfigError(
            f"adapter.targets={adapter.targets!r} is not allowed: it wraps no linear module of this {family} "
            f"model's blocks"
            + (f" once adapter.exclude={adapter.exclude!r} is left out" if adapter.exclude is not None else "")
            + f"; their names are {', '.join(linears[: len(BLOCK_LINEARS[family].block)])}, ..."
        )
    return sorted(found, key=list(name_of.values()).index)


def _is_linear(module: nn.Module) -> bool:
    """A linear module peft wraps: torch's Linear or transformers' Conv1D (GPT-2)."""
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def add_lora(layered, adapter: AdapterConfig) -> None:
    """Wrap `layered`'s block linears named by `adapter` in LoRA adapters, in place, while its parameters are
    on the meta device (`ptrun.models.lazy.parameters_on_meta` open); the units' parameter lists, the fixed
    base weights and the per-unit initialisation follow."""
    # inner import: optional library (peft, for LoRA runs)
    from peft import inject_adapter_in_model

    from ptrun.models.lora_linear import fuse_lora_linears

    config = lora_config(adapter, layered.family, block_targets(layered, adapter), layered.num_blocks)
    inject_adapter_in_model(config, layered.model, ADAPTER_NAME)
    fuse_lora_linears(layered.model)
    layered.repartition()
    layered.adapter_config = config
    layered.adapters = {n for n in layered.param_shapes if ".lora_" in n}
    head = layered.unit_param_names(len(layered.units) - 1)
    trains = layered.adapters | {n for n in head if set(HEAD_MODULES).intersection(n.split(".")[:-1])}
    layered.fixed = set(layered.param_shapes) - trains
    for name, p in layered.model.named_parameters():
        p.requires_grad_(name not in layered.fixed)
    library_init = layered._init

    def init(unit: nn.Module) -> None:
        library_init(unit)  # the library's rule also reaches the adapters' Linears: peft's own comes last
        for module in lora_layers(unit):
            module.reset_lora_parameters(ADAPTER_NAME, adapter.init)

    layered._init = init
    if adapter.dora:
        layered.after_values = lambda units: dora_magnitudes(layered, units)


def lora_layers(module: nn.Module):
    """The peft LoRA layers in `module` that hold ptrun's adapter."""
    return [m for m in module.modules() if hasattr(m, "reset_lora_parameters") and ADAPTER_NAME in m.lora_A]


def dora_magnitudes(layered, units) -> None:
    """DoRA's magnitude of each adapted linear in `units`, by peft's rule (the row norms of the base weight
    plus the adapter's product), computed once the units hold their real values: peft computes it when it
    wraps a module, and the model was then still on the meta device. Copied into the parameter the units
    already hold, so its name, storage and place in the optimizer stay."""
    from peft.tuners.lora.dora import DoraLinearLayer  # inner import: optional library

    for u in units:
        for module in lora_layers(layered.units[u]):
            magnitude = module.lora_magnitude_vector[ADAPTER_NAME]
            fresh = DoraLinearLayer(fan_in_fan_out=magnitude.fan_in_fan_out)
            with torch.no_grad():
                fresh.update_layer(
                    base_layer=module.get_base_layer(),
                    lora_A=module.lora_A[ADAPTER_NAME].weight,
                    lora_B=module.lora_B[ADAPTER_NAME].weight,
                    scaling=module.scaling[ADAPTER_NAME],
                )
                magnitude.weight.copy_(fresh.weight)


def library_name(name: str) -> str:
    """A parameter's name in the library model without its adapter: peft keeps a wrapped module's own weight as
    `base_layer.weight` (what a pretrained file names `weight`)."""
    return name.replace(".base_layer.", ".")


PEFT_PREFIX = "base_model.model."
"""What a PeftModel's state dict puts before the library model's names (the keys of peft's saved adapter)."""


def peft_key(name: str) -> str:
    """A trained parameter's key in peft's saved adapter (`peft_state_dict`'s, `get_peft_model_state_dict`'s
    naming): under `PEFT_PREFIX` and without the adapter's name."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER_NAME}.", ".")


def head_modules(layered) -> list[str]:
    """The task head's modules that train (`HEAD_MODULES`) by their names in the model: peft's
    `modules_to_save`, so that loading the adapter restores the head too."""
    trained = set(layered.param_shapes) - layered.fixed - layered.adapters
    return sorted({n.rsplit(".", 1)[0] for n in trained})


def save_adapter(layered, out: Path, base: str | None = None) -> None:
    """peft's files of the trained adapters and head in `out` (its host copy of them must be current):
    `PeftModel.from_pretrained(base_model, out)` loads them without ptrun. `base`: the base model's name or
    directory, recorded as peft's `base_model_name_or_path`."""
    config = copy.deepcopy(layered.adapter_config)
    config.modules_to_save = head_modules(layered) or None
    config.base_model_name_or_path = base
    config.save_pretrained(str(out))
    if layered.library_config:  # timm: how to build the base model, as the export of the whole model says it
        (out / "config.json").write_text(json.dumps(layered.library_config, indent=1) + "\n")
    save_file(peft_state_dict(layered), str(out / "adapter_model.safetensors"))


def peft_state_dict(layered) -> dict:
    """The trained tensors under the keys of peft's saved adapter: the adapters' as peft's public
    `get_peft_model_state_dict` names them (without the adapter's name; DoRA's magnitude as peft stores it),
    the task head's as a `modules_to_save` module's, all under `PEFT_PREFIX`."""
    from peft import get_peft_model_state_dict  # inner import: optional library

    params = {n: p.detach().cpu().contiguous() for n, p in layered.model.named_parameters() if n not in layered.fixed}
    adapters = {n: params[n] for n in layered.adapters}
    saved = get_peft_model_state_dict(
        layered.model, state_dict=adapters, adapter_name=ADAPTER_NAME, save_embedding_layers=False
    )
    head = {n: t for n, t in params.items() if n not in layered.adapters}
    assert len(saved) == len(adapters), "peft saved another set of adapter tensors than ptrun trains"
    return {PEFT_PREFIX + n: t for n, t in (saved | head).items()}


def merged(layered) -> nn.Module:
    """A copy of the library model with each adapter merged into its base weight (peft's `merge`) and the
    wrapped modules unwrapped, as peft's `merge_and_unload` leaves it: the library's own model again."""
    model = copy.deepcopy(layered.model)
    for name, module in list(model.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "merge"):
            module.merge()
            parent, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, leaf, module.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model
