"""`adapter.*`: fine-tuning through adapters (LoRA, by peft) instead of every weight.

Which modules an adapter wraps is a table per model family (`BLOCK_LINEARS`): the linear modules of a
transformer block, by their names in the library, and the subset `adapter.targets=auto` wraps (the attention
and MLP projections). The launcher checks `adapter.targets` against it from the model's family alone (a
config.json's `model_type`), so a name that wraps nothing is one line before any worker starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ptrun.config.adapter_layers import check_layers_form
from ptrun.config.model import is_hf_dir, model_family
from ptrun.config.rules import check_choices, choice, require
from ptrun.errors import ConfigError


@dataclass(frozen=True)
class AdapterKind:
    """What one `adapter.name` does to the model."""

    trains_base: bool
    """Whether the base model's weights train (no adapter), or stay fixed while the adapters and the task head
    train."""
    preload: tuple[str, ...] = ()
    """What the workers' server imports for it beside the model's library (importing peft takes seconds: 2 s
    more on 2 CPU cores than torch and transformers alone)."""


ADAPTER_SPECS: dict[str, AdapterKind] = {
    "none": AdapterKind(True),
    "lora": AdapterKind(False, preload=("ptrun.models.lora_linear",)),
}
"""Every `adapter.name`."""


@dataclass(frozen=True)
class Linears:
    """The linear modules of one family's transformer block, by their names in the library."""

    block: tuple[str, ...]
    """Every linear module of a block (what `adapter.targets` may name)."""
    auto: tuple[str, ...]
    """What `adapter.targets=auto` wraps: the attention and MLP projections; in every family, all of `block`,
    the attention's output projection included (what peft's `target_modules="all-linear"` picks within the
    blocks; peft's per-family defaults are the query and value projections only)."""
    conv1d: bool = False
    """Whether they are transformers' `Conv1D` (GPT-2: weights stored as (in, out), peft's `fan_in_fan_out`)."""


