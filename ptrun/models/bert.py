"""ptrun's BERT presets (`model.name=bert-tiny` ... `bert-large`): a BERT of a named size with random weights,
built and split like any BERT checkpoint (`ptrun.models.hf`, `ptrun.models.encoders`).

Masked-LM (`task: mlm`) ties the decoder weight to the word-embedding matrix (one Parameter, used by the
embed unit and the head unit); the builder declares it to LayeredModel as tied (see layered.py for how a
pipeline keeps the two stages' replicas equal). The decoder bias is also an alias (`cls.predictions.bias`),
but both names live in the head unit, so it needs no declaration.
"""

from __future__ import annotations

from ptrun.config import ConfigError, ModelConfig
from ptrun.models.hf import build_transformers
from ptrun.models.layered import LayeredModel

# name -> (layers L, hidden H, heads A); the intermediate size is 4H unless `mlp_ratio` is set.
PRESETS = {
    "bert-tiny": (2, 128, 2),
    "bert-mini": (4, 256, 4),
    "bert-small": (4, 512, 8),
    "bert-medium": (8, 512, 8),
    "bert-base": (12, 768, 12),
    "bert-large": (24, 1024, 16),
}


def _preset_sizes(cfg: ModelConfig, vocab_size: int | None) -> dict:
    """BertConfig size fields: the preset for `cfg.name`, overridden by the fields set in cfg."""
    if cfg.name not in PRESETS:
        raise ConfigError(
            f"model.name={cfg.name!r} is not a known model: BERT names are "
            f"{', '.join(PRESETS)} (or a Hugging Face directory as model.pretrained)"
        )
    layers, hidden, heads = PRESETS[cfg.name]
    hidden = cfg.embed_dim or hidden
    return dict(
        vocab_size=cfg.vocab_size or vocab_size or 30522,
        hidden_size=hidden,
        num_hidden_layers=cfg.depth or layers,
        num_attention_heads=cfg.num_heads or heads,
        intermediate_size=int(hidden * (cfg.mlp_ratio or 4)),
        max_position_embeddings=cfg.max_position_embeddings or 512,
    )


def build_bert(cfg: ModelConfig, *, num_classes: int, vocab_size: int | None) -> LayeredModel:
    """The preset `cfg.name`'s BertForSequenceClassification (task classification / regression),
    BertForQuestionAnswering (qa) or BertForMaskedLM (mlm), with random weights."""
    from transformers import BertConfig  # inner import: optional library

    num_labels = 2 if cfg.task == "qa" else (cfg.num_classes or num_classes)
    config = BertConfig(
        **_preset_sizes(cfg, vocab_size),
        num_labels=num_labels,
        attn_implementation=cfg.attention,
        hidden_dropout_prob=cfg.dropout,
        attention_probs_dropout_prob=cfg.dropout,
    )
    return build_transformers(cfg, config, "bert")
