"""The freeze policies' common part: the registry of policy classes by name, the per-block measures a
policy may read, and `FreezePolicy`, the base that gates, clamps and keeps state.

When a policy decides
---------------------
Training is cut into intervals of `every` epochs (1: the paper's epoch boundaries; 0.25: four decisions an
epoch, AutoFreeze's setting). The runtime calls `policy.decide(k, frozen_blocks, measured)` at the end of
interval k - 1, before interval k (0-based) starts, with `measured` the policy's measure over the interval
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
A policy declares the per-block measure it reads (`measure`); the trainer measures that one alone
(`ptrun.freezing.measures`) and passes it as `measured`, a list of L values >= 0, or None when nothing was
measured (an interval without steps; for `weight_change`, an interval a resume cut: its reference copy is
not checkpointed). Entries of frozen blocks are ignored.
- `grad_norms` (`pipetransformer`, `autofreeze`): each block's gradient norm, averaged over the finished
  interval's steps (summed over the stages holding a block).
- `weight_change` (`plasticity`): each active block's relative weight change over the finished interval,
  ||theta - ref|| / ||ref|| with ref a bfloat16 copy taken as it began, over the interval's mean learning
  rate (so a decaying schedule does not read as settling).
- None: the other policies read nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ptrun.config import (
    FREEZE_POLICIES,
    ConfigError,
    FreezeConfig,
)
from ptrun.freezing.counts import EPS, floor_tol

MEASURES = {"grad_norms": "gradient norms", "weight_change": "weight changes"}
"""The per-block measures a policy may read (`FreezePolicy.measure`), in words."""


REGISTRY: dict[str, type[FreezePolicy]] = {}
"""Policy classes by name (`registered`), in the order they registered: the config, the layer below, declares
the names (`ptrun.config.FREEZE_POLICIES`), and each policy class registers under one; `ptrun.freezing.policies`'s
`POLICIES` holds them all in the config's order."""


def registered(name: str):
    """Class decorator: the policy `name` (one of the config's `FREEZE_POLICIES`), the name its state and
    messages carry."""
    assert name in FREEZE_POLICIES and name not in REGISTRY, name

    def register(cls: type[FreezePolicy]) -> type[FreezePolicy]:
        cls.name = name
        REGISTRY[name] = cls
        return cls

    return register


class FreezePolicy:
    """Base of all policies: the decision gate, the clamp to [current, cap] and the state protocol.

    Subclasses implement `_propose` (the raw proposal at a decision) and, when they keep state,
    `_observe`, `_state` and `_load`.
    """

    name: ClassVar[str] = "base"
    measure: ClassVar[str | None] = None
    """The per-block measure `decide` reads (`grad_norms` or `weight_change`), None for none: the trainer
    measures only what the policy declares."""
    params: ClassVar[tuple[str, ...]] = ()
    """The `make_policy` keywords (`freeze.*` keys) the policy's constructor takes beyond the common ones."""
    priced_as: ClassVar[str | None] = None
    """The policy the planner simulates in this one's place (`ptrun.sim.planning.plannable`), which cannot
    measure anything: None where it simulates this one, or refuses it."""

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

    def decide(self, interval: int, frozen_blocks: int, measured: Sequence[float] | None = None) -> int:
        """The frozen block count for `interval`, given the current count and the finished interval's
        per-block `measure` (or None). Call it at the end of every interval; see the module docstring."""
        if interval < 0:
            raise ValueError(f"interval {interval} must be >= 0")
        if not 0 <= frozen_blocks <= self.num_blocks:
            raise ValueError(f"frozen block count {frozen_blocks} must be in 0..{self.num_blocks}")
        if measured is not None:
            if len(measured) != self.num_blocks:
                raise ValueError(
                    f"{self.measure or 'measured'} has {len(measured)} entries for {self.num_blocks} blocks"
                )
            measured = [float(g) for g in measured]
            if any(g < 0 for g in measured):
                raise ValueError(f"{self.measure or 'measured'} values must be >= 0, got {measured}")
        proposal = frozen_blocks
        if self.is_decision(interval) and frozen_blocks < self.num_blocks:
            proposal = self._propose(interval, frozen_blocks, measured)
        self._observe(interval, measured)
        return max(frozen_blocks, min(proposal, self.cap))

    def _propose(self, interval: int, frozen_blocks: int, measured: list[float] | None) -> int:
        raise NotImplementedError

    def _observe(self, interval: int, measured: list[float] | None) -> None:
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
