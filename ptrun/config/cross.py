"""Rules between groups (the layout's, against the world size and the batch, are in `layout.py`): PipeDream's
constraints on the other keys, the text sources' model and task, the model against its pretrained files and
the data it reads; and the pass over files and directories, which `ptrun plan` (no data at hand) skips."""

from __future__ import annotations

import importlib.util
import json
import re
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from ptrun.config.data import SOURCE_IMAGES, TEXT_MAX_LENGTH, TEXT_SOURCES, check_hf_path, data_defaults
from ptrun.config.freezing import cache_dtype, inside_epochs
from ptrun.config.model import (
    DECODER_TASKS,
    DECODER_TYPES,
    ENCODER_TASKS,
    ENCODER_TYPES,
    HF_MODEL_TYPES,
    family_spec,
)
from ptrun.config.pipe import SCHEDULE_SPECS, recomputes
from ptrun.config.recipe_catalogue import Recipe, recipe_named, use_recipe
from ptrun.config.rules import require
from ptrun.config.training import PRECISION_SPECS
from ptrun.errors import ConfigError

BERT_MAX_POSITIONS = 512
"""The position table of ptrun's BERT presets when `model.max_position_embeddings` is unset (models/bert.py)."""
TIMM_VIT_MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit")
"""timm modules whose registered models build a plain `VisionTransformer`, the class ptrun splits into units."""


def check_pipedream(cfg) -> None:
    """What PipeDream's asynchronous schedule and its stage replication rule out elsewhere."""
    p, t, au = cfg.pipe, cfg.train, cfg.auto
    if not SCHEDULE_SPECS[p.schedule].flushing:
        require(
            not recomputes(p.recompute),
            "pipe.recompute",
            "none with pipe.schedule=pipedream (a stashed weight version is used once per pass)",
            p.recompute,
        )
        require(
            not PRECISION_SPECS[t.precision].loss_scale,
            "train.precision",
            "fp32 or bf16 with "
            "pipe.schedule=pipedream (fp16's loss scale needs every stage to step or skip together; pipedream "
            "stages step apart)",
            t.precision,
        )
        require(
            not inside_epochs(cfg.freeze),
            "freeze.every",
            "whole epochs with pipe.schedule=pipedream (its "
            "stages step apart, so a layout changes only where the pipeline drains: an epoch's end)",
            cfg.freeze.every_steps or cfg.freeze.every,
        )
    if p.first_stage_replicas > 1:
        require(
            not SCHEDULE_SPECS[p.schedule].flushing,
            "pipe.first_stage_replicas",
            "1 unless pipe.schedule=pipedream (stage replication is PipeDream's)",
            p.first_stage_replicas,
        )
        for key, on in (("auto.pipe", au.pipe), ("auto.dp", au.dp)):
            require(
                not on,
                key,
                "false with pipe.first_stage_replicas > 1 (a replicated layout stays as "
                "placed; freezing and AutoCache still apply)",
                on,
            )
        require(
            p.microbatches in (1, None), "pipe.microbatches", "1 with pipe.first_stage_replicas > 1", p.microbatches
        )
        require(
            p.length != "auto",
            "pipe.length",
            "an integer with pipe.first_stage_replicas > 1 (a replicated placement is fixed)",
            p.length,
        )


def check_compile(cfg) -> None:
    """Compiled units under a schedule that splits each stage's backward pass (the zero-bubble ones: the
    inputs' gradients first, the weights' later from hooks on the graph) got a weight's gradient wrong in a
    test: refused when asked for, and `auto` runs such a schedule eager (`ptrun.compiling.compiler`)."""
    if cfg.train.compile is True:
        require(
            not SCHEDULE_SPECS[cfg.pipe.schedule].split_backward,
            "train.compile",
            "true only with a schedule "
            f"whose stages run their backward pass whole, not with pipe.schedule={cfg.pipe.schedule} (it splits "
            "it); leave it auto (eager there) or choose 1F1B, GPipe, Interleaved1F1B, LoopedBFS or pipedream",
            "true",
        )


def check_text(cfg) -> None:
    """A text source needs a transformers model, the source's task and sensible lengths (its tokenizer:
    `check_paths`)."""
    m, d = cfg.model, cfg.data
    if d.name in TEXT_SOURCES:
        require(
            (spec := family_spec(m)) is not None and not spec.reads_images or m.pretrained is not None,
            "model.name",
            f"a transformers model (a BERT preset, or a Hugging Face "
            f"model as model.pretrained) for the text source data.name={d.name}",
            m.name,
        )
        want_task = "qa" if d.name == "squad" else "regression" if d.task == "stsb" else "classification"
        require(m.task == want_task, "model.task", f"{want_task} for data.name={d.name}", m.task)
        require(d.max_length is None or d.max_length >= 8, "data.max_length", "an integer >= 8 or null", d.max_length)
        if d.name == "squad":
            require(
                1 <= d.doc_stride < (d.max_length or 384),
                "data.doc_stride",
                "an integer >= 1 and below data.max_length",
                d.doc_stride,
            )


