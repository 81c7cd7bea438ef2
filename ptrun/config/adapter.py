"""`adapter.*`: fine-tuning through adapters (LoRA, by peft) instead of every weight.

Which modules an adapter wraps is a table per model family (`BLOCK_LINEARS`): the linear modules of a
transformer block, by their names in the library, and the subset `adapter.targets=auto` wraps (the attention
and MLP projections). The launcher checks `adapter.targets` against it from the model's family alone (a
config.json's `model_type`), so a name that wraps nothing is one line before any worker starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields
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
    """Every linear module of a block, by its path within the block (`attention.self.query`), in the order the
    block runs them (the attention's, then the MLP's: the order of `ModelCosts.linears`). `adapter.targets`
    names them by a path's last part (`query`), or by any dotted end of it that tells apart modules sharing a
    last part (`attention.output.dense` beside `output.dense`)."""
    prefix: str
    """What the task model's module names start with before a block's index (`bert.encoder.layer`): a block
    linear's full name is `PREFIX.INDEX.PATH`, what a regex in `adapter.targets` is matched against."""
    conv1d: bool = False
    """Whether they are transformers' `Conv1D` (GPT-2: weights stored as (in, out), peft's `fan_in_fan_out`)."""

    @property
    def names(self) -> tuple[str, ...]:
        """The blocks' linear modules' last names, each once, in block order."""
        return tuple(dict.fromkeys(p.rsplit(".", 1)[-1] for p in self.block))


_BERT = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
_LLAMA = tuple(f"self_attn.{n}_proj" for n in "qkvo") + tuple(f"mlp.{n}_proj" for n in ("gate", "up", "down"))
BLOCK_LINEARS: dict[str, Linears] = {
    "vit": Linears(("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2"), "blocks"),
    "bert": Linears(_BERT, "bert.encoder.layer"),
    "roberta": Linears(_BERT, "roberta.encoder.layer"),
    "xlm-roberta": Linears(_BERT, "roberta.encoder.layer"),
    "electra": Linears(_BERT, "electra.encoder.layer"),
    "distilbert": Linears(
        ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "ffn.lin1", "ffn.lin2"),
        "distilbert.transformer.layer",
    ),
    "deberta-v2": Linears(
        tuple(re.sub(r"\.(query|key|value)$", r".\1_proj", p) for p in _BERT), "deberta.encoder.layer"
    ),
    "modernbert": Linears(("attn.Wqkv", "attn.Wo", "mlp.Wi", "mlp.Wo"), "model.layers"),
    "gpt2": Linears(("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"), "transformer.h", conv1d=True),
    "llama": Linears(_LLAMA, "model.layers"),
    "qwen2": Linears(_LLAMA, "model.layers"),
    "qwen3": Linears(_LLAMA, "model.layers"),
    "mistral": Linears(_LLAMA, "model.layers"),
}
"""The families peft wraps, by ptrun's family name (`vit`) or a Hugging Face `model_type`."""

HEAD_MODULES = ("classifier", "score", "qa_outputs", "head")
"""The task heads' modules that train beside the adapters (in the head unit): the newly initialised layer of a
classification, regression or span head, by the library's name (timm's `head`, transformers' `classifier`,
`score`, `qa_outputs`). A language-model head (the tied or pretrained `lm_head`) stays fixed."""


ALPHA_PER_RANK = 2.0
"""`adapter.alpha` when unset: this many times `adapter.r` (LlamaFactory's rule, alpha = 2r; peft's own
default is alpha = 8 whatever r is, and its examples tie alpha to r). With it the adapter's scale, alpha / r,
stays 2 as r changes, and r=8 keeps alpha 16 (what bbc_news_lora was measured with)."""
ALL_LINEAR = ("auto", "all-linear")
"""`adapter.targets` values that wrap every linear module of each block (peft's `target_modules="all-linear"`
within the blocks: never the task head, the pooler or an embedding's projection)."""
INITS = (True, "gaussian")
"""`adapter.init` values: peft's `init_lora_weights` that start the model as the base (B zero) from a random A."""
BASE_REWRITING_INITS = ("pissa", "olora", "loftq", "eva", "corda", "lora_ga", "mica")
"""peft inits (a prefix: `pissa_niter_4`) that move a part of each base weight into the adapter, so the model
trains on a rewritten base: refused, since a resume and the export would need that rewritten base."""
RESUME_FREE = ("merge",)
"""Adapter keys a resume may change: what the export writes, not what trains."""


