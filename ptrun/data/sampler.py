"""The epoch sampler: which sample ids form each global batch, and each replica's share of it.

Pure (no torch.distributed): every rank computes the same global order from (seed, epoch) alone, so the
data-parallel width may change between epochs, or after a restart mid-epoch, without losing or repeating a
sample. Padding rule (no drop_last): the last batch is filled up with the first ids of the same epoch's
order, carrying weight 0, so every batch has the same shape and every sample weighs 1 exactly once per epoch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_EPOCH_STRIDE = 1_000_003  # a prime > any epoch count, so (seed, epoch) pairs never share a generator seed


class EpochSampler:
    """Global batches of `global_batch_size` ids over `range(num_samples)`, one permutation per epoch.

    shuffle=False keeps the natural order (evaluation).
    """

    def __init__(self, num_samples: int, global_batch_size: int, seed: int, shuffle: bool = True):
        if num_samples < 1 or global_batch_size < 1:
            raise ValueError(
                f"EpochSampler needs num_samples >= 1 and global_batch_size >= 1, "
                f"got {num_samples} and {global_batch_size}"
            )
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_epoch = math.ceil(num_samples / global_batch_size)
        self._cached: tuple[int, Tensor, Tensor] | None = None  # (epoch, ids, weights) of the last epoch asked

    def _epoch(self, epoch: int) -> tuple[Tensor, Tensor]:
        """The whole padded epoch: ids int64 [steps * B] and weights float32 [steps * B]."""
        cached = self._cached  # read once: the prefetch thread and the caller may both ask
        if cached is not None and cached[0] == epoch:
            return cached[1], cached[2]
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed * _EPOCH_STRIDE + epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        positions = torch.arange(self.steps_per_epoch * self.global_batch_size)
        # wrap around (not just one extra slice) so padding works even when B > num_samples
        ids = order[positions % self.num_samples]
        weights = (positions < self.num_samples).to(torch.float32)
        self._cached = (epoch, ids, weights)
        return ids, weights

    def global_batch(self, epoch: int, step: int) -> tuple[Tensor, Tensor]:
        """(ids int64 [B], weight float32 [B]) of one step; depends only on (seed, epoch, step)."""
        if not 0 <= step < self.steps_per_epoch:
            raise IndexError(f"step {step} is outside the epoch's {self.steps_per_epoch} steps")
        ids, weights = self._epoch(epoch)
        window = slice(step * self.global_batch_size, (step + 1) * self.global_batch_size)
        return ids[window], weights[window]

    def replica_batch(self, epoch: int, step: int, replica: int, dp: int) -> tuple[Tensor, Tensor]:
        """The contiguous slice `[replica * B/dp, (replica + 1) * B/dp)` of the global batch."""
        if dp < 1 or self.global_batch_size % dp != 0:
            raise ValueError(
                f"global batch size {self.global_batch_size} is not divisible by the data-parallel width {dp}"
            )
        if not 0 <= replica < dp:
            raise ValueError(f"replica {replica} is outside 0..{dp - 1}")
        ids, weights = self.global_batch(epoch, step)
        share = self.global_batch_size // dp
        window = slice(replica * share, (replica + 1) * share)
        return ids[window], weights[window]
