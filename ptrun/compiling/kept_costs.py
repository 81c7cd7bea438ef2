"""What compiling costs and saves on this machine, measured by runs and kept on disk, as the micro-batch
timings are (`ptrun.layout.tuning`): one JSON file per machine (its device, torch, host, threads and
compile mode), in ~/.cache/ptrun/compile (`PTRUN_COMPILE_COSTS_DIR` moves it), holding

- the seconds one graph costs cold (inductor builds it) and warm (inductor's cache serves it), from the last
  run that compiled mostly cold or mostly cached graphs;
- per model and layout (`model_key`): the eager and the compiled step times the last `KEPT_STEPS` runs of
  each kind measured (what a compiled step saves is the least that any eager and compiled pair of them shows),
  the graphs its compiling took, and the entries it left in inductor's FX graph cache
  ($TORCHINDUCTOR_CACHE_DIR/fxgraph), so a later run counts as cached the share of them still there.

Rank 0 reads and writes it, atomically and beside its checksum (`ptrun.cache_entries`): a file that is
damaged, truncated, another machine's or does not parse is reported in one line, ignored and rewritten.
`CompileFigures` (`ptrun.compiling.price`) are made from it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import statistics
from collections.abc import Mapping
from pathlib import Path

import torch

from ptrun import cache_entries
from ptrun.compiling.price import DEFAULT_GRAPH_S, DEFAULT_SAVING, CompileFigures
from ptrun.layout.tuning import device_name

log = logging.getLogger(__name__)

DIR_ENV = "PTRUN_COMPILE_COSTS_DIR"
VERSION = 2
"""Bump when what is kept changes: older files are then ignored."""
KEPT_STEPS = 5
WHAT = "compile costs"
AGAIN = "starting from the defaults, measured again by this run"
"""Step times kept per model, layout and kind (eager, compiled): the last runs' measurements."""


def costs_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ptrun" / "compile"
    return Path(os.environ.get(DIR_ENV) or base)


def inductor_entries() -> set[str]:
    """The entries of inductor's FX graph cache now (one a compiled graph: `fxgraph/<xx>/<key>`), in
    $TORCHINDUCTOR_CACHE_DIR (which `ptrun train` sets; without it none are counted), read without creating
    it (torch's own `cache_dir()` makes it: an eager run leaves no empty cache behind)."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    try:
        top = Path(root or "") / "fxgraph"
        return {f"{d.name}/{e.name}" for d in top.iterdir() if d.is_dir() for e in d.iterdir()} if root else set()
    except OSError:
        return set()


def machine_fields(device: torch.device, mode: str) -> dict:
    """What shapes a graph's compile seconds on this machine."""
    return {
        "version": VERSION,
        "device": [device.type, device_name(device)],
        "torch": torch.__version__,
        "host": socket.gethostname(),
        "threads": torch.get_num_threads(),
        "mode": mode,
    }


def model_key(fields: Mapping) -> str:
    """The key of a model and layout's record (`fields`: the model, its inputs' shapes, the batch, the plan,
    the precision)."""
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


