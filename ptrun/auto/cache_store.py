"""AutoCache's stores. `LocalStore`: a job of one worker keeps its entries in its own device's memory (the
GPU's, or the host's on a CPU), read and written with one gather and one scatter per batch, never copied
through the host. `ActivationStore`: the workers of a node share one fixed-size slot per sample in
memory-mapped files, a memory tier in /dev/shm up to a byte budget and a disk tier beyond it (a sample one
replica cached is read by whichever replica trains on it in a later epoch).

A slot is a 16-byte header (`key` u64, `crc32` u32, unused u32) and the sample's tensors packed one after
another. `key` says what the slot holds (which frozen prefix, of which weights, on which data transform:
see `autocache.py`); 0 means empty. A writer clears the key, writes the data and its CRC, and sets the key
last, so a slot is either valid or recognisably not: a reader that finds an unknown key, or data whose CRC
does not match (a torn write after a crash, a flipped bit on disk), treats the sample as a miss and the
caller recomputes it. Nothing is ever read wrong, and nothing needs locking: each sample has one writer
per epoch (the replica that trains on it; padding duplicates are not written).

Samples `0 .. memory_slots - 1` live in the memory file, the rest in the disk file, so the budget holds
exactly and every process computes the same split. Both files are allocated up front (`posix_fallocate`):
running out of /dev/shm fails at once with a clear error instead of a SIGBUS mid-epoch; a disk tier there is
no space for is left out, its samples recomputed every time (`disk_lost` says why, once). A disk tier file a
resumed run (or one with `cache.keep`) finds at another size (truncated, another store's) is replaced by an
empty one, in one line; one of the right size is kept, its slots checked one by one as they are read.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ptrun import cache_entries
from ptrun.config import ConfigError

HEADER_BYTES = 16
SLOT_ALIGN = 64  # cache-line aligned slots: no two samples share a line that two processes write
REDO = "its entries are computed again"


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a sample's entry: its per-sample shape, its dtype in the model, how it is stored."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    stored: torch.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * torch.empty((), dtype=self.stored).element_size()


def entry_specs(sample: tuple[torch.Tensor, ...], storage_dtype: torch.dtype) -> tuple[TensorSpec, ...]:
    """Specs of one sample's carry (tensors without the batch dimension). The first tensor (the hidden
    states) is stored in `storage_dtype`; the others (masks) keep their own dtype, so a mask of -3.4e38
    never turns into -inf in float16."""
    return tuple(
        TensorSpec(tuple(t.shape), t.dtype, storage_dtype if i == 0 and t.is_floating_point() else t.dtype)
        for i, t in enumerate(sample)
    )


def _allocate(path: Path, size: int) -> None:
    """Create `path` at exactly `size` bytes with its blocks reserved (ENOSPC now, not SIGBUS later)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, 0)
            if size:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate
                        os.ftruncate(fd, size)
                    else:
                        os.unlink(path)  # nothing maps a file of the wrong size: leave no empty file behind
                        raise
    finally:
        os.close(fd)


def _allocate_disk(path: Path, size: int) -> str | None:
    """The disk tier's file at exactly `size` bytes. One of that size is kept: it may hold a killed or earlier
    run's entries, and each slot's key and CRC say what it still holds (a torn or damaged slot is a miss).
    Any other is unusable (truncated, or another store's file copied over it): removed, and an empty one
    reserved under a temporary name and renamed into place, so a run killed while reserving it leaves no
    file of the wrong size. Returns why a file there was replaced, None when none was."""
    try:
        found = path.stat().st_size
    except FileNotFoundError:
        found = None
    if found == size:
        return None
    path.unlink(missing_ok=True)  # useless now; its room counts for the new one
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # of a process killed reserving it (the caller
        stale.unlink(missing_ok=True)  # holds the store's lock: nobody else reserves it now)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        _allocate(tmp, size)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if found is None:
        return None
    return f"it was {found} bytes where this store's layout needs {size} (truncated, or another store's file)"


