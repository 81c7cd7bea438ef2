"""Batch iteration for one data-parallel replica, with the next batches loaded in a background thread."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from torch import Tensor

from ptrun.data.sampler import EpochSampler

PREFETCH_DEPTH = 2
PREFETCH_THREAD_NAME = "ptrun-prefetch"
_DONE = object()  # end-of-epoch marker in the prefetch queue


def iterate_batches(
    dataset,
    sampler: EpochSampler,
    epoch: int,
    replica: int,
    dp: int,
    start_step: int = 0,
    max_steps: int | None = None,
    fetch: Callable[[Tensor], dict] | None = None,
    pin_memory: bool = False,
) -> Iterator[tuple[int, dict[str, Tensor]]]:
    """Yield `(step, batch)` for steps `start_step .. min(steps_per_epoch, max_steps) - 1` of `epoch`.

    `batch` is `dataset[ids]` (every column as a stacked tensor), or `fetch(ids)` when given (AutoCache reads
    its entries instead of the raw inputs there), plus `weight` (float32 [b], 0 for padding) and `index`
    (int64 [b], the sample ids). Loading runs in a background thread, which starts on the first `next()` and
    is stopped and joined when the generator finishes or is closed; an exception while loading is raised here.
    With `pin_memory` (CUDA) the loading thread also pins each tensor, so the copy to the GPU can overlap.
    """
    end = sampler.steps_per_epoch if max_steps is None else min(sampler.steps_per_epoch, max_steps)
    ready: queue.Queue = queue.Queue(maxsize=PREFETCH_DEPTH)
    stop = threading.Event()

    def load(step: int) -> dict[str, Tensor]:
        ids, weight = sampler.replica_batch(epoch, step, replica, dp)
        batch = fetch(ids) if fetch is not None else dict(dataset[ids.tolist()])
        batch["weight"] = weight
        batch["index"] = ids
        if pin_memory:
            batch = {k: v.pin_memory() if isinstance(v, Tensor) else v for k, v in batch.items()}
        return batch

    def offer(item) -> bool:
        """Put `item` unless the consumer has gone; polls so a closed generator never leaves us blocked."""
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.05)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for step in range(start_step, end):
                if not offer((step, load(step))):
                    return
            offer(_DONE)
        except Exception as error:  # handed to the consumer, which re-raises it with its traceback
            offer(error)

    worker = threading.Thread(target=produce, name=PREFETCH_THREAD_NAME, daemon=True)
    worker.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()
