"""Optimizer and learning-rate schedule from config.

The optimizer only ever holds this rank's trainable parameters; a stage with none gets no optimizer
(`build_optimizer` returns None) rather than one over an empty list.
"""

from __future__ import annotations

import torch
from torch import nn

from ptrun.config import LR_SCHEDULE_SPECS, OPTIMIZER_SPECS, OptimConfig

# Parameters that conventionally take no weight decay besides biases and norm weights (ndim <= 1).
NO_DECAY_NAMES = ("pos_embed", "cls_token", "reg_token", "position_embeddings", "token_type_embeddings")


def build_optimizer(named_params: list[tuple[str, nn.Parameter]], cfg: OptimConfig) -> torch.optim.Optimizer | None:
    named_params = [(n, p) for n, p in named_params if p.requires_grad]
    if not named_params:
        return None
    decay = [p for n, p in named_params if p.ndim > 1 and not any(k in n for k in NO_DECAY_NAMES)]
    no_decay = [p for n, p in named_params if not (p.ndim > 1 and not any(k in n for k in NO_DECAY_NAMES))]
    groups = [
        g
        for g in ({"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0})
        if g["params"]
    ]
    # The fused kernels (CPU and CUDA) update every parameter in one pass; the default single-tensor path
    # costs ~4x as much per step on a small model (measured: 2.4 against 9.9 ms for 200 k parameters).
    impl = {"fused": True} if all(p.is_floating_point() for _, p in named_params) else {"foreach": True}
    spec = OPTIMIZER_SPECS[cfg.name]
    return getattr(torch.optim, spec.torch_class)(groups, lr=cfg.lr, **spec.options(cfg), **impl)


def lr_factor(step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based) of `total_steps`."""
    warmup = int(cfg.warmup_fraction * total_steps)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return LR_SCHEDULE_SPECS[cfg.schedule](progress)


def set_lr(optimizer: torch.optim.Optimizer | None, step: int, total_steps: int, cfg: OptimConfig) -> float:
    """Set every group's learning rate for `step`; a pure function of the step, so it needs no state of
    its own in checkpoints and is the same on every rank and after any layout change."""
    lr = cfg.lr * lr_factor(step, total_steps, cfg)
    if optimizer is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return lr
