"""Task losses that see sample weights, so padded samples (weight 0) count for nothing.

A pipeline schedule hands its loss function one micro-batch's output and target; the target therefore
carries the label(s) and the sample weight in one tensor, `[..., label(s), weight]` (int64; float64 for a
real-valued regression label). Each
micro-batch's loss is divided by the total weight of the *global* batch, so summing micro-batch losses
over stages' replicas gives exactly the global mean, whatever the layout (K, M, DP width).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LABEL_KEYS = {
    "classification": ("labels",),
    "regression": ("labels",),
    "qa": ("start_positions", "end_positions"),
    "mlm": ("labels",),
    "causal_lm": ("labels",),
}
TOKEN_TASKS = ("mlm", "causal_lm")
"""Tasks whose labels are one per token ([b, T]) and whose loss is a mean over the predicted tokens."""
IGNORE_INDEX = -100
"""Label of a token that is not predicted (transformers' convention): MLM's unmasked tokens, padding."""


def make_target(batch: dict[str, torch.Tensor], task: str) -> torch.Tensor:
    """Stack the task's labels and the 0/1 sample weight into one int64 tensor [b, n_labels + 1]
    (for `mlm` and `causal_lm`, the labels are the [b, T] token labels, so the target is [b, T + 1])."""
    if task == "regression":  # a real-valued label (STS-B's similarity score): the target is float64
        return torch.stack([batch["labels"].double(), batch["weight"].double()], dim=1)
    weight = batch["weight"].round().long()[:, None]
    if task in TOKEN_TASKS:
        return torch.cat([batch["labels"].long(), weight], dim=1)
    return torch.cat([batch[k].long()[:, None] for k in LABEL_KEYS[task]] + [weight], dim=1)


def predicted(target: torch.Tensor, task: str) -> torch.Tensor:
    """The token labels a token task predicts, [b, T'] (`causal_lm`: each position predicts the next token,
    so the first label has no prediction; the labels are shifted as transformers' causal-LM loss does)."""
    labels = target[:, :-1]
    return labels[:, 1:] if task == "causal_lm" else labels


def loss_weight(target: torch.Tensor, task: str) -> torch.Tensor:
    """What this target adds to the loss denominator: the real samples, or for a token task the predicted
    tokens of the real samples (MLM's and causal LM's loss is a mean over predicted tokens)."""
    weight = target[:, -1].to(torch.float64)
    if task in TOKEN_TASKS:
        return ((predicted(target, task) != IGNORE_INDEX).to(torch.float64) * weight[:, None]).sum()
    return weight.sum()


def batch_denominator(train, indices: torch.Tensor, weights: torch.Tensor, task: str) -> float:
    """The loss weight of a whole global batch (`indices` into the training set `train`, with their 0/1
    weights), which every rank needs before the step though it holds only its share: its real samples, or for
    a token task their predicted tokens."""
    if task not in TOKEN_TASKS:
        return float(weights.sum())
    labels = train[list(map(int, indices))]["labels"]
    return float(loss_weight(make_target({"labels": labels, "weight": weights}, task), task))


def per_sample_loss(output: torch.Tensor, target: torch.Tensor, task: str) -> torch.Tensor:
    """Unweighted loss of every sample in the micro-batch, shape [b] (for a token task: summed over its
    predicted tokens)."""
    if task == "classification":
        return F.cross_entropy(output.float(), target[:, 0], reduction="none")
    if task == "regression":  # one output per sample, squared error (transformers' num_labels == 1 loss)
        return (output.float().reshape(-1) - target[:, 0].float()) ** 2
    if task in TOKEN_TASKS:
        labels = predicted(target, task)
        if task == "causal_lm":  # the last position predicts no label: it gets the ignored one (no logit slice)
            labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)
        # [b * T, vocab] rows, as transformers computes it: cross_entropy over a [b, vocab, T] view (the
        # class dimension second) runs several times slower, forward and backward.
        token = F.cross_entropy(
            output.float().reshape(-1, output.shape[-1]),
            labels.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="none",
        )
        return token.view(labels.shape).sum(dim=1)
    # qa: logits [b, T, 2]; the loss is the mean of the start and end cross-entropies (BERT's QA loss).
    start = F.cross_entropy(output[..., 0].float(), target[:, 0], reduction="none")
    end = F.cross_entropy(output[..., 1].float(), target[:, 1], reduction="none")
    return (start + end) / 2


class WeightedLoss:
    """The schedule's loss_fn, a pure function of its arguments: the weighted sum of the per-sample losses
    over `denominator` (the global batch's `loss_weight`, so the loss is a mean over exactly its samples),
    times `scale` (fp16's loss scale; 1 otherwise), which multiplies the loss backward starts from. Each
    step's runtime passes them (a pipeline schedule through its `loss_kwargs`); the defaults, a plain sum,
    serve where the loss is computed and dropped (a schedule's evaluation pass). It holds only its task:
    one object serves every step and layout, and nothing can be left on it from an earlier step."""

    __slots__ = ("task",)

    def __init__(self, task: str):
        self.task = task

    def __call__(
        self, output: torch.Tensor, target: torch.Tensor, *, denominator: float = 1.0, scale: float = 1.0
    ) -> torch.Tensor:
        weight = target[:, -1].to(torch.float32)
        return (per_sample_loss(output, target, self.task) * weight).sum() / denominator * scale
