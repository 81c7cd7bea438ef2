"""Rules between groups (the layout's, against the world size and the batch, are in `layout.py`): PipeDream's
constraints on the other keys, the text sources' model and task, the model against its pretrained files and
the data it reads; and the pass over files and directories, which `ptrun plan` (no data at hand) skips."""

from __future__ import annotations

from pathlib import Path

from ptrun.config.data import SOURCE_IMAGES, TEXT_MAX_LENGTH, TEXT_SOURCES, check_hf_path
from ptrun.config.freezing import inside_epochs
from ptrun.config.model import DECODER_TASKS, DECODER_TYPES, ENCODER_TASKS, HF_MODEL_TYPES
from ptrun.config.rules import require
from ptrun.errors import ConfigError

BERT_MAX_POSITIONS = 512
"""The position table of ptrun's BERT presets when `model.max_position_embeddings` is unset (models/bert.py)."""
TIMM_VIT_MODULES = ("vision_transformer", "vision_transformer_hybrid", "deit")
"""timm modules whose registered models build a plain `VisionTransformer`, the class ptrun splits into units."""


def check_pipedream(cfg) -> None:
    """What PipeDream's asynchronous schedule and its stage replication rule out elsewhere."""
    p, t, au = cfg.pipe, cfg.train, cfg.auto
    if p.schedule == "pipedream":
        require(p.recompute == "none", "pipe.recompute", "none with pipe.schedule=pipedream (a stashed weight "
                "version is used once per pass)", p.recompute)
        require(t.precision != "fp16", "train.precision", "fp32 or bf16 with pipe.schedule=pipedream (fp16's "
                "loss scale needs every stage to step or skip together; pipedream stages step apart)",
                t.precision)
        require(not inside_epochs(cfg.freeze), "freeze.every", "whole epochs with pipe.schedule=pipedream (its "
                "stages step apart, so a layout changes only where the pipeline drains: an epoch's end)",
                cfg.freeze.every_steps or cfg.freeze.every)
    if p.first_stage_replicas > 1:
        require(p.schedule == "pipedream", "pipe.first_stage_replicas",
                "1 unless pipe.schedule=pipedream (stage replication is PipeDream's)", p.first_stage_replicas)
        for key, on in (("auto.pipe", au.pipe), ("auto.dp", au.dp)):
            require(not on, key, "false with pipe.first_stage_replicas > 1 (a replicated layout stays as "
                    "placed; freezing and AutoCache still apply)", on)
        require(p.microbatches in (1, None), "pipe.microbatches", "1 with pipe.first_stage_replicas > 1",
                p.microbatches)
        require(p.length != "auto", "pipe.length", "an integer with pipe.first_stage_replicas > 1 (a replicated "
                "placement is fixed)", p.length)


def check_text(cfg) -> None:
    """A text source needs a transformers model, the source's task and sensible lengths (its tokenizer:
    `check_paths`)."""
    m, d = cfg.model, cfg.data
    if d.name in TEXT_SOURCES:
        require(m.family in ("bert", "transformers") or (m.family is None and m.name.startswith("bert"))
                or m.pretrained is not None, "model.name", f"a transformers model (a BERT preset, or a Hugging Face "
                f"model as model.pretrained) for the text source data.name={d.name}", m.name)
        want_task = "qa" if d.name == "squad" else "regression" if d.task == "stsb" else "classification"
        require(m.task == want_task, "model.task", f"{want_task} for data.name={d.name}", m.task)
        require(d.max_length is None or d.max_length >= 8, "data.max_length", "an integer >= 8 or null",
                d.max_length)
        if d.name == "squad":
            require(1 <= d.doc_stride < (d.max_length or 384), "data.doc_stride",
                    "an integer >= 1 and below data.max_length", d.doc_stride)


def check_paths(cfg) -> None:
    """The files and directories the run reads: given where a source needs them, and there."""
    m, d, ca = cfg.model, cfg.data, cfg.cache
    require(ca.dir is None or not Path(ca.dir).expanduser().exists() or Path(ca.dir).expanduser().is_dir(),
            "cache.dir", "a directory (created when missing)", ca.dir)
    if d.name in ("cifar10", "cifar100", "glue", "squad"):
        require(d.path is not None, "data.path", f"the local dataset directory for data.name={d.name}", d.path)
    if d.name in TEXT_SOURCES:
        require(d.tokenizer is not None or m.pretrained is not None, "data.tokenizer",
                "a local tokenizer directory (or model.pretrained, a Hugging Face model directory)", d.tokenizer)
    if d.tokenizer is not None and not Path(d.tokenizer).expanduser().is_dir():
        raise ConfigError(f"data.tokenizer={d.tokenizer!r}: no such directory")
    if d.name == "imagefolder":
        require(d.path is not None, "data.path", "a directory of class folders for data.name=imagefolder",
                d.path)
    check_hf_path(cfg)  # a file, a folder or a hub dataset id
    if d.path is not None and d.name != "hf" and not Path(d.path).expanduser().is_dir():
        raise ConfigError(f"data.path={d.path!r}: no such directory")
    if m.pretrained is not None and not Path(m.pretrained).expanduser().exists():
        raise ConfigError(f"model.pretrained={m.pretrained!r}: no such file or directory")
    weights = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
    if _hf_config(m.pretrained) is not None and not any((Path(m.pretrained).expanduser() / w).is_file()
                                                        for w in weights):
        raise ConfigError(f"model.pretrained={m.pretrained!r}: no weights in the directory ({', '.join(weights)})")


def _hf_config(pretrained: str | None) -> dict | None:
    """The config.json of a Hugging Face model directory `pretrained`, or None when it is not one."""
    import json

    path = Path(pretrained).expanduser() / "config.json" if pretrained is not None else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the model builder reports an unreadable config.json with its own words


