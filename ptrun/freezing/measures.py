"""What the freeze policy reads at a decision (its `measure`, see `ptrun.freezing.policies`), measured over the
interval that just ended on the blocks each rank holds and summed over the stages at the decision. The
trainer takes only the measure its policy declares:

    after each layout change    measurement.hold(held_blocks(...))   # this rank's active blocks
    after each update           measurement.after_step(done)
    at a decision (collective)  measurement.measure(all_sum, steps)  # -> the policy; None: nothing measured
    as an interval begins       measurement.begin()               # after the decision's layout change
    in a checkpoint             measurement.progress(all_sum)     # what a resume mid-interval carries on

- `grad_norms`: each block's gradient norm, averaged over the interval's steps.
- `weight_change`: each active block's relative weight change over the interval, ||theta - ref|| / ||ref||,
  against a bfloat16 copy `ref` of its trainable parameters taken as the interval began, over the interval's
  mean learning rate.

Only the first data-parallel replica measures: the replicas hold the same weights and, once synchronised,
the same gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ptrun.train.step import Update

AllSum = Callable[[torch.Tensor], torch.Tensor]
"""The sum over every rank of the job (`ptrun.train.epoch_stats.all_sum`)."""


@dataclass(frozen=True)
class HeldBlocks:
    """The trainable parameters of the blocks this rank measures, by block: its stages' active blocks on the
    first data-parallel replica, none on the others."""

    params: dict[int, list[torch.nn.Parameter]] = field(default_factory=dict)

    @cached_property
    def block_of(self) -> dict[int, int]:
        """Parameter id -> its block."""
        return {id(p): b for b, params in self.params.items() for p in params}


def held_blocks(layered, unit_indices, first_replica: bool) -> HeldBlocks:
    """The blocks' trainable parameters among the units `unit_indices` (a rank's stages), on the first
    replica; the embedding and the head belong to no block, and frozen parameters are left out."""
    if not first_replica:
        return HeldBlocks()
    params: dict[int, dict[int, torch.nn.Parameter]] = {}
    for u in unit_indices:
        block = layered.unit_block(u)
        if block is not None:
            for p in layered.units[u].parameters():
                if p.requires_grad:
                    params.setdefault(block, {})[id(p)] = p  # by id: a parameter counts once
    return HeldBlocks({b: list(ps.values()) for b, ps in sorted(params.items())})


class NoMeasure:
    """The policies that read nothing: nothing is measured."""

    name: str | None = None

    def __init__(self, num_blocks: int, device: torch.device):
        self.num_blocks, self.device = num_blocks, device
        self.held = HeldBlocks()

    def hold(self, held: HeldBlocks) -> None:
        """The blocks this rank measures from now on (after every layout change)."""
        self.held = held

    @property
    def grad_norms_of(self) -> dict[int, int] | None:
        """Parameter id -> block for the update to measure each block's gradient norm with (None: not)."""
        return None

    def after_step(self, done: Update) -> None:
        """Count one step's update."""

    def begin(self) -> None:
        """An interval begins here, in the layout `hold` gave."""

    def measure(self, all_sum: AllSum, steps: int) -> list[float] | None:
        """Collective, at a decision: the per-block measure over the interval that ended (`steps` long), or
        None when nothing was measured."""
        return None

    def progress(self, all_sum: AllSum) -> dict[str, torch.Tensor]:
        """Collective: what a checkpoint keeps of the open interval."""
        return {}

    def resume(self, progress: dict[str, torch.Tensor]) -> None:
        """Take up a checkpoint's `progress` (on one rank: the sum at the decision counts it once)."""


class GradNorms(NoMeasure):
    """Each block's gradient norm (`ptrun.train.step.block_norms`), summed over the interval's steps."""

    name = "grad_norms"

    def __init__(self, num_blocks: int, device: torch.device):
        super().__init__(num_blocks, device)
        self.sums = torch.zeros(num_blocks, dtype=torch.float64, device=device)

    @property
    def grad_norms_of(self) -> dict[int, int] | None:
        return self.held.block_of or None

    def after_step(self, done: Update) -> None:
        if done.block_norms is not None:
            self.sums += done.block_norms

    def begin(self) -> None:
        self.sums.zero_()

    def measure(self, all_sum: AllSum, steps: int) -> list[float] | None:
        return (all_sum(self.sums) / steps).tolist() if steps else None

    def progress(self, all_sum: AllSum) -> dict[str, torch.Tensor]:
        return {"interval_norms": all_sum(self.sums).cpu()}

    def resume(self, progress: dict[str, torch.Tensor]) -> None:
        if "interval_norms" in progress:
            self.sums.copy_(progress["interval_norms"])


