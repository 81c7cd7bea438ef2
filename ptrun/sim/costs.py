"""Per-unit costs of a layered model, from its config alone (no weights) or from a measured profile.

Units are those of `ptrun/models/layered.py`: `embed`, then `block.i.attn` and `block.i.mlp` for each of
the L blocks, then `head` (2L + 2 units). For each unit, per sample:

- `params`: parameter elements the unit owns (a tied weight counts on every unit holding a copy, as
  `ptrun.parallel.layout.param_costs` counts it);
- `fwd_flops`: forward FLOPs of its matrix multiplications (2 per multiply-add). Layer norms, softmax,
  GELU, biases, residual adds and embedding lookups are left out: they are memory-bound and small next to
  the GEMMs of a ViT-B or BERT-large block (a few per cent);
- `act_bytes`: bytes of the unit's output (what crosses a stage boundary placed after it, and what
  AutoCache stores when the cache ends there), fp32.

Formulas (N tokens, width D, MLP hidden H = mlp_ratio x D, C input channels, P patch size):

    ViT   N = (img / P)^2 + 1 (the class token)
          embed  params C P^2 D + D (patch conv)  + D (cls token) + N D (position table)
                 flops  2 (N - 1) C P^2 D
          attn   params 4 D^2 + 4 D (qkv, proj + biases) + 2 D (norm1)
                 flops  4 N D^2 x 2 (qkv and proj) + 2 N^2 D x 2 (q k^T and attn v)
          mlp    params 2 D H + H + D (fc1, fc2) + 2 D (norm2)
                 flops  2 N D H x 2
          head   params 2 D (norm) + D classes + classes;  flops 2 D classes (on the pooled token)
    BERT  N = the sequence length; the same halves (its norm is post-norm: LN after the residual, same
          size); embed = word (V D) + position (512 D) + token type (2 D) tables + LN (2 D), 0 FLOPs;
          every unit but the head also passes on the additive mask (N fp32 values a sample).
          head: qa 2 D + 2 params, 2 N D 2 FLOPs; classification pooler + classifier; mlm transform +
          the tied decoder (V D, counted again: the head's stage holds a replica). Under a classification
          head the last layer computes the first token's row (`ptrun.models.encoders`): its attention
          2 N D^2 x 2 (k and v) + 2 D^2 x 2 (q and output) + 2 N D x 2 (one query's scores), DistilBERT's
          whole; its MLP one token; both halves output one row.
    The decoders (`decoder_costs`), DeBERTa-v2 / v3 (`deberta_costs`) and ModernBERT (`modernbert_costs`)
    are priced from their whole config.json, each function saying what it counts.

A measured profile (`load_profile`) replaces the FLOP model by per-unit forward + backward seconds per
sample measured on the target device (e.g. `ptrun.parallel.profile.profile_units` on one micro-batch,
written with `save_profile`); the parameter counts still come from the config unless the file has them.
Optionally it also holds, per unit: the forward alone (`forward_s`, else forward + backward / 3), the
forward + input-gradient backward of the unit frozen (`frozen_s`), and the optimizer update of its
parameters per step (`update_s`, seconds per step, not per sample; else 0). scripts/measure_cpu_costs.py
measures all of them.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

from ptrun.config import ConfigError, DataConfig, ModelConfig
from ptrun.config.model import DECODER_TYPES, POOLED_TASKS, named_family

FP32 = 4
"""Bytes of an fp32 value: activations, gradients and the cache's default dtype."""

VIT_SIZES = {
    "tiny": (192, 12, 3),
    "small": (384, 12, 6),
    "base": (768, 12, 12),
    "large": (1024, 24, 16),
    "huge": (1280, 32, 16),
}
"""timm ViT size -> (width D, depth L, heads) for names such as `vit_base_patch16_224`."""

BERT_SIZES = {
    "bert-tiny": (2, 128),
    "bert-mini": (4, 256),
    "bert-small": (4, 512),
    "bert-medium": (8, 512),
    "bert-base": (12, 768),
    "bert-large": (24, 1024),
}
"""BERT name -> (layers L, hidden D), as `ptrun.models.bert.PRESETS`."""

DATA_IMAGES = {"digits": (8, 1, 10), "cifar10": (32, 3, 10), "cifar100": (32, 3, 100), "imagefolder": (224, 3, 1000)}
"""Image source -> (native size in pixels, channels, classes); imagefolder is taken to be ImageNet-1k."""