def timm_vit_problem(name: str) -> str | None:
    """What keeps timm model `name` (an optional `.tag` aside) from being a ViT ptrun can split, read from
    timm's installed source without importing timm (that takes seconds, at every start): None when it is
    registered in one of TIMM_VIT_MODULES with timm's pre-norm Block (no `block_fn`) and no distillation
    token, or when timm's source cannot be read (the model builder checks again in the workers)."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("timm")
    if spec is None or not spec.submodule_search_locations:
        return None
    models = Path(next(iter(spec.submodule_search_locations))) / "models"
    base = name.split(".", 1)[0]
    pattern = re.compile(rf"@register_model\s*\ndef {re.escape(base)}\(")
    # ptrun's own modules first: a supported name is found after reading three files
    for source in sorted(models.glob("*.py"), key=lambda f: (f.stem not in TIMM_VIT_MODULES, f.name)):
        text = source.read_text(errors="replace")
        found = pattern.search(text)
        if not found:
            continue
        body = text[found.end():].split("@register_model", 1)[0]
        if source.stem not in TIMM_VIT_MODULES:
            return f"timm builds it in timm.models.{source.stem}, not as a VisionTransformer"
        if "block_fn=" in body:
            return "its blocks are not timm's pre-norm Block"
        if "distilled=True" in body:
            return "a distilled DeiT (two heads)"
        return None
    return "timm has no such model" if models.is_dir() else None


def check_model_type(m, hf: dict) -> None:
    """A Hugging Face directory's `model_type` must be a family ptrun splits, able to do `model.task`."""
    kind = hf.get("model_type")
    require(kind in HF_MODEL_TYPES, "model.pretrained", f"a Hugging Face model of a supported model_type "
            f"({', '.join(HF_MODEL_TYPES)}); this one is a {kind!r} model", m.pretrained)
    tasks = DECODER_TASKS if kind in DECODER_TYPES else ENCODER_TASKS
    require(m.task in tasks, "model.task", f"one of {', '.join(tasks)} for a {kind} model", m.task)


def check_model_against_data(cfg) -> None:
    """Cross-key checks between the model, its own config file and the data source: what the workers would
    otherwise find out only after they started (a crash in the model's forward, restarted max_restarts times).
    Reads the pretrained directory's config.json and timm's source files, nothing heavier."""
    m, d = cfg.model, cfg.data
    hf = _hf_config(m.pretrained)
    # a Hugging Face directory names its architecture itself, whatever the model group's family says
    family = "bert" if hf is not None else m.family or ("bert" if m.name.startswith("bert") else
                                                        "vit" if m.name.startswith(("vit_", "deit")) else None)
    if family == "transformers":
        family = "bert"  # one family of rules: a transformers model
    require(m.task != "causal_lm" or hf is not None, "model.task", "causal_lm only for a decoder given as "
            f"model.pretrained (a Hugging Face model of model_type {', '.join(DECODER_TYPES)})", m.task)
    if m.embed_dim is not None and m.num_heads is not None:
        require(m.embed_dim % m.num_heads == 0, "model.num_heads",
                f"a divisor of model.embed_dim={m.embed_dim} (each head gets embed_dim / num_heads channels)",
                m.num_heads)
    if family == "vit":
        require(m.name.startswith(("vit_", "deit")), "model.name",
                "a timm ViT name (vit_* or deit_*, e.g. vit_tiny_patch16_224) with model.family=vit", m.name)
        problem = timm_vit_problem(m.name)
        require(problem is None, "model.name", f"a timm VisionTransformer with pre-norm Blocks, e.g. "
                f"vit_tiny_patch16_224 or vit_base_patch16_224 ({problem})", m.name)
        if d.name in SOURCE_IMAGES:
            side, chans = SOURCE_IMAGES[d.name]
            side = d.image_size or side
            require(m.img_size is None or m.img_size == side, "model.img_size",
                    f"{side}, the side of the images data.name={d.name} produces (data.image_size="
                    f"{d.image_size}), or null to follow the data", m.img_size)
            require(m.in_chans is None or m.in_chans == chans, "model.in_chans",
                    f"{chans}, the channels of data.name={d.name}'s images, or null to follow the data", m.in_chans)
    if family == "bert":
        if hf is not None:
            check_model_type(m, hf)
            # the same rule as the model builder's (models/bert.py _check_against_dir): sizes are the weights'
            have = {"depth": hf.get("num_hidden_layers"), "embed_dim": hf.get("hidden_size"),
                    "num_heads": hf.get("num_attention_heads"), "vocab_size": hf.get("vocab_size"),
                    "max_position_embeddings": hf.get("max_position_embeddings")}
            for key, value in have.items():
                want = getattr(m, key)
                if want is not None and value is not None and want != value:
                    raise ConfigError(f"model.{key}={want!r} is not allowed: model.pretrained={m.pretrained!r} "
                                      f"has {value!r}; leave it null")
        if d.name in TEXT_MAX_LENGTH:
            length = d.max_length or TEXT_MAX_LENGTH[d.name]
            positions, where = (
                (m.max_position_embeddings, "model.max_position_embeddings") if m.max_position_embeddings else
                (hf["max_position_embeddings"], f"the position table of model.pretrained={m.pretrained!r}")
                if hf is not None and hf.get("max_position_embeddings") else
                (BERT_MAX_POSITIONS, f"the position table of model.name={m.name!r} (max_position_embeddings)"))
            # Longer inputs index past the position embedding table: an IndexError inside every worker.
            require(length <= positions, "data.max_length", f"at most {positions}, {where}"
                    + ("" if d.max_length else f" (null = {length} for data.name={d.name})"), d.max_length)
