"""`StageModule`: one pipeline stage's slice of a model's units, run in order, with the stage's
recomputation (activation checkpointing) and compute dtype."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ptrun.models.layered import run_units
from ptrun.models.per_pass import one_pass
from ptrun.parallel.precision import autocast


class StageModule(nn.Module):
    """A contiguous slice of units, run in order; each unit's output is splatted into the next.

    With recomputation on, the forward pass keeps only the inputs of each checkpointed chunk and the backward
    pass runs the chunk again (non-reentrant checkpointing, which restores the RNG state so dropout masks
    match).

    With a `compute_dtype` (bf16 / fp16) the units run under autocast and the stage's main output (the hidden
    states; masks stay as they are) leaves in that dtype, so half the bytes cross to the next stage."""

    def __init__(self, units: Sequence[nn.Module], recompute: int | None = None,
                 compute_dtype: torch.dtype | None = None):
        super().__init__()
        self.units = nn.ModuleList(units)
        self.recompute = recompute
        self.compute_dtype = compute_dtype

    def train(self, mode: bool = True) -> "StageModule":
        """Frozen units stay in eval mode (no dropout or stochastic depth): a frozen layer is a fixed
        function, the same here as in AutoCache's prefix, so caching it changes nothing."""
        super().train(mode)
        for unit in self.units:
            if not any(p.requires_grad for p in unit.parameters()):
                unit.train(False)
        return self

    def forward(self, *carry):
        training = self.training and torch.is_grad_enabled()
        if self.compute_dtype is not None and carry[0].dtype == self.compute_dtype:
            # Received in the compute dtype, the residual stream goes on in float32 as autocast keeps it in
            # one process: one rounding per boundary rather than bf16 sums through the rest of the model.
            carry = (carry[0].float(), *carry[1:])
        with autocast(carry[0].device, self.compute_dtype), one_pass():
            if self.recompute is None or not training:
                out = run_units(self.units, *carry)
            else:
                size = self.recompute or len(self.units)
                out = carry
                for lo in range(0, len(self.units), size):
                    chunk = list(self.units[lo : lo + size])
                    out = checkpoint(run_units, chunk, *(out if isinstance(out, tuple) else (out,)),
                                     use_reentrant=False)
        head = out[0] if isinstance(out, tuple) else out
        if self.compute_dtype is not None and head.is_floating_point() and head.dtype != self.compute_dtype:
            head = head.to(self.compute_dtype)  # autocast keeps residual streams in float32
            out = (head, *out[1:]) if isinstance(out, tuple) else head
        if training and head.is_floating_point() and not head.requires_grad:
            # A stage of only frozen units (a frozen prefix on stage 0) computes its output without
            # autograd; the schedule still runs its backward, which needs an output that takes a gradient.
            head.requires_grad_(True)
        return out