def check_paths(cfg) -> None:
    """The files and directories the run reads: given where a source needs them, and there."""
    m, d, ca = cfg.model, cfg.data, cfg.cache
    require(
        ca.dir is None or not Path(ca.dir).expanduser().exists() or Path(ca.dir).expanduser().is_dir(),
        "cache.dir",
        "a directory (created when missing)",
        ca.dir,
    )
    if d.name in ("cifar10", "cifar100", "glue", "squad"):
        require(d.path is not None, "data.path", f"the local dataset directory for data.name={d.name}", d.path)
    if d.name in TEXT_SOURCES:
        require(
            d.tokenizer is not None or m.pretrained is not None,
            "data.tokenizer",
            "a local tokenizer directory (or model.pretrained, a Hugging Face model directory)",
            d.tokenizer,
        )
    if d.tokenizer is not None and not Path(d.tokenizer).expanduser().is_dir():
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: no such directory")
    if d.name == "imagefolder":
        require(d.path is not None, "data.path", "a directory of class folders for data.name=imagefolder", d.path)
    check_hf_path(cfg)  # a file, a folder or a hub dataset id
    if d.path is not None and d.name != "hf" and not Path(d.path).expanduser().is_dir():
        raise ConfigError(f"data.path={d.path!r}: no such directory")
    if m.pretrained is not None and not Path(m.pretrained).expanduser().exists():
        raise ConfigError(f"model.pretrained={m.pretrained!r}: no such file or directory")
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if _hf_config(m.pretrained) is not None and not any(
        (Path(m.pretrained).expanduser() / w).is_file() for w in weights
    ):
        raise ConfigError(f"model.pretrained={m.pretrained!r}: no weights in the directory ({', '.join(weights)})")


def _hf_config(pretrained: str | None) -> dict | None:
    """The config.json of a Hugging Face model directory `pretrained`, or None when it is not one."""
    path = Path(pretrained).expanduser() / "config.json" if pretrained is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the model builder reports an unreadable config.json with its own words


def _timm_models_dir() -> Path | None:
    """timm's installed `timm/models/` source folder, found without importing timm; None without timm."""
    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"


@lru_cache(maxsize=1)
def timm_model_names() -> frozenset[str]:
    """Every model name timm registers (`@register_model def NAME(`), read from its source as
    `timm_vit_problem` reads it (about 4 MB of text, some 20 ms; importing timm takes seconds); empty without
    timm."""
    models = _timm_models_dir()
    if models is None or not models.is_dir():
        return frozenset()
    pattern = re.compile(r"@register_model\s*\ndef (\w+)\(")
    return frozenset(
        name for source in models.glob("*.py") for name in pattern.findall(source.read_text(errors="replace"))
    )


def is_timm_image_name(name: str) -> bool:
    """`name` (an optional `.tag` aside) names a timm image model: a ViT by its prefix (ptrun's own kind,
    known or not), or any model timm registers (resnet50, convnext_tiny ...). No text model is among them, so
    such a name cannot be a label of a Hugging Face text model."""
    base = name.split(".", 1)[0]
    return base.startswith(("vit_", "deit")) or base in timm_model_names()


def timm_vit_problem(name: str) -> str | None:
    """What keeps timm model `name` (an optional `.tag` aside) from being a ViT ptrun can split, read from
    timm's installed source without importing timm (that takes seconds, at every start): None when it is
    registered in one of TIMM_VIT_MODULES with timm's pre-norm Block (no `block_fn`) and no distillation
    token, or when timm's source cannot be read (the model builder checks again in the workers)."""
    models = _timm_models_dir()
    if models is None:
        return None
    base = name.split(".", 1)[0]
    pattern = re.compile(rf"@register_model\s*\ndef {re.escape(base)}\(")
    # ptrun's own modules first: a supported name is found after reading three files
    for source in sorted(models.glob("*.py"), key=lambda f: (f.stem not in TIMM_VIT_MODULES, f.name)):
        text = source.read_text(errors="replace")
        found = pattern.search(text)
        if not found:
            continue
        body = text[found.end() :].split("@register_model", 1)[0]
        if source.stem not in TIMM_VIT_MODULES:
            return f"timm builds it in timm.models.{source.stem}, not as a VisionTransformer"
        if "block_fn=" in body:
            return "its blocks are not timm's pre-norm Block"
        if "distilled=True" in body:
            return "a distilled DeiT (two heads)"
        return None
    return "timm has no such model" if models.is_dir() else None


