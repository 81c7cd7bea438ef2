"""transformers' DeBERTa-v2 / v3 (`model_type` `deberta-v2`) as units.

embed | (attention half, MLP half) x L | head, as the BERT-like encoders (`ptrun.models.encoders`); every unit
after the embedding takes and returns `(hidden, keep)`, `keep` being the float 0/1 padding mask [B, T]. The
library computes two things once for the whole encoder that every layer reads; here each attention half
computes them on its own stage, so any cut works:

- the attention mask: the encoder's own rule (`get_attention_mask`, a method that reads no parameter) turns
  `keep` into DeBERTa's [B, 1, T, T] query-and-key mask; carrying the [B, T] mask instead of that one keeps what
  crosses a stage boundary T times smaller;
- the relative-position embeddings (disentangled attention): the encoder's `rel_embeddings` table, normalised by
  its LayerNorm when `norm_rel_ebd` says so (`get_rel_embedding`), shared by all layers. These are trained
  parameters, not buffers, so they cannot simply be copied to each stage. Every attention half registers the
  encoder's two modules themselves, and the builder declares their parameters tied (`shared_rel_embeddings`):
  the first attention half owns them, the others share them, and a pipeline keeps a replica on each stage
  that holds an attention half and sums the replicas' gradients before the step (`ptrun.models.layered`), so
  every replica takes the identical update: the exact gradient of the one shared table, as the library
  computes it in one process. Freezing follows the owner (block 0's attention half): once block 0 is frozen
  the table is fixed for the later layers too, so a cached frozen prefix stays valid. (The relative positions
  themselves are integers from the sequence length: the attention module builds them with the same bucket
  settings as the encoder when given none.)

DeBERTa-v2 xlarge / xxlarge add a convolution after layer 0 (`conv_kernel_size`, `ConvLayer`) over layer 0's
input and output. That ConvLayer runs in block 0's MLP half; block 0's attention half passes its own input on
as a third tensor, so only the boundary between the two halves of block 0 carries it.

DeBERTa has one attention implementation (its own disentangled eager one); `model.attention` does not apply.
"""

from __future__ import annotations

import torch
from torch import nn

from ptrun.models.encoders import encoder_head


class DebertaEmbed(nn.Module):
    """Word (+ position, + token type) embeddings, projection, LayerNorm, padded positions zeroed (the library's
    `mask=`); passes the padding mask on as float."""

    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, mask=attention_mask)
        return hidden, attention_mask.to(hidden.dtype)


class DebertaAttnHalf(nn.Module):
    """The layer's `attention` (disentangled self-attention, output dense, LayerNorm(x + .)), with the mask and
    the shared relative-position embeddings built here; block 0 of a model with the convolution also passes
    its input on to the MLP half."""

    def __init__(self, attention: nn.Module, encoder: nn.Module, pass_input: bool = False) -> None:
        super().__init__()
        self.attention = attention
        # The encoder's shared modules themselves (tied across the attention halves; see the module docstring).
        self.rel_embeddings = getattr(encoder, "rel_embeddings", None) if encoder.relative_attention else None
        self.rel_norm = getattr(encoder, "LayerNorm", None) if "layer_norm" in encoder.norm_rel_ebd else None
        # A bound method, not a submodule: it reads no parameter, and registering the encoder would claim all
        # of its layers' parameters for this unit.
        self.expand_mask = encoder.get_attention_mask
        self.pass_input = pass_input

    def rel_embedding(self) -> torch.Tensor | None:
        """The encoder's `get_rel_embedding`, from the modules this unit holds."""
        if self.rel_embeddings is None:
            return None
        table = self.rel_embeddings.weight
        return self.rel_norm(table) if self.rel_norm is not None else table

    def forward(self, hidden: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, _ = self.attention(hidden, self.expand_mask(keep), rel_embeddings=self.rel_embedding())
        return (out, keep, hidden) if self.pass_input else (out, keep)


class _ContiguousGradient(torch.autograd.Function):
    """The identity, whose backward pass makes its gradient contiguous."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class DebertaMlpHalf(nn.Module):
    """`intermediate` + `output` (dense, activation, dense, LayerNorm(x + .)); in block 0, the encoder's
    ConvLayer where the model has one, over the layer's input (from the attention half) and output."""

    def __init__(self, intermediate: nn.Module, output: nn.Module, conv: nn.Module | None = None) -> None:
        super().__init__()
        self.intermediate, self.output, self.conv = intermediate, output, conv

    def forward(
        self, hidden: torch.Tensor, keep: torch.Tensor, layer_input: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.output(self.intermediate(hidden), hidden)
        if self.conv is not None:
            # The convolution runs over the transposed input, so the gradient of `layer_input` comes back
            # transposed (not contiguous); when this unit starts a stage that gradient is sent to the previous
            # stage, and the pipeline's point-to-point receive needs a contiguous buffer.
            out = self.conv(_ContiguousGradient.apply(layer_input), out, keep)
        return out, keep


def split_deberta(model: nn.Module, task: str) -> list[nn.Module]:
    """The units of a DeBERTa-v2 task model (`...ForSequenceClassification`, `...ForQuestionAnswering`)."""
    base = model.deberta
    encoder = base.encoder
    units: list[nn.Module] = [DebertaEmbed(base.embeddings)]
    for i, layer in enumerate(encoder.layer):
        conv = encoder.conv if i == 0 else None
        units += [
            DebertaAttnHalf(layer.attention, encoder, pass_input=conv is not None),
            DebertaMlpHalf(layer.intermediate, layer.output, conv),
        ]
    units.append(encoder_head(model, task))
    return units


def shared_rel_embeddings(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every attention half uses: the relative-position table and its LayerNorm."""
    encoder = model.deberta.encoder
    if not encoder.relative_attention:
        return []
    modules = [encoder.rel_embeddings] + ([encoder.LayerNorm] if "layer_norm" in encoder.norm_rel_ebd else [])
    return [p for m in modules for p in m.parameters()]