@dataclass
class AdapterConfig:
    name: str = choice("none", tuple(ADAPTER_SPECS))
    """`none` (every weight trains) or `lora` (LoRA through peft: low-rank adapters beside the chosen linear
    modules of each block train with the task head, the base weights stay fixed; a unit whose adapters converge
    freezes, leaves the backward pass and joins the cached prefix as under full fine-tuning). Every other
    `adapter.*` key needs `adapter=lora`."""
    r: int = 8
    """LoRA's rank (peft's `r`)."""
    alpha: float | None = None
    """LoRA's scale numerator (peft's `lora_alpha`): the adapter's output is scaled by alpha / r (alpha /
    sqrt(r) with `rslora`). Unset (null): 2 x r, LlamaFactory's rule (`ALPHA_PER_RANK`), so the scale stays 2
    whatever the rank: r=8 gives alpha 16, r=64 alpha 128."""
    dropout: float = 0.0
    """Dropout on the adapter's input (peft's `lora_dropout`)."""
    targets: Any = "auto"
    """The linear modules of each block that get an adapter (peft's `target_modules`, within the blocks only:
    never the task head or the pooler). `auto` or `all-linear`: every linear module of a block (BERT's query,
    key, value and its three dense; Llama's q/k/v/o/gate/up/down_proj; timm ViT's qkv, proj, fc1 and fc2). A
    list of names, e.g. `[query,value]`, or of dotted ends of the modules' paths that tell apart modules sharing
    a name, e.g. `[attention.output.dense]` (BERT's attention output, not the MLP's `output.dense`) or
    `[attn.c_proj]` (GPT-2's attention projection, not `mlp.c_proj`): a module matches when its full name is
    the entry or ends with `.` and the entry, as in peft. A string other than `auto` / `all-linear` is a
    regular expression the module's full name must match whole, as peft's (`'.*\\.(query|value)'`)."""
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
    exclude: Any = None
    """Modules of the blocks `targets` would pick that get no adapter (peft's `exclude_modules`): a list of
    names or dotted ends as in `targets`, or a regular expression matched against the full name; null: none."""
    rslora: bool = False
    """Rank-stabilised LoRA (peft's `use_rslora`): the scale is alpha / sqrt(r) instead of alpha / r."""
    dora: bool = False
    """DoRA (peft's `use_dora`): each adapted weight is split into a magnitude (a trained vector, one entry per
    output, computed from the loaded base weights) and a direction the adapter updates. Each step recomputes
    the adapted weight's norm, and the wrapped linears run peft's own forward."""
    init: Any = choice(True, INITS, check=False)
    """How the adapters start (peft's `init_lora_weights`): `true` (A Kaiming-uniform, B zero) or `gaussian` (A
    normal with std 1/r, B zero); either way the model starts as the base. peft's SVD-based inits (pissa,
    olora, loftq, eva, corda) are refused: they rewrite the base weights, which a resume and the export would
    then need."""
    modules_to_save: Any = None
    """peft's extra fully trained modules: only null. The task head's new layer already trains and is saved as
    peft's `modules_to_save`; any other module training whole would hold the base weights it replaces in the
    adapter's checkpoint and export, which ptrun's checkpoints and freezing do not do."""


def lora_alpha(a: AdapterConfig) -> float:
    """`adapter.alpha`, or `ALPHA_PER_RANK` x r when unset."""
    return float(a.alpha) if a.alpha is not None else ALPHA_PER_RANK * a.r


