"""Stage partitioners: split a model's ordered units into contiguous pipeline stages.

A model is an ordered list of N units (embedding, each block's attention half and MLP half, head). A layout
is S contiguous, non-empty, half-open ranges `((0, a), (a, b), ..., (z, N))`; a boundary can only fall
between units, so no stage ever cuts a residual connection. Every function here is pure (plain floats, no
torch, no process groups) so the controller can re-plan at any epoch boundary and tests can check the
results against brute force.

Methods (`PARTITIONERS`):

- `uniform`: equal unit counts (the starting layout, `plan.even_bounds`).
- `params`: exact min-max over parameter costs (memory balance).
- `time`: exact min-max over profiled per-unit times (compute balance).
- `pipetransformer`: the paper's greedy AutoPipe rule over parameter costs.
- `pipedream`: PipeDream's dynamic program over compute plus activation transfer.
- `explicit`: a user-given list of ranges (`pipe.stages`).

In every cost-based method a frozen unit costs `FROZEN_COST` of an active one. Errors are `ConfigError`
with one line naming the config key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ptrun.config import ConfigError
from ptrun.layout.plan import even_bounds

Bounds = tuple[tuple[int, int], ...]

FROZEN_COST = 1 / 6
"""Cost of a frozen unit relative to an active one: it keeps its weights but has no gradients, no optimizer
state and no stored activations (the paper's lambda; the released code used 0, which overloads stage 0)."""

_TIE = 1e-9
"""Relative slack for the greedy rule's comparison: normalising costs divides by a float, so a stage whose
exact sum equals its limit must not be rejected by a rounding error."""


# ---------------------------------------------------------------------------------------------------------
# Helpers


def _check_costs(costs: Sequence[float], name: str, method: str) -> list[float]:
    """Costs as floats; each finite and >= 0 (a negative or NaN cost would make "balanced" meaningless)."""
    out = []
    for i, c in enumerate(costs):
        try:
            v = float(c)
        except (TypeError, ValueError):
            v = math.nan
        if not (math.isfinite(v) and v >= 0):  # name the first bad unit: a 100-entry list is unreadable
            raise ConfigError(
                f"pipe.partition={method}: every {name} entry must be a finite number >= 0, unit {i} has {c!r}"
            )
        out.append(v)
    if not out:
        raise ConfigError(f"pipe.partition={method} needs a non-empty {name} vector (one entry per unit)")
    return out


def _check_stages(num_stages: int, num_units: int, method: str) -> None:
    """At least one stage and at least one unit per stage (a stage cannot be empty)."""
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ConfigError(f"pipe.partition={method}: the stage count must be an integer >= 1, got {num_stages!r}")
    if num_stages > num_units:
        raise ConfigError(
            f"pipe.partition={method} cannot split {num_units} units into {num_stages} stages: "
            f"every stage needs a unit, so at most {num_units} stages"
        )


def _bounds_from_ends(ends: Sequence[int]) -> Bounds:
    """Stage end indices (last one = N) -> the half-open range form."""
    starts = (0, *ends[:-1])
    return tuple((lo, hi) for lo, hi in zip(starts, ends, strict=True))


def _exact_partition(n: int, num_stages: int, cost: Callable[[int, int], float]) -> Bounds:
    """The contiguous partition minimizing the largest stage cost, where `cost(lo, hi)` is any stage cost.

    Ties are broken deterministically, in this order:
      1. leximax: among partitions with the optimal largest stage, the smallest second-largest stage, then
         the smallest third-largest, and so on (the most balanced optimum, not an arbitrary one);
      2. the lexicographically largest stage ends (earlier stages take more units), so equal costs give
         exactly `even_bounds`.
    Both orders survive prepending a common first stage, so a dynamic program over suffixes is exact.
    Cost: O(S * N^2) stage evaluations, each building an S-tuple; N ~ 100, S <= 32 takes well under a second.
    """
    table = [[0.0] * (n + 1) for _ in range(n + 1)]
    for i in range(n):
        for j in range(i + 1, n + 1):
            table[i][j] = cost(i, j)

    # Pass 1: the optimal bottleneck alone (cheap floats), used to prune pass 2 to stages that can be optimal.
    # f[i] = best bottleneck for units i..n in k stages.
    f = [table[i][n] for i in range(n)] + [math.inf]
    for k in range(2, num_stages + 1):
        g = [math.inf] * (n + 1)
        for i in range(num_stages - k, n - k + 1):
            g[i] = min(max(table[i][j], f[j]) for j in range(i + 1, n - k + 2))
        f = g
    bottleneck = f[0]

    # Pass 2: leximax over suffixes. best[i] = (stage costs sorted descending, negated stage ends) for the
    # best split of units i..n into k stages, or None when no split stays within the bottleneck.
    best: list[tuple[tuple[float, ...], tuple[int, ...]] | None] = [None] * (n + 1)
    for i in range(n):
        if table[i][n] <= bottleneck:
            best[i] = ((table[i][n],), (-n,))
    for k in range(2, num_stages + 1):
        nxt: list[tuple[tuple[float, ...], tuple[int, ...]] | None] = [None] * (n + 1)
        # Earlier stages need a unit each, so this suffix starts at num_stages - k or later.
        for i in range(num_stages - k, n - k + 1):
            cand = None
            for j in range(i + 1, n - k + 2):
                x, rest = table[i][j], best[j]
                if x > bottleneck or rest is None:
                    continue
                key = (tuple(sorted((x, *rest[0]), reverse=True)), (-j, *rest[1]))
                if cand is None or key < cand:
                    cand = key
            nxt[i] = cand
        best = nxt
    assert best[0] is not None  # the pass-1 optimum is always reachable
    return _bounds_from_ends([-e for e in best[0][1]])


# ---------------------------------------------------------------------------------------------------------
# Public API


def weighted_costs(costs: Sequence[float], frozen_units: int, frozen_weight: float = FROZEN_COST) -> list[float]:
    """Per-unit costs with the first `frozen_units` entries multiplied by `frozen_weight`.

    Freezing is always a prefix, so only a count is needed.
    """
    out = [float(c) for c in costs]
    if isinstance(frozen_units, bool) or not isinstance(frozen_units, int) or not 0 <= frozen_units <= len(out):
        raise ConfigError(f"frozen units must be an integer in 0..{len(out)} (the model's units), got {frozen_units!r}")
    if not (math.isfinite(frozen_weight) and frozen_weight >= 0):
        raise ConfigError(f"the frozen-unit weight must be a finite number >= 0, got {frozen_weight!r}")
    return [c * frozen_weight for c in out[:frozen_units]] + out[frozen_units:]


def stage_sums(bounds: Sequence[tuple[int, int]], costs: Sequence[float]) -> list[float]:
    """Sum of `costs` over each stage range.

    `math.fsum` is exactly rounded, so two stages whose exact sums are equal get equal floats: tie-breaks
    and tests comparing bottlenecks do not depend on summation order.
    """
    return [math.fsum(costs[lo:hi]) for lo, hi in bounds]


def stage_times(
    bounds: Sequence[tuple[int, int]], compute: Sequence[float], activation: Sequence[float], bandwidth: float
) -> list[float]:
    """PipeDream's per-stage time: the stage's compute plus sending its last unit's output to the next stage.

    `activation[i]` is the size of unit i's output and the transfer takes `activation / bandwidth`; the last
    stage sends nothing. The bottleneck (the pipeline's steady-state step time) is `max(stage_times(...))`.
    """
    n = len(compute)
    return [math.fsum(compute[lo:hi]) + (activation[hi - 1] / bandwidth if hi < n else 0.0) for lo, hi in bounds]


def uniform(num_units: int, num_stages: int) -> Bounds:
    """Equal unit counts per stage, earlier stages one larger when it does not divide (`plan.even_bounds`)."""
    _check_stages(num_stages, num_units, "uniform")
    return even_bounds(num_units, num_stages)


def min_max(costs: Sequence[float], num_stages: int) -> Bounds:
    """The contiguous partition of `costs` into `num_stages` stages minimizing the largest stage sum (exact).

    Among optimal partitions it returns the most balanced one (smallest second-largest stage, then third, ...)
    and, among those, the one whose earlier stages take more units; equal costs give `uniform`'s layout.
    """
    c = _check_costs(costs, "cost", "params/time")
    _check_stages(num_stages, len(c), "params/time")
    return _exact_partition(len(c), num_stages, lambda lo, hi: math.fsum(c[lo:hi]))


def pipetransformer(costs: Sequence[float], num_stages: int) -> Bounds:
    """The paper's greedy AutoPipe balance: one left-to-right scan.

    For stage k (of S), with the units not yet assigned:
      - `mean_k` = their total / the stages still to fill (S - k): each stage's fair share of what is left;
      - `var_k`  = the population variance of their per-unit costs;
      - the stage takes units while its sum stays at or below `mean_k + var_k`, but always at least one
        unit and never so many that a later stage would be empty; the last stage takes the rest.

    Normalisation: costs are first divided by the mean unit cost of the whole vector, so a typical unit is
    1.0. The sum and the mean then scale together while a variance scales with the square; without a common
    unit `mean + var` would depend on whether costs are in parameters or megabytes. With the mean unit as
    the unit, the slack `var_k` reads as "how uneven the units are, in typical units": zero for equal units
    (pure fair-share packing) and growing with lumpiness, letting a stage overshoot its share rather than
    push a large unit's excess onto the last stage. Fractions of the total would make the variance ~1/N^2
    and the slack vanish; raw parameter counts (the released code) make it dwarf the mean. The released
    code also divided the variance by the stages left; on ViT/BERT-base/large cost vectors with 2-8 stages
    and various frozen prefixes that smaller slack gave a worse bottleneck (against `min_max`) more often
    than a better one, so the variance is used as is.

    "Below" is read as "not above" (with a 1e-9 relative tolerance): under a strict reading equal units
    could never fill their exact fair share and every stage but the last would be one unit short.
    The result is a heuristic, not the optimum: compare with `min_max`.
    """
    c = _check_costs(costs, "parameter cost", "pipetransformer")
    n = len(c)
    _check_stages(num_stages, n, "pipetransformer")
    total = math.fsum(c)
    if total == 0:
        return even_bounds(n, num_stages)  # nothing to weigh: every layout is balanced, keep the default
    unit = total / n
    x = [v / unit for v in c]
    bounds, lo = [], 0
    for k in range(num_stages - 1):
        left = x[lo:]
        stages_left = num_stages - k
        mean_k = math.fsum(left) / stages_left
        mu = math.fsum(left) / len(left)
        var_k = math.fsum((v - mu) ** 2 for v in left) / len(left)
        limit = (mean_k + var_k) * (1 + _TIE)
        last_hi = n - (stages_left - 1)  # leave one unit for each later stage
        hi, acc = lo + 1, x[lo]  # a stage always takes its first unit, even one above the limit
        while hi < last_hi and acc + x[hi] <= limit:
            acc += x[hi]
            hi += 1
        bounds.append((lo, hi))
        lo = hi
    bounds.append((lo, n))
    return tuple(bounds)


def pipedream(compute: Sequence[float], activation: Sequence[float], num_stages: int, bandwidth: float) -> Bounds:
    """PipeDream's partition: the contiguous split minimizing the slowest stage, exactly.

    A stage's time is its units' compute plus `activation[hi - 1] / bandwidth` to send its output on (none
    after the last stage), as in `stage_times`; units must agree (e.g. seconds, bytes, bytes per second).
    `bandwidth=math.inf` makes transfers free (the same answer as `min_max(compute)`). Stage replication
    and the weight all-reduce are not modelled: ptrun replicates whole pipelines, not single stages.
    Ties are broken like `min_max` (most balanced stage times, then earlier stages larger).
    """
    comp = _check_costs(compute, "compute", "pipedream")
    act = _check_costs(activation, "activation", "pipedream")
    if len(act) != len(comp):
        raise ConfigError(
            f"pipe.partition=pipedream needs one activation size per unit: got {len(act)} for {len(comp)} units"
        )
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0):  # NaN fails `> 0` too
        raise ConfigError(f"pipe.partition=pipedream needs a bandwidth > 0, got {bandwidth!r}")
    n = len(comp)
    _check_stages(num_stages, n, "pipedream")
    return _exact_partition(
        n, num_stages, lambda lo, hi: math.fsum(comp[lo:hi]) + (act[hi - 1] / bandwidth if hi < n else 0.0)
    )


