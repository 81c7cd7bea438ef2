"""`PerPass`: what every attention half of one forward pass needs alike (its masks, its rotary tables), built
once a pass and stage, as the library model builds them once a forward. Built per layer instead, each mask
would read the padding mask on the host (transformers' masking functions check it for padding): on a GPU,
a wait for the device at every layer."""

from __future__ import annotations

import weakref
from typing import Callable


class PerPass:
    """Built by the first unit that asks and reused by the rest of that pass on the stage. A pass is known by
    its padding mask `keep`, which the units hand on unchanged; what was built is dropped with it. A
    recomputed unit (activation checkpointing) gets what its forward got. One per model; a copy of the model
    starts empty."""

    def __init__(self) -> None:
        self._keep: weakref.ref | None = None
        self._built: dict = {}

    def get(self, key, keep, build: Callable[[], object]):
        """What `build()` returns for `key` in the pass of `keep` (built on the first call of the pass)."""
        if self._keep is None or self._keep() is not keep:
            built = self._built = {}  # a new pass; the callback clears only its own pass's entries
            self._keep = weakref.ref(keep, lambda _: built.clear())
        if key not in self._built:
            self._built[key] = build()
        return self._built[key]

    def __deepcopy__(self, memo) -> "PerPass":
        return PerPass()

    def __reduce__(self):
        return PerPass, ()