@dataclass(frozen=True)
class ModelCosts:
    """Per-unit costs of one model, per sample (see the module docstring)."""

    names: tuple[str, ...]
    params: tuple[float, ...]
    act_bytes: tuple[float, ...]
    fwd_flops: Optional[tuple[float, ...]] = None
    """Analytic forward FLOPs per sample; None when the costs come from a measured profile."""
    fb_seconds: Optional[tuple[float, ...]] = None
    """Measured forward + backward seconds per sample; when set it is used instead of `fwd_flops`."""
    fwd_seconds: Optional[tuple[float, ...]] = None
    """Measured forward-only (no_grad) seconds per sample; None: forward + backward / 3."""
    frozen_seconds: Optional[tuple[float, ...]] = None
    """Measured seconds per sample of the unit frozen with its input needing a gradient (forward + the input
    gradient's backward: a frozen unit on a later pipeline stage); None: derived (`ptrun.sim.simulate`)."""
    update_seconds: Optional[tuple[float, ...]] = None
    """Measured seconds per optimizer step of each unit's parameters (clip work + optimizer); None: 0."""
    sequence_units: Optional[int] = None
    """How many leading units return every token's row (`LayeredModel.sequence_units`); None: all of them."""

    @property
    def num_units(self) -> int:
        return len(self.names)

    @property
    def num_blocks(self) -> int:
        return (self.num_units - 2) // 2


def unit_names(num_blocks: int) -> tuple[str, ...]:
    """The unit names of `LayeredModel` for L blocks."""
    return ("embed", *(f"block.{b}.{h}" for b in range(num_blocks) for h in ("attn", "mlp")), "head")


def attention_flops(tokens: int, width: int) -> float:
    """Forward FLOPs of one attention half: q, k, v and output projections (4 N D^2 multiply-adds) plus
    q k^T and attn v (2 N^2 D multiply-adds), at 2 FLOPs each."""
    return 2.0 * (4 * tokens * width**2 + 2 * tokens**2 * width)


def mlp_flops(tokens: int, width: int, hidden: int) -> float:
    """Forward FLOPs of one MLP half: two N x D x H matrix multiplications."""
    return 2.0 * 2 * tokens * width * hidden


def _blocks(num_blocks: int, tokens: int, width: int, hidden: int, carry: float) -> tuple[list, list, list]:
    """params, flops and output bytes of the 2L block halves (pre- or post-norm: same sizes)."""
    attn_p = 4 * width**2 + 4 * width + 2 * width
    mlp_p = 2 * width * hidden + hidden + width + 2 * width
    act = tokens * width * FP32 + carry
    params, flops, acts = [], [], []
    for _ in range(num_blocks):
        params += [attn_p, mlp_p]
        flops += [attention_flops(tokens, width), mlp_flops(tokens, width, hidden)]
        acts += [act, act]
    return params, flops, acts


