"""Start the workers through torch.distributed.elastic (one machine or many, c10d rendezvous)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from ptrun.config import PtrunConfig, parse_nnodes


class LaunchFailed(RuntimeError):
    """The worker group failed more often than `launcher.max_restarts` allows."""


def launch(cfg: PtrunConfig, config_path: Path) -> dict:
    """Run `ptrun.worker.run_worker(config_path)` on every worker; returns rank 0's result."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from ptrun.worker import run_worker  # spawned workers import it by name

    # torch 2.13/2.14: restarted gloo workers fail in connectFullMesh when the agent shares its TCP store
    # with them (the store still holds the previous attempt's addresses); a separate store fixes restarts.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    lc = cfg.launcher
    min_nodes, max_nodes = parse_nnodes(lc.nnodes)
    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=lc.nproc_per_node,
        run_id=lc.rdzv_id or f"{Path(cfg.run_dir).name}-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=lc.rdzv_endpoint,
        rdzv_configs={"timeout": 900},
        max_restarts=lc.max_restarts,
        monitor_interval=lc.monitor_interval,
    )
    try:
        results = elastic_launch(config, run_worker)(str(config_path))
    except ChildFailedError as e:
        rank, failure = next(iter(e.failures.items()))
        if failure.exitcode == 2:  # the worker already printed a one-line user-facing error
            raise SystemExit(2)
        message = failure.message.get("message", "") if isinstance(failure.message, dict) else str(failure.message)
        raise LaunchFailed(f"worker rank {rank} failed (exit code {failure.exitcode}): "
                           f"{message.strip().splitlines()[-1] if message.strip() else 'see the log above'}")
    return results.get(0, {}) if isinstance(results, dict) else {}

