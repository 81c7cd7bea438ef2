"""transformers encoders as units: BERT, RoBERTa / XLM-R, ELECTRA and DistilBERT.

embed | (attention half, MLP half) x L | head. Every unit after the embedding takes and returns
`(hidden, ext_mask)`, the additive attention mask [B, 1, 1, T] that every attention half needs, so it reaches
every pipeline stage. Attention is the config's (`model.attention`): `sdpa` (torch's fused kernel, as
transformers picks; the additive mask goes in as SDPA's `attn_mask`) or `eager`, which adds the mask to the
scores as the library's eager forward does. The halves call the library's own modules: BERT, RoBERTa, XLM-R
and ELECTRA share one layer layout (`attention`, `intermediate`, `output`, each with its residual add and
LayerNorm inside); DistilBERT's block keeps the residual adds and LayerNorms beside its modules.
"""

from __future__ import annotations

import torch
from torch import nn


class EncoderEmbed(nn.Module):
    """Embeddings (plus ELECTRA's projection to the hidden width), and the additive mask."""

    def __init__(self, embeddings: nn.Module, project: nn.Module | None = None) -> None:
        super().__init__()
        self.embeddings, self.project = embeddings, project

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if token_type_ids is None:  # the family takes none (RoBERTa, DistilBERT): its own default
            hidden = self.embeddings(input_ids)
        else:
            hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        if self.project is not None:
            hidden = self.project(hidden)
        keep = attention_mask[:, None, None, :].to(hidden.dtype)
        return hidden, (1.0 - keep) * torch.finfo(hidden.dtype).min


class AttnHalf(nn.Module):
    """The layer's attention module: self-attention, output dense + dropout, LayerNorm(x + .)."""

    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.attention(hidden, attention_mask=ext_mask)
        return (out[0] if isinstance(out, tuple) else out), ext_mask


class MlpHalf(nn.Module):
    """`intermediate` + `output`: dense, activation, dense + dropout, LayerNorm(x + .)."""

    def __init__(self, intermediate: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.intermediate, self.output = intermediate, output

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.output(self.intermediate(hidden), hidden), ext_mask


class DistilAttnHalf(nn.Module):
    """DistilBERT: sa_layer_norm(x + attention(x))."""

    def __init__(self, attention: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.attention, self.norm = attention, norm

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.attention(hidden, attention_mask=ext_mask)
        return self.norm((out[0] if isinstance(out, tuple) else out) + hidden), ext_mask


class DistilMlpHalf(nn.Module):
    """DistilBERT: output_layer_norm(x + ffn(x))."""

    def __init__(self, ffn: nn.Module, norm: nn.Module) -> None:
        super().__init__()
        self.ffn, self.norm = ffn, norm

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.norm(self.ffn(hidden) + hidden), ext_mask


class Head(nn.Module):
    """The task model's own head modules in order, applied to the hidden states; `first_token` takes the
    first token first ([CLS] / <s>), for heads that expect it pooled (BERT's pooler does it itself)."""

    def __init__(self, *modules: nn.Module, first_token: bool = False) -> None:
        super().__init__()
        self.layers = nn.ModuleList(modules)
        self.first_token = first_token

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> torch.Tensor:
        out = hidden[:, 0] if self.first_token else hidden
        for layer in self.layers:
            out = layer(out)
        return out


def split_encoder(model: nn.Module, task: str) -> list[nn.Module]:
    """The units of an encoder task model (`...ForSequenceClassification`, `...ForQuestionAnswering`,
    `BertForMaskedLM`)."""
    base = getattr(model, model.base_model_prefix)
    units: list[nn.Module] = [EncoderEmbed(base.embeddings, getattr(base, "embeddings_project", None))]
    if hasattr(base, "transformer"):  # DistilBERT
        for block in base.transformer.layer:
            units += [DistilAttnHalf(block.attention, block.sa_layer_norm),
                      DistilMlpHalf(block.ffn, block.output_layer_norm)]
    else:
        for layer in base.encoder.layer:
            units += [AttnHalf(layer.attention), MlpHalf(layer.intermediate, layer.output)]
    units.append(encoder_head(model, task))
    return units


def encoder_head(model: nn.Module, task: str) -> nn.Module:
    """The task head over the last hidden states, as the task model's forward applies it."""
    if task == "qa":  # logits [B, T, 2]: start in [..., 0], end in [..., 1]
        return Head(*[m for m in (getattr(model, "dropout", None), model.qa_outputs) if m is not None])
    if task == "mlm":  # BertOnlyMLMHead: transform, then the decoder (tied to the word embedding)
        return Head(model.cls)
    if hasattr(model, "pre_classifier"):  # DistilBERT: first token, dense, ReLU, dropout, classifier
        return Head(model.pre_classifier, nn.ReLU(), model.dropout, model.classifier, first_token=True)
    # BERT's pooler is the base model's (first token, dense, tanh); DeBERTa's ContextPooler the task model's
    # (first token, dropout, dense, activation)
    pooler = getattr(model, "pooler", None) or getattr(getattr(model, model.base_model_prefix), "pooler", None)
    if pooler is not None:  # pooler, dropout, classifier
        return Head(pooler, model.dropout, model.classifier)
    return Head(model.classifier)  # RoBERTa / XLM-R / ELECTRA: their classification head pools itself