def vit_costs(
    *,
    img_size: int,
    patch_size: int,
    embed_dim: int,
    depth: int,
    mlp_ratio: float = 4.0,
    num_classes: int = 1000,
    in_chans: int = 3,
) -> ModelCosts:
    """Costs of a timm VisionTransformer (class token, pre-norm blocks, qkv bias, token pooling)."""
    if img_size % patch_size:
        raise ConfigError(f"model.patch_size={patch_size} is not allowed: a divisor of the image size {img_size}")
    n, d, h = (img_size // patch_size) ** 2 + 1, embed_dim, int(embed_dim * mlp_ratio)
    bp, bf, ba = _blocks(depth, n, d, h, 0.0)
    patch = in_chans * patch_size**2 * d
    params = [patch + d + d + n * d, *bp, 2 * d + d * num_classes + num_classes]
    flops = [2.0 * (n - 1) * patch, *bf, 2.0 * d * num_classes]
    acts = [n * d * FP32, *ba, num_classes * FP32]
    return ModelCosts(unit_names(depth), tuple(map(float, params)), tuple(map(float, acts)), tuple(flops))


def bert_costs(
    *,
    seq_len: int,
    hidden: int,
    depth: int,
    intermediate: int,
    vocab_size: int = 30522,
    max_positions: int = 512,
    task: str = "qa",
    num_labels: int = 2,
    whole_attention: bool = False,
) -> ModelCosts:
    """Costs of a Hugging Face BERT as ptrun splits it (the mask travels with the hidden state);
    `whole_attention`: the last layer's attention runs every query under a classification head (DistilBERT)."""
    t, d = seq_len, hidden
    mask = t * FP32
    bp, bf, ba = _blocks(depth, t, d, intermediate, mask)
    tail = task in POOLED_TASKS
    if tail:  # the last layer computes the first token's row (ptrun.models.encoders)
        if not whole_attention:
            bf[-2] = 2.0 * (2 * t * d * d + 2 * d * d + 2 * t * d)
        bf[-1] = mlp_flops(1, d, intermediate)
        ba[-2:] = [d * FP32 + mask] * 2
    embed_p = vocab_size * d + max_positions * d + 2 * d + 2 * d
    if task == "qa":
        head = (2 * d + 2, 2.0 * t * d * 2, t * 2 * FP32)
    elif task == "mlm":
        head = (
            d * d + d + 2 * d + vocab_size * d + vocab_size,
            2.0 * t * (d * d + d * vocab_size),
            t * vocab_size * FP32,
        )
    else:
        head = (d * d + d + d * num_labels + num_labels, 2.0 * (d * d + d * num_labels), num_labels * FP32)
    params = [embed_p, *bp, head[0]]
    flops = [0.0, *bf, head[1]]
    acts = [t * d * FP32 + mask, *ba, head[2]]
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, params)),
        tuple(map(float, acts)),
        tuple(flops),
        sequence_units=2 * depth - 1 if tail else None,
    )


def decoder_costs(
    *,
    seq_len: int,
    hidden: int,
    depth: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab_size: int,
    gated: bool = True,
    positions: int = 0,
    task: str = "causal_lm",
    num_labels: int = 2,
) -> ModelCosts:
    """Costs of a decoder as ptrun splits it (GPT-2, the Llama family): pre-norm halves, grouped KV heads,
    a gated MLP (three D x I matrices) or GPT-2's two, the padding mask (N fp32 values) travelling with
    the hidden state. The causal attention is counted in full (an upper bound: fused kernels skip about half
    of the scores). The causal-LM head is the vocabulary projection at every token; tied to the input
    embedding it is counted again, as the head's stage holds a replica."""
    t, d = seq_len, hidden
    mask = t * FP32
    projections = d * heads * head_dim * 2 + d * kv_heads * head_dim * 2  # q and o; k and v
    attn_p = projections + d
    mlp_p = (3 if gated else 2) * d * intermediate + d
    attn_f = 2.0 * (t * projections + 2 * t * t * heads * head_dim)
    mlp_f = 2.0 * t * (3 if gated else 2) * d * intermediate
    act = t * d * FP32 + mask
    blocks_p = [attn_p, mlp_p] * depth
    blocks_f = [attn_f, mlp_f] * depth
    embed_p = vocab_size * d + positions * d
    if task == "causal_lm":
        head = (d + vocab_size * d, 2.0 * t * d * vocab_size, t * vocab_size * FP32)
    else:
        head = (d + d * num_labels, 2.0 * d * num_labels, num_labels * FP32)
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, [embed_p, *blocks_p, head[0]])),
        tuple(map(float, [act, *[act] * (2 * depth), head[2]])),
        tuple([0.0, *blocks_f, head[1]]),
    )


