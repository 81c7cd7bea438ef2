"""Soak: hundreds of layout transitions and several elastic restarts of the real Trainer, watching for leaks.

    python -m benchmarks.soak [--transitions 200] [--restarts 5] [--run-dir runs/soak] [--out FILE] [overrides ...]

Two gloo workers, started by torch.distributed.elastic with the settings of `ptrun.launcher.launch.launch`, each run
the `Trainer` of a tiny ViT on the digits default (`fit`, short epochs: `train.max_steps_per_epoch`), whose
decision at each epoch's end (its `decide` hook) is the next of three Plans the controller makes for this
model, in a cycle:
  A  nothing frozen, K = 2, DP = 1                             `first_plan`
  B  embedding + block 0 frozen, K = 2, DP = 1, no cache       `Controller.plan_for(A, 1 block)`
  C  everything below the head frozen and cached, K = 1, DP = 2  `Controller.plan_for(A, 2 blocks)`
A real run freezes monotonically (a handful of transitions); the cycle drives every kind of change (stage
boundaries move, K halves and doubles, DP widens and narrows, AutoCache turns on and off) through the same
code as often as asked. At every decision (after a transition and an epoch in its layout) each rank records
its open file descriptors, threads (Python and OS) and RSS. Every `--checkpoint-every` epochs the workers
evaluate and write a checkpoint; in restart attempts 0 .. R-1 the last rank SIGKILLs itself two transitions
after a checkpoint, the agent restarts the group and the workers resume from that checkpoint
(TORCHELASTIC_RESTART_COUNT).

Judged per worker process after its first `--warmup` transitions (they allocate caches): open file
descriptors and threads must not grow at all; private memory (RSS less the shared pages of AutoCache's
store, which fill up to the store's fixed size as samples are cached) by at most `--memory-limit` MiB per 100
transitions (at least that much in total, for short processes). Each value is the maximum over a whole
A -> B -> C cycle, since each Plan holds a different number of process groups. The limit tolerates what was
measured here (about 2.5 MiB per 100 transitions: malloc keeping freed memory, torch's bookkeeping of
about 1 KiB per collective, which stops growing after about 2,000 collectives, and about 0.7 KiB torch keeps
of every process group destroyed) and catches 50 KiB kept per transition (a layout kept alive would keep its
optimizer state, up to 0.14 MiB for this model, and its groups' sockets and threads). The agent, which
lives through the restarts, must hold no more descriptors or threads at each attempt's start than at the
first's. Exit code 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

# This checkout's ptrun, installed or not; the spawned workers inherit the path.
import torch.distributed as dist

OVERRIDES = [
    "recipe=digits_vit",
    "model.embed_dim=32",
    "model.depth=2",
    "model.num_heads=2",
    "train.max_steps_per_epoch=2",
    "train.export=false",
    "checkpoint.keep=2",
    "pipe.length=2",  # plan A is the 2-stage pipeline: the cycle moves K 2 -> 1 -> 2
    # The digits recipe caches any frozen prefix of this 2-block model; 5 units (both blocks) keeps plan B
    # frozen but uncached, so the cycle has a frozen, a cached and a plain layout.
    "cache.min_frozen_units=5",
    "freeze.every=1",  # a decision at every epoch's end, and only there
]
CYCLE = 3  # plans A, B, C
METRICS = ("fds", "threads", "os_threads", "rss_mib", "private_mib", "shared_mib")


def usage() -> dict:
    """This process's open file descriptors, threads (Python's and the OS's) and resident memory (MiB)."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    mib = lambda key: int(status[key].split()[0]) / 1024  # noqa: E731 (values are in kB)
    kinds: dict[str, int] = {}  # socket, pipe, anon_inode, or the file's directory: what a leak would be
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir itself used, closed by now
            continue
        kind = target.split(":")[0] if ":" in target else str(Path(target).parent)
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "fds": sum(kinds.values()),
        "threads": threading.active_count(),
        "os_threads": int(status["Threads"]),
        "rss_mib": mib("VmRSS"),
        "private_mib": mib("VmRSS") - mib("RssShmem"),
        "shared_mib": mib("RssShmem"),
        "fd_kinds": kinds,
        "thread_names": sorted(t.name for t in threading.enumerate()),
    }


def cycle_plans(trainer) -> list:
    """Plans A, B, C: the first plan and the controller's plans for 1 and for every frozen block."""
    from ptrun.layout.first import first_plan

    first = first_plan(trainer.cfg.pipe, trainer.layered, trainer.world_size)
    blocks = trainer.layered.num_blocks
    return [first] + [trainer.controller.plan_for(first, b, trainer.world_size) for b in (1, blocks)]


