"""AutoCache: the frozen prefix's output for each sample, computed once and read in later epochs, so the
frozen units leave the pipeline altogether.

When the controller's Plan says `cached_units = C` (> 0), the first pipeline stage starts at unit C and its
rank asks this class for each batch's inputs: the output of units [0, C) per sample. A sample is found in
the node's `ActivationStore` under a key that names exactly what the entry holds:

    key(split, d) = hash(data and model tag, split, the weights and buffers of units 0 .. d-1, d)

so an entry is valid only for the same prefix depth, the same frozen weights and the same preprocessing; a
restart, a new run with `cache.keep`, or a changed recipe revalidates every entry by the key alone. The
split names the transform the sample went through: training's (`data.augment` and `cache.augment`, both in
the tag) or evaluation's (never augmented), so an entry of one is never served for the other. Keys
of every shallower depth are known too: when the prefix grows from d to C, an entry still holding depth d
is advanced by running only units [d, C) on it (the incremental update); only a missing, corrupt or
foreign entry is recomputed from the raw input. Results are written back for the batch's real samples
(weight 1: each appears once per epoch, so every slot has one writer); padding duplicates are not.

Evaluation is served the same way: eval samples have their own slots after the training samples' (so
training has the memory tier first), filled at the first evaluation at a depth, advanced when the depth grows
and read after that, so an evaluation runs only the active units. With `cache.eval=false` they have no
slots, and the frozen prefix runs on them at every evaluation.

Frozen units run in eval mode (no dropout, no stochastic depth) wherever they run, in the cache and in a
pipeline stage alike, so a cached activation is exactly what the prefix computes: the cache changes speed,
not results (with `cache.dtype=float32`).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

from ptrun.auto.cache_store import ActivationStore, LocalStore, device_index, entry_specs
from ptrun.config import CacheConfig, parse_memory
from ptrun.config.freezing import CACHE_DTYPE_BYTES
from ptrun.freezing.counts import frozen_units_for_blocks
from ptrun.models.layered import run_units
from ptrun.numerics.precision import autocast

STAT_NAMES = ("hits", "advanced", "computed", "corrupt", "written")
"""Per-epoch counters, kept per split: read as is, advanced from a shallower depth, computed from the raw
input, found corrupt (then computed), and written back."""


def default_min_units(num_blocks: int) -> int:
    """The paper's threshold (3 of 12 blocks for ViT-B, 5 of 24 for BERT-large), as a quarter of the blocks
    rounded up, in units."""
    return frozen_units_for_blocks(-(-num_blocks // 4))


def shared_memory_root() -> Path:
    """/dev/shm where the OS has it (memory every process of the node can map), else the temp directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def cache_dirs(cfg: CacheConfig, run_dir: str | Path) -> tuple[Path, Path]:
    """(the disk tier, the memory tier) of a run's cache. The memory tier is found from the disk tier's path,
    so the workers of a node (and a later run with `cache.keep` and the same `cache.dir`) all map the same
    files, and the launcher can remove what workers that were killed left behind."""
    disk_dir = Path(cfg.dir).expanduser() if cfg.dir else Path(run_dir) / "cache"
    node_key = hashlib.blake2b(str(disk_dir.resolve()).encode(), digest_size=6).hexdigest()
    return disk_dir, shared_memory_root() / f"ptrun-cache-{node_key}"


def _as_tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