def deberta_costs(hf: dict[str, Any], *, seq_len: int, task: str = "classification", num_labels: int = 2) -> ModelCosts:
    """Costs of a DeBERTa-v2 / v3 (`hf`: its config.json, with the library's defaults for absent keys) as
    ptrun splits it (`ptrun.models.deberta`): the padding mask (N fp32 values) travels with the hidden state;
    the relative-position table (and its LayerNorm) is counted on every attention half, each holding a
    replica; block 0's attention half also passes its input on when the model has the convolution after
    layer 0, which its MLP half holds. Attention FLOPs add the content-to-position and position-to-content
    scores (N x 2S per head, S the relative span)."""
    t, d, i, v = seq_len, hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    e = hf.get("embedding_size") or d
    heads = hf["num_attention_heads"]
    a = heads * hf["attention_head_size"] if hf.get("attention_head_size") else d
    positions = hf.get("max_position_embeddings") or 512
    kinds = hf.get("pos_att_type") or []
    kinds = [k.strip() for k in kinds.lower().split("|")] if isinstance(kinds, str) else list(kinds)
    relative = bool(hf.get("relative_attention", False))
    max_relative = hf.get("max_relative_positions", -1)
    max_relative = positions if max_relative < 1 else max_relative
    buckets = hf.get("position_buckets", -1)
    span = buckets if buckets > 0 else max_relative
    normed = "layer_norm" in [x.strip() for x in str(hf.get("norm_rel_ebd", "none")).lower().split("|")]
    kernel, groups = hf.get("conv_kernel_size", 0) or 0, hf.get("conv_groups", 1) or 1
    mask = t * FP32
    embed_p = (
        v * e
        + (positions * e if hf.get("position_biased_input", True) else 0)
        + (hf.get("type_vocab_size", 0) or 0) * e
        + (e * d if e != d else 0)
        + 2 * d
    )
    attn_p = 3 * (d * a + a) + d * d + d + 2 * d
    attn_f = 2.0 * (3 * t * d * a + t * a * d + 2 * t * t * a)
    if relative:
        if not hf.get("share_att_key", False):
            attn_p += sum(d * a + a for k in ("c2p", "p2c") if k in kinds)
        attn_p += 2 * span * d + (2 * d if normed else 0)  # the shared table: a replica on every attention half
        attn_f += 2.0 * t * 2 * span * a * sum(k in kinds for k in ("c2p", "p2c"))
    mlp_p = 2 * d * i + i + d + 2 * d
    mlp_f = 2.0 * 2 * t * d * i
    conv_p = d * (d // groups) * kernel + d + 2 * d if kernel > 0 else 0
    act = t * d * FP32 + mask
    params = [embed_p] + [attn_p, mlp_p] * hf["num_hidden_layers"]
    flops = [2.0 * t * e * d if e != d else 0.0] + [attn_f, mlp_f] * hf["num_hidden_layers"]
    acts = [act] * (1 + 2 * hf["num_hidden_layers"])
    if conv_p:
        params[2] += conv_p
        flops[2] += 2.0 * t * d * (d // groups) * kernel
        acts[1] += t * d * FP32  # layer 0's input, for the convolution
    if task == "qa":
        head = (2 * d + 2, 2.0 * t * d * 2, t * 2 * FP32)
    else:  # ContextPooler (first token, dense) and the classifier
        head = (d * d + d + d * num_labels + num_labels, 2.0 * (d * d + d * num_labels), num_labels * FP32)
    return ModelCosts(
        unit_names(hf["num_hidden_layers"]),
        tuple(map(float, params + [head[0]])),
        tuple(map(float, acts + [head[2]])),
        tuple(flops + [head[1]]),
    )


def modernbert_costs(
    hf: dict[str, Any], *, seq_len: int, task: str = "classification", num_labels: int = 2
) -> ModelCosts:
    """Costs of a ModernBERT (`hf`: its config.json, the library's defaults for absent keys) as ptrun splits it
    (`ptrun.models.modernbert`): pre-norm halves (layer 0's attention norm is an identity), fused QKV, a gated
    MLP (Wi: D x 2I, Wo: I x D), the padding mask travelling with the hidden state. Local layers are counted
    as global ones: the padded path computes every score and masks those outside the window. Head: final norm,
    the prediction head (dense, norm) and the classifier, on the pooled token or (qa) every token. Pooling the
    first token, the last layer keeps that row after its attention: its MLP runs one token."""
    t, d, i, v = seq_len, hf["hidden_size"], hf["intermediate_size"], hf["vocab_size"]
    norm = d * (2 if hf.get("norm_bias", False) else 1)
    attn_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    attn_p = 4 * d * d + (4 * d if attn_bias else 0)
    mlp_p = norm + 3 * d * i + (2 * i + d if mlp_bias else 0)
    attn_f, mlp_f = attention_flops(t, d), 2.0 * t * 3 * d * i
    depth = hf["num_hidden_layers"]
    params = [v * d + norm] + [p for layer in range(depth) for p in (attn_p + (norm if layer else 0), mlp_p)]
    labels = 2 if task == "qa" else num_labels
    head_p = 2 * norm + d * d + (d if hf.get("classifier_bias", False) else 0) + d * labels + labels
    pooled = t if task == "qa" else 1
    head = (head_p, 2.0 * pooled * (d * d + d * labels), pooled * labels * FP32)
    act = t * d * FP32 + t * FP32
    acts, flops = [act] * (1 + 2 * depth), [0.0] + [attn_f, mlp_f] * depth
    first_token = task != "qa" and hf.get("classifier_pooling", "cls") == "cls"
    if first_token:  # ptrun.models.modernbert
        acts[-2:] = [d * FP32 + t * FP32] * 2
        flops[-1] = 2.0 * 3 * d * i
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, params + [head[0]])),
        tuple(map(float, acts + [head[2]])),
        tuple(flops + [head[1]]),
        sequence_units=2 * depth - 1 if first_token else None,
    )


