"""Pipeline benchmark, side by side in one invocation on real worker processes.

1. Bubble fraction: GPipe and 1F1B at K = 2 for M in {1, 2, 4, 8}. A step's wall time T is measured through
   the pipeline; each stage's busy time is M x its own forward + backward time on one micro-batch, measured
   alone on the same rank (no communication). Bubble = 1 - busy / T, averaged over the stages, printed next
   to GPipe's (K - 1) / (M + K - 1).
2. Data parallelism: ptrun at K = 1, DP = 2 (its K = 1 runtime, `LocalRuntime`: the stage module in torch's
   DistributedDataParallel, plus the gradient norm it computes every step) next to a plain DDP step on the
   same model, batches and optimizer.

It writes both tables' numbers, with the command line, to `--out`; `benchmarks/results_page.py` makes the README's
tables from that JSON.

    python -m benchmarks.pipeline [--steps 8] [--batch 32] [--depth 8] [--dim 128] [--out bench.json]

On this 2-core machine each worker is one process with one thread: stages do run in parallel, but the
absolute numbers say little about GPUs. The ratios are the point.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

from benchmarks.harness import command_line
from ptrun.config import schedule_problem

# torch is imported inside the functions that use it: `benchmarks/results_page.py` imports this module for `caption`
# and `table` alone, and importing torch would cost it seconds.

WORLD = 2  # worker processes; K = 1 runs them as DP = WORLD


def build(args):
    import torch

    from ptrun.config import ModelConfig
    from ptrun.models import build_model

    torch.manual_seed(0)
    cfg = ModelConfig(
        name="vit_tiny_patch16_224",
        img_size=32,
        patch_size=4,
        in_chans=3,
        embed_dim=args["dim"],
        depth=args["depth"],
        num_heads=max(1, args["dim"] // 64),
        dropout=0.0,
        drop_path=0.0,
    )
    return build_model(cfg, num_classes=10)


def batches(args, count: int):
    import torch

    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(args["batch"], 3, 32, 32, generator=g), torch.randint(0, 10, (args["batch"],), generator=g))
        for _ in range(count)
    ]


def optimizer_for(params):
    import torch

    return torch.optim.AdamW(params, lr=1e-4)


def ptrun_step(rt, opt, inputs: tuple, target, denominator: float):
    """One training step through ptrun's runtime: pipelined forward + backward (the loss a mean over
    `denominator` samples), gradient sync, update."""

    def step():
        rt.forward_backward(inputs, target, denominator)
        rt.sync_and_clip(0.0)
        opt.step()
        rt.zero_grad()

    return step


def _timed(fn, warmup: int, steps: int) -> float:
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    dist.barrier()
    return (time.perf_counter() - t0) / steps


def stage_busy_time(module, inputs, target, loss_fn, is_first: bool, is_last: bool, repeats: int = 5) -> float:
    """Forward + backward of one micro-batch through this stage alone (what it does M times per step).
    Like in the pipeline, only a received activation needs an input gradient, not the first stage's data."""
    import torch

    samples = []
    for _ in range(repeats + 1):
        x = tuple(t.detach().requires_grad_(t.is_floating_point() and not is_first) for t in inputs)
        t0 = time.perf_counter()
        out = module(*x)
        if is_last:
            loss_fn(out, target).backward()
        else:
            out.backward(torch.ones_like(out))
        samples.append(time.perf_counter() - t0)
        module.zero_grad(set_to_none=True)
    return statistics.median(samples[1:])


def bench_pipeline(args, rank: int, schedule: str, m: int) -> dict:
    import torch

    from ptrun.layout.partition import min_max
    from ptrun.layout.plan import Plan
    from ptrun.models.losses import WeightedLoss, make_target
    from ptrun.parallel.flushing import PipelineRuntime
    from ptrun.parallel.groups import build_groups
    from ptrun.parallel.pipeline import StageParts

    layered = build(args)
    costs = [float(sum(p.numel() for p in u.parameters())) for u in layered.units]
    plan = Plan(
        num_units=len(costs),
        frozen_units=0,
        pp=2,
        dp=1,
        stage_bounds=min_max(costs, 2),
        microbatches=m,
        schedule=schedule,
    ).check()
    groups = build_groups(plan, rank)
    loss = WeightedLoss("classification")
    rt = PipelineRuntime(StageParts(layered, plan, rank, groups, torch.device("cpu"), loss))
    opt = optimizer_for(rt.trainable_parameters())
    data = batches(args, 1)
    x, y = data[0]
    target = make_target({"labels": y, "weight": torch.ones(len(y))}, "classification")

    wall = _timed(ptrun_step(rt, opt, (x,), target, float(args["batch"])), args["warmup"], args["steps"])
    # This stage's input for one micro-batch: the preceding units run locally (every rank has the model).
    mb = args["batch"] // m
    carry = (x[:mb],)
    lo, hi = plan.stage_bounds[rt.stage_indices[0]]
    with torch.no_grad():
        for unit in layered.units[:lo]:
            out = unit(*carry)
            carry = out if isinstance(out, tuple) else (out,)
    busy = m * stage_busy_time(
        rt.modules[0], carry, target[:mb], partial(loss, denominator=float(args["batch"])), rt.is_first, rt.is_last
    )
    groups.destroy()
    return {"wall": wall, "busy": busy}


