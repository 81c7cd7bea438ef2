"""Where freeze decisions fall and how many steps an epoch has: pure arithmetic that the trainer and the
simulator share, so the two never disagree about a position.

A freeze interval is a number of epochs, held as an exact fraction: `freeze.every=0.333..` is 1/3 and
`freeze.every_steps=N` is N / steps_per_epoch, so position arithmetic has no float drift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


def epoch_steps(num_samples: int, global_batch: int, max_steps: int | None = None) -> int:
    """Steps in one epoch: every sample once (the last batch padded), capped by `train.max_steps_per_epoch`."""
    steps = math.ceil(num_samples / global_batch)
    return min(steps, max_steps) if max_steps else steps


def interval_epochs(every: float, every_steps: int | None, steps_per_epoch: int | None) -> Fraction:
    """The interval between freeze decisions in epochs: `freeze.every_steps` over an epoch's steps when set
    (and the steps are known), else `freeze.every` as the simplest fraction within 1/1000."""
    if every_steps and steps_per_epoch:
        return Fraction(every_steps, steps_per_epoch)
    return Fraction(every).limit_denominator(1000)


def interval_at(epoch: int, steps_done: int, steps_per_epoch: int, interval: Fraction) -> int:
    """The freeze interval in force after `steps_done` steps of `epoch`: how many interval ends (decision
    points) lie at or before that position."""
    return math.floor(Fraction(epoch * steps_per_epoch + steps_done, steps_per_epoch) / interval)


def segment_end(epoch: int, position: int, steps_per_epoch: int, interval: Fraction | None) -> int:
    """The step of `epoch` after which the next decision falls, or the epoch's end: the steps from `position`
    up to it train in one layout. `interval` None (nothing is ever decided) makes the epoch one segment."""
    if interval is None:
        return steps_per_epoch
    now = interval_at(epoch, position, steps_per_epoch, interval)
    return next(
        (n for n in range(position + 1, steps_per_epoch) if interval_at(epoch, n, steps_per_epoch, interval) > now),
        steps_per_epoch,
    )


@dataclass(frozen=True)
class Positions:
    """The positions of a layout's steps: its epochs' steps, the freeze intervals that fall in them and the
    learning-rate schedule's clock."""

    steps_per_epoch: int
    """An epoch's steps in this layout (`epoch_steps` of its global batch)."""
    base_steps: int
    """An epoch's steps in the first layout: the schedule's clock, the same curve whatever later global
    batches do to the steps."""
    every: float
    every_steps: int | None
    """`freeze.every` and `freeze.every_steps`."""
    decides: bool = True
    """Whether anything is decided (`auto.freeze`): without, an epoch is one segment."""

    @property
    def interval(self) -> Fraction:
        """The freeze interval in epochs."""
        return interval_epochs(self.every, self.every_steps, self.steps_per_epoch)

    def interval_at(self, epoch: int, steps_done: int) -> int:
        """The freeze interval in force after `steps_done` steps of `epoch`."""
        return interval_at(epoch, steps_done, self.steps_per_epoch, self.interval)

    def segment_end(self, epoch: int, position: int) -> int:
        """The step of `epoch` after which the next decision falls (or the epoch's end); each segment starts
        its own batch loader."""
        return segment_end(epoch, position, self.steps_per_epoch, self.interval if self.decides else None)

    def progress(self, epoch: int, step: int) -> float:
        """Step `step` of `epoch` on the schedule's clock."""
        return epoch * self.base_steps + step * self.base_steps / self.steps_per_epoch
