"""The costs of the model a config would build (`costs_from_config`): from `model.*`, a Hugging Face
`model.pretrained` directory's config.json, the name's defaults and the data source, priced by the family's
formulas (`ptrun.costs.units` for ViT and BERT, `ptrun.costs.hf_families` for the others)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ptrun.config import ConfigError, DataConfig, ModelConfig
from ptrun.config.model import DECODER_TYPES, family_spec
from ptrun.costs.hf_families import ENCODER_COSTS, decoder_costs
from ptrun.costs.units import BERT_SIZES, VIT_SIZES, ModelCosts, bert_costs, vit_costs

DATA_IMAGES = {"digits": (8, 1, 10), "cifar10": (32, 3, 10), "cifar100": (32, 3, 100), "imagefolder": (224, 3, 1000)}
"""Image source -> (native size in pixels, channels, classes); imagefolder is taken to be ImageNet-1k."""


def _reads_tokens(model: ModelConfig) -> bool:
    """A transformers model (a Hugging Face directory, or a name or family that says so); else a ViT."""
    family = family_spec(model)
    return family is not None and not family.reads_images


SIZE_KEYS = {
    "depth": ("num_hidden_layers", "n_layer", "n_layers"),
    "width": ("hidden_size", "n_embd", "dim"),
    "hidden": ("intermediate_size", "n_inner", "hidden_dim"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads",),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    "positions": ("max_position_embeddings", "n_positions"),
    "model_type": ("model_type",),
}
"""Each size and the config.json keys the families name it by (BERT's, GPT-2's, DistilBERT's)."""


def _hf_config(model: ModelConfig) -> dict[str, Any]:
    """A Hugging Face directory's config.json (`model.pretrained`), which the model is built from; {} when
    there is none."""
    path = Path(model.pretrained).expanduser() / "config.json" if model.pretrained else None
    if path is None or not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"model.pretrained={model.pretrained!r}: cannot read its sizes from config.json ({e})"
        ) from None


def _hf_sizes(model: ModelConfig) -> dict[str, Any]:
    """The sizes in a Hugging Face directory's config.json (`model.pretrained`); {} when there is none."""
    hf = _hf_config(model)
    if not hf:
        return {}
    sizes = {size: next((hf[k] for k in keys if hf.get(k) is not None), None) for size, keys in SIZE_KEYS.items()}
    if not (sizes["depth"] and sizes["width"]):
        raise ConfigError(
            f"model.pretrained={model.pretrained!r}: cannot read its sizes from config.json (no layer count or width)"
        )
    sizes["hidden"] = sizes["hidden"] or 4 * sizes["width"]  # GPT-2's n_inner=null
    return sizes


def costs_from_config(model: ModelConfig, data: DataConfig) -> ModelCosts:
    """Analytic costs of the model a config would build: `model.*` fields first, then a Hugging Face
    `model.pretrained` directory's config.json, then the name's defaults (timm's `vit_SIZE_patchP_IMG`,
    ptrun's BERT presets), then the data source (image size, channels, classes, sequence length). Raises
    ConfigError naming the key that is missing."""
    if _reads_tokens(model):
        hf = _hf_sizes(model)
        if hf.get("model_type") in ENCODER_COSTS:
            labels = model.num_classes or (3 if data.task == "mnli" else 2)
            return ENCODER_COSTS[hf["model_type"]](
                _hf_config(model),
                task=model.task,
                num_labels=labels,
                seq_len=data.max_length or (384 if data.name == "squad" else 128),
            )
        if hf.get("model_type") in DECODER_TYPES:
            heads = hf["heads"] or 1
            return decoder_costs(
                seq_len=data.max_length or 512,
                hidden=hf["width"],
                depth=model.depth or hf["depth"],
                intermediate=hf["hidden"],
                heads=heads,
                kv_heads=hf["kv_heads"] or heads,
                head_dim=hf["head_dim"] or hf["width"] // heads,
                vocab_size=hf["vocab"] or 32000,
                gated=hf["model_type"] != "gpt2",
                positions=(hf["positions"] or 0) if hf["model_type"] == "gpt2" else 0,
                task=model.task,
                num_labels=model.num_classes or 2,
            )
        layers, width = BERT_SIZES.get(model.name, (hf.get("depth"), hf.get("width")))
        if hf:
            layers, width = hf["depth"], hf["width"]
        depth, width = model.depth or layers, model.embed_dim or width
        if not (depth and width):
            raise ConfigError(
                f"model.name={model.name!r}: the simulator knows {', '.join(BERT_SIZES)}; "
                f"set model.depth and model.embed_dim for another BERT"
            )
        hidden = int(width * model.mlp_ratio) if model.mlp_ratio else hf.get("hidden") or 4 * width
        labels = model.num_classes or (3 if data.task == "mnli" else 2)
        return bert_costs(
            seq_len=data.max_length or (384 if data.name == "squad" else 128),
            hidden=width,
            depth=depth,
            intermediate=hidden,
            vocab_size=model.vocab_size or hf.get("vocab") or 30522,
            max_positions=model.max_position_embeddings or hf.get("positions") or 512,
            task=model.task,
            num_labels=labels,
            whole_attention=hf.get("model_type") == "distilbert",
        )
    m = re.match(r"(?:vit|deit)_(tiny|small|base|large|huge)_patch(\d+)_(\d+)", model.name)
    width, depth, _ = VIT_SIZES[m.group(1)] if m else (None, None, None)
    native, chans, classes = DATA_IMAGES.get(data.name, (None, 3, None))
    sizes = dict(
        embed_dim=model.embed_dim or width,
        depth=model.depth or depth,
        patch_size=model.patch_size or (int(m.group(2)) if m else None),
        img_size=model.img_size or data.image_size or native or (int(m.group(3)) if m else None),
        num_classes=model.num_classes or classes,
    )
    missing = [k for k, v in sizes.items() if v is None]
    if missing:
        raise ConfigError(
            f"model.{missing[0]}=None is not allowed: the simulator cannot infer it for "
            f"model.name={model.name!r} and data.name={data.name!r}; set it"
        )
    return vit_costs(mlp_ratio=model.mlp_ratio or 4.0, in_chans=model.in_chans or chans, **sizes)  # type: ignore[arg-type]
