"""What an epoch event reports beside the loss: AutoCache's counters, fp16's loss scale and skipped steps,
PipeDream's stashed weight bytes, each worker's memory, and one step's recorded timeline. A mixin of
`Trainer` (ptrun/train/trainer.py)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.parallel.pipedream import AsyncPipelineRuntime


class EpochStats:
    def _stash_stats(self) -> dict:
        """pipedream: the most bytes of weight copies (stashed versions) any rank held during the epoch."""
        if not isinstance(self.runtime, AsyncPipelineRuntime):
            return {}
        peak = torch.tensor([float(self.runtime.stash_bytes_peak)], dtype=torch.float64, device=self.device)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        return {"stash_bytes_peak": int(peak.item())}

    def _scaler_stats(self, skipped_before: int) -> dict:
        """fp16: the loss scale at the epoch's end and the overflowed steps it skipped."""
        if not self.scaler.enabled:
            return {}
        return {"loss_scale": self.scaler.scale, "skipped_steps": self.scaler.skipped - skipped_before}

    def _write_timeline(self, events: list[dict]) -> None:
        """Collective: every rank's recorded passes of one step, written by rank 0 to RUN_DIR/timeline.json
        (only replica 0's pipeline: the replicas run the same schedule)."""
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, events if self.replica == 0 else [])
        if self.is_main:
            plan = self.plan.to_dict()
            (Path(self.cfg.run_dir) / "timeline.json").write_text(json.dumps(
                {"step": self.global_step, "plan": plan, "events": [e for part in gathered for e in part]}))

    def _cache_stats(self) -> dict:
        """AutoCache counters of the epoch summed over the workers, and this node's cache size in bytes."""
        if self.cache is None:
            return {}
        own = self.cache.take_stats()
        total = self.all_sum(list(own.values())).long().tolist()
        return {"cache": {**dict(zip(own, total)), "cached_units": self.plan.cached_units,
                          "memory_bytes": self.cache.memory_bytes, "disk_bytes": self.cache.disk_bytes}}

    def _memory_stats(self) -> dict:
        """Collective: per worker (by rank), the bytes of the parameters its stages hold (with the prefix
        AutoCache serves, on the first stage), of its optimizer state, and its resident host memory now and
        at its peak."""
        held = {id(p): p for u in self.runtime.unit_indices for p in self.layered.units[u].parameters()}
        if self.runtime.is_first:
            held.update({id(p): p for u in range(self.plan.cached_units) for p in self.layered.units[u].parameters()})
        optim = 0
        if self.optimizer is not None:
            optim = sum(v.numel() * v.element_size() for s in self.optimizer.state.values() for v in s.values()
                        if torch.is_tensor(v) and v.ndim)  # not the scalar step counts
        # ru_maxrss is KiB on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
        mine = [sum(p.numel() * p.element_size() for p in held.values()), optim, resident_bytes(), peak]
        gathered = torch.zeros(self.world_size, len(mine), dtype=torch.float64, device=self.device)
        gathered[self.rank] = torch.tensor(mine, dtype=torch.float64)
        dist.all_reduce(gathered)
        param, optim, rss, peak = gathered.long().T.tolist()
        return {"memory": {"param_bytes": param, "optim_bytes": optim, "rss_bytes": rss, "peak_rss_bytes": peak}}


def resident_bytes() -> int:
    """This process's resident host memory now (0 where /proc is missing)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    except OSError:
        return 0
