"""transformers BERT adapter: embed | (attention half, MLP half) x L | head, for classification, QA and MLM.

Every unit after the embedding takes and returns `(hidden, ext_mask)`, so the additive attention mask
reaches every pipeline stage. Attention is `model.attention`: `sdpa` by default (torch's fused kernel, as
transformers itself picks; the additive mask goes in as SDPA's `attn_mask`, and the split equals the library
model's own sdpa forward in the tests), or `eager`, which adds the mask to the scores exactly as
transformers' own eager forward does, bit for bit whatever the library does with its mask.
transformers is imported inside the functions: importing it costs seconds per process.

Masked-LM (`task: mlm`) ties the decoder weight to the word-embedding matrix (one Parameter, used by the
embed unit and the head unit); the adapter declares it to LayeredModel as tied (see layered.py for how a
pipeline keeps the two stages' replicas equal). The decoder bias is also an alias (`cls.predictions.bias`),
but both names live in the head unit, so it needs no declaration.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from pathlib import Path

import torch
from torch import nn

from ptrun.config import ConfigError, ModelConfig
from ptrun.models.layered import LayeredModel

log = logging.getLogger(__name__)

# name -> (layers L, hidden H, heads A); the intermediate size is 4H unless `mlp_ratio` is set.
PRESETS = {
    "bert-tiny": (2, 128, 2),
    "bert-mini": (4, 256, 4),
    "bert-small": (4, 512, 8),
    "bert-medium": (8, 512, 8),
    "bert-base": (12, 768, 12),
    "bert-large": (24, 1024, 16),
}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")


def is_hf_dir(path: str | None) -> bool:
    """A Hugging Face model directory (has config.json)."""
    return path is not None and (Path(path).expanduser() / "config.json").is_file()


class BertEmbed(nn.Module):
    """Embeddings, plus the float additive mask every attention half needs."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        keep = attention_mask[:, None, None, :].to(hidden.dtype)
        return hidden, (1.0 - keep) * torch.finfo(hidden.dtype).min


class BertAttnHalf(nn.Module):
    """BertAttention: self-attention, output dense + dropout, LayerNorm(x + .)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.attention(hidden, attention_mask=ext_mask)
        return (out[0] if isinstance(out, tuple) else out), ext_mask


class BertMlpHalf(nn.Module):
    """BertIntermediate + BertOutput: dense, activation, dense + dropout, LayerNorm(x + .)."""

    def __init__(self, intermediate: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.intermediate, self.output = intermediate, output

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.output(self.intermediate(hidden), hidden), ext_mask


class BertClassifierHead(nn.Module):
    """pooler (first token, dense, tanh) -> dropout -> classifier: logits (B, num_labels)."""

    def __init__(self, pooler: nn.Module, dropout: nn.Module, classifier: nn.Module) -> None:
        super().__init__()
        self.pooler, self.dropout, self.classifier = pooler, dropout, classifier

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(self.pooler(hidden)))


class BertMlmHead(nn.Module):
    """BertOnlyMLMHead (`model.cls`): transform (dense, activation, LayerNorm) -> decoder: logits (B, T, vocab).

    The decoder weight is the word-embedding weight (tied); the attention mask is not needed.
    """

    def __init__(self, cls: nn.Module) -> None:
        super().__init__()
        self.cls = cls

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> torch.Tensor:
        return self.cls(hidden)


class BertQAHead(nn.Module):
    """qa_outputs: logits (B, T, 2), start in [..., 0] and end in [..., 1]."""

    def __init__(self, qa_outputs: nn.Module) -> None:
        super().__init__()
        self.qa_outputs = qa_outputs

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> torch.Tensor:
        return self.qa_outputs(hidden)


def _preset_sizes(cfg: ModelConfig, vocab_size: int | None) -> dict:
    """BertConfig size fields: the preset for `cfg.name`, overridden by the fields set in cfg."""
    if cfg.name not in PRESETS:
        raise ConfigError(f"model.name={cfg.name!r} is not a known model: BERT names are "
                          f"{', '.join(PRESETS)} (or a Hugging Face directory as model.pretrained)")
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


def _check_against_dir(cfg: ModelConfig, hf_config) -> None:
    """Size fields set in cfg must agree with the pretrained directory's (they cannot change its weights)."""
    have = {"depth": hf_config.num_hidden_layers, "embed_dim": hf_config.hidden_size,
            "num_heads": hf_config.num_attention_heads, "vocab_size": hf_config.vocab_size,
            "max_position_embeddings": hf_config.max_position_embeddings,
            "mlp_ratio": hf_config.intermediate_size / hf_config.hidden_size}
    for key, value in have.items():
        want = getattr(cfg, key)
        if want is not None and want != value:
            raise ConfigError(f"model.{key}={want!r} is not allowed: model.pretrained={cfg.pretrained!r} "
                              f"has {value!r}; leave it null")


