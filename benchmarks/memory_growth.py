"""How much a worker's peak resident memory grows with the model, at K = 1 and K = 4, this tree against an
earlier commit, side by side in one invocation.

A random-init BERT at hidden 768 trains 4 steps (64 tokens, batch 8, freezing and AutoCache off, no export) at
12 and at 24 layers (+85 M parameters): as one worker at K = 1, which holds the whole model, and as 4 workers
at K = 4 with the recipe's time-balanced stages. The ratio is the growth of the largest K = 4 worker over the
growth of the single worker: a worker that holds only its stage gives about 0.25. Peaks are each worker's
high-water mark of resident memory, read from the run's epoch event (`memory.peak_rss_bytes`); the runs are
interleaved over `--repeats` rounds and the table gives medians. Prints the table and writes it with the
command line to `bench_memory_growth.json` in --out.

    python -m benchmarks.memory_growth --before REF [--repeats 1] [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from benchmarks.harness import command_line, fmt, fresh_run_dir, median, publish, rounds_parser, run_to_end
from benchmarks.memory import BERT_BASE, REPO, checkout, mib

RUN = [
    *BERT_BASE,
    "train.global_batch_size=8",
    "train.epochs=1",
    "train.max_steps_per_epoch=4",
    "auto.freeze=false",
    "auto.cache=false",
    "train.export=false",
    "checkpoint.every_epochs=0",
]
"""What every run trains (an earlier commit measured beside this one must accept these keys too)."""
SHAPES = [(12, 1), (24, 1), (12, 4), (24, 4)]
"""(layers, workers = pipeline length) of the four runs."""


def peak(tree: Path, run_dir: Path, layers: int, workers: int, overrides: list[str], reuse: bool) -> int:
    """The largest worker's peak resident bytes in one run of `tree`'s ptrun into `run_dir`."""
    events = run_dir / "metrics.jsonl"
    if fresh_run_dir(events, reuse):
        cmd = [
            str(tree / ".venv" / "bin" / "python"),
            "-m",
            "ptrun.cli",
            "train",
            f"hydra.run.dir={run_dir}",
            *RUN,
            f"model.depth={layers}",
            f"launcher.nproc_per_node={workers}",
            f"pipe.length={workers}",
            *overrides,
        ]
        print(f"$ {cmd[0]} -m ptrun.cli train {' '.join(cmd[4:])}", flush=True)
        run_to_end(cmd, cwd=tree)
    (epoch,) = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "epoch"]
    return max(epoch["memory"]["peak_rss_bytes"])


def row(label: str, rounds: list[dict]) -> dict:
    """Medians over the rounds of each run's peak, the two growths and their ratio."""
    peaks = {f"{layers},{workers}": median([r[(layers, workers)] for r in rounds]) for layers, workers in SHAPES}
    ratios = [(r[(24, 4)] - r[(12, 4)]) / (r[(24, 1)] - r[(12, 1)]) for r in rounds]
    return {
        "label": label,
        "peak_bytes": peaks,
        "growth_k1_bytes": peaks["24,1"] - peaks["12,1"],
        "growth_k4_bytes": peaks["24,4"] - peaks["12,4"],
        "ratio": median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
    }


def caption(result: dict) -> str:
    return (
        f"Random-init BERT at hidden 768, 12 and 24 layers (+85 M parameters), 4 training steps; the largest "
        f"worker's peak resident memory in MiB; {result['repeats']} round(s), interleaved (medians); growth = "
        f"24 layers - 12 layers; ratio = the K = 4 worker's growth / the single worker's (a stage's share: "
        f"about 0.25); before = `{result['before']}`"
    )


def table(result: dict) -> str:
    lines = [
        "| code | K = 1, 12 layers | K = 1, 24 layers | K = 4, 12 layers | K = 4, 24 layers | growth K = 1 "
        "| growth K = 4 | ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        low, high = r["ratio_range"]
        spread = f" ({low:.2f}-{high:.2f})" if result["repeats"] > 1 else ""
        cells = [mib(r["peak_bytes"][f"{layers},{workers}"]) for layers, workers in SHAPES]
        lines.append(
            f"| {r['label']} | {' | '.join(cells)} | {mib(r['growth_k1_bytes'])} | "
            f"{mib(r['growth_k4_bytes'])} | {fmt(r['ratio'])}x{spread} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_memory_growth", recipe=None, repeats_help="interleaved rounds")
    parser.add_argument("--before", required=True, help="the earlier commit to compare with")
    args, overrides = parser.parse_known_args()
    out = Path(args.out).resolve()
    before_tree, sha = checkout(args.before, out / "before-tree")
    trees = {f"before ({sha})": before_tree, "this tree": REPO}
    rounds: dict[str, list[dict]] = {label: [] for label in trees}
    try:
        for r in range(args.repeats):
            peaks: dict[str, dict] = {label: {} for label in trees}
            for layers, workers in SHAPES:  # every shape on both trees before the next, so a slow spell hits both
                for label, tree in trees.items():
                    run_dir = out / f"round{r}" / label.split()[0] / f"k{workers}-layers{layers}"
                    peaks[label][(layers, workers)] = peak(tree, run_dir, layers, workers, overrides, args.reuse)
            for label in trees:
                rounds[label].append(peaks[label])
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before_tree)], check=False)
    result = {
        "command": command_line(),
        "before": sha if sha.startswith(args.before) else f"{args.before} = {sha}",
        "overrides": overrides,
        "repeats": args.repeats,
        "rows": [row(label, rounds[label]) for label in trees],
    }
    out.mkdir(parents=True, exist_ok=True)
    publish(result, out / "bench_memory_growth.json", caption, table)


if __name__ == "__main__":
    main()