def check_model_type(m, hf: dict, recipe: str | None = None) -> None:
    """A Hugging Face directory's `model_type` must be a family ptrun splits, able to do `model.task`; the
    refusal of a task names the recipes (other than `recipe`) whose task the family does."""
    kind = hf.get("model_type")
    require(
        kind in HF_MODEL_TYPES,
        "model.pretrained",
        f"a Hugging Face model of a supported model_type ({', '.join(HF_MODEL_TYPES)}); this one is a {kind!r} model",
        m.pretrained,
    )
    decoder = kind in DECODER_TYPES
    tasks = DECODER_TASKS if decoder else ENCODER_TASKS
    if m.task not in tasks:
        # the task usually comes with the recipe, so what to change is the recipe (or the model)
        other, others = ("a decoder", "an encoder") if decoder else ("an encoder", "a decoder")
        takes = ", ".join(ENCODER_TYPES if decoder else DECODER_TYPES)
        require(
            False,
            "model.task",
            f"one of {', '.join(tasks)} for a {kind} model (model.pretrained="
            f"{m.pretrained!r}, {other}; {m.task} takes {others}: {takes}); for this model "
            + use_recipe(lambda r: r.takes_text_model(kind), recipe),
            m.task,
        )


def _beside_weights(pretrained: str | None) -> dict | None:
    """The config.json of `pretrained`'s directory, or of the directory of `pretrained`, a weights file (a
    hub snapshot's model.safetensors, as a ViT is handed it): None when there is none."""
    if pretrained is None:
        return None
    path = Path(pretrained).expanduser()
    return _hf_config(str(path.parent)) if path.is_file() else _hf_config(pretrained)


def text_model_type(pretrained: str | None) -> str | None:
    """The `model_type` of the Hugging Face text model `pretrained` names (a directory, or a weights file
    beside its config.json), else None: timm's own config.json names an `architecture`, no `model_type`."""
    hf = _beside_weights(pretrained)
    kind = hf.get("model_type") if hf is not None else None
    return kind if kind in HF_MODEL_TYPES else None


def run_inputs(cfg) -> str | None:
    """`images` or `text`: what the data source gives the model; None for `data.name=hf` with neither
    column set (its own check says which to set)."""
    d = cfg.data
    if d.name in SOURCE_IMAGES or (d.name == "hf" and d.image_column is not None):
        return "images"
    if d.name in TEXT_SOURCES or (d.name == "hf" and d.text_column is not None):
        return "text"
    return None


def _trains(cfg, inputs: str) -> str:
    """`recipe NAME trains INPUTS (data.name=SOURCE)`, or the data source alone outside a known recipe."""
    where = f"data.name={cfg.data.name}"
    return f"recipe {cfg.recipe} trains {inputs} ({where})" if recipe_named(cfg.recipe) else f"{where} gives {inputs}"


def _timm_name_on_text(cfg, inputs: str | None, kind: str | None) -> str:
    """The refusal of timm image model `model.name` where the run trains text (`inputs`) or beside a text
    model of `kind` as model.pretrained; it names the image recipes, and why the name itself would not do
    there when ptrun cannot split it."""
    name = cfg.model.name
    why = [_trains(cfg, "text")] if inputs == "text" else []
    if kind is not None:
        why.append(f"model.pretrained is a {kind} text model, which model.name only labels")
    problem = timm_vit_problem(name)
    split = f", with a timm ViT ptrun splits (not {name}: {problem})" if problem else ""
    return (
        f"model.name={name!r} is a timm image model; {' and '.join(why)}: "
        f"{use_recipe(Recipe.takes_timm, cfg.recipe)}{split}"
    )


def check_model_fits_recipe(cfg, shown: str | None = None) -> None:
    """`model.pretrained` and `model.name` name a model the data (the recipe) can train: a text model is
    refused on images, a timm image model's name on text or beside a text model as model.pretrained (there
    the name would only label it: the run would train the text model under the image model's name), a
    family on a task it does not do; each naming the recipes that fit. Reads config.json files and timm's
    source, nothing heavier. `shown`: how to name `model.pretrained` (the hub id typed, not its snapshot)."""
    m = cfg.model
    inputs, kind = run_inputs(cfg), text_model_type(m.pretrained)
    if kind is not None and inputs == "images":
        raise ConfigError(
            f"model.pretrained={shown or m.pretrained!r} is a {kind} text model; "
            f"{_trains(cfg, 'images')}: " + use_recipe(lambda r: r.takes_text_model(kind), cfg.recipe)
        )
    if is_timm_image_name(m.name) and (kind is not None or inputs == "text"):
        raise ConfigError(_timm_name_on_text(cfg, inputs, kind))
    hf = _hf_config(m.pretrained)
    if hf is not None:
        check_model_type(
            replace(m, pretrained=shown or m.pretrained), hf, cfg.recipe
        )  # before the files pass: a wrong family outweighs a missing file


