"""The harness of the tests that run cases in real worker processes: `nproc` processes started by
torch.distributed.elastic on localhost, one gloo process group among them, each running a job function of a
`*_cases.py` module (imported by name by the spawned workers) with its rank, the cases in order; each rank
saves what it holds as `NAME.rankR.pt` for the test to read back (`save_rank`, `load_rank`, `load_ranks`)."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist


def run_elastic(fn, nproc: int, name: str, *args) -> None:
    """Run `fn(*args)` on `nproc` real processes started by torch.distributed.elastic on localhost."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ptrun.signal_scope import elastic_handlers_restored

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # logs to /dev/null: elastic's default is a torchelastic_* directory in /tmp, left behind
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"{name}-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.2,
        logs_specs=DefaultLogsSpecs(log_dir=os.devnull),
    )
    with elastic_handlers_restored():  # the test session's Ctrl-C and SIGTERM handlers are back afterwards
        elastic_launch(config, fn)(*args)


def in_group(job, minutes: float, args: tuple) -> None:
    """One spawned worker: `job(rank, *args)` inside a gloo group of every worker (collectives time out after
    `minutes`), with one intra-op thread as a ptrun worker has (two threads on two busy cores make a step ten
    times slower)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=minutes))
    try:
        job(dist.get_rank(), *args)
    finally:
        dist.destroy_process_group()


def launch(job, nproc: int, name: str, *args, minutes: float = 10) -> None:
    """`job(rank, *args)` on `nproc` real worker processes in one gloo group: several cases share one launch
    (the workers' start costs seconds, a case a fraction of that). `job` and `args` travel to the spawned
    workers by pickling: a module-level function, plain values and dataclasses."""
    run_elastic(in_group, nproc, name, job, minutes, args)


def each_case(rank: int, run_case, cases: list, out_dir) -> None:
    """One worker's part of `launch_cases`: `run_case(case, rank, out_dir)` for every case in order."""
    for case in cases:
        run_case(case, rank, out_dir)


def launch_cases(run_case, cases: list, nproc: int, name: str, out_dir, minutes: float = 10) -> None:
    """`run_case(case, rank, out_dir)` for every case in order, on `nproc` real worker processes in one gloo
    group (`launch`)."""
    launch(each_case, nproc, name, run_case, cases, out_dir, minutes=minutes)


def save_rank(held, out_dir, name: str, rank: int) -> None:
    """What rank `rank` holds at the end of the case `name`, written for the test to read back (`load_rank`)."""
    torch.save(held, Path(out_dir) / f"{name}.rank{rank}.pt")


def load_rank(out_dir, name: str, rank: int, **kw):
    """What rank `rank` saved for the case `name` (`save_rank`); `kw` goes to `torch.load`."""
    return torch.load(Path(out_dir) / f"{name}.rank{rank}.pt", **kw)


def load_ranks(out_dir, name: str, world: int, **kw) -> list:
    """What each of `world` ranks saved for the case `name`, in rank order."""
    return [load_rank(out_dir, name, rank, **kw) for rank in range(world)]
