"""transformers' ModernBERT (`model_type` `modernbert`) as units.

embed | (attention half, MLP half) x L | head. ModernBERT's layer is pre-norm like the decoders' (x + attn(norm(x)),
then x + mlp(norm(x)); layer 0's attention norm is an identity), so the embedding and MLP halves are the
decoders' (`ptrun.models.decoders`) and every unit after the embedding takes and returns `(hidden, keep)`, `keep`
being the float 0/1 padding mask [B, T]. The library runs the padded path here (its masks are built from the
padding mask; nothing is unpadded). What it builds once at model level, the attention halves build once a pass on
each stage (`ptrun.models.per_pass`), for their layer's type, with the library's own functions:

- the mask of the layer's type (`config.layer_types`): `create_bidirectional_mask` for a global layer,
  `create_bidirectional_sliding_window_mask` for a local one (window `local_attention`), as the model does;
- the rotary position embeddings of the layer's type (global and local layers use different RoPE theta):
  `rotary_emb(hidden, positions, layer_type)`. The rotary module holds buffers only (no parameter), so every
  attention half may register the model's one module. Inputs are padded on the right, so positions are
  0..T-1 on every stage without carrying them.

Head: the final norm, then pooling (`classifier_pooling`: the first token, or the mean over the real tokens,
from `keep`), the prediction head (dense, activation, norm), dropout and the classifier; for `qa` the same at
every token, without pooling. Under first-token pooling the last attention half keeps the first token's row
and the MLP half after it runs that row only: the head reads nothing else (`ptrun.models.encoders` says why).
"""

from __future__ import annotations

import torch
from torch import nn

from ptrun.models.decoders import DecoderMlpHalf, TokenEmbed, positions
from ptrun.models.per_pass import shared


class ModernBertAttnHalf(nn.Module):
    """x + attention(attn_norm(x)) with the mask and rotary embedding of the layer's type."""

    def __init__(
        self,
        config,
        norm: nn.Module,
        attention: nn.Module,
        layer_type: str,
        rotary: nn.Module,
        first_token_only: bool = False,
    ) -> None:
        super().__init__()
        self.config, self.layer_type = config, layer_type
        self.norm, self.attention, self.rotary = norm, attention, rotary
        self.first_token_only = first_token_only

    def mask(self, hidden: torch.Tensor, keep: torch.Tensor):
        """The library model's mask for this layer's type (None where sdpa needs none: no padding)."""
        # inner import: optional library
        from transformers.masking_utils import create_bidirectional_mask, create_bidirectional_sliding_window_mask

        make = (
            create_bidirectional_sliding_window_mask
            if self.layer_type == "sliding_attention"
            else create_bidirectional_mask
        )
        return make(config=self.config, inputs_embeds=hidden, attention_mask=keep > 0.5)

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        key = (self.layer_type, hidden.dtype)  # the layers of one type share a mask and a rotary table
        rope = shared(("rotary", *key), lambda: self.rotary(hidden, positions(hidden), self.layer_type))
        mask = shared(("mask", *key), lambda: self.mask(hidden, keep))
        out, _ = self.attention(self.norm(hidden), position_embeddings=rope, attention_mask=mask)
        if self.first_token_only:
            return hidden[:, :1] + out[:, :1], keep
        return hidden + out, keep


class ModernBertHead(nn.Module):
    """Final norm, pooling (classification / regression: `classifier_pooling`; none for qa), then the task
    model's `head`, `drop` and `classifier`."""

    def __init__(
        self, final_norm: nn.Module, head: nn.Module, drop: nn.Module, classifier: nn.Module, pooling: str | None
    ) -> None:
        super().__init__()
        self.final_norm, self.head, self.drop, self.classifier = final_norm, head, drop, classifier
        self.pooling = pooling

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        hidden = self.final_norm(hidden)
        if self.pooling == "cls":
            hidden = hidden[:, 0]
        elif self.pooling == "mean":  # over the real tokens, as the library pools with the attention mask
            hidden = (hidden * keep.unsqueeze(-1)).sum(dim=1) / keep.sum(dim=1, keepdim=True)
        return self.classifier(self.drop(self.head(hidden)))


def split_modernbert(model: nn.Module, task: str) -> list[nn.Module]:
    """The units of a ModernBERT task model (`...ForSequenceClassification`, `...ForQuestionAnswering`)."""
    base = model.model
    config = model.config
    units: list[nn.Module] = [TokenEmbed(base.embeddings)]
    pooling = None if task == "qa" else config.classifier_pooling
    for layer in base.layers:
        units += [
            ModernBertAttnHalf(
                config,
                layer.attn_norm,
                layer.attn,
                layer.attention_type,
                base.rotary_emb,
                pooling == "cls" and layer is base.layers[-1],
            ),
            DecoderMlpHalf(layer.mlp_norm, layer.mlp),
        ]
    units.append(ModernBertHead(base.final_norm, model.head, model.drop, model.classifier, pooling))
    return units
