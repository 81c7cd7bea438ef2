"""Mixed precision: the dtype stages compute in, and fp16's loss scale.

Under `train.precision=bf16|fp16` every stage runs its forward pass (and the last stage its loss) under
`torch.autocast`; parameters, gradients and optimizer state stay float32 (the master weights), so the
optimizer step is the fp32 one. Activations leave a stage in the compute dtype, which halves what crosses a
stage boundary (and what AutoCache stores by default).

fp16's range ends at 65504, so small gradients underflow unless the loss is scaled up before backward and the
gradients scaled down after. A scale that is too large overflows instead; then the step must be skipped and
the scale lowered. In a pipeline the overflow may happen on one stage only, so the decision is taken from the
global gradient norm, which is all-reduced over every stage and replica anyway: every rank sees the same
norm, hence the same verdict, steps or skips together, and keeps the same scale. (torch.amp.GradScaler checks
each rank's own gradients only, which would let the stages' weights drift apart.)
"""

from __future__ import annotations

import contextlib

import torch

from ptrun.config import PRECISION_SPECS


def compute_dtype(precision: str) -> torch.dtype | None:
    """`train.precision`'s autocast dtype (`ptrun.config.PRECISION_SPECS`; None: plain float32)."""
    name = PRECISION_SPECS[precision].autocast
    return None if name is None else getattr(torch, name)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """torch.autocast for `dtype` on `device`'s type, or nothing for float32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class LossScaler:
    """fp16's dynamic loss scale (torch.amp.GradScaler's defaults and update rule), driven by a verdict all
    ranks agree on. Disabled (fp32, bf16) it is a constant 1 that never skips a step."""

    @classmethod
    def for_precision(cls, precision: str) -> LossScaler:
        """The scaler of `train.precision` (`Precision.loss_scale`)."""
        return cls(enabled=PRECISION_SPECS[precision].loss_scale)

    def __init__(
        self,
        enabled: bool,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ):
        self.enabled = enabled
        self.scale = init_scale if enabled else 1.0
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good_steps = 0
        self.skipped = 0

    def update(self, finite: bool) -> bool:
        """Record one step's verdict (the global gradient norm is finite); returns whether to step."""
        if not self.enabled:
            return True
        if not finite:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale *= self.growth_factor
            self.good_steps = 0
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped}

    def load_state_dict(self, state: dict) -> None:
        if self.enabled and state:
            self.scale, self.good_steps, self.skipped = state["scale"], state["good_steps"], state["skipped"]
