"""The paper's speedup breakdown (Table 1 and Figure 9), measured side by side in one invocation.

Runs one recipe five times with the same seed and data: the baseline (the starting layout, no freezing)
and each component combination of the paper's Figure 9. Prints and writes (`bench_speedup.json` beside the
runs, with the command line; `benchmarks/results_page.py` makes the README's table from it) per combination:
training time for the recipe's epoch budget (the Table-1 measure) and its speedup, wall time to the
baseline's final accuracy (the stricter measure) and its speedup, final accuracy, mean samples/s, and the
ideal speedup the run's own freeze schedule allows: the model's training cost over the
cost of its active units, summed over the epochs (per-unit FLOPs from `ptrun.costs.units`; a frozen unit
counted at nothing), and how much of that ideal the run reached.

    python -m benchmarks.speedup [--recipe digits_vit] [--repeats 3] [--out DIR] [--reuse]
        [--only 'all four'] [overrides ...]

`--only` runs the baseline and just the named combinations (for a recipe too slow for all five).

Without AutoDP, ptrun keeps the pipeline length (it never leaves workers idle), so "freeze + AutoPipe +
AutoCache" moves stage boundaries and caches, but does not shorten the pipeline as the paper's did.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import (
    COMBINATIONS,
    aggregate,
    cell,
    command_line,
    fmt,
    markdown_lines,
    median,
    paper_for,
    publish,
    rounds_parser,
    run_rounds,
)


def caption(result: dict) -> str:
    """The line above the table: what was run and what the target is."""
    metric = result["rows"][0]["metric"]
    target = median([run["target"] for run in result["rows"][0]["runs"]])
    return (
        f"{result['recipe']}: {result['repeats']} round(s) of {len(result['rows'])} runs; medians; target = the "
        f"baseline's final {metric} (median {target:.2f})"
    )


def table(result: dict) -> str:
    """The Markdown table of a `bench_speedup.json` (printed by this script, put in the README by
    `benchmarks/results_page.py`)."""
    header = [
        "combination",
        "training time (s)",
        "speedup (range)",
        "time to target (s)",
        "speedup to target",
        f"final {result['rows'][0]['metric']}",
        "ideal speedup",
        "share of ideal",
        paper_for(result["recipe"])[1],
    ]
    rows = (
        [
            r["combination"],
            f"{r['train_time_s']:.1f}",
            cell(r, "speedup", ".2f", "x", result["repeats"]),
            fmt(r["time_to_target_s"], ".1f"),
            fmt(r["speedup_to_target"], ".2f", "x"),
            fmt(r["final"]),
            f"{r['ideal_speedup']:.2f}x",
            fmt(r["share_of_ideal"] and 100 * r["share_of_ideal"], ".0f", "%"),
            fmt(r["paper_speedup"], ".2f", "x"),
        ]
        for r in result["rows"]
    )
    return "\n".join(markdown_lines(header, rows))


def main() -> None:
    parser = rounds_parser(
        __doc__,
        "runs/bench_speedup",
        repeats_help="rounds of all the runs, interleaved (a "
        "slow spell of the machine hits every combination alike); the table shows medians and "
        "the speedups' range",
    )
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated combinations to run beside the baseline (e.g. 'all four'), for "
        "recipes too slow for all five",
    )
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    runs = COMBINATIONS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        unknown = [w for w in wanted if w not in COMBINATIONS]
        if unknown:
            parser.error(f"--only {unknown[0]!r}: not one of {', '.join(list(COMBINATIONS)[1:])}")
        runs = {k: v for k, v in COMBINATIONS.items() if k == "baseline" or k in wanted}
    paper = paper_for(args.recipe)[0]
    repeats = run_rounds(
        out, runs, [f"recipe={args.recipe}", "train.export=false", *extra], args.repeats, args.reuse, paper
    )
    rows = aggregate(repeats, paper)
    result = {
        "command": command_line(),
        "recipe": args.recipe,
        "overrides": extra,
        "repeats": args.repeats,
        "rows": rows,
    }
    publish(result, out / "bench_speedup.json", caption, table)


if __name__ == "__main__":
    main()
