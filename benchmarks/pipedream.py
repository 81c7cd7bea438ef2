"""PipeDream's asynchronous 1F1B against the flushing 1F1B at K = 2, side by side in one invocation.

Runs the recipe (default: digits_vit) with `pipe.schedule=1F1B` (the recipe's own) and with
`pipe.schedule=pipedream pipe.microbatches=1` (with and without vertical sync), same seed and data, in
interleaved rounds; once as the recipe is (freezing packs the pipeline into K = 1 later on, where pipedream
runs synchronously) and once without freezing (K = 2 throughout). Reports per run: the median samples/s of
the K = 2 epochs (the schedules' own speed), training time, wall time to the flushing run's final accuracy,
final accuracy, and the most memory the stashed weight versions took.

With `--placements` it compares instead where the same pipedream training runs, without freezing: K = 2
on 2 workers, the first stage replicated on 2 workers plus 1 for the second stage (PipeDream's "2-1",
`pipe.first_stage_replicas=2`, 3 workers) and K = 2 x DP = 2 (4 workers). All three train the same
mathematics (one update per stage per 16-sample step), so the table is about speed per worker.

    python -m benchmarks.pipedream [--repeats 2] [--out DIR] [--reuse] [--placements] [overrides ...]
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.harness import aggregate, command_line, fmt, median, publish, rounds_parser, run_rounds

SCHEDULES = {
    "1F1B": [],
    "pipedream": ["pipe.schedule=pipedream", "pipe.microbatches=1"],
    "pipedream + vertical sync": ["pipe.schedule=pipedream", "pipe.microbatches=1", "pipe.vertical_sync=true"],
}
PIPEDREAM = ["pipe.schedule=pipedream", "pipe.microbatches=1"]
PLACEMENTS = {
    "K = 2": [*PIPEDREAM, "launcher.nproc_per_node=2"],
    "2-1 (first stage replicated)": [
        *PIPEDREAM,
        "pipe.first_stage_replicas=2",
        "auto.pipe=false",
        "auto.dp=false",
        "launcher.nproc_per_node=3",
    ],
    "K = 2 x DP = 2": [*PIPEDREAM, "launcher.nproc_per_node=4"],
}
"""Where the same pipedream training runs (`--placements`), label -> overrides."""
SETTINGS = {"the recipe (freezing on)": [], "no freezing (K = 2 throughout)": ["auto.freeze=false", "auto.cache=false"]}


def pipelined_stats(run_dir: str) -> dict:
    """The median samples/s over the epochs that ran as a K = 2 pipeline, and the stash's peak bytes."""
    from ptrun.report import load_run

    run = load_run(Path(run_dir))
    k2 = [e for e in run.epochs if (run.plan_for(e["epoch"]) or {}).get("pp") == 2]
    return {
        "k2_epochs": len(k2),
        "k2_samples_per_s": statistics.median(e["samples_per_s"] for e in k2) if k2 else None,
        "stash_bytes_peak": max((e.get("stash_bytes_peak", 0) for e in run.epochs), default=0),
    }


def table(result: dict) -> str:
    """The benchmark's table (for the terminal and `benchmarks/results_page.py`)."""
    if result.get("kind") == "placements":
        return placement_table(result["rows"])
    return schedule_table(result["rows"])


def caption(result: dict) -> str:
    if result.get("kind") == "placements":
        return f"{result['recipe']}: {result['repeats']} round(s); medians; pipedream without freezing"
    return f"{result['recipe']}: {result['repeats']} round(s); medians; target = the flushing 1F1B run's final top-1"


def schedule_table(rows: list[dict]) -> str:
    lines = [
        "| setting | schedule | samples/s, K = 2 epochs | training time (s) | time to target (s) | "
        "speedup to target | final top-1 | stashed weights (KiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['setting']} | {r['combination']} | {fmt(r['k2_samples_per_s'], '.0f')} "
            f"({r['k2_epochs']} epochs) | {r['train_time_s']:.1f} | {fmt(r['time_to_target_s'], '.1f')} "
            f"| {fmt(r['speedup_to_target'], '.2f', 'x')} | {fmt(r['final'])} "
            f"| {r['stash_bytes_peak'] / 1024:.0f} |"
        )
    return "\n".join(lines)


def placement_table(rows: list[dict]) -> str:
    lines = [
        "| placement | workers | samples/s | samples/s per worker | training time (s) | final top-1 |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['combination']} | {r['workers']} | {r['samples_per_s']:.0f} | "
            f"{r['samples_per_s'] / r['workers']:.0f} | {r['train_time_s']:.1f} | {fmt(r['final'])} |"
        )
    return "\n".join(lines)


def placements(args, extra: list[str]) -> None:
    out = Path(args.out)
    rounds = run_rounds(
        out / "placements",
        PLACEMENTS,
        [f"recipe={args.recipe}", "train.export=false", "auto.freeze=false", "auto.cache=false", *extra],
        args.repeats,
        args.reuse,
        paper={},
    )
    rows = aggregate(rounds, paper={})
    for row in rows:
        row["workers"] = int(next(o for o in PLACEMENTS[row["combination"]] if "nproc_per_node" in o).split("=")[1])
        row["samples_per_s"] = median([r["mean_samples_per_s"] for r in row["runs"]])
    result = {
        "command": command_line(),
        "kind": "placements",
        "recipe": args.recipe,
        "repeats": args.repeats,
        "rows": rows,
    }
    publish(result, out / "bench_pipedream_placement.json", caption, table)


def main() -> None:
    parser = rounds_parser(
        __doc__, "runs/bench_pipedream", repeats=2, repeats_help="interleaved rounds; the table shows medians"
    )
    parser.add_argument("--no-vertical", action="store_true", help="leave out the vertical-sync runs")
    parser.add_argument(
        "--placements",
        action="store_true",
        help="compare K = 2, 2-1 (first stage replicated) and K = 2 x DP = 2 instead",
    )
    args, extra = parser.parse_known_args()
    if args.placements:
        return placements(args, extra)
    out = Path(args.out)
    rows = []
    for s, (setting, overrides) in enumerate(SETTINGS.items()):
        schedules = {k: v for k, v in SCHEDULES.items() if not (args.no_vertical and "vertical" in k)}
        rounds = run_rounds(
            out / f"setting{s}",
            schedules,
            [f"recipe={args.recipe}", "train.export=false", *overrides, *extra],
            args.repeats,
            args.reuse,
            paper={},
        )
        for row in aggregate(rounds, paper={}):
            stats = [pipelined_stats(r["run_dir"]) for r in row["runs"]]
            row.update(
                setting=setting,
                k2_epochs=stats[0]["k2_epochs"],
                k2_samples_per_s=median([x["k2_samples_per_s"] for x in stats]),
                stash_bytes_peak=max(x["stash_bytes_peak"] for x in stats),
            )
            rows.append(row)
    result = {"command": command_line(), "recipe": args.recipe, "repeats": args.repeats, "rows": rows}
    publish(result, out / "bench_pipedream.json", caption, table)


if __name__ == "__main__":
    main()