def adapter_settings(a: AdapterConfig) -> dict[str, Any]:
    """Every adapter key as the run uses it (alpha filled), as JSON values: what a checkpoint records and a
    resume compares."""
    values = {f.name: getattr(a, f.name) for f in fields(a)}
    values["alpha"] = lora_alpha(a) if a.name != "none" else a.alpha
    return json.loads(json.dumps(values, default=list))


def check_adapter(cfg) -> None:
    a = cfg.adapter
    check_choices(a, "adapter")
    if ADAPTER_SPECS[a.name].trains_base:
        check_unused_keys(a)
        return
    require(isinstance(a.r, int) and a.r >= 1, "adapter.r", "an integer >= 1", a.r)
    require(a.alpha is None or a.alpha > 0, "adapter.alpha", "a number > 0, or null for 2 x adapter.r", a.alpha)
    require(0.0 <= a.dropout < 1.0, "adapter.dropout", "0 <= p < 1", a.dropout)
    check_target_forms(a)
    check_lora_options(a)
    require(not a.merge or cfg.train.export, "adapter.merge", "false unless train.export=true", a.merge)
    check_layers_form(a.layers)
    require(
        not (a.dora and a.pretrained is not None),
        "adapter.dora",
        "false with adapter.pretrained (DoRA's magnitudes start from the base weights: no DoRA adapter continues)",
        a.dora,
    )
    family = adapter_family(cfg.model)
    if family is None:
        return  # not known before its config.json is read (a hub id yet to resolve): checked once it is
    if family not in BLOCK_LINEARS:
        raise ConfigError(
            f"adapter.name={a.name!r} is not allowed: peft cannot wrap a {family!r} model here; "
            f"LoRA wraps {', '.join(BLOCK_LINEARS)}"
        )
    check_targets_of(a, family)


def check_unused_keys(a: AdapterConfig) -> None:
    """`adapter=none` reads no other adapter key: one set away from its default would be ignored without a
    word (a full fine-tuning where LoRA was meant)."""
    default = AdapterConfig()
    for f in fields(a):
        value = getattr(a, f.name)
        if f.name != "name" and value != getattr(default, f.name):
            raise ConfigError(unused_key_message(f.name, value))


def unused_key_message(key: str, value: Any) -> str:
    return (
        f"adapter.{key}={value!r} is not allowed: adapter.* keys are read only with adapter=lora "
        f"(without it every weight trains); add adapter=lora, or leave adapter.{key} out"
    )


def check_adapter_overrides(cfg, overrides: list[str]) -> None:
    """An `adapter.KEY=...` given on the command line while `adapter=none`: refused even where it equals the
    default (`adapter.r=8`), which `check_unused_keys` cannot tell from an unset key."""
    if not ADAPTER_SPECS[cfg.adapter.name].trains_base:
        return
    known = {f.name for f in fields(AdapterConfig)} - {"name"}
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~").strip()
        if key.startswith("adapter.") and key[len("adapter.") :] in known:
            field_name = key[len("adapter.") :]
            raise ConfigError(unused_key_message(field_name, getattr(cfg.adapter, field_name)))


def _module_list(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(t, str) and t for t in value)


def _regex(value: Any) -> bool:
    """A string peft would read as a regular expression (and that compiles)."""
    if not isinstance(value, str) or value in ALL_LINEAR:
        return False
    try:
        re.compile(value)
    except re.error:
        return False
    return True


def check_target_forms(a: AdapterConfig) -> None:
    """`adapter.targets` and `adapter.exclude` in one of peft's forms."""
    require(
        a.targets in ALL_LINEAR or _module_list(a.targets) or _regex(a.targets),
        "adapter.targets",
        "auto, all-linear, a non-empty list of module names or dotted ends, e.g. [query,value] or "
        "[attention.output.dense], or a regular expression the full name matches, e.g. '.*\\.(query|value)'",
        a.targets,
    )
    require(
        a.exclude is None or _module_list(a.exclude) or _regex(a.exclude),
        "adapter.exclude",
        "null, a non-empty list of module names or dotted ends, e.g. [output.dense], or a regular expression "
        "the full name matches",
        a.exclude,
    )


