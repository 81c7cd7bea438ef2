"""Small splits held as whole tensors, so a batch is one index operation per column.

A `datasets.Dataset` in torch format converts Arrow rows to tensors on every `dataset[ids]`: on the embedded
default that conversion cost about a quarter of a training step's time (in the loading thread, which shares
the worker's core). A split whose columns are all tensors and whose Arrow table is small is converted once;
the result answers the same calls the trainer, AutoCache and the micro-batch tuner make (`len`, `[ids]`,
`[:]`, `select_columns`, `column_names`) with the same values and dtypes. Splits with a per-row transform
(decoding, random augmentation) or that are large stay as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MAX_BYTES = 1 << 30
"""The largest Arrow table (bytes) converted to tensors; larger splits keep reading rows from Arrow."""


class InMemoryDataset:
    """Columns of equal length as tensors, indexed like a torch-format `datasets.Dataset`."""

    def __init__(self, columns: dict[str, Tensor]):
        self.columns = columns
        self._len = len(next(iter(columns.values())))

    def __len__(self) -> int:
        return self._len

    @property
    def column_names(self) -> list[str]:
        return list(self.columns)

    def __getitem__(self, key) -> dict[str, Tensor]:
        if isinstance(key, (list, tuple)):
            key = torch.as_tensor(key, dtype=torch.long)
        return {name: column[key] for name, column in self.columns.items()}

    def select_columns(self, names: Sequence[str]) -> InMemoryDataset:
        return InMemoryDataset({name: self.columns[name] for name in names})


def in_memory(dataset, max_bytes: int = MAX_BYTES):
    """`dataset` as an `InMemoryDataset` when it is a torch-format split without a transform, every column
    comes out as a tensor, and its table holds at most `max_bytes`; else `dataset` itself."""
    fmt = getattr(dataset, "format", None)
    if not fmt or fmt.get("type") != "torch" or fmt.get("format_kwargs") or len(dataset) == 0:
        return dataset
    if dataset.data.nbytes > max_bytes:
        return dataset
    columns = dataset[:]
    if not all(isinstance(v, Tensor) for v in columns.values()):
        return dataset
    return InMemoryDataset(dict(columns))
