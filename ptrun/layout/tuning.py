"""`pipe.microbatches=auto` end to end: `tune` reads the measured step times from the disk cache or measures
them (`ptrun.layout.microtune.measure`), then chooses the M per K (`choose`) and lays `auto.microbatch_table`
over the choice.

The disk cache: one JSON file per key, a hash of everything that shapes the timing (model config, input
shapes, batches and candidates per K, world size, schedule, precision, device, torch version, host), so a
model is measured once per machine. Rank 0 reads it and tells the others, so ranks of several machines
never disagree. Each file is written atomically beside its checksum and verified when read
(`ptrun.cache_entries`): one that is damaged, truncated, another key's or does not parse is reported in one
line, ignored, measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ptrun import cache_entries
from ptrun.layout.microtune import (
    BATCHES,
    TIMED_BUDGET_S,
    TIMED_STEPS,
    VERSION,
    WARMUP_STEPS,
    Choice,
    Length,
    choose,
    with_table,
)

log = logging.getLogger(__name__)


DIR_ENV = "PTRUN_MICROTUNE_DIR"
WHAT = "micro-batch cache"
AGAIN = "measuring again and rewriting it"


def cache_dir() -> Path:
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "ptrun" / "microtune")


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model (from /proc/cpuinfo where there is one) and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name} x{os.cpu_count()}"


def cache_fields(
    *,
    model: Mapping,
    input_shapes: Mapping,
    lengths: Sequence[Length],
    world_size: int,
    schedule: str,
    stages_per_rank: int,
    partition: str,
    recompute: str,
    precision: str,
    threads: int,
    device: torch.device,
) -> dict:
    """Everything that shapes the measured step times (and so keys the cache)."""
    return {
        "version": VERSION,
        "timing": [WARMUP_STEPS, TIMED_BUDGET_S, list(TIMED_STEPS), BATCHES],
        "model": dict(model),
        "input_shapes": dict(input_shapes),
        "lengths": [[length.pp, length.dp, length.per_replica, list(length.microbatches)] for length in lengths],
        "world_size": world_size,
        "schedule": schedule,
        "stages_per_rank": stages_per_rank,
        "partition": partition,
        "recompute": recompute,
        "precision": precision,
        "threads": threads,
        "device": [device.type, device_name(device)],
        "torch": torch.__version__,
        "host": socket.gethostname(),
    }


def cache_key(fields: Mapping) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def cache_path(fields: Mapping, root: Path | None = None) -> Path:
    return (root or cache_dir()) / f"{cache_key(fields)[:32]}.json"


def load(path: Path, fields: Mapping, needed: Sequence[tuple[int, int]]) -> dict[tuple[int, int], float] | None:
    """The cached costs for `fields` from `path`, or None: missing (silently); damaged, truncated or another
    entry's file (`ptrun.cache_entries`), of other fields or lacking a needed (K, M) (with one line; the
    caller measures and rewrites it)."""
    text = cache_entries.read_bytes(path, WHAT, AGAIN)
    if text is None:
        return None
    try:
        data = json.loads(text)
        if data["key"] != cache_key(fields):
            raise ValueError("written for other settings")
        costs = {(int(k), int(m)): float(s) for k, m, s in data["costs"]}
        if any(not (costs.get(c, 0) > 0 and math.isfinite(costs[c])) for c in needed):
            raise ValueError("missing or invalid step times")
        return costs
    except (ValueError, KeyError, TypeError) as e:
        log.warning(
            "%s %s is unusable (%s: %s); %s",
            WHAT,
            path,
            e.__class__.__name__,
            str(e).splitlines()[0] if str(e) else "",
            AGAIN,
        )
        return None


def store(path: Path, fields: Mapping, costs: Mapping[tuple[int, int], float]) -> bool:
    """Write the costs atomically beside their checksum (a reader never sees half a file, two runs that measured
    at once write one after the other); False, with a warning, if it cannot."""
    record = {
        "key": cache_key(fields),
        "fields": fields,
        "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "costs": [[k, m, s] for (k, m), s in sorted(costs.items())],
    }
    try:
        cache_entries.write_bytes(path, json.dumps(record, indent=1, default=str).encode())
        return True
    except OSError as e:
        log.warning("%s %s cannot be written (%s); the next run measures again", WHAT, path, e)
        return False


@dataclass
class Tuning:
    """What `tune` found: the M per K, where it came from and why."""

    lengths: list[Length]
    costs: dict[tuple[int, int], float]
    choices: dict[int, Choice]
    table: dict[int, int]
    """For AutoPipe: the measured M per K with `auto.microbatch_table`'s entries laid over it."""
    notes: list[str] = field(default_factory=list)
    source: str = "measured"
    """`measured` (profiled in this run), `cached` (read from `cache_file`) or `no choice` (one candidate
    at every K)."""
    seconds: float = 0.0
    cache_file: str = ""

    @property
    def reason(self) -> str:
        return "; ".join([c.reason for c in self.choices.values()] + self.notes)

    def samples_per_s(self) -> dict[str, dict[str, float]]:
        batch = {length.pp: length.global_batch for length in self.lengths}
        out: dict[str, dict[str, float]] = {}
        for (k, m), s in sorted(self.costs.items(), key=lambda item: (-item[0][0], item[0][1])):
            out.setdefault(str(k), {})[str(m)] = round(batch[k] / s, 1)
        return out

    def event_fields(self) -> dict:
        """For the first `plan` event."""
        return {
            "microbatches_reason": self.reason,
            "microbatch_tuning": {
                "source": self.source,
                "seconds": round(self.seconds, 3),
                "chosen": {str(k): c.microbatches for k, c in self.choices.items()},
                "table": {str(k): m for k, m in self.table.items()},
                "samples_per_s": self.samples_per_s(),
                "cache_file": self.cache_file,
            },
        }

    def summary(self) -> str:
        """The console line."""
        return f"micro-batches (pipe.microbatches=auto, {self.source} in {self.seconds:.1f}s): {self.reason}"


def tune(
    lengths: list[Length],
    fields: Mapping,
    *,
    measure_costs: Callable[[], dict[tuple[int, int], float]],
    explicit_table: Mapping[Any, int] | None = None,
    device: torch.device,
    root: Path | None = None,
) -> Tuning:
    """Collective: the cached costs for `fields` if rank 0 has them, else `measure_costs()` on every rank
    (then rank 0 writes the cache); then the choice per K. Every rank returns the same Tuning."""
    t0 = time.perf_counter()
    needed = [(length.pp, m) for length in lengths if len(length.microbatches) > 1 for m in length.microbatches]
    path = cache_path(fields, root)
    if not needed:
        costs, source = {}, "no choice"
    else:
        box: list = [load(path, fields, needed) if not dist.is_initialized() or dist.get_rank() == 0 else None]
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0, device=device if device.type == "cuda" else None)
        costs, source = (box[0], "cached") if box[0] is not None else (measure_costs(), "measured")
        if source == "measured" and (not dist.is_initialized() or dist.get_rank() == 0):
            store(path, fields, costs)
    choices = choose(lengths, costs)
    table, notes = with_table(choices, explicit_table)
    return Tuning(
        list(lengths), costs, choices, table, notes, source, time.perf_counter() - t0, str(path) if needed else ""
    )
