"""Freeze policies: how many leading transformer blocks to freeze at the end of each interval.

Freezing is always a prefix of whole blocks. With F frozen blocks the frozen units are the embedding and
blocks 0..F-1 (`frozen_units_for_blocks`); the final norm and task head always train, so F = L (every block
frozen) still leaves the head trainable.

Policies (`make_policy(name, ...)`): `none`, `alpha` (the paper's closed form), `pipetransformer` (the
paper's full rule with the gradient-norm term the released code never ran), `autofreeze` (AutoFreeze's
rule on the relative change of gradient norms, at a percentile: the median by default), `plasticity`
(Egeria's idea in weight space: the blocks whose weights have stopped moving, against a cheap reference
copy), `linear` (a baseline ramp) and `schedule` (a list); the three that read a measure live in
`ptrun.freezing.measured_policies`, and when a policy decides and what it reads is `ptrun.freezing.policy`'s. Their
state round-trips through `state_dict()` / `load_state_dict()` as JSON-able dicts, so a checkpoint resumes the
same decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ptrun.config import FREEZE_POLICIES, ConfigError, FreezeConfig, check_alpha, one_of
from ptrun.freezing import measured_policies  # noqa: F401 (the policies that read a measure register as it is imported)
from ptrun.freezing.counts import ceil_tol, floor_tol
from ptrun.freezing.policy import REGISTRY, FreezePolicy, registered


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


@registered("linear")
class LinearFreeze(FreezePolicy):
    """`linear`: a baseline ramp. The frozen fraction rises linearly from 0 at epoch `start` to
    `max_fraction` at the last epoch (`total_epochs - 1`): F(e) = floor(max_fraction * L * (e - start) /
    (total_epochs - 1 - start)), e in (fractional) epochs at each decision, so the count holds between
    decisions. If the ramp has no length (start >= total_epochs - 1) it never freezes."""

    params = ("total_epochs",)

    def __init__(self, num_blocks: int, *, total_epochs: int | None = None, **kw: Any):
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

    def __init__(self, num_blocks: int, *, blocks: Sequence[int] | None = None, **kw: Any):
        super().__init__(num_blocks, **kw)
        if not blocks or any(b < 0 or b > num_blocks for b in blocks):
            raise ConfigError(f"freeze.blocks={list(blocks or [])} is not allowed: counts in 0..{num_blocks}")
        self.blocks = [int(b) for b in blocks]

    def is_decision(self, interval: int) -> bool:
        return True

    def _propose(self, interval, frozen_blocks, grad_norms):
        return self.blocks[min(interval, len(self.blocks) - 1)]


assert sorted(REGISTRY) == sorted(FREEZE_POLICIES), "every freeze.policy value has one policy class"
POLICIES: dict[str, type[FreezePolicy]] = {name: REGISTRY[name] for name in FREEZE_POLICIES}
"""Policy classes by name, in the order of `freeze.policy`'s values."""


def make_policy(
    name: str,
    num_blocks: int,
    *,
    alpha: float = FreezeConfig.alpha,
    every: float = FreezeConfig.every,
    max_fraction: float = FreezeConfig.max_fraction,
    start: int = FreezeConfig.start,
    total_epochs: int | None = None,
    blocks: Sequence[int] | None = None,
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
