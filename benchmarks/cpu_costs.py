"""Measure what `ptrun plan cluster=this_machine --profile FILE` needs on this machine, in a few seconds.

Two gloo workers of one thread each (the digits recipe's layout: `launcher.threads_per_worker=1`). Compute
is measured by each worker in turn while the other waits (what it costs on a core of its own), in CPU
seconds of the worker process (`time.process_time`, which stops while the process waits for a core, so
other people's jobs on the shared machine disturb it less); messages by the fastest of the repeats (wall
time: a trip that met no queue). Each number is the mean over the two workers, then the median over
`--passes` passes. How much the two workers slow each other down when both compute is measured separately
(`cores_per_node`); how much other jobs stretch a run is the model's `cluster.background_load`
(`ptrun.sim.simulate`, assumption 7), not part of these numbers. Written to `--out` as JSON:

- the per-unit profile `ptrun plan --profile` reads (`ptrun.sim.load_profile`): `batch` (the micro-batch,
  8 = the digits recipe's at K = 2, M = 2 and at K = 1, DP = 2), `time_s` (forward + backward),
  `forward_s` (forward under no_grad), `frozen_s` (forward + input-gradient backward, parameters frozen),
  `update_s` (the optimizer step and the clip's per-parameter work for each unit's parameters: AdamW with
  the recipe's settings, `StageRuntime.sync_and_clip`'s squared-norm sum and rescale), `activation_bytes`,
  `params`: from `ptrun.parallel.profile.profile_units(..., detail=True)`;
- `cluster`: the fixed costs of the `this_machine` preset (`ptrun/sim/cluster.py` cites this file):
  - `cores_per_node`: 2 x (the whole model's forward + backward on one worker alone) / (the same on both
    workers at once), in CPU seconds: the cores' worth two busy workers get side by side (2 = they do not
    slow each other down). Wall time is recorded too, but on a shared machine it mostly measures the other
    jobs (two of ours plus theirs queue for the 2 cores);
  - `microbatch_overhead_s`: a one-stage schedule step (`LocalRuntime.forward_backward`, K = 1, M = 1,
    the whole model on one micro-batch, without the DP all-reduce, which is priced on its own) less the
    units' own forward + backward times measured just before: the schedule's bookkeeping, the loss, the
    autograd engine's start, per stage and micro-batch;
  - `link_latency_s`, `intra_gbs`: a gloo send + recv between the two workers (ping-pong, half the round
    trip, the fastest of the repeats) at the boundary tensor's size and at 4 MB: time = latency + bytes /
    bandwidth;
  - `allreduce_s` (a check, not a preset constant): a gloo all-reduce between the two workers of the flat
    fp32 gradient of all parameters and of a third of them (what `sync_and_clip` reduces at DP = 2), the
    fastest of the repeats; the model prices it as 2 latencies + bytes / bandwidth;
  - `loader_batch_s`, `loader_samples_s`: `dataset[ids]` on the digits training set (what the loading
    thread does per batch) at 1x and 2x the micro-batch: time = fixed + samples / rate;
  - `cache_batch_s`, `cache_sample_s`: `AutoCache.fetch` + `AutoCache.inputs` of cache hits (the first
    stage's batch from the cache, /dev/shm) at 1x and 2x the micro-batch: fixed + per sample; and
    `cache_write_sample_s`: one entry written (`ActivationStore.write`).

    python -m benchmarks.cpu_costs [--out docs/results/cpu_costs_digits_vit.json] [--passes 5]
                                        [--repeats 10] [--batch 8] [overrides ...]

Overrides are `ptrun train`'s (default: the digits recipe). Nothing here trains.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from benchmarks.harness import command_line

WORLD = 2


def unchecked_config(overrides: list[str]):
    """The recipe's typed config, resolved but not validated (data and weight paths are not needed: digits
    ships with scikit-learn)."""
    from ptrun.compose import compose

    return compose(overrides, recipe="measure", check=False)


CPU = time.process_time
"""The clock of compute: this process's CPU seconds (all its threads), blind to time spent waiting for a core."""


def median_s(run, repeats: int, setup=tuple, clock=CPU, pick=statistics.median) -> float:
    """`pick` (median) of the seconds of `run(*setup())` on `clock` over `repeats` calls after one warm-up."""
    out = []
    for rep in range(repeats + 1):
        args = setup()
        t0 = clock()
        run(*args)
        if rep:
            out.append(clock() - t0)
    return pick(out)