def explicit(stages: Any, num_units: int) -> Bounds:
    """Validate a user layout `[[lo, hi], ...]` (`pipe.stages`) and return it as a tuple of ranges.

    It must be a list of integer pairs, each non-empty (lo < hi), each starting where the previous ended,
    the first at 0 and the last ending at `num_units`.
    """

    def bad() -> ConfigError:
        shown = stages
        if not isinstance(stages, (str, bytes)):
            try:  # show tuples and OmegaConf lists like the YAML the user wrote
                shown = [list(r) for r in stages]
            except TypeError:
                pass
        return ConfigError(
            f"pipe.stages={shown!r} must be contiguous non-empty [lo, hi) ranges covering units 0..{num_units}"
        )

    if isinstance(stages, (str, bytes)):
        raise bad()
    try:
        stages = list(stages)  # also accepts tuples and OmegaConf's ListConfig
    except TypeError:
        raise bad() from None
    if not stages:
        raise bad()
    out, expect = [], 0
    for r in stages:
        try:
            lo, hi = r
        except (TypeError, ValueError):
            raise bad() from None
        # bool is an int subclass, and 1.0 would silently index; only true ints are unit indices.
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (lo, hi)) or lo != expect or hi <= lo:
            raise bad()
        out.append((lo, hi))
        expect = hi
    if expect != num_units:
        raise bad()
    return tuple(out)


