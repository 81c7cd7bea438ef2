"""One worker process: read the resolved config, join the process group, train.

Started by torch.distributed.elastic (see launch.py), which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR
and MASTER_PORT, and TORCHELASTIC_RESTART_COUNT after a restart (then the worker resumes automatically).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from ptrun.config import ConfigError, load_resolved


def pick_device(backend: str) -> tuple[torch.device, str]:
    """One GPU per worker (from LOCAL_RANK) with nccl when CUDA is there; the CPU with gloo otherwise."""
    if backend in ("auto", "nccl") and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device, "nccl"
    return torch.device("cpu"), "gloo"


def run_worker(config_path: str) -> dict:
    cfg = load_resolved(config_path)
    # elastic_launch, unlike torchrun, does not set OMP_NUM_THREADS: one intra-op thread per emulated device.
    torch.set_num_threads(cfg.launcher.threads_per_worker)
    # Late in training, tiny gradients and optimizer moments become denormal floats, which run tens of
    # times slower on x86 CPUs; flushing them to zero costs nothing in accuracy.
    torch.set_flush_denormal(True)
    device, backend = pick_device(cfg.launcher.backend)
    dist.init_process_group(backend, timeout=timedelta(minutes=10),
                            device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()

    from ptrun.train.report import setup_logging
    from ptrun.train.trainer import Trainer

    setup_logging(cfg.run_dir, rank)
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    trainer = None
    try:
        trainer = Trainer(cfg, rank, world, device, resume=cfg.train.resume or restarted)
        return trainer.fit()
    except ConfigError as e:
        # A user-facing problem found only in a worker (e.g. a checkpoint of another model): one line, no traceback.
        if rank == 0:
            print(f"ptrun: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    finally:
        if trainer is not None:
            trainer.close()
        dist.destroy_process_group()