def check_model_against_data(cfg) -> None:
    """Cross-key checks between the model, its own config file and the data source: what the workers would
    otherwise find out only after they started (a crash in the model's forward, restarted max_restarts times).
    Reads the pretrained directory's config.json and timm's source files, nothing heavier."""
    m, d = cfg.model, cfg.data
    hf = _hf_config(m.pretrained)
    # a Hugging Face directory names its architecture itself, whatever the model group's family says
    family = family_spec(m)
    require(
        m.task != "causal_lm" or hf is not None,
        "model.task",
        "causal_lm only for a decoder given as "
        f"model.pretrained (a Hugging Face model of model_type {', '.join(DECODER_TYPES)})",
        m.task,
    )
    if m.embed_dim is not None and m.num_heads is not None:
        require(
            m.embed_dim % m.num_heads == 0,
            "model.num_heads",
            f"a divisor of model.embed_dim={m.embed_dim} (each head gets embed_dim / num_heads channels)",
            m.num_heads,
        )
    if family is not None and family.reads_images:
        require(
            m.name.startswith(("vit_", "deit")),
            "model.name",
            "a timm ViT name (vit_* or deit_*, e.g. vit_tiny_patch16_224) with model.family=vit",
            m.name,
        )
        problem = timm_vit_problem(m.name)
        require(
            problem is None,
            "model.name",
            f"a timm VisionTransformer with pre-norm Blocks, e.g. "
            f"vit_tiny_patch16_224 or vit_base_patch16_224 ({problem})",
            m.name,
        )
        if d.name in SOURCE_IMAGES:
            side, chans = SOURCE_IMAGES[d.name]
            side = d.image_size or side
            require(
                m.img_size is None or m.img_size == side,
                "model.img_size",
                f"{side}, the side of the images data.name={d.name} produces (data.image_size="
                f"{d.image_size}), or null to follow the data",
                m.img_size,
            )
            require(
                m.in_chans is None or m.in_chans == chans,
                "model.in_chans",
                f"{chans}, the channels of data.name={d.name}'s images, or null to follow the data",
                m.in_chans,
            )
    if family is not None and not family.reads_images:
        if hf is not None:
            check_model_type(m, hf, cfg.recipe)
            # the same rule as the model builder's (models/bert.py _check_against_dir): sizes are the weights'
            have = {
                "depth": hf.get("num_hidden_layers"),
                "embed_dim": hf.get("hidden_size"),
                "num_heads": hf.get("num_attention_heads"),
                "vocab_size": hf.get("vocab_size"),
                "max_position_embeddings": hf.get("max_position_embeddings"),
            }
            for key, value in have.items():
                want = getattr(m, key)
                if want is not None and value is not None and want != value:
                    raise ConfigError(
                        f"model.{key}={want!r} is not allowed: model.pretrained={m.pretrained!r} "
                        f"has {value!r}; leave it null"
                    )
        if d.name in TEXT_MAX_LENGTH:
            length = d.max_length or TEXT_MAX_LENGTH[d.name]
            positions, where = (
                (m.max_position_embeddings, "model.max_position_embeddings")
                if m.max_position_embeddings
                else (hf["max_position_embeddings"], f"the position table of model.pretrained={m.pretrained!r}")
                if hf is not None and hf.get("max_position_embeddings")
                else (BERT_MAX_POSITIONS, f"the position table of model.name={m.name!r} (max_position_embeddings)")
            )
            # Longer inputs index past the position embedding table: an IndexError inside every worker.
            require(
                length <= positions,
                "data.max_length",
                f"at most {positions}, {where}"
                + ("" if d.max_length else f" (null = {length} for data.name={d.name})"),
                d.max_length,
            )


def with_defaults(cfg):
    """`cfg` with the values that default to other keys': a text source's `data.tokenizer` is the model's own
    directory (`model.pretrained`) when unset; `cache.dtype=auto` the compute dtype of `train.precision`; the
    data source's image size or token length (`data_defaults`).
    Applied after validation, whose messages name the keys as given."""
    if cfg.data.tokenizer is None and cfg.model.pretrained is not None and run_inputs(cfg) == "text":
        cfg = replace(cfg, data=replace(cfg.data, tokenizer=cfg.model.pretrained))
    cache = replace(cfg.cache, dtype=cache_dtype(cfg.cache.dtype, cfg.train.precision))
    return replace(cfg, data=data_defaults(cfg.data), cache=cache)