_BERT = ("query", "key", "value", "dense")
_LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK_LINEARS: dict[str, Linears] = {
    "vit": Linears(("qkv", "proj", "fc1", "fc2"), ("qkv", "proj", "fc1", "fc2")),
    "bert": Linears(_BERT, _BERT),
    "roberta": Linears(_BERT, _BERT),
    "xlm-roberta": Linears(_BERT, _BERT),
    "electra": Linears(_BERT, _BERT),
    "distilbert": Linears(*(("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),) * 2),
    "deberta-v2": Linears(*(("query_proj", "key_proj", "value_proj", "dense"),) * 2),
    "modernbert": Linears(("Wqkv", "Wo", "Wi"), ("Wqkv", "Wo", "Wi")),
    "gpt2": Linears(("c_attn", "c_proj", "c_fc"), ("c_attn", "c_proj", "c_fc"), conv1d=True),
    "llama": Linears(_LLAMA, _LLAMA),
    "qwen2": Linears(_LLAMA, _LLAMA),
    "qwen3": Linears(_LLAMA, _LLAMA),
    "mistral": Linears(_LLAMA, _LLAMA),
}
"""The families peft wraps, by ptrun's family name (`vit`) or a Hugging Face `model_type`."""

HEAD_MODULES = ("classifier", "score", "qa_outputs", "head")
"""The task heads' modules that train beside the adapters (in the head unit): the newly initialised layer of a
classification, regression or span head, by the library's name (timm's `head`, transformers' `classifier`,
`score`, `qa_outputs`). A language-model head (the tied or pretrained `lm_head`) stays fixed."""


@dataclass
class AdapterConfig:
    name: str = choice("none", tuple(ADAPTER_SPECS))
    """`none` (every weight trains) or `lora` (LoRA through peft: low-rank adapters beside the chosen linear
    modules of each block train with the task head, the base weights stay fixed; a unit whose adapters converge
    freezes, leaves the backward pass and joins the cached prefix as under full fine-tuning)."""
    r: int = 8
    """LoRA's rank (peft's `r`)."""
    alpha: float = 16.0
    """LoRA's scale numerator (peft's `lora_alpha`): the adapter's output is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input (peft's `lora_dropout`)."""
    targets: Any = "auto"
    """The linear modules of each block that get an adapter: `auto` (the family's attention and MLP
    projections, every linear module of a block, the attention's output projection included: BERT's query,
    key, value and dense; Llama's q/k/v/o/gate/up/down_proj; timm ViT's qkv, proj, fc1 and fc2) or a list of
    their names, e.g. `[query,value]` (peft's `target_modules`, matched within the blocks)."""
    layers: Any = None
    """Which blocks get adapters (peft's `layers_to_transform`): null (every block), a list of block indices
    counted from 0 at the bottom, e.g. `[4,5]`, or `top:N`, the N highest blocks, e.g. `top:3`. The blocks
    below the lowest adapted block are frozen from the first step (no backward pass; AutoCache serves their
    output from the first epoch it can), and the freeze policy counts the adapted blocks only."""
    pretrained: str | None = None
    """A peft LoRA adapter to continue training (peft's `PeftModel.from_pretrained(..., is_trainable=True)`):
    its directory (adapter_config.json + adapter_model.safetensors, such as a LoRA run's export) or a Hugging
    Face hub id. Its adapters and its trained task head (`modules_to_save`) are the run's starting values; its
    adapter_config.json must say what the run's `adapter.*` keys say (r, alpha, dropout, targets, layers)."""
    merge: bool = False
    """What the export writes to RUN_DIR/model/: the adapter in peft's own format (false: load it with
    `PeftModel.from_pretrained(base, dir)`) or the base model with the adapters merged into its weights (true:
    loadable by its library alone). Needs `train.export=true`."""


def check_adapter(cfg) -> None:
    a = cfg.adapter
    check_choices(a, "adapter")
    if ADAPTER_SPECS[a.name].trains_base:
        return
    require(isinstance(a.r, int) and a.r >= 1, "adapter.r", "an integer >= 1", a.r)
    require(a.alpha > 0, "adapter.alpha", "a number > 0", a.alpha)
    require(0.0 <= a.dropout < 1.0, "adapter.dropout", "0 <= p < 1", a.dropout)
    named = a.targets != "auto"
    require(
        not named
        or (isinstance(a.targets, (list, tuple)) and a.targets and all(isinstance(t, str) for t in a.targets)),
        "adapter.targets",
        "auto or a non-empty list of module names, e.g. [query,value]",
        a.targets,
    )
    require(not a.merge or cfg.train.export, "adapter.merge", "false unless train.export=true", a.merge)
    check_layers_form(a.layers)
    family = adapter_family(cfg.model)
    if family is None:
        return  # not known without reading the model (a weights file): the model builder checks the names
    if family not in BLOCK_LINEARS:
        raise ConfigError(
            f"adapter.name={a.name!r} is not allowed: peft cannot wrap a {family!r} model here; "
            f"LoRA wraps {', '.join(BLOCK_LINEARS)}"
        )
    if named:
        linears = BLOCK_LINEARS[family].block
        unknown = [t for t in a.targets if t not in linears]
        require(
            not unknown,
            "adapter.targets",
            f"names of a {family} block's linear modules: {', '.join(linears)} ({', '.join(unknown)} wraps nothing)",
            list(a.targets),
        )


def adapter_family(m) -> str | None:
    """The key of `BLOCK_LINEARS` the model of `m` (ModelConfig) has: `vit`, a Hugging Face directory's
    `model_type`, `bert` for ptrun's BERT presets; None where the directory's config.json cannot be read."""
    if is_hf_dir(m.pretrained):
        try:
            return json.loads((Path(m.pretrained).expanduser() / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            return None  # the model's own check names the unreadable file
    try:
        family = model_family(m)
    except ConfigError:
        return None  # the model group's check says what is wrong with it
    return family if family in BLOCK_LINEARS else "bert"  # transformers without a directory: a BERT preset


def target_names(adapter: AdapterConfig, family: str) -> tuple[str, ...]:
    """The block modules' names `adapter.targets` stands for in `family`."""
    return BLOCK_LINEARS[family].auto if adapter.targets == "auto" else tuple(adapter.targets)
