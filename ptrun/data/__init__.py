"""Data: dataset sources, the epoch sampler and per-replica batch iteration."""

from ptrun.data.loader import iterate_batches
from ptrun.data.sampler import EpochSampler
from ptrun.data.sources import DataSplits, build_datasets

__all__ = ["DataSplits", "EpochSampler", "build_datasets", "iterate_batches"]
