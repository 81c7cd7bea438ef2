"""Micro-batch sweep (the paper's Figure 11): training samples/s for M in {K, 2K, ..., 6K} micro-batches at each
pipeline length K in {1, 2} on 2 workers, side by side in one invocation on real worker processes.

K = 2 is one 2-stage pipeline (DP = 1) over the whole batch; K = 1 is two replicas (DP = 2), each splitting
its half of the batch into M micro-batches. A count that does not divide the per-replica batch is skipped
(micro-batches must be equal) and listed in the JSON. Every layout runs `--steps` timed training steps
(forward + backward through ptrun's pipeline runtime, gradient all-reduce, AdamW update) after `--warmup`
untimed ones; with `--repeats N` the layouts run in N interleaved rounds, and the table shows each layout's
fastest round (other work on a shared machine only ever slows a step down, so the fastest round is the
closest to the layout's own speed, as `timeit` reasons) with the median beside it.

The model and data are `benchmarks.pipeline`'s (a ViT of width 128 and depth 8 on random 32x32 inputs; one
thread per worker). The default batch, 120, is the smallest that every M of both ranges divides (K = 1:
1-6 into 60 per replica; K = 2: 2-12 into 120), so no point of the paper's range is missing.

    python -m benchmarks.sweep_microbatches [--batch 120] [--steps 8] [--warmup 2] [--repeats 1]
                                         [--schedule 1F1B] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from datetime import timedelta
from pathlib import Path

from benchmarks.harness import command_line, publish

KS = (1, 2)
MULTIPLES = range(1, 7)
"""M from K to 6K: the range the paper profiles once per machine."""
WORLD = 2


def layouts(batch: int, schedule: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The (K, M) layouts to time and the ones skipped because M does not divide the per-replica batch
    (or the schedule refuses M at K)."""
    from ptrun.config import schedule_problem

    run, skipped = [], []
    for k in KS:
        per_replica = batch // (WORLD // k)
        for m in (k * i for i in MULTIPLES):
            ok = per_replica % m == 0 and schedule_problem(schedule, k, 1, m) is None
            (run if ok else skipped).append((k, m))
    return run, skipped


def time_layout(args: dict, rank: int, k: int, m: int) -> float:
    """Mean wall time of one training step at K = k, M = m on this rank (the same on every rank: the steps
    end in a collective and the timing in a barrier)."""
    import torch

    from benchmarks.pipeline import _timed, batches, build, optimizer_for, ptrun_step
    from ptrun.layout.partition import min_max
    from ptrun.layout.plan import Plan
    from ptrun.models.losses import WeightedLoss, make_target
    from ptrun.parallel.flushing import PipelineRuntime
    from ptrun.parallel.groups import build_groups
    from ptrun.parallel.pipeline import StageParts

    layered = build(args)
    # Stages balanced by parameter count, as `pipe.partition=params` (the default) would split them.
    costs = [float(sum(p.numel() for p in u.parameters())) for u in layered.units]
    dp = WORLD // k
    plan = Plan(
        num_units=len(costs),
        frozen_units=0,
        pp=k,
        dp=dp,
        stage_bounds=min_max(costs, k),
        microbatches=m,
        schedule=args["schedule"],
    ).check()
    groups = build_groups(plan, rank)
    rt = PipelineRuntime(StageParts(layered, plan, rank, groups, torch.device("cpu"), WeightedLoss("classification")))
    opt = optimizer_for(rt.trainable_parameters())
    x, y = batches(args, 1)[0]
    per = args["batch"] // dp
    rows = slice(rt.replica * per, (rt.replica + 1) * per)
    target = make_target({"labels": y[rows], "weight": torch.ones(per)}, "classification")
    step_s = _timed(ptrun_step(rt, opt, (x[rows],), target, float(args["batch"])), args["warmup"], args["steps"])
    groups.destroy()
    return step_s


