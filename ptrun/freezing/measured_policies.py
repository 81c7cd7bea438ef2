"""The freeze policies that read a per-block measure (`ptrun.freezing.policy`'s `MEASURES`): `pipetransformer`
and `autofreeze` read gradient norms, `plasticity` weight changes. Each registers under its name as this module
is imported (`ptrun.freezing.policies` imports it)."""

from __future__ import annotations

import math
from typing import Any

from ptrun.config import (
    FreezeConfig,
    check_alpha,
    check_percentile,
    check_threshold,
)
from ptrun.freezing.counts import ceil_tol, percentile
from ptrun.freezing.policy import FreezePolicy, registered


@registered("pipetransformer")
class PipeTransformerFreeze(FreezePolicy):
    """`pipetransformer`: the paper's full rule
    F_T = min(ceil(F_{T-1} + alpha * (L - F_{T-1})), argmin_{l >= F_{T-1}} ||g_l|| + 1).

    Choices where the paper is loose:
    - The first term is applied to the actual current count (the recursion), rounded up with `ceil_tol`.
      Rounding up guarantees at least one block of progress per decision while blocks remain; rounding
      down would stall once alpha * (L - F) < 1. Because the rounding compounds, without gradients the
      sequence is 0, 4, 7, 9, 10, 11, 12 for L = 12, alpha = 1/3 (the closed form reaches 12 one step later).
    - Blocks are 0-based and `l` ranges over the active blocks F_{T-1}..L-1. "Freeze up to the argmin
      layer" freezes that layer too: F = l + 1. The layer with the smallest gradient is the one the rule
      deems converged; reading it as F = l would leave that very layer training, and when the first active
      block has the smallest norm (common in fine-tuning, where lower layers move least) the rule would
      make no progress at all, step after step. Ties go to the lowest block.
    - Non-finite norms (an overflowed interval) never win the argmin; if no active norm is finite, or
      `grad_norms` is None, only the first term applies.
    - alpha is a rate per epoch: with intervals of `every` epochs each decision uses
      rate = 1 - (1 - alpha)^every, so an epoch of decisions freezes what one epoch-boundary decision would.
      Inside epochs (every < 1) the first term keeps its fraction between decisions (`reach`, the unrounded
      count, pulled back to the actual count when the gradient term held it lower) and rounds up only the
      proposal: rounding up at each of four quarter-epoch decisions would freeze at least a block a quarter,
      whatever alpha says.
    """

    params = ("alpha",)
    measure = "grad_norms"
    priced_as = "alpha"  # its first term, the bound the gradient term can only lower

    def __init__(self, num_blocks: int, *, alpha: float = FreezeConfig.alpha, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.alpha = check_alpha(alpha)
        self.reach = 0.0
        """The first term's unrounded count so far (used with every < 1)."""

    @property
    def rate(self) -> float:
        """The share of the active blocks one decision may freeze: alpha compounded over an interval."""
        return 1.0 - (1.0 - self.alpha) ** self.every

    def reach_from(self, frozen_blocks: int) -> float:
        """The first term unrounded: from the current count (inside epochs: from the unrounded count carried
        from the last decision, when that is below it) plus a fraction `rate` of the active blocks."""
        start = frozen_blocks if self.every >= 1 else min(self.reach, frozen_blocks)
        return start + self.rate * (self.num_blocks - start)

    def bound(self, frozen_blocks: int) -> int:
        """The first term, rounded up."""
        return ceil_tol(self.reach_from(frozen_blocks))

    def _propose(self, interval, frozen_blocks, grad_norms):
        bound = self.bound(frozen_blocks)
        self.reach = self.reach_from(frozen_blocks)
        if grad_norms is None:
            return bound
        finite = [block for block in range(frozen_blocks, self.num_blocks) if math.isfinite(grad_norms[block])]
        if not finite:
            return bound
        argmin = min(finite, key=lambda block: (grad_norms[block], block))
        return min(bound, argmin + 1)

    def _state(self):
        return {"reach": self.reach}

    def _load(self, state):
        self.reach = float(state.get("reach", 0.0))


@registered("autofreeze")
class AutoFreeze(FreezePolicy):
    """`autofreeze` (AutoFreeze, Liu et al. 2021): per active block, the relative change of its gradient
    norm between consecutive intervals, |n_t - n_{t-1}| / n_{t-1}; freeze every block before the first
    active block whose change is at or above the `percentile`-th percentile of the changes over the active
    blocks (that block keeps training). Slowly changing blocks at the bottom are the converged ones. The
    default, 50, is the median (`statistics.median`: the mean of the middle pair for an even count); a higher
    percentile sets a higher bar for the block that stops the prefix, so it freezes at least as many
    (`percentile` interpolates linearly between the ranks, as numpy's default).

    It needs the previous interval's norms, so the first decision (and any decision after an interval whose
    norms were not collected) freezes nothing. A previous norm of 0 gives an infinite change (unless the
    new one is 0 too), as does a non-finite norm. The norms are means over an interval's steps, so intervals
    of different lengths compare fairly.
    """

    params = ("percentile",)
    measure = "grad_norms"

    def __init__(self, num_blocks: int, *, percentile: float = FreezeConfig.percentile, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.percentile = check_percentile(percentile)
        self.prev_norms: list[float] | None = None
        self.prev_interval: int | None = None
        """The interval `prev_norms` were averaged over."""

    @staticmethod
    def relative_change(new: float, old: float) -> float:
        """|new - old| / old, with 0/0 = 0 and x/0 = inf (a block that just started moving is not converged)."""
        if not (math.isfinite(new) and math.isfinite(old)):
            return math.inf
        if old == 0.0:
            return 0.0 if new == 0.0 else math.inf
        return abs(new - old) / old

    def _propose(self, interval, frozen_blocks, grad_norms):
        # The norms passed at `interval` come from interval - 1; the stored ones must come from interval - 2.
        if grad_norms is None or self.prev_norms is None or self.prev_interval != interval - 2:
            return frozen_blocks
        active = range(frozen_blocks, self.num_blocks)
        change = {block: self.relative_change(grad_norms[block], self.prev_norms[block]) for block in active}
        threshold = percentile(change.values(), self.percentile)
        # The percentile is at most the largest change, so a threshold block always exists.
        return next(block for block in active if change[block] >= threshold)

    def _observe(self, interval, grad_norms):
        if grad_norms is None:
            self.prev_norms, self.prev_interval = None, None
        else:
            self.prev_norms, self.prev_interval = list(grad_norms), interval - 1

    def _state(self):
        # JSON has no inf/nan literals: store non-finite norms as strings ("inf", "nan").
        norms = None if self.prev_norms is None else [g if math.isfinite(g) else str(g) for g in self.prev_norms]
        return {"prev_norms": norms, "prev_interval": self.prev_interval}

    def _load(self, state):
        norms = state.get("prev_norms")
        self.prev_norms = None if norms is None else [float(g) for g in norms]
        self.prev_interval = state.get("prev_interval", state.get("prev_epoch"))  # older checkpoints: epochs


@registered("plasticity")
class PlasticityFreeze(FreezePolicy):
    """`plasticity`, in the spirit of Egeria (Wang et al., EuroSys 2023: freeze the layers whose behaviour
    has stopped changing, judged against a cheap reference copy), in weight space so it costs no forward
    pass: a block's plasticity is its relative weight change over the finished interval, ||theta - ref|| /
    ||ref||, against a bfloat16 copy `ref` of its parameters taken when the interval began, over the
    interval's mean learning rate (the measure `weight_change`, measured by the trainer). A block has settled
    once its plasticity falls below `threshold` times the largest it has shown so far (`peaks`, over every
    interval measured, decisions or not); the policy freezes the longest prefix of settled active blocks.

    The first measurement of a block is its peak, so the first decision freezes nothing. The trainer keeps
    the reference copy in memory only (checkpoints hold the peaks, not the copy): an interval that a resume
    cuts has no reference, and the first decision after a resume mid-interval freezes nothing either. A
    non-finite plasticity (a reference of norm 0 that moved) never settles and is no peak.
    """

    params = ("threshold",)
    measure = "weight_change"

    def __init__(self, num_blocks: int, *, threshold: float = FreezeConfig.threshold, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.threshold = check_threshold(threshold)
        self.peaks: list[float | None] = [None] * num_blocks
        """Each block's largest finite plasticity so far (None: never measured)."""

    @staticmethod
    def _peak(old: float | None, new: float) -> float | None:
        if not math.isfinite(new):
            return old
        return new if old is None else max(old, new)

    def settled(self, block: int, plasticity: float) -> bool:
        """Whether `plasticity`, measured now, is below `threshold` times the block's peak (counting it)."""
        peak = self._peak(self.peaks[block], plasticity)
        return math.isfinite(plasticity) and peak is not None and plasticity < self.threshold * peak

    def _propose(self, interval, frozen_blocks, plasticity):
        if plasticity is None:
            return frozen_blocks
        unsettled = (
            block for block in range(frozen_blocks, self.num_blocks) if not self.settled(block, plasticity[block])
        )
        return next(unsettled, self.num_blocks)

    def _observe(self, interval, plasticity):
        if plasticity is not None:  # (a frozen block's entry is 0: its peak, never read again, stays)
            self.peaks = [self._peak(peak, p) for peak, p in zip(self.peaks, plasticity, strict=True)]

    def _state(self):
        return {"peaks": list(self.peaks)}

    def _load(self, state):
        self.peaks = [None if p is None else float(p) for p in state.get("peaks", [None] * self.num_blocks)]