class KeptCosts:
    """This machine's kept compile measurements (see the module's docstring)."""

    def __init__(self, device: torch.device, mode: str, root: Path | None = None):
        self.device_type = device.type
        self.fields = machine_fields(device, mode)
        key = model_key(self.fields)
        self.path = (root or costs_dir()) / f"{key}.json"
        self.data = {"key": key, "fields": self.fields, "graph_s": {}, "models": {}}
        text = cache_entries.read_bytes(self.path, WHAT, AGAIN)
        try:
            kept = json.loads(text) if text is not None else None
        except ValueError as e:
            kept = None
            cache_entries.report(WHAT, self.path, f"it does not parse ({e.__class__.__name__})", AGAIN)
        if isinstance(kept, dict) and kept.get("key") == key and isinstance(kept.get("models"), dict):
            self.data = kept

    def model(self, key: str) -> dict:
        return self.data["models"].get(key, {})

    def graph_s(self) -> tuple[float, float]:
        """Seconds a graph costs (cold, warm): measured here, else the device's default."""
        cold, warm = DEFAULT_GRAPH_S[self.device_type]
        kept = self.data["graph_s"]
        return kept.get("cold", cold), kept.get("warm", warm)

    def saving(self, key: str) -> tuple[float, bool]:
        """The fraction of an eager step a compiled one saves for `key`, and whether it was measured: the least
        that any pair of kept measurements shows (the slowest compiled step against the fastest eager one).
        Runs on a shared machine time the same step up to a tenth apart, so a single pair of runs can show a
        saving where there is none (on 2 CPU cores one did: 12%, where compiled runs trained 13% slower); a
        saving that holds for every pair is larger than the machine's spread. On a GPU step times repeat within
        a percent or two, so a real saving still shows."""
        m = self.model(key)
        eager, compiled = m.get("eager_steps_s"), m.get("compiled_steps_s")
        if eager and compiled:
            return 1.0 - max(compiled) / min(eager), True
        return DEFAULT_SAVING[self.device_type], False

    def cached(self, key: str, graphs: int, present: set[str]) -> int:
        """How many of `graphs` inductor's cache holds for `key`: the share of the entries its earlier
        compiles left that are still `present` (none without a record)."""
        kept = self.model(key).get("entries", [])
        if not kept:
            return 0
        return round(graphs * sum(e in present for e in kept) / len(kept))

    def figures(self, key: str, steps: int, step_s: float | None, graphs: int, present: set[str]):
        """The `CompileFigures` for `key` (`graphs`: the estimate, replaced by the graphs a run of it took)."""
        graphs = self.model(key).get("graphs", graphs)
        cold, warm = self.graph_s()
        saving, measured = self.saving(key)
        eager = self.model(key).get("eager_steps_s")
        step_s = step_s or (statistics.median(eager) if eager else None)
        return CompileFigures(steps, step_s, graphs, self.cached(key, graphs, present), cold, warm, saving, measured)

    # ---- what a run measured --------------------------------------------------------------------------
    def learn_compile(self, key: str, cost: Mapping, new_entries: set[str]) -> None:
        """A compile of `key`'s layout (`cost`: `UnitCompiler.counts` between its start and end, the busiest
        worker's): the graphs it took, the entries it left, and the per-graph seconds, cold or cached, of what
        most of its graphs were."""
        graphs, cached, seconds = int(cost["graphs"]), int(cost["graphs_from_cache"]), float(cost["compile_s"])
        if graphs <= 0:
            return
        m = self.data["models"].setdefault(key, {})
        m["graphs"] = graphs
        m["entries"] = sorted(set(m.get("entries", [])) | new_entries)
        # Mostly built graphs give the cold figure, mostly cached ones the warm, the few others priced at the
        # figure already known (two workers of a machine building the same graphs: one may find the other's).
        cold, warm = self.graph_s()
        built = graphs - cached
        if built >= cached:
            self.data["graph_s"]["cold"] = max(seconds - cached * warm, 0.0) / built
        elif seconds > built * cold:
            self.data["graph_s"]["warm"] = (seconds - built * cold) / cached

    def learn_step(self, key: str, compiled: bool, step_s: float | None) -> None:
        """A step time `key`'s layout ran at, compiled or eager (the last `KEPT_STEPS` of each are kept)."""
        if step_s:
            kind = "compiled_steps_s" if compiled else "eager_steps_s"
            m = self.data["models"].setdefault(key, {})
            m[kind] = [*m.get(kind, []), step_s][-KEPT_STEPS:]

    def save(self) -> None:
        """Write atomically beside its checksum; a warning where it cannot (the next run measures again)."""
        try:
            cache_entries.write_bytes(self.path, json.dumps(self.data, indent=1, default=str).encode())
        except OSError as e:
            log.warning("compile costs %s cannot be written (%s)", self.path, e)
