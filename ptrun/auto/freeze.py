"""Freeze policies: how many leading transformer blocks to freeze at the end of each interval.

Freezing is always a prefix of whole blocks. With F frozen blocks the frozen units are the embedding and
blocks 0..F-1 (`frozen_units_for_blocks`); the final norm and task head always train, so F = L (every block
frozen) still leaves the head trainable.

When a policy decides
---------------------
Training is cut into intervals of `every` epochs (1: the paper's epoch boundaries; 0.25: four decisions an
epoch, AutoFreeze's setting). The runtime calls `policy.decide(k, frozen_blocks, measured)` at the end of
interval k - 1, before interval k (0-based) starts, with `measured` the policy's signal over the interval
that just finished (below). The return value is the frozen block count for interval k. A policy only
changes the count when the interval starts after `start` (an epoch): k * every > start. Time is counted in
epochs, t = k * every, so the curves below do not depend on the interval: the closed form's freeze step is
T = t - start (fractional epochs), and with the defaults (start = 0, every = 1) T equals the epoch, giving
the paper's sequence for L = 12, alpha = 1/3: 0, 4, 7, 9, 10, 11, 11, 12 over epochs 0..7. Interval 0 never
decides (there is nothing to judge). Calling `decide` on every interval is still required by `autofreeze`,
which compares consecutive intervals' gradient norms, and by `plasticity`, which keeps each block's peak.

Whatever a policy proposes, `decide` returns a value that is never below the current count (a frozen block
never thaws: its optimizer state is gone and the cache depends on it) and never above the cap
`floor(max_fraction * L)`; if the current count is already above the cap (a resumed run with a smaller
`max_fraction`) it is kept.

What a policy reads
-------------------
A policy declares the per-block signal it reads (`signal`); the trainer measures that one alone
(`ptrun.train.signals`) and passes it as `measured`, a list of L values >= 0, or None when nothing was
measured (an interval without steps; for `weight_change`, an interval a resume cut: its reference copy is
not checkpointed). Entries of frozen blocks are ignored.
- `grad_norms` (`pipetransformer`, `autofreeze`): each block's gradient norm, averaged over the finished
  interval's steps (summed over the stages holding a block).
- `weight_change` (`plasticity`): each active block's relative weight change over the finished interval,
  ||theta - ref|| / ||ref|| with ref a bfloat16 copy taken as it began, over the interval's mean learning
  rate (so a decaying schedule does not read as settling).
- None: the other policies read nothing.

Policies (`make_policy(name, ...)`): `none`, `alpha` (the paper's closed form), `pipetransformer` (the
paper's full rule with the gradient-norm term the released code never ran), `autofreeze` (AutoFreeze's
rule on the relative change of gradient norms, at a percentile: the median by default), `plasticity`
(Egeria's idea in weight space: the blocks whose weights have stopped moving, against a cheap reference
copy), `linear` (a baseline ramp) and `schedule` (a list). Their state round-trips through `state_dict()` /
`load_state_dict()` as JSON-able dicts, so a checkpoint resumes the same decisions.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Optional, Sequence

from ptrun.auto.counts import (  # noqa: F401 (the helpers are this module's too, as they always were)
    EPS,
    blocks_of_units,
    ceil_tol,
    floor_tol,
    frozen_units_for_blocks,
    num_units_for_blocks,
    percentile,
)
from ptrun.config import (
    FREEZE_POLICIES,
    ConfigError,
    FreezeConfig,
    check_alpha,
    check_percentile,
    check_threshold,
    one_of,
)

SIGNALS = {"grad_norms": "gradient norms", "weight_change": "weight changes"}
"""The per-block signals a policy may read (`FreezePolicy.signal`), in words."""


POLICIES: dict[str, type[FreezePolicy]] = {}
"""Policy classes by name (`registered`), in the order of `freeze.policy`'s values: the config, the layer
below, declares the names (`ptrun.config.FREEZE_POLICIES`), and each policy class registers under one."""


def registered(name: str):
    """Class decorator: the policy `name` (one of the config's `FREEZE_POLICIES`), the name its state and
    messages carry."""
    assert name in FREEZE_POLICIES and name not in POLICIES, name

    def register(cls: type[FreezePolicy]) -> type[FreezePolicy]:
        cls.name = name
        POLICIES[name] = cls
        return cls

    return register


class FreezePolicy:
    """Base of all policies: the decision gate, the clamp to [current, cap] and the state protocol.

    Subclasses implement `_propose` (the raw proposal at a decision) and, when they keep state,
    `_observe`, `_state` and `_load`.
    """

    name: ClassVar[str] = "base"
    signal: ClassVar[Optional[str]] = None
    """The per-block signal `decide` reads (`grad_norms` or `weight_change`), None for none: the trainer
    measures only what the policy declares."""
    params: ClassVar[tuple[str, ...]] = ()
    """The `make_policy` keywords (`freeze.*` keys) the policy's constructor takes beyond the common ones."""

    def __init__(
        self,
        num_blocks: int,
        *,
        every: float = FreezeConfig.every,
        max_fraction: float = FreezeConfig.max_fraction,
        start: int = FreezeConfig.start,
    ):
        if num_blocks < 1:
            raise ConfigError(f"freeze: the model has {num_blocks} blocks; a policy needs at least 1")
        if not every > 0:
            raise ConfigError(f"freeze every={every} is not allowed: a number of epochs > 0")
        if not 0.0 <= max_fraction <= 1.0:
            raise ConfigError(f"freeze max_fraction={max_fraction} is not allowed: 0 <= f <= 1")
        if start < 0:
            raise ConfigError(f"freeze start={start} is not allowed: an epoch >= 0")
        self.num_blocks = num_blocks
        self.every = float(every)
        """The interval between decisions, in epochs."""
        self.max_fraction = max_fraction
        self.start = start

    @property
    def cap(self) -> int:
        """The most blocks this policy will ever freeze: floor(max_fraction * L)."""
        return floor_tol(self.max_fraction * self.num_blocks)

    def epochs(self, interval: int) -> float:
        """The time at the start of `interval`, in epochs: interval * every."""
        return interval * self.every

    def is_decision(self, interval: int) -> bool:
        """True when the count may change before `interval`: it starts after epoch `start`."""
        return interval > 0 and self.epochs(interval) > self.start + EPS

    def freeze_step(self, interval: int) -> float:
        """The paper's freeze step T in force at `interval`: epochs since `start` (fractional), 0 up to it."""
        return max(0.0, self.epochs(interval) - self.start)

    def decide(self, interval: int, frozen_blocks: int, measured: Optional[Sequence[float]] = None) -> int:
        """The frozen block count for `interval`, given the current count and the finished interval's
        per-block `signal` (or None). Call it at the end of every interval; see the module docstring."""
        if interval < 0:
            raise ValueError(f"interval {interval} must be >= 0")
        if not 0 <= frozen_blocks <= self.num_blocks:
            raise ValueError(f"frozen block count {frozen_blocks} must be in 0..{self.num_blocks}")
        if measured is not None:
            if len(measured) != self.num_blocks:
                raise ValueError(
                    f"{self.signal or 'measured'} has {len(measured)} entries for {self.num_blocks} blocks"
                )
            measured = [float(g) for g in measured]
            if any(g < 0 for g in measured):
                raise ValueError(f"{self.signal or 'measured'} values must be >= 0, got {measured}")
        proposal = frozen_blocks
        if self.is_decision(interval) and frozen_blocks < self.num_blocks:
            proposal = self._propose(interval, frozen_blocks, measured)
        self._observe(interval, measured)
        return max(frozen_blocks, min(proposal, self.cap))

    def _propose(self, interval: int, frozen_blocks: int, measured: Optional[list[float]]) -> int:
        raise NotImplementedError

    def _observe(self, interval: int, measured: Optional[list[float]]) -> None:
        """Record what later decisions need (called on every `decide`, after the proposal)."""

    def _state(self) -> dict[str, Any]:
        return {}

    def _load(self, state: dict[str, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the policy name, L (both checked on load) and the policy's own state."""
        return {"policy": self.name, "num_blocks": self.num_blocks, **self._state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output; refuses a state written by another policy or for another depth,
        whose gradient history would not mean the same thing."""
        if state.get("policy") != self.name or state.get("num_blocks") != self.num_blocks:
            raise ValueError(
                f"freeze state for policy {state.get('policy')!r} with {state.get('num_blocks')} "
                f"blocks cannot load into {self.name!r} with {self.num_blocks} blocks"
            )
        self._load(state)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_blocks={self.num_blocks}, every={self.every}, "
            f"max_fraction={self.max_fraction}, start={self.start})"
        )


@registered("none")
class NoFreeze(FreezePolicy):
    """`none`: never freezes (and, like every policy, never thaws what is already frozen)."""

    def _propose(self, interval, frozen_blocks, grad_norms):
        return frozen_blocks


@registered("alpha")
class AlphaFreeze(FreezePolicy):
    """`alpha`: the paper's closed form F_T = ceil(L * (1 - (1 - alpha)^T)), the first term of the rule
    alone (what the released code ran), T in epochs (fractional between boundaries). It depends only on T,
    so it needs no state and resumes exactly."""

    params = ("alpha",)

    def __init__(self, num_blocks: int, *, alpha: float = FreezeConfig.alpha, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.alpha = check_alpha(alpha)

    def target(self, step: float) -> int:
        """F_T for freeze step T (before the clamp)."""
        return ceil_tol(self.num_blocks * (1.0 - (1.0 - self.alpha) ** step))

    def _propose(self, interval, frozen_blocks, grad_norms):
        return self.target(self.freeze_step(interval))


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
    signal = "grad_norms"

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
    signal = "grad_norms"

    def __init__(self, num_blocks: int, *, percentile: float = FreezeConfig.percentile, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.percentile = check_percentile(percentile)
        self.prev_norms: Optional[list[float]] = None
        self.prev_interval: Optional[int] = None
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
    interval's mean learning rate (the signal `weight_change`, measured by the trainer). A block has settled
    once its plasticity falls below `threshold` times the largest it has shown so far (`peaks`, over every
    interval measured, decisions or not); the policy freezes the longest prefix of settled active blocks.

    The first measurement of a block is its peak, so the first decision freezes nothing. The trainer keeps
    the reference copy in memory only (checkpoints hold the peaks, not the copy): an interval that a resume
    cuts has no reference, and the first decision after a resume mid-interval freezes nothing either. A
    non-finite plasticity (a reference of norm 0 that moved) never settles and is no peak.
    """

    params = ("threshold",)
    signal = "weight_change"

    def __init__(self, num_blocks: int, *, threshold: float = FreezeConfig.threshold, **kw: Any):
        super().__init__(num_blocks, **kw)
        self.threshold = check_threshold(threshold)
        self.peaks: list[Optional[float]] = [None] * num_blocks
        """Each block's largest finite plasticity so far (None: never measured)."""

    @staticmethod
    def _peak(old: Optional[float], new: float) -> Optional[float]:
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
            self.peaks = [self._peak(peak, p) for peak, p in zip(self.peaks, plasticity)]

    def _state(self):
        return {"peaks": list(self.peaks)}

    def _load(self, state):
        self.peaks = [None if p is None else float(p) for p in state.get("peaks", [None] * self.num_blocks)]


@registered("linear")
class LinearFreeze(FreezePolicy):
    """`linear`: a baseline ramp. The frozen fraction rises linearly from 0 at epoch `start` to
    `max_fraction` at the last epoch (`total_epochs - 1`): F(e) = floor(max_fraction * L * (e - start) /
    (total_epochs - 1 - start)), e in (fractional) epochs at each decision, so the count holds between
    decisions. If the ramp has no length (start >= total_epochs - 1) it never freezes."""

    params = ("total_epochs",)

    def __init__(self, num_blocks: int, *, total_epochs: Optional[int] = None, **kw: Any):
        super().__init__(num_blocks, **kw)
        if total_epochs is None or total_epochs < 1:
            raise ConfigError(f"freeze policy linear needs total_epochs >= 1, got {total_epochs}")
        self.total_epochs = total_epochs

    def target(self, epoch: float) -> int:
        """F(epoch) on the ramp (before the clamp)."""
        span = self.total_epochs - 1 - self.start
        if span <= 0:
            return 0
        fraction = self.max_fraction * min(1.0, max(0.0, (epoch - self.start) / span))
        return floor_tol(fraction * self.num_blocks)

    def _propose(self, interval, frozen_blocks, grad_norms):
        return self.target(self.epochs(interval))


@registered("schedule")
class ScheduledFreeze(FreezePolicy):
    """`schedule`: the frozen block count of each interval read from a list (`blocks[k]`, the last entry
    held after the list ends). Reproduces a run's freeze sequence exactly, for tests and benchmarks; it
    ignores start (the list says everything)."""

    params = ("blocks",)

    def __init__(self, num_blocks: int, *, blocks: Optional[Sequence[int]] = None, **kw: Any):
        super().__init__(num_blocks, **kw)
        if not blocks or any(b < 0 or b > num_blocks for b in blocks):
            raise ConfigError(f"freeze.blocks={list(blocks or [])} is not allowed: counts in 0..{num_blocks}")
        self.blocks = [int(b) for b in blocks]

    def is_decision(self, interval: int) -> bool:
        return True

    def _propose(self, interval, frozen_blocks, grad_norms):
        return self.blocks[min(interval, len(self.blocks) - 1)]


assert sorted(POLICIES) == sorted(FREEZE_POLICIES), "every freeze.policy value has one policy class"
POLICIES = {name: POLICIES[name] for name in FREEZE_POLICIES}


def make_policy(
    name: str,
    num_blocks: int,
    *,
    alpha: float = FreezeConfig.alpha,
    every: float = FreezeConfig.every,
    max_fraction: float = FreezeConfig.max_fraction,
    start: int = FreezeConfig.start,
    total_epochs: Optional[int] = None,
    blocks: Optional[Sequence[int]] = None,
    percentile: float = FreezeConfig.percentile,
    threshold: float = FreezeConfig.threshold,
) -> FreezePolicy:
    """Build the policy called `name` for a model of `num_blocks` blocks. `alpha` is used by `alpha` and
    `pipetransformer`, `percentile` by `autofreeze`, `threshold` by `plasticity`, `total_epochs` (required)
    by `linear`, `blocks` by `schedule` (each policy's `params`); the others ignore what they do not use.
    Raises ConfigError for an unknown name or an out-of-range parameter."""
    if name not in POLICIES:
        raise ConfigError(f"freeze policy {name!r} is not allowed: {one_of(POLICIES)}")
    cls = POLICIES[name]
    given = dict(alpha=alpha, percentile=percentile, threshold=threshold, total_epochs=total_epochs, blocks=blocks)
    return cls(num_blocks, every=every, max_fraction=max_fraction, start=start, **{k: given[k] for k in cls.params})
