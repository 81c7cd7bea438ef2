"""What an epoch event reports beside the loss: AutoCache's counters, fp16's loss scale and skipped steps,
PipeDream's stashed weight bytes, and one step's recorded timeline. A mixin of `Trainer`
(ptrun/train/trainer.py)."""

from __future__ import annotations

import json
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