ENCODER_COSTS = {"deberta-v2": deberta_costs, "modernbert": modernbert_costs}
"""Encoder families whose units are not BERT's (`bert_costs`), by `model_type`: priced from their whole
config.json."""


def _family(model: ModelConfig) -> str:
    if model.pretrained and (Path(model.pretrained).expanduser() / "config.json").is_file():
        return "bert"  # a Hugging Face directory: a transformers model, whatever the model group said
    return "bert" if (named_family(model) or "vit") == "transformers" else "vit"


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
    if _family(model) == "bert":
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


def save_profile(
    profile: Any,
    batch: int,
    path: str | Path,
    params: Optional[Sequence[float]] = None,
    update_s: Optional[Sequence[float]] = None,
) -> None:
    """Write a `UnitProfile` (`time_s` and `activation_bytes` for one micro-batch of `batch` samples, and
    `forward_s` / `frozen_s` when it has them) as the JSON `load_profile` reads; `params` (per-unit parameter
    counts) and `update_s` (per-unit optimizer seconds per step) are optional."""
    doc = {"batch": batch, "time_s": list(profile.time_s), "activation_bytes": list(profile.activation_bytes)}
    for key in ("forward_s", "frozen_s"):
        if getattr(profile, key, None) is not None:
            doc[key] = list(getattr(profile, key))
    if params is not None:
        doc["params"] = list(params)
    if update_s is not None:
        doc["update_s"] = list(update_s)
    Path(path).write_text(json.dumps(doc, indent=1))


def load_profile(path: str | Path, base: ModelCosts) -> ModelCosts:
    """`base` with its compute and activation sizes replaced by a measured profile (JSON: `batch`, the
    micro-batch the times were measured on; `time_s`, forward + backward seconds per unit for that batch;
    `activation_bytes`, each unit's output bytes for that batch; optional `forward_s` and `frozen_s` for that
    batch, `update_s` per step, and `params`). Other keys are ignored. Raises ConfigError."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as e:
        raise ConfigError(f"--profile {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ConfigError(f"--profile {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not {"batch", "time_s", "activation_bytes"} <= set(doc):
        raise ConfigError(f"--profile {path}: needs the keys batch, time_s and activation_bytes")
    batch = doc["batch"]
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"--profile {path}: batch={batch!r} is not allowed: the micro-batch size, an integer >= 1")
    vectors = {
        k: doc[k] for k in ("time_s", "activation_bytes", "params", "forward_s", "frozen_s", "update_s") if k in doc
    }
    for key, vec in vectors.items():
        if (
            not isinstance(vec, list)
            or len(vec) != base.num_units
            or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in vec
            )
        ):
            raise ConfigError(
                f"--profile {path}: {key} must list {base.num_units} finite numbers >= 0 "
                f"(one per unit of the recipe's model)"
            )

    def per_sample(key: str) -> Optional[tuple[float, ...]]:
        return tuple(t / batch for t in vectors[key]) if key in vectors else None

    return replace(
        base,
        fb_seconds=per_sample("time_s"),
        act_bytes=per_sample("activation_bytes"),
        params=tuple(map(float, vectors.get("params", base.params))),
        fwd_seconds=per_sample("forward_s"),
        frozen_seconds=per_sample("frozen_s"),
        update_seconds=tuple(map(float, vectors["update_s"])) if "update_s" in vectors else None,
    )


__all__ = [
    "ModelCosts",
    "attention_flops",
    "bert_costs",
    "costs_from_config",
    "deberta_costs",
    "load_profile",
    "mlp_flops",
    "modernbert_costs",
    "save_profile",
    "unit_names",
    "vit_costs",
]