class ActivationStore:
    """`num_slots` sample slots of `specs` under `mem_dir` (the first `max_memory // slot_bytes`) and
    `disk_dir` (the rest). Any number of processes may open the same store; the first one allocates it."""

    def __init__(
        self, mem_dir: str | Path, disk_dir: str | Path, specs: tuple[TensorSpec, ...], num_slots: int, max_memory: int
    ):
        self.specs, self.num_slots = specs, num_slots
        self.data_bytes = sum(s.nbytes for s in specs)
        self.slot_bytes = -(-(HEADER_BYTES + self.data_bytes) // SLOT_ALIGN) * SLOT_ALIGN
        self.memory_slots = min(num_slots, max(0, max_memory) // self.slot_bytes)
        layout = json.dumps(
            [[list(s.shape), str(s.dtype), str(s.stored)] for s in specs]
            + [num_slots, self.memory_slots, self.slot_bytes]
        )
        self.name = "entries-" + hashlib.blake2b(layout.encode(), digest_size=6).hexdigest()
        self.mem_path = Path(mem_dir) / f"{self.name}.mem"
        self.disk_path = Path(disk_dir) / f"{self.name}.disk"
        for key, folder in (
            ("cache.max_memory (the memory tier)", self.mem_path.parent),
            ("cache.dir", self.disk_path.parent),
        ):
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"{key}: cannot create the directory {folder} ({e.strerror})") from None
        self.disk_lost: str | None = None
        """Why the disk tier could not be had (no space), if so: its samples are never cached."""
        lock = os.open(self.disk_path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one process allocates; the others find the files complete
            try:
                _allocate(self.mem_path, self.memory_slots * self.slot_bytes)
            except OSError as e:
                raise ConfigError(
                    f"cache.max_memory: cannot reserve {self.memory_slots * self.slot_bytes} bytes in "
                    f"{self.mem_path.parent} ({os.strerror(e.errno)}); lower cache.max_memory"
                ) from None
            try:
                replaced = _allocate_disk(self.disk_path, (num_slots - self.memory_slots) * self.slot_bytes)
                if replaced:  # said by the one process that found it (the others find the new file)
                    cache_entries.report("AutoCache's disk tier", self.disk_path, replaced, REDO)
            except OSError as e:
                if e.errno in (errno.ENOSPC, errno.EDQUOT):  # no disk tier: its samples are recomputed
                    self.disk_lost = (
                        f"no space for the cache's disk tier ({self.disk_bytes} bytes in {self.disk_path.parent}, "
                        f"{shutil.disk_usage(self.disk_path.parent).free} free): the frozen prefix of the "
                        f"{num_slots - self.memory_slots} samples beyond cache.max_memory is recomputed instead; "
                        f"free space there, set cache.dir elsewhere or raise cache.max_memory to cache them"
                    )
                else:
                    raise ConfigError(
                        f"cache.dir: cannot reserve {(num_slots - self.memory_slots) * self.slot_bytes} "
                        f"bytes in {self.disk_path.parent} ({os.strerror(e.errno)}); free space or "
                        f"raise cache.max_memory"
                    ) from None
        finally:
            os.close(lock)  # closing releases the lock
        self._mem = self._map(self.mem_path, self.memory_slots)
        self._disk = None if self.disk_lost else self._map(self.disk_path, num_slots - self.memory_slots)
        self.offsets = np.cumsum([HEADER_BYTES] + [s.nbytes for s in specs]).tolist()

    def _map(self, path: Path, slots: int) -> np.ndarray | None:
        if slots == 0:
            return None
        return np.memmap(path, dtype=np.uint8, mode="r+", shape=(slots, self.slot_bytes))

    @property
    def memory_bytes(self) -> int:
        return self.memory_slots * self.slot_bytes

    @property
    def disk_bytes(self) -> int:
        return 0 if getattr(self, "disk_lost", None) else (self.num_slots - self.memory_slots) * self.slot_bytes

    def _slot(self, sample: int) -> np.ndarray | None:
        """The slot of `sample`; None where it lies in a disk tier there was no space for."""
        if not 0 <= sample < self.num_slots:
            raise IndexError(f"sample {sample} outside the cache's {self.num_slots} slots")
        if sample < self.memory_slots:
            return self._mem[sample]
        return None if self.disk_lost else self._disk[sample - self.memory_slots]

    # ---- entries ------------------------------------------------------------------------------------
    def key_of(self, sample: int) -> int:
        slot = self._slot(sample)
        return 0 if slot is None else int(slot[:8].view(np.uint64)[0])

    def read(self, samples: list[int], keys: set[int] | dict[int, object]) -> tuple[list[int], list[torch.Tensor], int]:
        """Look up `samples`. Returns (the key found per sample, 0 where the slot is empty, holds a key not
        in `keys`, or fails its CRC), the stacked tensors (zeros for those misses), and the number of slots
        that held a wanted key but failed the CRC (corrupt or torn)."""
        found = [0] * len(samples)
        raw = np.zeros((len(samples), self.data_bytes), dtype=np.uint8)
        corrupt = 0
        for row, sample in enumerate(samples):
            slot = self._slot(sample)
            key = 0 if slot is None else int(slot[:8].view(np.uint64)[0])
            if key == 0 or key not in keys:
                continue
            data = np.array(slot[HEADER_BYTES : HEADER_BYTES + self.data_bytes])  # a private copy
            if zlib.crc32(data) != int(slot[8:12].view(np.uint32)[0]) or int(slot[:8].view(np.uint64)[0]) != key:
                corrupt += 1
                continue
            raw[row] = data
            found[row] = key
        return found, self._unpack(torch.from_numpy(raw)), corrupt

    def _unpack(self, raw: torch.Tensor) -> list[torch.Tensor]:
        out, lo = [], 0
        for spec in self.specs:
            part = raw[:, lo : lo + spec.nbytes].contiguous().view(spec.stored)
            out.append(part.view(raw.shape[0], *spec.shape).to(spec.dtype))
            lo += spec.nbytes
        return out

    def write(self, sample: int, tensors: list[torch.Tensor], key: int) -> None:
        """Store one sample's tensors (no batch dimension) under `key` (non-zero)."""
        if key == 0:
            raise ValueError("key 0 marks an empty slot")
        slot = self._slot(sample)
        if slot is None:  # a disk tier there was no space for: the sample stays a miss
            return
        slot[:8].view(np.uint64)[0] = 0  # invalid while the data changes
        parts = [
            t.detach().to("cpu", spec.stored).contiguous().reshape(-1).view(torch.uint8)
            for t, spec in zip(tensors, self.specs, strict=True)
        ]
        data = torch.cat(parts).numpy()
        if data.size != self.data_bytes:
            raise ValueError(f"entry of {data.size} bytes for slots of {self.data_bytes}")
        slot[HEADER_BYTES : HEADER_BYTES + self.data_bytes] = data
        slot[8:12].view(np.uint32)[0] = zlib.crc32(data)
        slot[:8].view(np.uint64)[0] = key

    def write_rows(self, samples: list[int], rows: list[torch.Tensor], key: int) -> None:
        """Store `rows` (batched, on any device) as the entries of `samples` under `key`: one copy to the
        host, then slot by slot."""
        host = [r.detach().cpu() for r in rows]
        for j, sample in enumerate(samples):
            self.write(sample, [h[j] for h in host], key)

    def close(self) -> None:
        self._mem = self._disk = None  # the mappings close when the last view of them is gone


def device_index(rows: list[int], device: torch.device) -> torch.Tensor:
    """`rows` as an index tensor on `device`. To a GPU through pinned memory, asynchronously: a copy from
    ordinary (pageable) host memory first waits for every kernel queued before it."""
    index = torch.tensor(rows, dtype=torch.long)
    if device.type != "cuda":
        return index
    return index.pin_memory().to(device, non_blocking=True)


class LocalStore:
    """`num_slots` entries of `specs` in this process's memory on `device`: one tensor per spec with a row
    per sample, and each row's key in a host array (a lookup never waits for the device). Nothing outlives
    the process, and nothing is torn by a crash, so there is no checksum: a key says what a row holds."""

    def __init__(self, specs: tuple[TensorSpec, ...], num_slots: int, device: torch.device):
        self.specs, self.num_slots = specs, num_slots
        self.rows = [torch.zeros((num_slots, *s.shape), dtype=s.stored, device=device) for s in specs]
        self.keys = np.zeros(num_slots, dtype=np.uint64)
        self.device = device

    @staticmethod
    def size(specs: tuple[TensorSpec, ...], num_slots: int) -> int:
        """The bytes a store of `num_slots` entries holds."""
        return num_slots * sum(s.nbytes for s in specs)

    @property
    def memory_bytes(self) -> int:
        return self.size(self.specs, self.num_slots)

    disk_bytes = 0

    def read(self, samples: list[int], keys: set[int] | dict[int, object]) -> tuple[list[int], list[torch.Tensor], int]:
        """As `ActivationStore.read`, the tensors on the store's device (a miss's row holds whatever the slot
        held: never read)."""
        found = [int(k) if int(k) in keys else 0 for k in self.keys[samples]]
        index = device_index(samples, self.device)
        return found, [r.index_select(0, index).to(s.dtype) for r, s in zip(self.rows, self.specs, strict=True)], 0

    def write_rows(self, samples: list[int], rows: list[torch.Tensor], key: int) -> None:
        """Store `rows` (batched) as the entries of `samples` under `key`: one scatter per tensor."""
        if key == 0:
            raise ValueError("key 0 marks an empty slot")
        index = device_index(samples, self.device)
        for store, row in zip(self.rows, rows, strict=True):
            store.index_copy_(0, index, row.detach().to(store.device, store.dtype))
        self.keys[samples] = key

    def write(self, sample: int, tensors: list[torch.Tensor], key: int) -> None:
        """Store one sample's tensors (no batch dimension) under `key`."""
        self.write_rows([sample], [t[None] for t in tensors], key)

    def key_of(self, sample: int) -> int:
        return int(self.keys[sample])

    def close(self) -> None:
        self.rows = []
