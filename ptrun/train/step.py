"""One training step's update, which the runtime asks for once its forward and backward passes have run:

    def apply_update(item, loss):  # the runtime calls it for each step whose update is due
        state, done = train_step(state, progress, StepParts(...), item.step)  # this module: the update

    runtime.run_step(step, apply_update, loss_scale, drain)  # forward + backward, any runtime

`train_step` sets the schedule's learning rate, makes the gradients global and clips them by the global norm,
steps the optimizer (or skips where fp16 overflowed on any rank), clears the gradients, measures each
block's gradient norm for the freeze policies that read them, hands the global norm to the divergence watch
(`ptrun.train.divergence`: a non-finite one stops the run), and returns the run's position one step on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch

from ptrun.config import OptimConfig
from ptrun.numerics.optim import set_lr
from ptrun.numerics.precision import LossScaler
from ptrun.parallel.pipeline import Norms, Runtime
from ptrun.train.divergence import DivergenceWatch, StepRecord
from ptrun.train.state import TrainState


@dataclass(frozen=True)
class Update:
    """What one step's update did."""

    lr: float
    """The learning rate it stepped with."""
    stepped: bool
    """False when fp16's gradients overflowed somewhere and no rank stepped."""
    block_norms: torch.Tensor | None
    """Each block's gradient norm on this rank's stages (0 elsewhere), when asked for and stepped."""
    measure_s: float = 0.0
    """Host seconds spent on `block_norms` (what the freeze policy's measure costs a step)."""


@dataclass(frozen=True)
class StepParts:
    """What a layout's steps are updated with."""

    runtime: Runtime
    """The rank's runtime."""
    optimizer: torch.optim.Optimizer | None
    scaler: LossScaler
    optim: OptimConfig
    grad_clip: float
    total_steps: int
    """The schedule's length in the first layout's steps."""
    block_of: dict[int, int] | None = None
    """Parameter id -> block, to measure per-block gradient norms (None: not measured)."""
    num_blocks: int = 0
    divergence: DivergenceWatch | None = None
    """What watches the global gradient norm for divergence (None: nothing does)."""


def train_step(state: TrainState, progress: float, parts: StepParts, step: int = 0) -> tuple[TrainState, Update]:
    """Collective over every rank of the job: the update of the step whose backward pass just ran, step `step`
    of the epoch at `progress` (its position in the first layout's steps, the schedule's clock). Returns the
    state one step on (its global and interval step counts) and what the update did; raises Diverged where
    the divergence watch stops the run at this step."""
    runtime, optimizer, scaler = parts.runtime, parts.optimizer, parts.scaler
    lr = set_lr(optimizer, progress, parts.total_steps, parts.optim)
    want_norms = parts.block_of is not None
    # The norm is the same on every rank; only fp16 reads it on the host (its verdict): fp32 and bf16 steps
    # never wait for the device.
    norms = runtime.sync_and_clip(parts.grad_clip, inv_scale=1.0 / scaler.scale)
    stepped = not scaler.enabled or scaler.update(math.isfinite(norms.total.item()))
    if optimizer is not None and stepped:
        optimizer.step()
    runtime.zero_grad()
    t0 = time.perf_counter()
    blocks = block_norms(norms, parts.block_of, parts.num_blocks) if want_norms and stepped else None
    done = Update(lr, stepped, blocks, time.perf_counter() - t0 if want_norms else 0.0)
    if parts.divergence is not None:
        parts.divergence.observe(
            norms.total,
            stepped,
            scaler.enabled,
            not runtime.asynchronous,
            StepRecord(state.epoch, step, state.global_step, lr),
        )
    return replace(state, global_step=state.global_step + 1, interval_steps=state.interval_steps + 1), done


def block_norms(norms: Norms, block_of: dict[int, int], num_blocks: int) -> torch.Tensor:
    """Each block's gradient norm from the squared norms the step's sync measured per parameter (kept on the
    device: no host sync per parameter). The gather index is made once per set of parameters: built every
    step, its copy to a GPU would wait for the step's kernels."""
    ids = tuple(id(p) for p in norms.params)
    cached = _BLOCK_INDEX.get(id(block_of))
    if cached is None or cached[0] != ids:
        blocks = [block_of.get(i) for i in ids]
        rows = [i for i, b in enumerate(blocks) if b is not None]
        device = norms.squares.device
        cached = (
            ids,
            torch.tensor(rows, dtype=torch.long, device=device),
            torch.tensor([blocks[i] for i in rows], dtype=torch.long, device=device),
        )
        _BLOCK_INDEX.clear()  # one layout's index at a time
        _BLOCK_INDEX[id(block_of)] = cached
    _, rows, blocks = cached
    sq = torch.zeros(num_blocks, dtype=torch.float64, device=norms.squares.device)
    sq.index_add_(0, blocks, norms.squares.index_select(0, rows).to(torch.float64))
    return sq.sqrt()


_BLOCK_INDEX: dict[int, tuple] = {}
"""`block_norms`' index for the parameter -> block map in use (by its id), with the parameters it was made for."""
