"""What every attention half of one forward pass needs alike (its masks, its rotary tables), built once a pass
as the library model builds them once a forward. Built per layer instead, each mask would read the padding
mask on the host (transformers' masking functions check it for padding): on a GPU, a wait for the device at
every layer.

A pass is one `run_units` call (`ptrun.models.layered`) or one stage's forward (`StageModule`): one batch
through a slice of units. Inside it `shared(key, build)` builds on the first call and hands the same object to
the rest; outside any pass (a unit called on its own) it builds every time. What a pass built is dropped when
the pass ends. A pass is not known by its tensors: a pipeline stage receives every step's activations into the
same buffers, so a key made of a tensor's identity would hand one step's masks to the next."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_built: ContextVar[dict | None] = ContextVar("ptrun_per_pass", default=None)


@contextmanager
def one_pass() -> Iterator[None]:
    """The units run inside share what they build with `shared`. Inside an open pass, that same pass: a stage
    opens one for its whole forward, so its activation-checkpointed chunks share it too (their recomputation
    in the backward pass, outside it, builds anew)."""
    if _built.get() is not None:
        yield
        return
    token = _built.set({})
    try:
        yield
    finally:
        _built.reset(token)


def shared(key, build: Callable[[], object]):
    """What `build()` returns for `key` in this pass (built on its first call), or a new build outside a pass."""
    built = _built.get()
    if built is None:
        return build()
    if key not in built:
        built[key] = build()
    return built[key]