@dataclass(frozen=True)
class Given:
    """What a partition is asked with: the unit count, the costs the caller has (None where it has none), the
    frozen prefix and `pipe.stages`. Each partitioner takes what it needs (`need`)."""

    method: str
    num_units: int
    param_costs: Sequence[float] | None = None
    time_costs: Sequence[float] | None = None
    activation: Sequence[float] | None = None
    bandwidth: float | None = None
    frozen_units: int = 0
    stages: Any = None

    def need(self, name: str, label: str) -> list[float]:
        """The costs `name` (checked here, so the message names the method asked for) or ConfigError."""
        vec = getattr(self, name)
        if vec is None:
            raise ConfigError(f"pipe.partition={self.method} needs per-unit {label}, which were not given")
        if len(vec) != self.num_units:
            raise ConfigError(
                f"pipe.partition={self.method}: {label} has {len(vec)} entries for {self.num_units} units"
            )
        return _check_costs(vec, label, self.method)

    def weighted(self, name: str, label: str) -> list[float]:
        """`need`, with the frozen prefix charged `FROZEN_COST`."""
        return weighted_costs(self.need(name, label), self.frozen_units)


def _by_pipedream(num_stages: int, given: Given) -> Bounds:
    if given.bandwidth is None:
        raise ConfigError("pipe.partition=pipedream needs the link bandwidth, which was not given")
    return pipedream(
        given.weighted("time_costs", "time costs"),
        given.need("activation", "activation sizes"),
        num_stages,
        given.bandwidth,
    )


