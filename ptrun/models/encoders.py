"""transformers encoders as units: BERT, RoBERTa / XLM-R, ELECTRA and DistilBERT.

embed | (attention half, MLP half) x L | head. Every unit after the embedding takes and returns
`(hidden, ext_mask)`, the additive attention mask [B, 1, 1, T] that every attention half needs, so it reaches
every pipeline stage. Attention is the config's (`model.attention`): `sdpa` (torch's fused kernel, as
transformers picks; the additive mask goes in as SDPA's `attn_mask`) or `eager`, which adds the mask to the
scores as the library's eager forward does. The halves call the library's own modules: BERT, RoBERTa, XLM-R
and ELECTRA share one layer layout (`attention`, `intermediate`, `output`, each with its residual add and
LayerNorm inside); DistilBERT's block keeps the residual adds and LayerNorms beside its modules.

A sequence-classification head reads the first token only ([CLS] / <s>: BERT's pooler, RoBERTa's and
ELECTRA's classification heads, DistilBERT's pre-classifier), so the last layer's other rows are computed for
nothing: all of its work but the keys and values, about five sixths of a layer (DistilBERT: its MLP, two
thirds), in every step while the layer trains and most of a step once it is the only one. There the last
attention half returns the first token's row only, [B, 1, H], and the MLP half after it runs that one row.
BERT, RoBERTa, XLM-R and ELECTRA also ask the first token's query only (keys and values still come from every
token), through the family's own cross-attention forward run on the layer's self-attention weights;
DistilBERT's attention takes no separate query, so it runs whole and keeps one row. Logits and gradients are
the library's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
from torch import nn

from ptrun.config.model import POOLED_TASKS


class EncoderEmbed(nn.Module):
    """Embeddings (plus ELECTRA's projection to the hidden width), and the additive mask."""

    def __init__(self, embeddings: nn.Module, project: nn.Module | None = None) -> None:
        super().__init__()
        self.embeddings, self.project = embeddings, project

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if token_type_ids is None:  # the family takes none (RoBERTa, DistilBERT): its own default
            hidden = self.embeddings(input_ids)
        else:
            hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        if self.project is not None:
            hidden = self.project(hidden)
        keep = attention_mask[:, None, None, :].to(hidden.dtype)
        return hidden, (1.0 - keep) * torch.finfo(hidden.dtype).min


class AttnHalf(nn.Module):
    """The layer's attention module: self-attention, output dense + dropout, LayerNorm(x + .). With
    `first_token` (the family's cross-attention forward, see the module's docstring) it returns the first
    token's row only."""

    def __init__(self, attention: nn.Module, first_token: Callable | None = None) -> None:
        super().__init__()
        self.attention = attention
        self.first_token = first_token

    @property
    def first_token_only(self) -> bool:
        """Whether the output is the first token's row only ([B, 1, H])."""
        return self.first_token is not None

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.first_token is not None:
            query = hidden[:, :1]
            context = self.first_token(
                self.attention.self, query, encoder_hidden_states=hidden, attention_mask=ext_mask
            )[0]
            return self.attention.output(context, query), ext_mask
        out = self.attention(hidden, attention_mask=ext_mask)
        return (out[0] if isinstance(out, tuple) else out), ext_mask


def first_token_attention(attention: nn.Module) -> Callable | None:
    """The forward that runs `attention`'s self-attention weights for one query row: the family's own
    `<Name>CrossAttention.forward` (BERT, RoBERTa, XLM-R and ELECTRA define it beside `<Name>SelfAttention`,
    reading the same attributes: query, key, value, dropout, scaling), which takes queries from one tensor and
    keys and values from another. None where the library has none, or where the layer is not plain
    self-attention over absolute positions (a relative-position or causal one would need more than that)."""
    inner = getattr(attention, "self", None)
    name = type(inner).__name__
    if inner is None or not hasattr(attention, "output") or not name.endswith("SelfAttention"):
        return None
    if getattr(inner, "is_causal", False) or getattr(inner, "position_embedding_type", "absolute") != "absolute":
        return None
    cross = getattr(sys.modules[type(inner).__module__], name[: -len("SelfAttention")] + "CrossAttention", None)
    return getattr(cross, "forward", None)


class MlpHalf(nn.Module):
    """`intermediate` + `output`: dense, activation, dense + dropout, LayerNorm(x + .)."""

    def __init__(self, intermediate: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.intermediate, self.output = intermediate, output

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.output(self.intermediate(hidden), hidden), ext_mask


class DistilAttnHalf(nn.Module):
    """DistilBERT: sa_layer_norm(x + attention(x)); the first token's row only with `first_token_only`."""

    def __init__(self, attention: nn.Module, norm: nn.Module, first_token_only: bool = False) -> None:
        super().__init__()
        self.attention, self.norm = attention, norm
        self.first_token_only = first_token_only

    def forward(self, hidden: torch.Tensor, ext_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.attention(hidden, attention_mask=ext_mask)
        out = out[0] if isinstance(out, tuple) else out
        if self.first_token_only:
            out, hidden = out[:, :1], hidden[:, :1]
        return self.norm(out + hidden), ext_mask


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
    `BertForMaskedLM`). Under a sequence-classification head the last layer computes the first token only."""
    base = getattr(model, model.base_model_prefix)
    units: list[nn.Module] = [EncoderEmbed(base.embeddings, getattr(base, "embeddings_project", None))]
    first_token = task in POOLED_TASKS  # each family here pools the first token
    if hasattr(base, "transformer"):  # DistilBERT
        blocks = list(base.transformer.layer)
        for block in blocks:
            units += [
                DistilAttnHalf(block.attention, block.sa_layer_norm, first_token and block is blocks[-1]),
                DistilMlpHalf(block.ffn, block.output_layer_norm),
            ]
    else:
        layers = list(base.encoder.layer)
        for layer in layers:
            last = first_token and layer is layers[-1]
            units += [
                AttnHalf(layer.attention, first_token_attention(layer.attention) if last else None),
                MlpHalf(layer.intermediate, layer.output),
            ]
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