def _tied_decoder(model: nn.Module) -> list[nn.Parameter]:
    """The MLM decoder weight, checked to be the word-embedding Parameter itself when the config ties them.

    transformers ties them in `post_init` (also while the parameters are on the meta device); a copy instead of
    the same object would train two diverging matrices, so it is an error rather than silently untied.
    """
    decoder = model.cls.predictions.decoder.weight
    if not model.config.tie_word_embeddings:
        return []  # a checkpoint that trained them untied: two ordinary parameters, nothing to declare
    if decoder is not model.bert.embeddings.word_embeddings.weight:
        raise RuntimeError("BertForMaskedLM: tie_word_embeddings is set but the decoder weight is not the "
                           "word-embedding Parameter")
    return [decoder]


def build_bert(cfg: ModelConfig, *, num_classes: int, vocab_size: int | None) -> LayeredModel:
    """BertForSequenceClassification (task classification), BertForQuestionAnswering (task qa) or
    BertForMaskedLM (task mlm, whose word-embedding / decoder weight is declared tied)."""
    from transformers import BertConfig, BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification

    cls = {"qa": BertForQuestionAnswering, "mlm": BertForMaskedLM}.get(cfg.task, BertForSequenceClassification)
    num_labels = 2 if cfg.task == "qa" else (cfg.num_classes or num_classes)
    dropout = dict(hidden_dropout_prob=cfg.dropout, attention_probs_dropout_prob=cfg.dropout)
    if is_hf_dir(cfg.pretrained):
        # The directory's configuration; its weights are read per unit as units are filled (ptrun.models.weights).
        path = str(Path(cfg.pretrained).expanduser())  # type: ignore[arg-type]
        config = BertConfig.from_pretrained(path, num_labels=num_labels, attn_implementation=cfg.attention, **dropout)
        model_type = json.loads(Path(path, "config.json").read_text()).get("model_type")
        if model_type != "bert" or config.is_decoder:
            raise ConfigError(f"model.pretrained={cfg.pretrained!r} is not allowed: ptrun needs a BERT "
                              f"encoder, this is a {model_type} (is_decoder={config.is_decoder})")
        _check_against_dir(cfg, config)
    else:
        config = BertConfig(**_preset_sizes(cfg, vocab_size), num_labels=num_labels, attn_implementation=cfg.attention,
                            **dropout)
    model = cls(config)

    units: list[nn.Module] = [BertEmbed(model.bert.embeddings)]
    for layer in model.bert.encoder.layer:
        units += [BertAttnHalf(layer.attention), BertMlpHalf(layer.intermediate, layer.output)]
    tied: list[nn.Parameter] = []
    if cfg.task == "qa":
        units.append(BertQAHead(model.qa_outputs))
    elif cfg.task == "mlm":
        units.append(BertMlmHead(model.cls))
        tied = _tied_decoder(model)
    else:
        units.append(BertClassifierHead(model.bert.pooler, model.dropout, model.classifier))
    return LayeredModel(model, family="bert", task=cfg.task, units=units, input_names=INPUT_NAMES, tied=tied,
                        init=partial(init_bert_unit, model))


def init_bert_unit(model: nn.Module, unit: nn.Module) -> None:
    """transformers' own initialisation (`_init_weights`: Linear and Embedding normal with the config's
    `initializer_range`, zero biases and padding row, LayerNorm ones and zeros), for one unit's modules."""
    for module in unit.modules():
        model._init_weights(module)
