"""The update of one training step, after the runtime's forward and backward passes: the learning rate for
the step's position, the gradients made global and clipped, the optimizer step (skipped where fp16
overflowed), and each block's gradient norm for the freeze policies that read them.

    runtime.train_steps(steps, on_step)        # forward + backward per step, any runtime
      on_step(step, loss) -> update(...)       # this module: schedule, sync and clip, step
                          -> bookkeeping       # the trainer: counters, sample uses, what is due after it
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ptrun.config import OptimConfig
from ptrun.parallel.optim import set_lr
from ptrun.parallel.precision import LossScaler, step_or_skip


@dataclass(frozen=True)
class Update:
    """What one step's update did."""

    lr: float
    """The learning rate it stepped with."""
    stepped: bool
    """False when fp16's gradients overflowed somewhere and no rank stepped."""
    block_norms: torch.Tensor | None
    """Each block's gradient norm on this rank's stages (0 elsewhere), when asked for and stepped."""


def update(runtime, optimizer, scaler: LossScaler, optim: OptimConfig, grad_clip: float, progress: float,
           total_steps: int, block_of: dict[int, int] | None = None, num_blocks: int = 0) -> Update:
    """Collective over every rank of the job. `progress` is the step's position in the first layout's steps
    (the schedule's clock, `total_steps` long); `block_of` (parameter id -> block) asks for per-block norms."""
    lr = set_lr(optimizer, progress, total_steps, optim)
    want_norms = block_of is not None
    stepped = step_or_skip(runtime, optimizer, scaler, grad_clip, per_parameter=want_norms)
    norms = block_norms(runtime, block_of, num_blocks) if want_norms and stepped else None
    return Update(lr, stepped, norms)


def block_norms(runtime, block_of: dict[int, int], num_blocks: int) -> torch.Tensor:
    """Each block's gradient norm from the squared norms the last sync measured per parameter (kept on the
    device: no host sync per parameter)."""
    blocks = [block_of.get(id(p)) for p in runtime.grad_sq_params]
    in_block = [i for i, b in enumerate(blocks) if b is not None]
    sq = torch.zeros(num_blocks, dtype=torch.float64, device=runtime.grad_sq.device)
    sq.index_add_(0, torch.tensor([blocks[i] for i in in_block], dtype=torch.long, device=sq.device),
                  runtime.grad_sq[in_block].to(torch.float64))
    return sq.sqrt()
