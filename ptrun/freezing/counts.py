"""The arithmetic the freeze policies share: block counts rounded with a tolerance, the frozen unit prefix of F
blocks and back, and a percentile (`ptrun.freezing.policies` re-exports them all)."""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-9
"""Tolerance for rounding real-valued block counts: 12 * (1 - 2/3) and 10 * 0.3 evaluate to 4.0 and
3.0000000000000004, and a bare ceil would freeze one block too many (floor, for the cap, one too few)."""


def ceil_tol(x: float) -> int:
    """ceil(x), treating values within EPS above an integer as that integer (3.0000000000000004 -> 3)."""
    return math.ceil(x - EPS)


def floor_tol(x: float) -> int:
    """floor(x), treating values within EPS below an integer as that integer (28.999999999999996 -> 29)."""
    return math.floor(x + EPS)


def frozen_units_for_blocks(frozen_blocks: int) -> int:
    """Length of the frozen unit prefix for F frozen blocks: 0 if F == 0, else 1 + 2F (the embedding,
    then each block's attention and MLP halves). The embedding freezes together with the first block:
    below the first block nothing else feeds it, and freezing it alone would save almost nothing."""
    if frozen_blocks < 0:
        raise ValueError(f"frozen block count {frozen_blocks} must be >= 0")
    return 0 if frozen_blocks == 0 else 1 + 2 * frozen_blocks


def blocks_of_units(frozen_units: int) -> int:
    """The number of whole blocks inside a frozen unit prefix (the inverse of `frozen_units_for_blocks`
    on its values; a prefix that ends inside a block, or holds only the embedding, counts the whole
    blocks only: 1 -> 0, 2 -> 0, 3 -> 1, 4 -> 1)."""
    if frozen_units < 0:
        raise ValueError(f"frozen unit count {frozen_units} must be >= 0")
    return 0 if frozen_units <= 1 else (frozen_units - 1) // 2


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 < q <= 100) of `values`, interpolated linearly between the ranks as numpy's
    default method does. Written out because numpy's interpolation differs from `statistics.median` in the
    last bit at q = 50 (b - (b - a) / 2 against (a + b) / 2) and answers nan between two infinite values; here
    0.5 a + 0.5 b rounds exactly as (a + b) / 2 (halving is exact), so q = 50 is the median, and the result is
    kept within its two neighbours (inf between infinities)."""
    ranked = sorted(values)
    position = (len(ranked) - 1) * q / 100.0
    lo = math.floor(position)
    fraction = position - lo
    if fraction == 0.0:
        return ranked[lo]
    a, b = ranked[lo], ranked[lo + 1]
    return min(max(a * (1.0 - fraction) + b * fraction, a), b)