def _by_explicit(num_stages: int, given: Given) -> Bounds:
    if given.stages is None:
        raise ConfigError("pipe.partition=explicit needs pipe.stages, a list of [lo, hi) unit ranges")
    out = explicit(given.stages, given.num_units)
    if len(out) != num_stages:
        raise ConfigError(
            f"pipe.stages has {len(out)} ranges but the pipeline has {num_stages} stages; give exactly {num_stages}"
        )
    return out


PARTITIONERS: dict[str, Callable[[int, Given], Bounds]] = {
    "uniform": lambda k, given: uniform(given.num_units, k),
    "params": lambda k, given: min_max(given.weighted("param_costs", "parameter costs"), k),
    "time": lambda k, given: min_max(given.weighted("time_costs", "time costs"), k),
    "pipetransformer": lambda k, given: pipetransformer(given.weighted("param_costs", "parameter costs"), k),
    "pipedream": _by_pipedream,
    "explicit": _by_explicit,
}
"""`pipe.partition` -> its partitioner, called with the stage count and what was given. Its names are the
values the config accepts (`ptrun.config.PARTITIONS`, in the schema below this layer, which a test holds equal
to these keys)."""

REPARTITION = {"explicit": "params"}
"""The partitioner AutoPipe's later plans use where it is not `pipe.partition` itself: an explicit layout
cannot be re-derived for other stage counts, so AutoPipe balances parameters then."""

NEEDS_PROFILE = ("time", "pipedream")
"""Partitioners that balance measured time rather than parameter size: a start profiles the units for them."""


def partition(
    method: str,
    num_stages: int,
    *,
    num_units: int,
    param_costs: Sequence[float] | None = None,
    time_costs: Sequence[float] | None = None,
    activation: Sequence[float] | None = None,
    bandwidth: float | None = None,
    frozen_units: int = 0,
    stages: Any = None,
) -> Bounds:
    """Split `num_units` units into `num_stages` stages by `method` (a key of `PARTITIONERS`).

    - uniform: equal unit counts.
    - params: `min_max` over parameter costs; time: `min_max` over per-unit times.
    - pipetransformer: the paper's greedy rule over parameter costs.
    - pipedream: PipeDream's DP over per-unit times plus `activation` / `bandwidth` transfers.
    - explicit: `stages` as given (`pipe.stages`); it must have `num_stages` ranges.
    The first `frozen_units` units are charged `FROZEN_COST` in every cost-based method (activations are
    not: a frozen stage still sends its output forward).
    """
    if method not in PARTITIONERS:
        raise ConfigError(f"pipe.partition={method!r} is not one of {', '.join(PARTITIONERS)}")
    if isinstance(num_units, bool) or not isinstance(num_units, int) or num_units < 1:
        raise ConfigError(f"pipe.partition={method}: the model must have at least one unit, got {num_units!r}")
    _check_stages(num_stages, num_units, method)
    if num_stages == 1 and method != "explicit":
        return uniform(num_units, num_stages)  # one stage holds every unit whatever the costs: none are needed
    given = Given(method, num_units, param_costs, time_costs, activation, bandwidth, frozen_units, stages)
    return PARTITIONERS[method](num_stages, given)
