"""Data: dataset sources, the epoch sampler and per-replica batch iteration.

The names below load their modules on first use (PEP 562): `ptrun train`'s check of a user's files, before
any worker starts, imports `ptrun.data.hf_read` without torch, torchvision and every other source."""

from importlib import import_module

_HOMES = {
    "DataSplits": "ptrun.data.splits",
    "EpochSampler": "ptrun.data.sampler",
    "build_datasets": "ptrun.data.sources",
    "iterate_batches": "ptrun.data.loader",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'ptrun.data' has no attribute {name!r}")
    value = getattr(import_module(_HOMES[name]), name)
    globals()[name] = value  # found once; later lookups do not come here
    return value