def kill_points(transitions: int, restarts: int, checkpoint_every: int) -> list[int]:
    """The transition after which attempt r's last rank kills itself: two past a checkpoint (that work is
    lost and redone) and two checkpoints after the previous kill, so every attempt gets past its resume point;
    the last attempt runs on to the end."""
    points = [(r + 1) * 2 * checkpoint_every + 2 for r in range(restarts)]
    if points and points[-1] >= transitions:
        raise ValueError(
            f"{restarts} restarts need more than {points[-1]} transitions "
            f"(or a smaller --checkpoint-every than {checkpoint_every})"
        )
    return points


def worker(config_path: str, samples_dir: str, transitions: int, restarts: int, checkpoint_every: int) -> None:
    """One spawned worker (as `ptrun.launcher.worker.run_worker` starts one): the Trainer's own `fit`, whose decisions
    are the cycle's plans (its `decide` hook), which records this process's usage at each."""
    started = time.time()
    from ptrun.config import load_resolved
    from ptrun.launcher.worker import join_job
    from ptrun.train.run_output import setup_logging
    from ptrun.train.trainer import Trainer

    cfg = load_resolved(config_path)
    device, rank, world = join_job(cfg, timeout=timedelta(minutes=5))
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    setup_logging(cfg.run_dir, rank)
    kill_at = kill_points(transitions, restarts, checkpoint_every)
    with open(Path(samples_dir) / f"rank{rank}.jsonl", "a") as out:

        def record(done: int, **extra) -> None:
            row = {"attempt": attempt, "rank": rank, "transition": done, "time": time.time(), **extra, **usage()}
            out.write(json.dumps(row) + "\n")
            out.flush()  # a killed worker keeps what it measured

        def decide(interval: int, current, measured):
            """Before epoch `interval` (an epoch after transition `interval - 1`): the usage, a kill where one
            is due, and the next plan of the cycle."""
            record(interval - 1, **({"started": started} if interval - 1 == first else {}))
            if attempt < restarts and interval - 1 == kill_at[attempt] and rank == world - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            return plans[interval % CYCLE]

        trainer = Trainer(cfg, rank, world, device, resume=attempt > 0, decide=decide)
        plans = cycle_plans(trainer)
        first = trainer.state.epoch  # the transitions before the checkpoint resumed from
        assert trainer.plan == plans[first % CYCLE], (first, trainer.plan)
        if rank == 0 and attempt == 0:
            (Path(samples_dir) / "plans.json").write_text(json.dumps([p.to_dict() for p in plans]))
        trainer.fit()
        record(transitions)
    trainer.close()
    dist.destroy_process_group()


def soak_config(overrides: list[str], run_dir: Path):
    """The resolved config `ptrun train OVERRIDES` would run."""
    from ptrun.compose import compose, for_launch

    return for_launch(compose(overrides, run_dir=run_dir, recipe="soak"))[0]


def watch(into: list, stop: threading.Event, every: float = 0.5) -> None:
    """Append this process's usage (with the time) to `into` every `every` seconds until `stop`."""
    while not stop.wait(every):
        into.append({"time": time.time(), **usage()})


def judge(samples: list[dict], warmup: int, memory_limit: float) -> tuple[list[dict], list[str]]:
    """One row per worker process (attempt, rank): each metric's first value, its maximum over the cycle
    after warm-up and over the last cycle, and the growth between those two per 100 transitions. Returns
    the rows and the failed checks."""
    rows, problems = [], []
    for key in sorted({(s["attempt"], s["rank"]) for s in samples}):
        series = [s for s in samples if (s["attempt"], s["rank"]) == key]  # series[i]: after i transitions
        row = {
            "attempt": key[0],
            "rank": key[1],
            "from": series[0]["transition"],
            "to": series[-1]["transition"],
            "judged": len(series) >= warmup + 2 * CYCLE,
        }
        warm, last = series[warmup : warmup + CYCLE], series[-CYCLE:]
        span = len(series) - CYCLE - warmup  # transitions between the two windows
        for m in METRICS:
            entry = {"first": series[0][m]}
            if row["judged"]:
                entry.update(warm=max(s[m] for s in warm), last=max(s[m] for s in last))
                entry["growth"] = entry["last"] - entry["warm"]
                entry["per_100"] = 100 * entry["growth"] / span
            row[m] = entry
        rows.append(row)
        if not row["judged"]:
            continue
        name = f"attempt {key[0]} rank {key[1]}"
        for m in ("fds", "threads", "os_threads"):
            if row[m]["growth"] > 0:
                problems.append(f"{name}: {m} grew by {row[m]['growth']} after warm-up")
        allowed = memory_limit * max(span, 100) / 100
        if row["private_mib"]["growth"] > allowed:
            problems.append(
                f"{name}: private memory grew {row['private_mib']['growth']:.1f} MiB over {span} "
                f"transitions after warm-up (allowed {allowed:.1f})"
            )
    if not any(r["judged"] for r in rows):
        problems.append(f"no worker process ran more than {warmup + 2 * CYCLE} transitions: nothing judged")
    return rows, problems