def mean_over_workers(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


def update_seconds(unit, optim_cfg, repeats: int) -> float:
    """One unit's share of a step's update: the clip's per-parameter work in `StageRuntime.sync_and_clip`
    (squared norm in float64, then the rescale) and the optimizer step over its parameters."""
    from ptrun.numerics.optim import build_optimizer

    named = [(n, p) for n, p in unit.named_parameters()]
    if not named:
        return 0.0
    saved = [p.detach().clone() for _, p in named]
    optimizer = build_optimizer(named, optim_cfg)
    for _, p in named:
        p.grad = torch.randn_like(p) * 1e-3

    def update():
        sq = torch.zeros((), dtype=torch.float64)
        for _, p in named:
            sq += p.grad.detach().double().pow(2).sum()
        coef = 1.0 / (sq.sqrt().item() + 1e-6)
        for _, p in named:
            p.grad.mul_(min(coef, 1.0))
        optimizer.step()

    t = median_s(update, repeats)
    with torch.no_grad():
        for (_, p), s in zip(named, saved, strict=True):
            p.copy_(s)
            p.grad = None
    return t


def ping_pong_s(rank: int, nbytes: int, repeats: int) -> float:
    """Half a round trip of `nbytes` between workers 0 and 1 (gloo send + recv), the same on both."""
    buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32)

    def trip():
        if rank == 0:
            dist.send(buf, dst=1)
            dist.recv(buf, src=1)
        else:
            dist.recv(buf, src=0)
            dist.send(buf, dst=0)

    dist.barrier()
    return mean_over_workers([median_s(trip, repeats, clock=time.perf_counter, pick=min) / 2])[0]


def allreduce_s(numel: int, repeats: int) -> float:
    flat = torch.zeros(numel, dtype=torch.float32)
    dist.barrier()
    return mean_over_workers([median_s(lambda: dist.all_reduce(flat), repeats, clock=time.perf_counter, pick=min)])[0]


def fit_line(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float]:
    """(intercept, slope) through two points, neither below 0."""
    slope = max(0.0, (y1 - y0) / (x1 - x0))
    return max(0.0, y0 - slope * x0), slope


def solo(rank: int, measure) -> list[float]:
    """`measure()` (a list of numbers) run by each worker in turn while the other waits, averaged over the
    workers: what it costs with a core to itself."""
    mine = None
    for turn in range(WORLD):
        dist.barrier()
        if rank == turn:
            mine = list(measure())
        dist.barrier()
    return mean_over_workers(mine)