class WeightChange(NoMeasure):
    """Each active block's relative weight change since the interval began, per unit of learning rate.

    The reference is a bfloat16 copy (half the memory of float32 weights, on the ranks holding the block).
    Its rounding would read as movement: ||theta - ref||^2 = ||change||^2 + ||rounding||^2 (the cross term
    averages out: an update does not depend on how its weights round), a floor near 2^-9 relative that is
    a large share of a fine-tune's small changes. So the rounding's own square, measured when the copy is
    taken, is subtracted, and a block that did not move reads 0. The learning rate is the mean over the
    interval's steps (a step fp16 skipped moved nothing and counts as 0), so a decaying schedule does not
    read as settling. The copy lives in memory only: a resume mid-interval, or a layout change, leaves no
    reference until the next interval begins.
    """

    name = "weight_change"

    def __init__(self, num_blocks: int, device: torch.device):
        super().__init__(num_blocks, device)
        self.ref: dict[int, list[torch.Tensor]] | None = None
        """The bfloat16 copies of the held blocks' parameters as the interval began (None: no reference)."""
        self.at_begin = torch.zeros(2, num_blocks, dtype=torch.float64, device=device)
        """Per block: the copy's rounding error squared, and the copy's norm squared."""
        self.lr_sum = 0.0

    def hold(self, held: HeldBlocks) -> None:
        super().hold(held)
        self.ref = None  # the blocks may have changed hands: the next interval takes a new copy

    def after_step(self, done: Update) -> None:
        if done.stepped:
            self.lr_sum += done.lr

    def begin(self) -> None:
        self.ref = {
            b: [p.detach().to(torch.bfloat16, copy=True) for p in params] for b, params in self.held.params.items()
        }
        self.at_begin = torch.stack([self._squares(lambda p, r: p - r.float()), self._squares(lambda p, r: r.float())])
        self.lr_sum = 0.0

    def _squares(self, of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Per block, the squared norm of `of(parameter, its copy)` over the block's held parameters, in
        float64 on the device (0 for blocks this rank does not hold)."""
        sq = torch.zeros(self.num_blocks, dtype=torch.float64, device=self.device)
        for b, params in self.held.params.items():
            for p, r in zip(params, self.ref[b], strict=True):
                sq[b] += of(p.detach().float(), r).square().sum(dtype=torch.float64)
        return sq

    def measure(self, all_sum: AllSum, steps: int) -> list[float] | None:
        # Every rank agrees on these: the reference is taken and dropped at the same points everywhere, and
        # the learning rate and whether a step stepped are the same on every rank.
        if self.ref is None or not steps or self.lr_sum <= 0.0:
            return None
        moved = self._squares(lambda p, r: p - r.float())
        moved_sq, rounding_sq, ref_sq = all_sum(torch.cat([moved[None], self.at_begin])).tolist()
        mean_lr = self.lr_sum / steps
        return [plasticity(max(m - e, 0.0), r, mean_lr) for m, e, r in zip(moved_sq, rounding_sq, ref_sq, strict=True)]


def plasticity(change_sq: float, ref_sq: float, mean_lr: float) -> float:
    """sqrt(change_sq / ref_sq) / mean_lr: a relative weight change per unit of learning rate, with 0/0 = 0
    (a block not measured, or that did not move) and x/0 = inf."""
    if ref_sq == 0.0:
        return 0.0 if change_sq == 0.0 else math.inf
    return math.sqrt(change_sq / ref_sq) / mean_lr


MEASUREMENTS: dict[str | None, type[NoMeasure]] = {m.name: m for m in (NoMeasure, GradNorms, WeightChange)}
"""The measurement of each measure a policy may read (`ptrun.freezing.policy.MEASURES`), and of none."""


def make_measurement(name: str | None, num_blocks: int, device: torch.device) -> NoMeasure:
    """The measurement of the measure `name` (None: nothing) for a model of `num_blocks` blocks."""
    return MEASUREMENTS[name](num_blocks, device)
