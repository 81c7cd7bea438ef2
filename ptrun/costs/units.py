"""Per-unit costs of a layered model, from its config alone (no weights) or from a measured profile.

Units are those of `ptrun/models/layered.py`: `embed`, then `block.i.attn` and `block.i.mlp` for each of
the L blocks, then `head` (2L + 2 units). For each unit, per sample:

- `params`: parameter elements the unit owns (a tied weight counts on every unit holding a copy, as
  `ptrun.layout.first.param_costs` counts it);
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
    The decoders, DeBERTa-v2 / v3 and ModernBERT are priced from their whole config.json (`ptrun.costs.hf_families`),
    each function saying what it counts; `ptrun.costs.from_config` picks the family a config builds.

A measured profile (`ptrun.sim.profiles`) replaces the FLOP model by per-unit forward + backward seconds per
sample measured on the target device (e.g. `ptrun.parallel.profile.profile_units` on one micro-batch,
written with `save_profile`); the parameter counts still come from the config unless the file has them.
Optionally it also holds, per unit: the forward alone (`forward_s`, else forward + backward / 3), the
forward + input-gradient backward of the unit frozen (`frozen_s`), and the optimizer update of its
parameters per step (`update_s`, seconds per step, not per sample; else 0). benchmarks/cpu_costs.py
measures all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ptrun.config import ConfigError
from ptrun.config.model import POOLED_TASKS

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


Linear = tuple[str, int, int]
"""A linear module of a unit: its name in the library (the last part: `query`, `fc1`), fan-in, fan-out."""


def block_linears(num_blocks: int, attn: tuple[Linear, ...], mlp: tuple[Linear, ...], head=()) -> tuple:
    """`ModelCosts.linears` of a model whose blocks' halves all hold `attn` and `mlp`: none in the embedding,
    `head` in the head unit."""
    return ((), *(half for _ in range(num_blocks) for half in (attn, mlp)), tuple(head))


@dataclass(frozen=True)
class ModelCosts:
    """Per-unit costs of one model, per sample (see the module docstring)."""

    names: tuple[str, ...]
    params: tuple[float, ...]
    act_bytes: tuple[float, ...]
    fwd_flops: tuple[float, ...] | None = None
    """Analytic forward FLOPs per sample; None when the costs come from a measured profile."""
    fb_seconds: tuple[float, ...] | None = None
    """Measured forward + backward seconds per sample; when set it is used instead of `fwd_flops`."""
    fwd_seconds: tuple[float, ...] | None = None
    """Measured forward-only (no_grad) seconds per sample; None: forward + backward / 3."""
    frozen_seconds: tuple[float, ...] | None = None
    """Measured seconds per sample of the unit frozen with its input needing a gradient (forward + the input
    gradient's backward: a frozen unit on a later pipeline stage); None: derived (`ptrun.sim.simulate`)."""
    update_seconds: tuple[float, ...] | None = None
    """Measured seconds per optimizer step of each unit's parameters (clip work + optimizer); None: 0."""
    sequence_units: int | None = None
    """How many leading units return every token's row (`LayeredModel.sequence_units`); None: all of them."""
    linears: tuple[tuple[Linear, ...], ...] | None = None
    """Per unit, the linear modules an adapter may wrap or that train beside adapters (a block's projections,
    the task head's new layer), by their names in the library; None where not known (what an adapter trains
    is then priced as full fine-tuning)."""

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
    attn, mlp = (("qkv", d, 3 * d), ("proj", d, d)), (("fc1", d, h), ("fc2", h, d))
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, params)),
        tuple(map(float, acts)),
        tuple(flops),
        linears=block_linears(depth, attn, mlp, [("head", d, num_classes)]),
    )


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
    q, k, v, o, up, down = ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2") if whole_attention else BERT_NAMES
    attn = tuple((name, d, d) for name in (q, k, v, o))
    return ModelCosts(
        unit_names(depth),
        tuple(map(float, params)),
        tuple(map(float, acts)),
        tuple(flops),
        sequence_units=2 * depth - 1 if tail else None,
        linears=block_linears(
            depth, attn, ((up, d, intermediate), (down, intermediate, d)), head_linears(task, d, num_labels)
        ),
    )


BERT_NAMES = ("query", "key", "value", "dense", "dense", "dense")
"""A BERT-like block's linear modules (q, k, v, attention output; MLP in, out) by their library names."""


def head_linears(task: str, width: int, num_labels: int, classifier: str = "classifier") -> tuple[Linear, ...]:
    """The task head's new layer of a transformers model: the span head's `qa_outputs`, a classifier (a
    language-model head, pretrained, has none)."""
    if task == "qa":
        return (("qa_outputs", width, 2),)
    return ((classifier, width, num_labels),) if task in POOLED_TASKS else ()


__all__ = [
    "BERT_NAMES",
    "Linear",
    "ModelCosts",
    "attention_flops",
    "bert_costs",
    "block_linears",
    "head_linears",
    "mlp_flops",
    "unit_names",
    "vit_costs",
]