def worker(args: dict, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=10))
    rank = dist.get_rank()
    run, _ = layouts(args["batch"], args["schedule"])
    times: dict[tuple[int, int], list[float]] = {km: [] for km in run}
    # Rounds outermost: a slow spell of the shared machine then lands on every layout, not on one.
    for _ in range(args["repeats"]):
        for k, m in run:
            times[(k, m)].append(time_layout(args, rank, k, m))
    dist.destroy_process_group()
    if rank == 0:
        # Per layout, the step time of every round; the launcher process turns them into the result.
        Path(out).write_text(json.dumps([{"K": k, "M": m, "step_s": t} for (k, m), t in times.items()]))


def result_rows(batch: int, timed: list[dict]) -> list[dict]:
    """One row per (K, M): the fastest round's step time and samples/s, the median's, and samples/s relative
    to M = K (fastest rounds)."""
    rows = []
    for t in timed:
        step = min(t["step_s"])
        rows.append(
            {
                "K": t["K"],
                "M": t["M"],
                "dp": WORLD // t["K"],
                "step_s": step,
                "samples_per_s": batch / step,
                "samples_per_s_median": batch / statistics.median(t["step_s"]),
                "step_s_rounds": t["step_s"],
            }
        )
    for r in rows:
        first = next(b for b in rows if b["K"] == r["K"])
        r["vs_m_equals_k"] = r["samples_per_s"] / first["samples_per_s"]
    return rows


def caption(result: dict) -> str:
    """The line above the table: model, batch and how many steps each number is."""
    a = result["args"]
    rounds = f"fastest of {a['repeats']} interleaved rounds" if a["repeats"] > 1 else "one round"
    return (
        f"ViT dim {a['dim']} depth {a['depth']}, 32x32, batch {a['batch']}, {WORLD} workers x 1 thread, "
        f"{a['schedule']}, {a['steps']} timed steps per layout; {rounds}"
    )


def table(result: dict) -> str:
    """The Markdown table of a `sweep_microbatches.json` (printed by this script, put in the README by
    `benchmarks/results_page.py`): every (K, M) of the range, "-" where M was not measured."""
    by = {(r["K"], r["M"]): r for r in result["rows"]}
    several = result["args"]["repeats"] > 1
    lines = [
        f"| K | DP | M | step (ms) | samples/s{' (median)' if several else ''} | vs M = K |",
        "|---|---|---|---|---|---|",
    ]
    for k in KS:
        for m in (k * i for i in MULTIPLES):
            r = by.get((k, m))
            if r is None:
                lines.append(f"| {k} | {WORLD // k} | {m} | - | - | - |")
                continue
            spread = f" ({r['samples_per_s_median']:.0f})" if several else ""
            lines.append(
                f"| {k} | {r['dp']} | {m} | {1000 * r['step_s']:.0f} | {r['samples_per_s']:.0f}{spread} "
                f"| {r['vs_m_equals_k']:.2f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=120, help="global batch (K = 1 splits it over 2 replicas)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--schedule",
        default="1F1B",
        choices=("GPipe", "1F1B"),
        help="digits_vit's schedule is 1F1B (the paper's Pipe ran GPipe)",
    )
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--out", default="runs/sweep_microbatches")
    args = vars(parser.parse_args())
    out = Path(args.pop("out")).resolve()
    if args["batch"] % WORLD:
        parser.error(f"--batch {args['batch']} must split over {WORLD} replicas")
    out.mkdir(parents=True, exist_ok=True)

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=WORLD,
        run_id=f"mbsweep-{os.getpid()}",
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
    )
    raw = out / "sweep_microbatches.raw.json"
    elastic_launch(config, worker)(args, str(raw))
    timed = json.loads(raw.read_text())
    raw.unlink()
    _, skipped = layouts(args["batch"], args["schedule"])
    result = {
        "command": command_line(),
        "args": args,
        "skipped": [{"K": k, "M": m} for k, m in skipped],
        "rows": result_rows(args["batch"], timed),
    }
    publish(result, out / "sweep_microbatches.json", caption, table)


if __name__ == "__main__":
    sys.exit(main())
