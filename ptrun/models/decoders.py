"""transformers decoders as units: GPT-2 and the Llama family (Llama, Qwen2, Qwen3, Mistral share its layout).

embed | (attention half, MLP half) x L | head. Every unit after the embedding takes and returns
`(hidden, keep)`, `keep` being the float 0/1 padding mask [B, T] (1 = a real token): the one tensor besides the
hidden states that crosses a stage boundary. Each attention half builds what it needs from it on its own stage,
with the library's own functions: the causal (or sliding-window) mask with `create_causal_mask` /
`create_sliding_window_causal_mask`, as the library model does for that layer's type, and the Llama family's
rotary position embeddings from the positions `0..T-1` (`rotary_emb`, which holds buffers only, so every
attention half may share it). Inputs are padded on the right, so positions are the same on every stage
without carrying them. As in the library model, each is built once a forward pass and stage, not per layer
(`ptrun.models.per_pass`).

Heads: `causal_lm` (final norm, `lm_head`: logits [B, T, vocab]; the loss shifts the labels) and
`classification` / `regression` (final norm, `score` at the last real token of each sequence, which is
where the library pools, from `input_ids != pad_token_id`; here from `keep`, so no pad token id is needed).
"""

from __future__ import annotations

import torch
from torch import nn

from ptrun.compat import causal_mask_kwargs, mask_parameters
from ptrun.models.per_pass import shared


def positions(hidden: torch.Tensor) -> torch.Tensor:
    """Positions 0..T-1 as the library builds them when given none ([1, T])."""
    return torch.arange(hidden.shape[1], device=hidden.device)[None]


def attention_mask(config, layer: int, hidden: torch.Tensor, keep: torch.Tensor):
    """The mask the library model gives layer `layer`: causal, or sliding-window where the layer's type says
    so (`config.layer_types`, Qwen2/Qwen3) or the model has one window for all layers (Mistral). May be None,
    which the library's sdpa path runs as `is_causal`."""
    from transformers.masking_utils import (  # inner import: optional library
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    types = getattr(config, "layer_types", None)
    sliding = (types[layer] == "sliding_attention") if types else getattr(config, "sliding_window", None) is not None
    make = create_sliding_window_causal_mask if sliding else create_causal_mask
    return make(
        config=config, inputs_embeds=hidden, attention_mask=keep > 0.5, **causal_mask_kwargs(make, positions(hidden))
    )


class TokenEmbed(nn.Module):
    """Token embeddings (plus GPT-2's learned positions and dropout); passes the padding mask on as float."""

    def __init__(
        self, tokens: nn.Module, learned_positions: nn.Module | None = None, dropout: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.tokens, self.learned_positions, self.dropout = tokens, learned_positions, dropout

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.tokens(input_ids)
        if self.learned_positions is not None:
            hidden = hidden + self.learned_positions(positions(hidden))
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        return hidden, attention_mask.to(hidden.dtype)


class DecoderAttnHalf(nn.Module):
    """x + attention(norm(x)) for layer `layer`: the layer's pre-attention norm and self-attention module,
    and (Llama family) the model's rotary embedding."""

    def __init__(
        self, config, layer: int, norm: nn.Module, attention: nn.Module, rotary: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.config, self.layer = config, layer
        # The rotary embedding holds buffers only (no parameter), so every attention half may register the
        # model's one module: it then moves with each stage to its device.
        self.norm, self.attention, self.rotary = norm, attention, rotary
        types = getattr(config, "layer_types", None)
        self.mask_kind = types[layer] if types else "attention"  # the layers of one type share a mask

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = shared(
            ("mask", self.mask_kind, hidden.dtype), lambda: attention_mask(self.config, self.layer, hidden, keep)
        )
        extra = {}
        if self.rotary is not None:
            extra["position_embeddings"] = shared(
                ("rotary", hidden.dtype), lambda: self.rotary(hidden, positions(hidden))
            )
        out = self.attention(self.norm(hidden), attention_mask=mask, **extra)
        return hidden + (out[0] if isinstance(out, tuple) else out), keep


class DecoderMlpHalf(nn.Module):
    """x + mlp(norm(x))."""

    def __init__(self, norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.norm, self.mlp = norm, mlp

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return hidden + self.mlp(self.norm(hidden)), keep


class LmHead(nn.Module):
    """Final norm, then `lm_head`: next-token logits [B, T, vocab] at every position."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module) -> None:
        super().__init__()
        self.norm, self.lm_head = norm, lm_head

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


class LastTokenHead(nn.Module):
    """Final norm, then `score` at each sequence's last real token: logits [B, num_labels]."""

    def __init__(self, norm: nn.Module, score: nn.Module) -> None:
        super().__init__()
        self.norm, self.score = norm, score

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        index = torch.arange(keep.shape[1], device=keep.device)
        last = (index * (keep > 0.5)).argmax(-1)  # the library's rule, from the mask instead of the pad id
        return self.score(self.norm(hidden[torch.arange(hidden.shape[0], device=hidden.device), last]))


def split_decoder(model: nn.Module, task: str) -> list[nn.Module]:
    """The units of a GPT-2 or Llama-family task model."""
    from transformers.masking_utils import (  # inner import: optional library
        create_causal_mask,
        create_sliding_window_causal_mask,
    )

    for make in (create_causal_mask, create_sliding_window_causal_mask):
        mask_parameters(make)  # read now, eagerly: a compiled attention half only looks them up
    base = getattr(model, model.base_model_prefix)
    config = model.config
    if hasattr(base, "wte"):  # GPT-2: wte + wpe, blocks of (ln_1, attn, ln_2, mlp), ln_f
        units: list[nn.Module] = [TokenEmbed(base.wte, base.wpe, base.drop)]
        for i, block in enumerate(base.h):
            units += [DecoderAttnHalf(config, i, block.ln_1, block.attn), DecoderMlpHalf(block.ln_2, block.mlp)]
        final_norm = base.ln_f
    else:  # Llama family: embed_tokens, layers of (input_layernorm, self_attn, post_attention_layernorm, mlp)
        units = [TokenEmbed(base.embed_tokens)]
        for i, layer in enumerate(base.layers):
            units += [
                DecoderAttnHalf(config, i, layer.input_layernorm, layer.self_attn, base.rotary_emb),
                DecoderMlpHalf(layer.post_attention_layernorm, layer.mlp),
            ]
        final_norm = base.norm
    if task == "causal_lm":
        units.append(LmHead(final_norm, model.lm_head))
    else:
        units.append(LastTokenHead(final_norm, model.score))
    return units


def tied_lm_head(model: nn.Module, task: str) -> list[nn.Parameter]:
    """The output projection when it is the input embedding itself (`tie_word_embeddings`: GPT-2, small
    Qwen models); the embed and head units then share it across stages."""
    if task != "causal_lm":
        return []
    head, embedding = model.lm_head.weight, model.get_input_embeddings().weight
    return [head] if head is embedding else []