class AutoCache:
    """The frozen-prefix cache of one worker. `tag` names the data transforms and model configuration (any
    change to them must change the tag); train samples use slots [0, num_train), eval samples the next
    num_eval (0: eval samples have no slots, and `inputs` runs the prefix on them every time)."""

    def __init__(
        self,
        layered,
        cfg: CacheConfig,
        *,
        tag: str,
        num_train: int,
        num_eval: int,
        device: torch.device,
        run_dir: str | Path,
        compute_dtype: torch.dtype | None = None,
        local: bool = False,
        speaks: bool = False,
    ):
        self.layered, self.cfg, self.tag, self.device = layered, cfg, tag, device
        # the worker that says a missing disk tier, and entries that failed their checksum, once each
        self.speaks, self.said_disk_lost, self.said_corrupt = speaks, False, False
        # A job of one worker keeps its entries on its own device when they fit (`LocalStore`): nobody else
        # reads them, and a GPU then never copies an activation through the host.
        self.local = local and not cfg.keep
        self.compute_dtype = compute_dtype  # the prefix runs as it would in a stage: under the same autocast
        self.disk_dir, self.mem_dir = cache_dirs(cfg, run_dir)
        self.max_memory = parse_memory(cfg.max_memory)
        # `auto` is filled in resolution; a cache made without it stores in the compute dtype
        self.storage_dtype = (
            getattr(torch, cfg.dtype) if cfg.dtype in CACHE_DTYPE_BYTES else (compute_dtype or torch.float32)
        )
        self.offset = {"train": 0, "eval": num_train} if num_eval else {"train": 0}  # the splits with slots
        self.num_slots = num_train + num_eval
        self.depth = 0
        self.keys: dict[str, dict[int, int]] = {}  # per split: key -> the prefix depth it stands for
        self.key: dict[str, int] = {}  # per split: the key of the current depth
        self.store: ActivationStore | LocalStore | None = None
        # The running hash of the frozen prefix after each unit (index d: units 0 .. d-1), grown as the prefix
        # does: the prefix only ever grows, and frozen weights never change, so a unit is hashed once a run.
        self._hashes = [hashlib.blake2b(self.tag.encode(), digest_size=8)]
        self.stats: defaultdict[str, Counter] = defaultdict(Counter)
        # What serving costs against recomputing (training's split): host seconds reading entries and the hits
        # they served this epoch; seconds running frozen units on rows and the unit-rows run, over the run (a
        # GPU's timed by events, read at `costs`, so nothing waits for the device meanwhile).
        self.read_s, self.read_rows, self.read_hits, self.compute_s, self.unit_rows = 0.0, 0, 0, 0.0, 0
        self._events: list[tuple] = []
        self._label_views: dict[str, object] = {}

    # ---- depth --------------------------------------------------------------------------------------
    def holds(self, split: str) -> bool:
        """Whether `split`'s samples have slots (evaluation's only with `cache.eval`)."""
        return split in self.offset

    def depth_keys(self, depth: int) -> dict[str, dict[int, int]]:
        """Per split with slots: key -> d for every d in 1..depth. A unit's weights and buffers are hashed
        the first time the prefix reaches past it (on a GPU each is a copy to the host), not at every depth."""
        for unit in self.layered.units[len(self._hashes) - 1 : depth]:
            running = self._hashes[-1].copy()
            for name, value in unit.state_dict().items():
                running.update(name.encode())
                running.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            self._hashes.append(running)
        keys: dict[str, dict[int, int]] = {split: {} for split in self.offset}
        for d in range(1, depth + 1):
            for split, of_split in keys.items():
                at = self._hashes[d].copy()
                at.update(f"split={split};depth={d}".encode())
                of_split[int.from_bytes(at.digest(), "little") | 1] = d  # | 1: never 0, the empty slot's key
        return keys

    def _open_store(self, specs) -> ActivationStore | LocalStore:
        """A store for entries of `specs`: on this worker's device when the job has one worker and they fit
        in half its free memory (a GPU's) or in `cache.max_memory` (the host's), else the node's shared one."""
        if self.local:
            need = LocalStore.size(specs, self.num_slots)
            room = torch.cuda.mem_get_info(self.device)[0] // 2 if self.device.type == "cuda" else self.max_memory
            if need <= room:
                return LocalStore(specs, self.num_slots, self.device)
        store = ActivationStore(self.mem_dir, self.disk_dir, specs, self.num_slots, self.max_memory)
        if store.disk_lost and self.speaks and not self.said_disk_lost:
            logging.getLogger(__name__).warning("AutoCache: %s", store.disk_lost)
            self.said_disk_lost = True
        return store

    def set_depth(self, depth: int, probe: tuple[torch.Tensor, ...]) -> None:
        """Serve the output of units [0, depth) from now on (0 = the cache is not used). `probe` is one
        sample's raw inputs (batch dimension 1), run once to learn the entry's shapes."""
        if depth == self.depth:
            return
        self.depth = depth
        if depth == 0:
            return
        prefix = self.layered.units[:depth]
        for unit in prefix:
            unit.to(self.device).eval()
        self.keys = self.depth_keys(depth)
        self.key = {split: next(k for k, d in keys.items() if d == depth) for split, keys in self.keys.items()}
        with torch.no_grad(), autocast(self.device, self.compute_dtype):
            sample = _as_tuple(run_units(prefix, *(t.to(self.device) for t in probe)))
        specs = entry_specs(tuple(t[0] for t in sample), self.storage_dtype)
        if self.store is None or self.store.specs != specs:
            if self.store is not None:
                self.store.close()
            self.store = self._open_store(specs)

    # ---- batches ------------------------------------------------------------------------------------
    def fetch(
        self, split: str, dataset, ids: torch.Tensor, input_names: tuple[str, ...], label_names: tuple[str, ...]
    ) -> dict:
        """The batch of `ids` (of a split with slots) for the first stage while the cache serves it (the
        loading thread calls this): the cache's entries, the labels, and raw inputs only for the samples no
        entry serves. Reading, decoding and augmenting a hit's raw input would be wasted work. Raw input rows
        of the other samples are zeros (never read)."""
        batch = {"index": ids}
        self.lookup(split, batch)
        view = self._label_views.get(split)
        if view is None:  # one label-only view per split, not one per batch
            view = self._label_views[split] = dataset.select_columns(list(label_names))
        labels = view[ids.tolist()]
        batch.update({k: torch.as_tensor(labels[k]) for k in label_names})
        misses = [row for row, key in enumerate(batch["cache_found"]) if self.keys[split].get(key, 0) == 0]
        if misses:
            raw = dataset[ids[misses].tolist()]
            for name in input_names:
                column = torch.as_tensor(raw[name])
                full = column.new_zeros((len(ids), *column.shape[1:]))
                full[misses] = column
                batch[name] = full
        return batch

    def lookup(self, split: str, batch: dict) -> dict:
        """Read the batch's entries (I/O only: the prefetch thread calls this). Adds `cache_found` (the key
        found per sample, 0 = miss) and `cache_tensors`."""
        if self.depth:
            t0 = time.perf_counter()
            ids = (batch["index"] + self.offset[split]).tolist()
            found, tensors, corrupt = self.store.read(ids, self.keys[split])
            if self.device.type == "cuda" and not tensors[0].is_cuda:  # pinned: the copy to the GPU overlaps
                tensors = [t.pin_memory() for t in tensors]
            if split == "train":
                self.read_s += time.perf_counter() - t0
                self.read_rows += len(ids)
            batch["cache_found"], batch["cache_tensors"], batch["cache_corrupt"] = found, tensors, corrupt
        return batch

    @torch.no_grad()
    def inputs(self, split: str, batch: dict, raw: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The first active unit's inputs for `batch`: entries found by `lookup` at the current depth as
        they are, shallower ones advanced by the missing units, the rest computed from `raw`; new results
        written back for the real samples. A split without slots has the prefix computed from `raw`."""
        stats = self.stats[split]
        if not self.holds(split):
            with autocast(self.device, self.compute_dtype):
                out = _as_tuple(run_units(self.layered.units[: self.depth], *raw))
            stats["computed"] += len(batch["index"])
            return out
        if "cache_found" not in batch:
            self.lookup(split, batch)
        depth_of = [self.keys[split].get(k, 0) for k in batch.pop("cache_found")]
        out = [t.to(self.device, non_blocking=True) for t in batch.pop("cache_tensors")]
        stats["corrupt"] += batch.pop("cache_corrupt")
        ids = (batch["index"] + self.offset[split]).tolist()
        real = (batch["weight"] > 0).tolist()  # one conversion, not a tensor read per row
        for start in sorted(set(depth_of) - {self.depth}):
            rows = [i for i, d in enumerate(depth_of) if d == start]
            index = device_index(rows, self.device)
            carry = (
                tuple(r.index_select(0, index) for r in raw)
                if start == 0
                else tuple(t.index_select(0, index) for t in out)
            )
            with autocast(self.device, self.compute_dtype), self._timing(split, len(rows) * (self.depth - start)):
                result = _as_tuple(run_units(self.layered.units[start : self.depth], *carry))
            for t, r in zip(out, result, strict=True):
                t.index_copy_(0, index, r.to(t.dtype))
            stats["computed" if start == 0 else "advanced"] += len(rows)
            keep = [j for j, row in enumerate(rows) if real[row]]
            if keep:
                at = device_index(keep, self.device)
                self.store.write_rows(
                    [ids[rows[j]] for j in keep], [r.index_select(0, at) for r in result], self.key[split]
                )
                stats["written"] += len(keep)
        hits = sum(d == self.depth for d in depth_of)
        stats["hits"] += hits
        if split == "train":
            self.read_hits += hits
        return tuple(out)

    @contextlib.contextmanager
    def _timing(self, split: str, unit_rows: int):
        """Time the frozen units run inside the block on training's rows (`unit_rows`: rows x units)."""
        if split != "train":
            yield
        elif self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._events.append((start, end, unit_rows))
        else:
            t0 = time.perf_counter()
            yield
            self.compute_s += time.perf_counter() - t0
            self.unit_rows += unit_rows

    def costs(self) -> list[float]:
        """[seconds reading entries, entries read, hits] this epoch (then reset), [seconds running frozen
        units, unit-rows run] over the run: one hit's cost against recomputing its prefix (`serving_costs`)."""
        for start, end, unit_rows in self._events:
            end.synchronize()
            self.compute_s += start.elapsed_time(end) / 1000
            self.unit_rows += unit_rows
        self._events.clear()
        read = [self.read_s, float(self.read_rows), float(self.read_hits)]
        self.read_s, self.read_rows, self.read_hits = 0.0, 0, 0
        return [*read, self.compute_s, float(self.unit_rows)]

    def say_corrupt(self, count: int) -> None:
        """Once a run, by the worker that speaks: `count` entries (an epoch's, summed over the workers) failed
        their CRC and were computed again, naming the store's files (a disk tier's slots torn by a run killed
        while writing them, or damaged on disk, are found so on resume)."""
        if count and self.speaks and not self.said_corrupt and isinstance(self.store, ActivationStore):
            files = [
                p
                for p, n in (
                    (self.store.mem_path, self.store.memory_bytes),
                    (self.store.disk_path, self.store.disk_bytes),
                )
                if n
            ]
            logging.getLogger(__name__).warning(
                "AutoCache: %d cached entries in %s failed their checksum (torn by a run killed while writing "
                "them, or damaged on disk); computed again and rewritten (each epoch's cache.corrupt counts them)",
                count,
                " or ".join(map(str, files)),
            )
            self.said_corrupt = True

    def take_stats(self, split: str) -> dict[str, int]:
        """This worker's counters of `split` since the last call (then reset)."""
        counts = self.stats.pop(split, Counter())
        return {name: int(counts[name]) for name in STAT_NAMES}

    @property
    def memory_bytes(self) -> int:
        return self.store.memory_bytes if self.store else 0

    @property
    def disk_bytes(self) -> int:
        return self.store.disk_bytes if self.store else 0

    def close(self, remove: bool) -> None:
        """Unmap the store; with `remove`, delete its files (one process per node should)."""
        store, self.store = self.store, None
        if store is not None:
            store.close()
        if remove:
            for path in list(self.mem_dir.glob("entries-*")) + list(self.disk_dir.glob("entries-*")):
                path.unlink(missing_ok=True)
            for folder in (self.mem_dir, self.disk_dir):
                try:
                    folder.rmdir()  # only if nothing else lives there (a user's own cache.dir keeps its files)
                except OSError:
                    pass
