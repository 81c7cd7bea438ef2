"""How often to decide: freezing at epoch boundaries (the paper) against freezing inside epochs, beside the
plain PyTorch loop a user would run instead, in one invocation.

Per recipe, in interleaved rounds, the plain loop (`benchmarks.plain_loop`, one process with every core
as threads: the faster plain peer on the BERT recipe) and the recipe's ptrun job with the freeze decision
every epoch, every half and every quarter epoch, and AutoFreeze's rule (the relative change of each block's
gradient norm against the median) every quarter epoch, and the paper's rule with a faster freeze rate
(alpha 1/2, 2/3) every quarter epoch. Per run: wall time, training time, final top-1,
training time to the plain loop's final top-1, the speedup in wall time over the plain loop, and the
schedule's own ideal (the full model's training FLOPs over the run's, from its plan events: what freezing
alone could save, before any overhead). Prints the table and writes it with the command line to
`sweep_interval_<recipe>.json` in --out (`benchmarks/results_page.py` makes the README's table from it).

    python -m benchmarks.sweep_interval [--recipe bbc_news_bert] [--repeats 1] [--out DIR] [--reuse]
        [--only LABEL ...] [overrides ...]
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import (
    command_line,
    dir_name,
    fmt,
    ideal_speedup,
    label_rows,
    median,
    publish,
    rounds_caption,
    rounds_parser,
    rows_table,
)
from benchmarks.peer_runs import commands, execute
from benchmarks.peer_summary import COLUMNS, measure

PEER = "plain loop"
VARIANTS = {
    "ptrun, every epoch (the paper)": ["freeze.every=1"],
    "ptrun, every 1/2 epoch": ["freeze.every=0.5"],
    "ptrun, every 1/4 epoch": ["freeze.every=0.25"],
    "ptrun, AutoFreeze rule every 1/4 epoch": ["freeze.policy=autofreeze", "freeze.every=0.25"],
    "ptrun, alpha 1/2 every 1/4 epoch": ["freeze.alpha=0.5", "freeze.every=0.25"],
    "ptrun, alpha 2/3 every 1/4 epoch": ["freeze.alpha=0.6667", "freeze.every=0.25"],
}
"""label -> `ptrun train` overrides after `recipe=NAME` (the rest is the recipe's: all four components)."""
LABELS = [PEER, *VARIANTS]
KEYS = ("wall_s", "train_time_s", "final_top1", "time_to_target_s", "speedup_wall", "ideal")


def aggregate(rounds: list[list[dict]]) -> dict:
    """Per label over the rounds: the median and range of every measure, and its rows."""
    return {"rows": label_rows(rounds, KEYS), "target": median([rnd[0]["target"] for rnd in rounds])}


def caption(result: dict) -> str:
    return (
        rounds_caption(result) + "; speedup = the plain loop's wall time over the run's; target = the plain "
        f"loop's final top-1 (median {fmt(result['target'])}); ideal = what the run's freeze schedule alone "
        "could save"
    )


def table(result: dict) -> str:
    n = result["repeats"]
    lines = rows_table(result["rows"], [*(COLUMNS[key] for key in KEYS[:-1]), ("ideal", "ideal", ".2f", "x")], n)
    return "\n".join(lines)


def main() -> None:
    parser = rounds_parser(__doc__, "runs/sweep_interval", recipe=None)
    parser.add_argument("--recipe", action="append", help="bbc_news_bert (default) or digits_vit; repeatable")
    parser.add_argument("--only", action="append", choices=LABELS, help="a run to make (repeatable)")
    args, overrides = parser.parse_known_args()
    labels = [label for label in LABELS if not args.only or label in args.only]
    out = Path(args.out)
    for recipe in args.recipe or ["bbc_news_bert"]:
        rounds = []
        for r in range(args.repeats):
            runs = [
                execute(label, recipe, out / recipe / f"round{r}" / dir_name(label), overrides, args.reuse, VARIANTS)
                for label in labels
            ]
            for run in runs:
                run["ideal"] = None if run["label"] == PEER else ideal_speedup(Path(run["run_dir"]))
            rounds.append(measure(runs))
        result = {
            "command": command_line(),
            "recipe": recipe,
            "overrides": overrides,
            "repeats": args.repeats,
            "commands": commands(labels, recipe, overrides, VARIANTS),
            **aggregate(rounds),
        }
        publish(result, out / f"sweep_interval_{recipe}.json", caption, table)


if __name__ == "__main__":
    main()
