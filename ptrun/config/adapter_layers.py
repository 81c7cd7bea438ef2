"""`adapter.layers`: which blocks get adapters (peft's `layers_to_transform`), and what follows from it.

The blocks are counted from 0 at the bottom. A value is null (every block), a list of block indices (`[4,5]`)
or `top:N`, the N highest blocks (`top:3`). The blocks below the lowest adapted block train nothing and
nothing below them does: they are fixed from the first step, a frozen prefix the plan starts with
(`fixed_blocks`). A block above it without an adapter (between two adapted blocks, or above the highest)
trains nothing either, but it still runs its backward pass while an adapted block below it trains: the
gradient reaches that block through it. The freeze policy counts the adapted blocks only (`adapted_blocks`),
and a block without an adapter freezes with the adapted block below it (`frozen_blocks_for`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ptrun.config.rules import require

TOP = re.compile(r"^top:(\d+)$")
"""`top:N`: the N highest blocks."""
ALLOWED = (
    "null (every block), a list of block indices counted from 0 at the bottom, e.g. [4,5], "
    "or top:N (the N highest blocks), e.g. top:3"
)
"""What `adapter.layers` allows, in words."""


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_layers_form(layers: Any) -> None:
    """`adapter.layers` is one of its forms (`ALLOWED`); the block indices are checked against the model's
    blocks once they are known (`check_layers_range`)."""
    if layers is None:
        return
    if isinstance(layers, str):
        m = TOP.match(layers.strip())
        require(m is not None and int(m[1]) >= 1, "adapter.layers", ALLOWED, layers)
        return
    ok = isinstance(layers, (list, tuple)) and bool(layers) and all(_is_index(b) for b in layers)
    require(ok, "adapter.layers", ALLOWED, layers)
    require(len(set(layers)) == len(layers), "adapter.layers", "a list of block indices, each once", layers)


def check_layers_range(layers: Any, num_blocks: int) -> None:
    """`adapter.layers` names blocks the model has (`num_blocks` of them)."""
    if layers is None:
        return
    if isinstance(layers, str):
        n = int(TOP.match(layers.strip())[1])
        allowed = f"top:N with N in 1..{num_blocks} (the model has {num_blocks} blocks)"
        require(n <= num_blocks, "adapter.layers", allowed, layers)
        return
    beyond = [b for b in layers if b >= num_blocks]
    require(
        not beyond,
        "adapter.layers",
        f"block indices in 0..{num_blocks - 1} (the model has {num_blocks} blocks; "
        f"{', '.join(map(str, beyond))} is not one)",
        list(layers),
    )


def adapted_blocks(layers: Any, num_blocks: int) -> tuple[int, ...]:
    """The blocks that get adapters, lowest first (every block for null)."""
    if layers is None:
        return tuple(range(num_blocks))
    if isinstance(layers, str):
        return tuple(range(num_blocks - int(TOP.match(layers.strip())[1]), num_blocks))
    return tuple(sorted(set(layers)))


def fixed_blocks(adapted: Sequence[int]) -> int:
    """The blocks below the lowest adapted one: nothing in or below them trains, so they are frozen (with the
    embedding) from the first step."""
    return adapted[0] if adapted else 0


def frozen_blocks_for(adapted: Sequence[int], count: int, num_blocks: int) -> int:
    """The model's frozen block prefix when the lowest `count` adapted blocks are frozen: every block below
    the lowest adapted block still training (the blocks without adapters among them included), all of them
    once every adapted block is frozen."""
    return adapted[count] if count < len(adapted) else num_blocks


def adapted_count_below(adapted: Sequence[int], frozen_blocks: int) -> int:
    """How many adapted blocks a frozen prefix of `frozen_blocks` blocks holds (the inverse of
    `frozen_blocks_for` on its values)."""
    return sum(b < frozen_blocks for b in adapted)


def peft_layers(layers: Any, num_blocks: int) -> list[int] | None:
    """peft's `layers_to_transform` for `adapter.layers` (None: every block)."""
    return None if layers is None else list(adapted_blocks(layers, num_blocks))
