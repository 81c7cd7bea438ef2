"""`StageModule`: one pipeline stage's slice of a model's units, run in order, with the stage's
recomputation (activation checkpointing), compute dtype and compiled units."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ptrun.compiling.compiler import UnitCompiler, as_frozen, no_grad_if
from ptrun.models.layered import run_units
from ptrun.models.per_pass import one_pass
from ptrun.numerics.precision import autocast


class StageModule(nn.Module):
    """A contiguous slice of units, run in order; each unit's output is splatted into the next.

    With recomputation on, the forward pass keeps only the inputs of each checkpointed chunk and the backward
    pass runs the chunk again (non-reentrant checkpointing, which restores the RNG state so dropout masks
    match).

    With a `compute_dtype` (bf16 / fp16) the units run under autocast and the stage's main output (the hidden
    states; masks stay as they are) leaves in that dtype, so half the bytes cross to the next stage.

    The stage's leading frozen units (a frozen prefix; freezing builds new stages) run under `no_grad` where
    the stage's input takes no gradient, as autograd would record nothing there anyway: with a `compiler`
    (`train.compile`), that is their own compiled variant, never the trained one (`ptrun.compiling.compiler`).
    The stage calls each unit's compiled form (`calls`), while `units` holds the modules themselves, so the
    parameters keep their names. `first` is the stage's first unit index in the model."""

    def __init__(
        self,
        units: Sequence[nn.Module],
        recompute: int | None = None,
        compute_dtype: torch.dtype | None = None,
        compiler: UnitCompiler | None = None,
        first: int = 0,
    ):
        super().__init__()
        self.units = nn.ModuleList(units)
        self.recompute = recompute
        self.compute_dtype = compute_dtype
        self.compiler, self.first = compiler, first
        self.calls = compiler.runners(units, first) if compiler is not None else list(units)
        self.frozen = next((i for i, u in enumerate(units) if any(p.requires_grad for p in u.parameters())), len(units))
        """Leading units with nothing to train (fixed for the stage: freezing builds new stages)."""

    def train(self, mode: bool = True) -> StageModule:
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
        if training and self.compiler is not None:
            self.compiler.remember(self.first, carry)
        evaluating = as_frozen(self) if self.compiler is not None and not torch.is_grad_enabled() else nullcontext()
        with autocast(carry[0].device, self.compute_dtype), one_pass(), evaluating:
            # A frozen prefix runs without autograd unless its input asks for a gradient (a stage after a stage
            # of frozen units only): then it runs eager, so no compiled graph is ever run for both.
            prefix = self.frozen if training else 0
            cut = prefix if not carry[0].requires_grad else 0
            with no_grad_if(cut > 0):
                out = run_units(self.calls[:cut], *carry) if cut else carry
            calls = list(self.units[:prefix]) + self.calls[prefix:] if cut < prefix else self.calls[cut:]
            out = out if isinstance(out, tuple) else (out,)
            if self.recompute is None or not training:
                out = run_units(calls, *out)
            else:
                size = self.recompute or len(calls)
                for lo in range(0, len(calls), size):
                    out = checkpoint(
                        run_units,
                        calls[lo : lo + size],
                        *(out if isinstance(out, tuple) else (out,)),
                        use_reentrant=False,
                    )
        head = out[0] if isinstance(out, tuple) else out
        if self.compute_dtype is not None and head.is_floating_point() and head.dtype != self.compute_dtype:
            head = head.to(self.compute_dtype)  # autocast keeps residual streams in float32
            out = (head, *out[1:]) if isinstance(out, tuple) else head
        if training and head.is_floating_point() and not head.requires_grad:
            # A stage of only frozen units (a frozen prefix on stage 0) computes its output without
            # autograd; the schedule still runs its backward, which needs an output that takes a gradient.
            head.requires_grad_(True)
        return out