def bench_dp(args, rank: int, world: int) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from ptrun.layout.plan import Plan
    from ptrun.models.losses import WeightedLoss, make_target
    from ptrun.parallel.flushing import flushing_runtime
    from ptrun.parallel.groups import build_groups
    from ptrun.parallel.pipeline import StageParts

    per = args["batch"] // world
    data = batches(args, 1)
    x, y = data[0][0][rank * per : (rank + 1) * per], data[0][1][rank * per : (rank + 1) * per]

    layered = build(args)
    plan = Plan(
        num_units=len(layered.units),
        frozen_units=0,
        pp=1,
        dp=world,
        stage_bounds=((0, len(layered.units)),),
        microbatches=1,
        schedule="GPipe",
    ).check()
    groups = build_groups(plan, rank)
    rt = flushing_runtime(StageParts(layered, plan, rank, groups, torch.device("cpu"), WeightedLoss("classification")))
    opt = optimizer_for(rt.trainable_parameters())
    target = make_target({"labels": y, "weight": torch.ones(len(y))}, "classification")

    t_ptrun = _timed(ptrun_step(rt, opt, (x,), target, float(args["batch"])), args["warmup"], args["steps"])
    groups.destroy()

    ddp = DistributedDataParallel(build(args).model)
    opt2 = optimizer_for(ddp.parameters())

    def ddp_step():
        F.cross_entropy(ddp(x), y).backward()
        opt2.step()
        opt2.zero_grad(set_to_none=True)

    t_ddp = _timed(ddp_step, args["warmup"], args["steps"])
    return {"ptrun": args["batch"] / t_ptrun, "ddp": args["batch"] / t_ddp}


def worker(args: dict, out: str, command: str) -> None:
    """One rank: every measurement, then rank 0 writes the JSON with `command`, the command line the
    launching process was started with (what the README names as the table's source)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    results: dict = {"bubble": [], "dp": None}
    for schedule in ("GPipe", "1F1B"):
        for m in (1, 2, 4, 8):
            if schedule_problem(schedule, world, 1, m):
                continue  # 1F1B needs M >= K
            r = bench_pipeline(args, rank, schedule, m)
            stats = torch.tensor([r["wall"], 1 - r["busy"] / r["wall"]], dtype=torch.float64)
            dist.all_reduce(stats)
            stats /= world
            results["bubble"].append(
                {
                    "schedule": schedule,
                    "K": 2,
                    "M": m,
                    "step_s": stats[0].item(),
                    "bubble": stats[1].item(),
                    "ideal": 1 / (m + 1),
                }
            )
    results["dp"] = bench_dp(args, rank, world)
    dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps({"command": command, "args": args, **results}, indent=2))


def caption(result: dict) -> str:
    """The line above the tables: model, input, batch, workers and timed steps."""
    a = result["args"]
    return (
        f"ViT dim {a['dim']} depth {a['depth']}, 32x32, batch {a['batch']}, {WORLD} workers x 1 thread, "
        f"{a['steps']} timed steps"
    )


def bubble_table(rows: list[dict]) -> str:
    """Measured bubble per schedule and M, next to GPipe's formula."""
    lines = ["| schedule | K | M | step (ms) | measured bubble | (K-1)/(M+K-1) |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['schedule']} | {r['K']} | {r['M']} | {1000 * r['step_s']:.0f} | {r['bubble']:.2f} | "
            f"{r['ideal']:.2f} |"
        )
    return "\n".join(lines)


def dp_table(dp: dict) -> str:
    """ptrun's samples/s at K = 1, DP = WORLD next to DDP's."""
    return "\n".join(
        [
            f"| K = 1, DP = {WORLD} | samples/s | vs DDP |",
            "|---|---|---|",
            f"| torch DistributedDataParallel | {dp['ddp']:.0f} | 1.00 |",
            f"| ptrun (K = 1: the stage in DDP) | {dp['ptrun']:.0f} | {dp['ptrun'] / dp['ddp']:.2f} |",
        ]
    )


def table(result: dict) -> str:
    """The Markdown tables of a `bench_pipeline.json`, bubble then data parallelism, a blank line apart
    (printed by this script, put in the README by `benchmarks/results_page.py`)."""
    return f"{bubble_table(result['bubble'])}\n\n{dp_table(result['dp'])}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", default="bench_pipeline.json")
    args = vars(parser.parse_args())
    out = str(Path(args.pop("out")).resolve())

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=WORLD,
        run_id=f"bench-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    elastic_launch(config, worker)(args, out, command_line())
    result = json.loads(Path(out).read_text())
    print(f"{caption(result)}\n")
    print(table(result))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    sys.exit(main())
