"""A layout's batches on one rank: the samples its replica reads of each split, from the raw data or, where
AutoCache serves the first stage, from the cache's entries, and each batch's inputs and target on the device."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from ptrun.data import EpochSampler, iterate_batches
from ptrun.models.losses import LABEL_KEYS, batch_denominator, make_target
from ptrun.parallel.pipeline import Step


@dataclass(frozen=True)
class Feed:
    """Where a layout's batches come from on this rank (made anew with each layout)."""

    data: object
    """The run's `DataSplits`."""
    plain_train: object
    """The training split as a cached run reads it (without the columns the cache serves)."""
    cache: object | None
    """AutoCache while this rank reads its inputs from it (the first stage, a prefix cached); else None."""
    train_sampler: EpochSampler
    eval_sampler: EpochSampler
    replica: int
    dp: int
    """This rank's replica of `dp`: a stage shared by every replica (PipeDream's stage replication) runs the
    whole global batch, in lanes, as replica 0 of 1."""
    device: torch.device
    input_names: tuple[str, ...]
    task: str
    pin_memory: bool
    """Pinned host batches make their copy to the GPU asynchronous (`non_blocking`)."""

    def inputs_and_target(self, batch: dict, split: str) -> tuple[tuple, torch.Tensor]:
        inputs = tuple(batch[k].to(self.device, non_blocking=True) for k in self.input_names if k in batch)
        if self.cache is not None:  # raw inputs are there only for samples the cache does not serve
            inputs = self.cache.inputs(split, batch, inputs)
        return inputs, make_target(batch, self.task).to(self.device, non_blocking=True)

    def step(self, epoch: int, index: int, batch: dict) -> Step:
        """Step `index` of `epoch` as a runtime takes it: this rank's inputs and target on the device, the
        global batch's loss weight and real samples, and the batch (for its sample counts)."""
        inputs, target = self.inputs_and_target(batch, "train")
        indices, weights = self.train_sampler.global_batch(epoch, index)
        denominator = batch_denominator(self.data.train, indices, weights, self.task)
        return Step(index, inputs, target, denominator, float(weights.sum()), extra=batch)

    def batches(self, split: str, epoch: int = 0, start_step: int = 0, end_step: int | None = None):
        """This rank's `(step, batch)` of `split` in `epoch` from `start_step` up to `end_step` (the epoch's
        end; None: the sampler's); AutoCache's entries are read in the loading thread."""
        train = split == "train"
        data = (self.plain_train if self.cache is not None else self.data.train) if train else self.data.eval
        fetch = None
        if self.cache is not None and self.cache.holds(split):
            fetch = partial(
                self.cache.fetch, split, data, input_names=self.input_names, label_names=LABEL_KEYS[self.task]
            )
        return iterate_batches(
            data,
            self.train_sampler if train else self.eval_sampler,
            epoch if train else 0,
            self.replica,
            self.dp,
            start_step=start_step,
            max_steps=end_step if train else None,
            fetch=fetch,
            pin_memory=self.pin_memory,
        )