def check_lora_options(a: AdapterConfig) -> None:
    """`adapter.init` among peft's inits that keep the base weights, and no extra trained modules."""
    if a.init not in INITS:
        rewrites = isinstance(a.init, str) and a.init.lower().startswith(BASE_REWRITING_INITS)
        why = (
            " (it rewrites the base weights, moving their principal part into the adapter: a resume and the "
            "export would need that rewritten base, which ptrun never saves)"
            if rewrites
            else ""
        )
        raise ConfigError(
            f"adapter.init={a.init!r} is not allowed: true (Kaiming-uniform A) or gaussian, which start the "
            f"model as the base{why}"
        )
    require(
        a.modules_to_save is None,
        "adapter.modules_to_save",
        "null (the task head's new layer trains and is saved already; another module trained whole would "
        "need its base weights in the checkpoints and the export, and its freezing, which ptrun does not do)",
        a.modules_to_save,
    )


def wraps(a: AdapterConfig, name: str) -> bool:
    """Whether the block linear module of full name `name` gets an adapter: peft's matching of
    `target_modules` and `exclude_modules` (a list: the name or a dotted end of it; a string: a regular
    expression matching the whole name), `auto` / `all-linear` for every one."""
    return (a.targets in ALL_LINEAR or _matches(a.targets, name)) and not (
        a.exclude is not None and _matches(a.exclude, name)
    )


def _matches(spec: Any, name: str) -> bool:
    if isinstance(spec, str):
        return re.fullmatch(spec, name) is not None
    return any(name == t or name.endswith("." + t) for t in spec)


BLOCKS_CHECKED = 1000
"""How many blocks a regex in `adapter.targets` is tried on before the model is built (its full names are
`PREFIX.INDEX.PATH`): a regex that picks only the later blocks still finds its modules."""


def check_targets_of(a: AdapterConfig, family: str) -> None:
    """`adapter.targets` and `adapter.exclude` against `family`'s block linears: every listed entry names one,
    and together they leave at least one."""
    linears = BLOCK_LINEARS[family]
    for key, spec in (("targets", a.targets), ("exclude", a.exclude)):
        if not _module_list(spec):
            continue
        unknown = [t for t in spec if not any(p == t or p.endswith("." + t) for p in linears.block)]
        require(
            not unknown,
            f"adapter.{key}",
            f"names or dotted ends of a {family} block's linear modules: {', '.join(linears.block)} "
            f"({', '.join(unknown)} names none)",
            list(spec),
        )
    names = (f"{linears.prefix}.{b}.{p}" for b in range(BLOCKS_CHECKED) for p in linears.block)
    if not any(wraps(a, n) for n in names):
        raise ConfigError(
            f"adapter.targets={a.targets!r} is not allowed: it wraps no linear module of a {family} model's blocks"
            + (f" once adapter.exclude={a.exclude!r} is left out" if a.exclude is not None else "")
            + f" (their full names: {linears.prefix}.0.{linears.block[0]}, ...)"
        )


def adapter_family(m) -> str | None:
    """The key of `BLOCK_LINEARS` the model of `m` (ModelConfig) has: `vit`, a Hugging Face directory's
    `model_type`, `bert` for ptrun's BERT presets; None where that is not known without reading a config.json
    not there yet (a hub id not resolved, or an unreadable directory), never a guess."""
    if is_hf_dir(m.pretrained):
        try:
            return json.loads((Path(m.pretrained).expanduser() / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            return None  # the model's own check names the unreadable file
    try:
        family = model_family(m)
    except ConfigError:
        return None  # the model group's check says what is wrong with it
    if family in BLOCK_LINEARS:
        return family
    if m.pretrained is not None:
        return None  # a hub id, checked once it resolves to its directory; or a path the model's check names
    return "bert"  # transformers without a directory: a BERT preset


def selected_paths(a: AdapterConfig, family: str, block: int = 0) -> tuple[str, ...]:
    """The paths within block `block` of `family` (`Linears.block`) that get an adapter."""
    linears = BLOCK_LINEARS[family]
    return tuple(p for p in linears.block if wraps(a, f"{linears.prefix}.{block}.{p}"))
