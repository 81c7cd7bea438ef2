"""The update of one training step, after the runtime's forward and backward passes: the learning rate for
the step's position, the gradients made global and clipped, the optimizer step (skipped where fp16
overflowed), and each block's gradient norm for the freeze policies that read them.

    runtime.train_steps(steps, on_step)        # forward + backward per step, any runtime
      on_step(step, loss) -> update(...)       # this module: schedule, sync and clip, step
                          -> bookkeeping       # the trainer: counters, sample uses, what is due after it
"""

from __future__ import annotations

import time
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
    signal_s: float = 0.0
    """Host seconds spent on `block_norms` (what the freeze policy's signal costs a step)."""


def update(runtime, optimizer, scaler: LossScaler, optim: OptimConfig, grad_clip: float, progress: float,
           total_steps: int, block_of: dict[int, int] | None = None, num_blocks: int = 0) -> Update:
    """Collective over every rank of the job. `progress` is the step's position in the first layout's steps
    (the schedule's clock, `total_steps` long); `block_of` (parameter id -> block) asks for per-block norms."""
    lr = set_lr(optimizer, progress, total_steps, optim)
    want_norms = block_of is not None
    stepped = step_or_skip(runtime, optimizer, scaler, grad_clip, per_parameter=want_norms)
    t0 = time.perf_counter()
    norms = block_norms(runtime, block_of, num_blocks) if want_norms and stepped else None
    return Update(lr, stepped, norms, time.perf_counter() - t0 if want_norms else 0.0)


def block_norms(runtime, block_of: dict[int, int], num_blocks: int) -> torch.Tensor:
    """Each block's gradient norm from the squared norms the last sync measured per parameter (kept on the
    device: no host sync per parameter). The gather index is made once per set of parameters: built every
    step, its copy to a GPU would wait for the step's kernels."""
    params = runtime.grad_sq_params
    ids = tuple(id(p) for p in params)
    cached = _BLOCK_INDEX.get(id(block_of))
    if cached is None or cached[0] != ids:
        blocks = [block_of.get(i) for i in ids]
        rows = [i for i, b in enumerate(blocks) if b is not None]
        device = runtime.grad_sq.device
        cached = (ids, torch.tensor(rows, dtype=torch.long, device=device),
                  torch.tensor([blocks[i] for i in rows], dtype=torch.long, device=device))
        _BLOCK_INDEX.clear()  # one layout's index at a time
        _BLOCK_INDEX[id(block_of)] = cached
    _, rows, blocks = cached
    sq = torch.zeros(num_blocks, dtype=torch.float64, device=runtime.grad_sq.device)
    sq.index_add_(0, blocks, runtime.grad_sq.index_select(0, rows).to(torch.float64))
    return sq.sqrt()


_BLOCK_INDEX: dict[int, tuple] = {}
"""`block_norms`' index for the parameter -> block map in use (by its id), with the parameters it was made for."""