def one_pass(rank: int, cfg, layered, data, batch: int, repeats: int, cache_root: Path) -> dict:
    from ptrun.auto.autocache import AutoCache
    from ptrun.auto.autodp import Builder, build_engine, set_frozen
    from ptrun.freezing.counts import frozen_units_for_blocks
    from ptrun.layout.plan import Plan
    from ptrun.models.layered import run_units
    from ptrun.models.losses import LABEL_KEYS, WeightedLoss, make_target
    from ptrun.parallel.profile import profile_units

    names = layered.input_names
    ids = torch.arange(rank * 2 * batch, (rank + 1) * 2 * batch)  # each worker its own samples
    raw = dict(data.train[ids[:batch].tolist()])
    inputs = tuple(raw[k] for k in names if k in raw)
    n = len(layered.units)
    out: dict = {}

    # 1. per-unit times on one micro-batch, each worker alone
    set_frozen(layered, 0)
    holder: dict = {}

    def units():
        holder["p"] = profile_units(layered, inputs, torch.device("cpu"), repeats=repeats, detail=True, clock=CPU)
        return holder["p"].time_s + holder["p"].forward_s + holder["p"].frozen_s

    times = solo(rank, units)
    out.update(
        time_s=times[:n],
        forward_s=times[n : 2 * n],
        frozen_s=times[2 * n :],
        activation_bytes=holder["p"].activation_bytes,
    )

    # 2. the schedule's fixed cost per stage and micro-batch: K = 1 (DP = 2), M = 1, whole model, alone
    plan = Plan(
        num_units=n, frozen_units=0, pp=1, dp=WORLD, stage_bounds=((0, n),), microbatches=1, schedule="GPipe"
    ).check()
    loss = WeightedLoss(cfg.model.task)
    name_of = {id(p): k for k, p in layered.model.named_parameters()}
    layout = build_engine(Builder(layered, rank, torch.device("cpu"), loss, cfg.optim, name_of), plan)
    target = make_target({**raw, "weight": torch.ones(batch)}, cfg.model.task)
    runtime = layout.runtime
    # Each worker alone: the replicas' gradient all-reduce (DDP's, in backward) would wait for the other one.
    alone = runtime.run.no_sync if runtime.syncs_in_backward else contextlib.nullcontext

    def schedule_step():
        with alone():
            runtime.forward_backward(inputs, target, float(WORLD * batch))

    step = solo(rank, lambda: [median_s(schedule_step, repeats)])[0]
    layout.runtime.zero_grad()
    layout.groups.destroy()
    out["schedule_step_s"] = step
    out["microbatch_overhead_s"] = step - sum(out["time_s"])

    # 3. the update's per-unit share, alone
    out["update_s"] = solo(rank, lambda: [update_seconds(u, cfg.optim, repeats) for u in layered.units])

    # 4. two workers computing at once against one alone: how much the 2 cores give side by side
    def model_step():
        head = run_units(list(layered.units), *inputs)
        (head[0] if isinstance(head, tuple) else head).float().sum().backward()

    out["alone_s"], out["alone_wall_s"] = solo(
        rank, lambda: [median_s(model_step, repeats), median_s(model_step, repeats, clock=time.perf_counter)]
    )
    dist.barrier()
    out["together_s"], out["together_wall_s"] = mean_over_workers(
        [median_s(model_step, repeats), median_s(model_step, repeats, clock=time.perf_counter)]
    )
    layered.model.zero_grad(set_to_none=True)

    # 5. links: the boundary tensor (the middle unit's output) and 4 MB; the DP all-reduce
    boundary = int(out["activation_bytes"][n // 2 - 1])
    out["p2p_bytes"] = [boundary, 4 << 20]
    out["p2p_s"] = [ping_pong_s(rank, b, repeats) for b in out["p2p_bytes"]]
    total = sum(p.numel() for p in layered.model.parameters())
    out["allreduce_params"] = [total, total // 3]
    out["allreduce_s"] = [allreduce_s(k, repeats) for k in out["allreduce_params"]]

    # 6. the loading thread's work per batch, alone: raw samples, and AutoCache hits
    out["loader_samples"] = [batch, 2 * batch]
    out["loader_s"] = solo(
        rank, lambda: [median_s(lambda k=k: dict(data.train[ids[:k].tolist()]), repeats) for k in out["loader_samples"]]
    )
    depth = frozen_units_for_blocks(max(1, 2 * layered.num_blocks // 3))  # what the digits runs cache: 9 units
    cache = AutoCache(
        layered,
        cfg.cache,
        tag=f"measure-{rank}",
        num_train=len(data.train),
        num_eval=0,
        device=torch.device("cpu"),
        run_dir=cache_root / f"rank{rank}",
    )
    try:
        cache.set_depth(depth, tuple(t[:1] for t in inputs))

        def fetch_and_inputs(k: int):
            b = cache.fetch("train", data.train, ids[:k], input_names=names, label_names=LABEL_KEYS[cfg.model.task])
            b["weight"] = torch.ones(k)
            cache.inputs("train", b, tuple(b[x] for x in names if x in b))

        fetch_and_inputs(2 * batch)  # fills the entries (misses, computed and written)
        out["cache_s"] = solo(
            rank, lambda: [median_s(lambda k=k: fetch_and_inputs(k), repeats) for k in out["loader_samples"]]
        )
        entry = [torch.zeros(s.shape, dtype=s.dtype) for s in cache.store.specs]
        out["cache_write_sample_s"] = solo(
            rank, lambda: [median_s(lambda: cache.store.write(int(ids[0]), entry, cache.key["train"]), repeats)]
        )[0]
    finally:
        cache.close(remove=True)
    set_frozen(layered, 0)
    return out


def worker(rank: int, port: int, overrides: list[str], batch: int, passes: int, repeats: int, out_path: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    from ptrun.data import build_datasets
    from ptrun.models import build_model

    cfg = unchecked_config(overrides)
    data = build_datasets(cfg.data)
    torch.manual_seed(cfg.train.seed)
    layered = build_model(cfg.model, **data.model_sizes)
    with tempfile.TemporaryDirectory(prefix="ptrun-measure-") as cache_root:
        runs = [one_pass(rank, cfg, layered, data, batch, repeats, Path(cache_root)) for _ in range(passes)]
    dist.destroy_process_group()
    if rank:
        return

    def med(key):
        first = runs[0][key]
        if isinstance(first, list):
            return [statistics.median(r[key][i] for r in runs) for i in range(len(first))]
        return statistics.median(r[key] for r in runs)

    p2p, nb = med("p2p_s"), runs[0]["p2p_bytes"]
    latency, per_byte = fit_line(nb[0], p2p[0], nb[1], p2p[1])
    loader_fixed, loader_per = fit_line(batch, med("loader_s")[0], 2 * batch, med("loader_s")[1])
    cache_fixed, cache_per = fit_line(batch, med("cache_s")[0], 2 * batch, med("cache_s")[1])
    doc = {
        "command": command_line(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": socket.gethostname(),
        "load_average_at_end": os.getloadavg(),
        "torch": torch.__version__,
        "workers": WORLD,
        "threads_per_worker": 1,
        "passes": passes,
        "repeats": repeats,
        "batch": batch,
        "time_s": med("time_s"),
        "forward_s": med("forward_s"),
        "frozen_s": med("frozen_s"),
        "update_s": med("update_s"),
        "activation_bytes": runs[0]["activation_bytes"],
        "params": [float(sum(p.numel() for p in u.parameters())) for u in layered.units],
        "cluster": {
            "cores_per_node": min(2.0, WORLD * med("alone_s") / med("together_s")),
            "microbatch_overhead_s": med("microbatch_overhead_s"),
            "link_latency_s": latency,
            "intra_gbs": 1 / per_byte / 1e9 if per_byte else None,
            "loader_batch_s": loader_fixed,
            "loader_samples_s": 1 / loader_per if loader_per else None,
            "cache_batch_s": cache_fixed,
            "cache_sample_s": cache_per,
            "cache_write_sample_s": med("cache_write_sample_s"),
        },
        "raw": {
            k: med(k)
            for k in (
                "p2p_s",
                "allreduce_s",
                "loader_s",
                "cache_s",
                "microbatch_overhead_s",
                "schedule_step_s",
                "alone_s",
                "together_s",
                "alone_wall_s",
                "together_wall_s",
            )
        }
        | {
            "p2p_bytes": nb,
            "allreduce_params": runs[0]["allreduce_params"],
            "loader_samples": runs[0]["loader_samples"],
            "per_pass_microbatch_overhead_s": [r["microbatch_overhead_s"] for r in runs],
            "per_pass_alone_s": [r["alone_s"] for r in runs],
            "per_pass_together_s": [r["together_s"] for r in runs],
            "per_pass_time_s_sum": [sum(r["time_s"]) for r in runs],
        },
    }
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    Path(out_path).write_text(json.dumps(doc, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="docs/results/cpu_costs_digits_vit.json")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8, help="the micro-batch the units are timed on")
    args, overrides = ap.parse_known_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(
        worker,
        args=(port, overrides or ["recipe=digits_vit"], args.batch, args.passes, args.repeats, args.out),
        nprocs=WORLD,
    )
    doc = json.loads(Path(args.out).read_text())
    ms = lambda v: f"{1e3 * v:.2f} ms"  # noqa: E731
    print(f"wrote {args.out}")
    print(
        f"  units, micro-batch {doc['batch']}: forward + backward {ms(sum(doc['time_s']))}, forward "
        f"{ms(sum(doc['forward_s']))}, frozen (input gradient) {ms(sum(doc['frozen_s']))}, "
        f"update {ms(sum(doc['update_s']))}"
    )
    for key, value in doc["cluster"].items():
        print(f"  {key} = {value:.6g}" if value is not None else f"  {key} = None")
    print(f"  all-reduce {doc['raw']['allreduce_params']} params: {[ms(v) for v in doc['raw']['allreduce_s']]}")


if __name__ == "__main__":
    main()
