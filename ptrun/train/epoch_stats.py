"""What an epoch event reports beside the loss: AutoCache's counters, fp16's loss scale and skipped steps,
PipeDream's stashed weight bytes, each worker's memory, the first steps' times, what compiling units cost, and
one step's recorded timeline."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch
import torch.distributed as dist

from ptrun.compiling.compiler import UnitCompiler
from ptrun.layout.plan import Plan

WARM_UP_STEPS = 5
"""The steps of a process's warm-up (the allocator's first blocks, kernels' first calls; 2 to 7 steps on a CPU):
its epoch event records when they ended (`warm_up_end_time`), and the savings estimate leaves them out of the
all-training rate."""


class StartClock:
    """Where a worker's start went, for the start event: when the worker began (a Unix time: what precedes it,
    from the command, is the launcher's and the workers' server's imports) and the seconds of each phase after
    it, in order (the process group, the data, the model, the controller, the cache, the first layout). On a
    GPU these are where the start differs from a loop without ptrun; `scripts/gpu_check.sh` prints them."""

    def __init__(self):
        self.began = round(time.time(), 3)
        self.phases: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        """`phase` ended now: the seconds since the last lap (or the worker's beginning) are its."""
        now = time.perf_counter()
        self.phases[f"{phase}_s"] = round(now - self._last, 3)
        self._last = now


class StepClock:
    """When this process's first training step began (before its forward pass) and ended (after its update),
    and when its warm-up ended, as Unix times on the clock of the events' `time`: the epoch event of the epoch
    they fell in carries them, so a benchmark can tell how long the start-up took (`benchmarks.startup`)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.steps = 0
        """Steps this process has trained (a resumed one counts from its start)."""
        self.times: dict[str, float] = {}
        self.reported = False
        self.recent: deque[float] = deque(maxlen=32)
        """The host's seconds between the ends of consecutive steps, lately (a GPU's queue keeps the host
        in step with the device once it has filled)."""
        self.last_end: float | None = None

    def step_begins(self) -> None:
        if not self.times:
            self.times["first_step_time"] = round(time.time(), 3)

    def pause(self) -> None:
        """Steps stop here for a while (a decision, an evaluation): the next step's time is not a step's."""
        self.last_end = None

    @property
    def step_s(self) -> float | None:
        """The median of the recent steps' seconds (None before two steps in a row)."""
        return statistics.median(self.recent) if self.recent else None

    def step_ended(self) -> None:
        now = time.perf_counter()
        if self.last_end is not None:
            self.recent.append(now - self.last_end)
        self.last_end = now
        self.steps += 1
        if self.steps in (1, WARM_UP_STEPS):  # the first step's end, and the warm-up's
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # a step has ended when its kernels have
            self.times["first_step_end_time" if self.steps == 1 else "warm_up_end_time"] = round(time.time(), 3)
            if self.steps == WARM_UP_STEPS:
                self.times["warm_up_steps"] = WARM_UP_STEPS

    def epoch_fields(self) -> dict[str, float]:
        """The first step's times, for the epoch event of the epoch it fell in (later epochs: none)."""
        if self.reported or "first_step_end_time" not in self.times:
            return {}
        self.reported = True
        return dict(self.times)


def all_sum(values: list[float] | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Collective: `values` summed over every rank, as float64."""
    t = torch.as_tensor(values, dtype=torch.float64, device=device).clone()
    dist.all_reduce(t)
    return t


def stash_stats(runtime, device: torch.device) -> dict:
    """Collective: pipedream's most bytes of weight copies (stashed versions) any rank held during the epoch;
    nothing for the other runtimes (every rank of a job runs the same kind)."""
    held = runtime.take_stash_peak()
    if held is None:
        return {}
    peak = torch.tensor([float(held)], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return {"stash_bytes_peak": int(peak.item())}


def scaler_stats(scaler, skipped_before: int) -> dict:
    """fp16: the loss scale at the epoch's end and the overflowed steps it skipped."""
    if not scaler.enabled:
        return {}
    return {"loss_scale": scaler.scale, "skipped_steps": scaler.skipped - skipped_before}


def cache_stats(cache, plan: Plan, device: torch.device) -> dict:
    """Collective: AutoCache counters of the epoch's training and of its evaluation (`eval_hits`, ...) summed
    over the workers, and this node's cache size."""
    if cache is None:
        return {}
    own = {**cache.take_stats("train"), **{f"eval_{k}": v for k, v in cache.take_stats("eval").items()}}
    total = all_sum(list(own.values()), device).long().tolist()
    summed = dict(zip(own, total, strict=True))
    cache.say_corrupt(summed["corrupt"] + summed["eval_corrupt"])
    return {
        "cache": {
            **summed,
            "cached_units": plan.cached_units,
            "memory_bytes": cache.memory_bytes,
            "disk_bytes": cache.disk_bytes,
        }
    }


def memory_stats(layered, layout, rank: int, device: torch.device) -> dict:
    """Collective: per worker (by rank), the bytes of the parameters its stages hold (with the prefix
    AutoCache serves, on the first stage), of its optimizer state, and its resident host memory now and
    at its peak."""
    runtime, plan, optimizer = layout.runtime, layout.plan, layout.optimizer
    held = {id(p): p for u in runtime.unit_indices for p in layered.units[u].parameters()}
    if runtime.is_first:
        held.update({id(p): p for u in range(plan.cached_units) for p in layered.units[u].parameters()})
    optim = 0
    if optimizer is not None:
        optim = sum(
            v.numel() * v.element_size()
            for s in optimizer.state.values()
            for v in s.values()
            if torch.is_tensor(v) and v.ndim
        )  # not the scalar step counts
    # ru_maxrss is KiB on Linux, bytes on macOS
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
    mine = [sum(p.numel() * p.element_size() for p in held.values()), optim, resident_bytes(), peak]
    gathered = torch.zeros(plan.world_size, len(mine), dtype=torch.float64, device=device)
    gathered[rank] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(gathered)
    param, optim, rss, peak = gathered.long().T.tolist()
    return {"memory": {"param_bytes": param, "optim_bytes": optim, "rss_bytes": rss, "peak_rss_bytes": peak}}


def start_memory(unheld_bytes: int, rank: int, world_size: int, device: torch.device) -> dict:
    """Collective, once the start is over: the parameter storage the workers keep outside their stages (their
    `unheld_bytes`, summed: 0) and each worker's resident host memory then, by rank (`rss_bytes`), before any
    step allocated what training needs."""
    gathered = torch.zeros(world_size, 2, dtype=torch.float64, device=device)
    gathered[rank] = torch.tensor([unheld_bytes, resident_bytes()], dtype=torch.float64)
    dist.all_reduce(gathered)
    unheld, rss = gathered.long().T.tolist()
    return {"unheld_param_bytes": sum(unheld), "rss_bytes": rss}


def resident_bytes() -> int:
    """This process's resident host memory now (0 where /proc is missing)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def compile_stats(compiler: UnitCompiler | None) -> dict:
    """Collective: the epoch event's `compile` (what compiling units cost since the last epoch event, its
    transition included: `UnitCompiler.epoch_fields`); nothing without compiled units."""
    return compiler.epoch_fields() if compiler is not None else {}
