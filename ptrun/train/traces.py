"""What a run records of chosen steps besides its metrics: the pipeline's timeline (`train.timeline_step`: when
each stage ran each micro-batch's forward and backward, for `ptrun report`'s Gantt chart) and a profile
(`train.profile_step`: torch.profiler over `PROFILE_STEPS` steps, every operator and on a GPU every kernel, as
a Chrome trace and a table per rank)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.config.training import PROFILE_STEPS
from ptrun.layout.plan import Plan

log = logging.getLogger(__name__)


class StepTraces:
    """Each recording starts as the run takes the step it names (`begin`, before its batch is made). The
    timeline ends after that step's passes (`end`); the profile when the step after its last begins (its
    updates included), or at the run's end (`close`). An asynchronous pipeline takes steps ahead of its
    updates: a recording then holds the work that ran meanwhile, which is what the steps cost."""

    def __init__(
        self, timeline_step: int | None, profile_step: int | None, run_dir: str, rank: int, device: torch.device
    ) -> None:
        self.timeline_step, self.profile_step = timeline_step, profile_step
        self.run_dir, self.rank, self.device = Path(run_dir), rank, device
        self._timeline: list[dict] | None = None
        self._profiler: torch.profiler.profile | None = None
        self._last_step = -1  # the last step begun while profiling

    def begin(self, runtime, global_step: int) -> None:
        """Before step `global_step` (counted over the run from 0)."""
        if self._profiler is not None and global_step >= self.profile_step + PROFILE_STEPS:
            self.close()
        if global_step == self.timeline_step:
            self._timeline = runtime.record_timeline()  # this step's passes, up to its update
        if global_step == self.profile_step:
            self._profiler = torch.profiler.profile(activities=profiler_activities(self.device))
            self._profiler.__enter__()
        if self._profiler is not None:
            self._last_step = global_step

    def end(self, runtime, plan: Plan, global_step: int) -> None:
        """Collective when the timeline's step is `global_step`: after its passes, before its update."""
        if self._timeline is not None:
            runtime.stop_timeline()
            write_timeline(self._timeline, self.run_dir, plan, self.rank, global_step)
            self._timeline = None

    def close(self) -> None:
        """Write the profile, if one is running."""
        if self._profiler is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the kernels launched so far belong to the steps profiled
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        folder = self.run_dir / "profile"
        folder.mkdir(exist_ok=True)
        profiler.export_chrome_trace(str(folder / f"rank{self.rank}.json"))
        key, averages = self_time_key(self.device), profiler.key_averages()
        table = averages.table(sort_by=key, row_limit=40)
        steps = f"steps {self.profile_step}-{self._last_step}"
        reads = host_reads(averages)
        (folder / f"rank{self.rank}.txt").write_text(
            f"{steps}, rank {self.rank}, by {key}; {reads} host reads of a tensor's value "
            f"({reads / (self._last_step - self.profile_step + 1):.1f} a step)\n{table}\n"
        )
        if self.rank == 0:
            log.info(
                "profile of %s written to %s (rankR.json: a Chrome trace for https://ui.perfetto.dev; "
                "rankR.txt: the operators by self time)",
                steps,
                folder,
            )


def profiler_activities(device: torch.device) -> list:
    """What torch.profiler records on `device`: the host's operators, and on a GPU its kernels. On a CPU the
    profiler's library is quieted first: it logs its stages and a failed GPU count on stderr (on a GPU it
    keeps them: CUPTI's permission errors come that way)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    else:
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    return activities


HOST_READ = "aten::_local_scalar_dense"
"""The operator every read of a tensor's value on the host ends in (`.item()`, `bool(t)`, `float(t)`): on a GPU
each waits for the device's queue to drain, so the host can no longer run ahead of the kernels (on a CPU it
counts reads of host tensors too)."""


def host_reads(averages) -> int:
    """How often the profiled code read a tensor's value on the host, from its `key_averages()`."""
    return sum(e.count for e in averages if e.key == HOST_READ)


def self_time_key(device: torch.device) -> str:
    """The profiler's total to rank operators by: the GPU's own time on a GPU, else the host's."""
    return "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"


def write_timeline(events: list[dict], run_dir: Path, plan: Plan, rank: int, global_step: int) -> None:
    """Collective: every rank's recorded passes of one step, written by rank 0 to RUN_DIR/timeline.json
    (only replica 0's pipeline: the replicas run the same schedule)."""
    gathered: list = [None] * plan.world_size
    dist.all_gather_object(gathered, events if plan.coords(rank)[0] == 0 else [])
    if rank == 0:
        (run_dir / "timeline.json").write_text(
            json.dumps({"step": global_step, "plan": plan.to_dict(), "events": [e for part in gathered for e in part]})
        )
