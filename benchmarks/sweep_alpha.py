"""The paper's alpha sweep (Figure 10: speedup and accuracy against the freeze rate), measured in one invocation.

Runs one recipe with the same seed and data: the baseline (no freezing, no cache) and, for each alpha in
{1/5, 1/4, 1/3, 2/5, 1/2}, all four components (freeze, AutoPipe, AutoDP, AutoCache) with
`freeze.policy=alpha freeze.alpha=X`. Prints and writes (`sweep_alpha.json` in `--out`) per alpha: the
frozen-block schedule, training time for the recipe's epoch budget and its speedup over the baseline, the
ideal speedup that schedule allows, the final metric and its difference to the baseline's; the paper's
Figure 10 (ViT-B/16 on CIFAR-100) beside it, for the shape only.

    python -m benchmarks.sweep_alpha [--recipe digits_vit] [--alphas 1/5,1/4,1/3,2/5,1/2] [--repeats 1]
                                  [--out DIR] [--reuse] [overrides ...]

Why `freeze.policy=alpha` and not the default `pipetransformer`: under the paper's full rule alpha is only
an upper bound, and the gradient-norm term may stop a freeze step earlier, so a sweep would measure alpha
mixed with this model's gradient norms (and two alphas could give the same schedule for reasons that have
nothing to do with alpha). The closed form F_T = ceil(L (1 - (1 - alpha)^T)) makes the schedule a function
of alpha alone, and it is what the paper's released code ran when Figure 10 was made. The recipe's own
`freeze.start` and `freeze.max_fraction` still apply: a cap of 4 of 6 blocks (digits_vit's, when this was measured)
makes alpha = 2/5 and 1/2 the same schedule, so lift it (`freeze.max_fraction=1.0`) to see the whole range.

Overrides after the options go to every run, the baseline included.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from benchmarks.harness import (
    aggregate,
    cell,
    command_line,
    fmt,
    markdown_lines,
    median,
    publish,
    rounds_parser,
    run_rounds,
)

ALPHAS = "1/5,1/4,1/3,2/5,1/2"
PAPER = {"1/5": (2.04, 91.33), "1/4": (2.44, 91.13), "1/3": (2.83, 90.78), "2/5": (3.29, 90.82), "1/2": (3.86, 89.84)}
"""Figure 10's (speedup, top-1) per alpha (ViT-B/16 fine-tuned on CIFAR-100, 2 x 8 GPUs)."""
PAPER_BASELINE_TOP1 = 91.21
"""The paper's CIFAR-100 baseline top-1 (Table 1), which Figure 10's accuracies compare against."""
ALL_FOUR = ["auto.freeze=true", "auto.pipe=true", "auto.dp=true", "auto.cache=true"]
"""Spelled out rather than left to the recipe: a recipe without AutoCache would otherwise sweep three."""


def label(alpha: str) -> str:
    return f"alpha {alpha}"


def frozen_blocks(run_dir: Path) -> list[int]:
    """Frozen blocks in each epoch of a run, from its `plan` events (the latest record of each epoch)."""
    from ptrun.freezing.counts import blocks_of_units
    from ptrun.report import load_run

    return [blocks_of_units(p["frozen_units"]) for p in load_run(run_dir).plans]


def schedule_text(blocks: list[int]) -> str:
    """[0, 0, 2, 4, 4] -> "2 (3), 4 (4)": each new frozen-block count with the 1-based epoch it starts in."""
    steps = [f"{b} ({epoch + 1})" for epoch, b in enumerate(blocks) if b != (blocks[epoch - 1] if epoch else 0)]
    return ", ".join(steps) or "none"


def sweep_rows(rounds: list[list[dict]], alphas: list[str]) -> list[dict]:
    """`benchmarks.speedup`'s aggregated rows plus, per run, its alpha, schedule, accuracy difference to the
    baseline (the median over rounds of each round's own difference) and the paper's numbers."""
    rows = aggregate(rounds, paper={})
    for i, (row, alpha) in enumerate(zip(rows, [None, *alphas], strict=True)):
        row["alpha"] = alpha
        row["frozen_blocks"] = frozen_blocks(Path(row["runs"][0]["run_dir"]))
        row["final_vs_baseline"] = median(
            [
                None if rep[i]["final"] is None or rep[0]["final"] is None else rep[i]["final"] - rep[0]["final"]
                for rep in rounds
            ]
        )
        row["paper_speedup"], row["paper_final"] = PAPER.get(alpha, (1.0, PAPER_BASELINE_TOP1))
    return rows


def caption(result: dict) -> str:
    """The line above the table: what was run."""
    rounds = f"medians of {result['repeats']} interleaved rounds" if result["repeats"] > 1 else "one round"
    return (
        f"{result['recipe']}, the baseline and all four components at each alpha (freeze.policy=alpha), same "
        f"seed and data; {rounds}"
    )


def table(result: dict) -> str:
    """The Markdown table of a `sweep_alpha.json` (printed by this script, put in the README by
    `benchmarks/results_page.py`)."""
    header = [
        "alpha",
        "frozen blocks (from epoch)",
        "training time (s)",
        "speedup",
        "ideal speedup",
        f"final {result['rows'][0]['metric']}",
        "vs baseline",
        "paper (Fig. 10): speedup, top-1",
    ]
    rows = (
        [
            str(r["alpha"] or "baseline"),
            schedule_text(r["frozen_blocks"]),
            f"{r['train_time_s']:.1f}",
            cell(r, "speedup", ".2f", "x", result["repeats"]),
            f"{r['ideal_speedup']:.2f}x",
            fmt(r["final"]),
            fmt(r["final_vs_baseline"], "+.2f"),
            f"{r['paper_speedup']:.2f}x, {r['paper_final']:.2f}",
        ]
        for r in result["rows"]
    )
    return "\n".join(markdown_lines(header, rows))


def main() -> None:
    parser = rounds_parser(__doc__, "runs/sweep_alpha", repeats_help="interleaved rounds of all runs; medians")
    parser.add_argument("--alphas", default=ALPHAS, help="comma-separated fractions (default: Figure 10's)")
    args, extra = parser.parse_known_args()
    alphas = [a.strip() for a in args.alphas.split(",")]
    for a in alphas:
        if not 0 < Fraction(a) < 1:
            parser.error(f"--alphas: {a} is not between 0 and 1")
    runs = {"baseline": ["auto.freeze=false", "auto.cache=false"]}
    # float() of the fraction: the config takes a number, and 1/3 must be 0.333..., not 0.33.
    runs.update({label(a): [*ALL_FOUR, "freeze.policy=alpha", f"freeze.alpha={float(Fraction(a))!r}"] for a in alphas})
    out = Path(args.out)
    rounds = run_rounds(
        out, runs, [f"recipe={args.recipe}", "train.export=false", *extra], args.repeats, args.reuse, paper={}
    )
    result = {
        "command": command_line(),
        "recipe": args.recipe,
        "overrides": extra,
        "repeats": args.repeats,
        "policy": "alpha",
        "alphas": alphas,
        "rows": sweep_rows(rounds, alphas),
    }
    publish(result, out / "sweep_alpha.json", caption, table)


if __name__ == "__main__":
    main()