def soak(
    run_dir: str | Path,
    *,
    transitions: int = 200,
    restarts: int = 5,
    checkpoint_every: int = 10,
    warmup: int = 10,
    memory_limit: float = 5.0,
    overrides: list[str] = (),
    start_method: str = "spawn",
) -> dict:
    """Run the soak in `run_dir` (emptied first) and judge it; returns everything measured, `problems` empty
    when nothing leaked. `start_method="forkserver"` forks the workers from a server that imported the trainer
    once, which saves each (re)start its ~10 s of imports (ptrun's launcher spawns)."""
    from omegaconf import OmegaConf
    from torch.distributed.launcher.api import elastic_launch

    from ptrun.launcher.elastic_agent import tidy_agent
    from ptrun.launcher.launch import launch_config
    from ptrun.signal_scope import elastic_handlers_restored

    kill_points(transitions, restarts, checkpoint_every)  # fail before starting anything
    run_dir = Path(run_dir).resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    samples_dir = run_dir / "soak"
    samples_dir.mkdir(parents=True)
    cfg = soak_config(
        OVERRIDES
        + [
            f"train.epochs={transitions + 1}",
            f"launcher.max_restarts={restarts}",
            f"checkpoint.every_epochs={checkpoint_every}",
            "checkpoint.every_steps=0",
            f"train.eval_every_epochs={checkpoint_every}",
            *overrides,
        ],
        run_dir,
    )
    config_path = run_dir / "config.yaml"
    config_path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg)))

    # As `ptrun.launcher.launch.launch` does, with the soak's worker as the entry point.
    config = launch_config(cfg, run_id=f"soak-{os.getpid()}", start_method=start_method)
    if start_method == "forkserver":
        multiprocessing.set_forkserver_preload([worker.__module__, "ptrun.train.trainer"])
    agent_before = usage()
    # The agent lives on through the restarts: sample it meanwhile, to compare it at each attempt's start.
    agent, stop = [], threading.Event()
    watcher = threading.Thread(target=watch, args=(agent, stop), name="soak-watch", daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        # The killed attempts' survivors raise (their exception files go); the caller's signal handlers are back
        # when the launch ends, and a signal that stopped it goes on to them.
        with tidy_agent(), elastic_handlers_restored():
            elastic_launch(config, worker)(str(config_path), str(samples_dir), transitions, restarts, checkpoint_every)
    finally:
        stop.set()
        watcher.join()
        if start_method == "forkserver":
            # The server holds a whole trainer's imports (~1 GB); the caller (pytest) lives on.
            multiprocessing.forkserver._forkserver._stop()
    wall = time.perf_counter() - t0
    agent_after = usage()

    samples = [
        json.loads(line) for path in sorted(samples_dir.glob("rank*.jsonl")) for line in path.read_text().splitlines()
    ]
    rows, problems = judge(samples, warmup, memory_limit)
    attempts = sorted({s["attempt"] for s in samples})
    if attempts != list(range(restarts + 1)):
        problems.append(f"attempts {attempts}, expected 0..{restarts}")
    if max(s["transition"] for s in samples) != transitions:
        problems.append(f"the workers stopped at transition {max(s['transition'] for s in samples)}")
    # The agent at the start of each attempt (its first sample after the attempt's first worker record).
    # Its first launch allocates a few descriptors for good (multiprocessing's resource tracker and
    # queues), so only growth from attempt to attempt counts.
    at_start = []
    for a in attempts:
        begun = min(s["time"] for s in samples if s["attempt"] == a)
        at_start.append(next((x for x in agent if x["time"] >= begun), agent[-1] if agent else agent_after))
    for m in ("fds", "os_threads"):
        if at_start and max(x[m] for x in at_start) > at_start[0][m]:
            problems.append(f"the agent's {m} grew across restarts: {[x[m] for x in at_start]}")
    # each transition's seconds, as the run's plan events recorded them (every attempt's)
    moved = [
        e["transition_s"]
        for e in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
        if e.get("event") == "plan" and e.get("transition_s", 0) > 0
    ]
    return {
        "transitions": transitions,
        "restarts": restarts,
        "checkpoint_every": checkpoint_every,
        "warmup": warmup,
        "memory_limit_mib_per_100": memory_limit,
        "overrides": OVERRIDES + list(overrides),
        "plans": json.loads((samples_dir / "plans.json").read_text()),
        "wall_s": wall,
        "transitions_run": len(moved),
        "transition_s_mean": sum(moved) / len(moved),
        "agent": {"before": agent_before, "after": agent_after, "at_attempt_start": at_start},
        "rows": rows,
        "problems": problems,
        "samples": samples,
    }


def table(result: dict) -> str:
    """The soak as markdown: one row per worker process, then the agent."""

    def cell(entry: dict, fmt: str = "{:.0f}") -> str:
        values = [entry["first"]] + ([entry["warm"], entry["last"]] if "warm" in entry else [])
        return " / ".join(fmt.format(v) for v in values)

    def growth(entry: dict, fmt: str = "{:+.0f}") -> str:
        return fmt.format(entry["per_100"]) if "per_100" in entry else "-"

    lines = [
        f"{result['transitions']} transitions (cycle A -> B -> C), {result['restarts']} restarts, "
        f"{result['transitions_run']} transitions run in all (work after a checkpoint is redone), "
        f"{result['wall_s']:.0f} s, {1000 * result['transition_s_mean']:.0f} ms per transition; "
        f"warm-up {result['warmup']} transitions per process",
        "",
        "| attempt | rank | transitions | fds first / warm / last | threads (Python) | threads (OS) "
        "| RSS MiB first / warm / last | of it cache store (shared) | per 100 transitions after warm-up: "
        "fds, threads, OS threads, RSS MiB, private MiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['attempt']} | {r['rank']} | {r['from']}-{r['to']} | {cell(r['fds'])} "
            f"| {cell(r['threads'])} | {cell(r['os_threads'])} | {cell(r['rss_mib'], '{:.1f}')} "
            f"| {cell(r['shared_mib'], '{:.1f}')} "
            f"| {growth(r['fds'])}, {growth(r['threads'])}, {growth(r['os_threads'])}, "
            f"{growth(r['rss_mib'], '{:+.2f}')}, {growth(r['private_mib'], '{:+.2f}')} |"
        )
    a, b, starts = result["agent"]["before"], result["agent"]["after"], result["agent"]["at_attempt_start"]
    lines += [
        "",
        f"agent (the launching process) before -> after: fds {a['fds']} -> {b['fds']}, threads "
        f"{a['threads']} -> {b['threads']} (OS {a['os_threads']} -> {b['os_threads']}), RSS "
        f"{a['rss_mib']:.1f} -> {b['rss_mib']:.1f} MiB; at each attempt's start: fds "
        f"{[x['fds'] for x in starts]}, OS threads {[x['os_threads'] for x in starts]}, RSS MiB "
        f"{[round(x['rss_mib'], 1) for x in starts]}",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=200)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--checkpoint-every", type=int, default=10, help="transitions between checkpoints")
    parser.add_argument("--warmup", type=int, default=10, help="transitions per process before judging")
    parser.add_argument(
        "--memory-limit", type=float, default=5.0, help="allowed growth of private memory, MiB per 100 transitions"
    )
    parser.add_argument("--run-dir", default="runs/soak")
    parser.add_argument("--out", help="JSON result (default RUN_DIR/soak.json)")
    args, overrides = parser.parse_known_args()
    result = soak(
        args.run_dir,
        transitions=args.transitions,
        restarts=args.restarts,
        checkpoint_every=args.checkpoint_every,
        warmup=args.warmup,
        memory_limit=args.memory_limit,
        overrides=overrides,
    )
    print(table(result))
    out = Path(args.out or Path(args.run_dir) / "soak.json")
    out.write_text(json.dumps(result, indent=1))
    print(f"written: {out}")
    for problem in result["problems"]:
        print(f"soak: FAILED: {problem}", file=sys.stderr)
    return 1 if result["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
