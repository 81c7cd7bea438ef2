"""How true the savings line is: the estimate of a run without freezing (`ptrun.report.savings`) against a
measured run with freezing off, side by side in one invocation.

Per recipe, in interleaved rounds (a slow spell of the shared machine hits both runs alike): the recipe as
shipped (it freezes), whose `savings` estimate says how long its training would have taken without freezing,
and the same recipe with `auto.freeze=false auto.cache=false`, whose training time is that, measured. Training
time is what the savings line counts: the epochs' training loops plus the layout changes between epochs. The
table shows both, the estimate's error, the range the line gives (the estimate at its slowest and fastest
steady stretch, where it measured two or more) and whether the measured run fell in it, and the error of the
earlier estimate (the rate of every stretch with every unit training, the first steps' warm-up included, times
every sample), for comparison. Runs with the recipe's own worker count, both of them (2 on a CPU).

    python -m benchmarks.savings_check [--recipe digits_vit] [--recipe text_classification] [--repeats 3]
        [--out DIR] [--reuse] [overrides ...]

`text_classification` runs on a tiny random BERT (4 layers, 64 wide, MiniLM's tokenizer; steps of a few
milliseconds, as on a GPU) and the packaged news sample (`--per-class` articles a topic, 80: 320 training
rows, 20 steps an epoch), both written under --out.
"""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path

from benchmarks.harness import (
    cell,
    command_line,
    dir_name,
    fmt,
    label_rows,
    markdown_lines,
    publish,
    rounds_parser,
    train,
)
from benchmarks.tiny_inputs import machine

RECIPES = ("digits_vit", "text_classification")
FREEZING, OFF = "freezing", "freezing off"
RUNS = {FREEZING: [], OFF: ["auto.freeze=false", "auto.cache=false"]}
KEYS = ("estimate_s", "measured_s", "error", "first_rate_estimate_s", "first_rate_error", "train_s", "rate_ratio")


def recipe_overrides(recipe: str, out: Path, per_class: int = 80) -> list[str]:
    """The overrides that make `recipe` run here: text_classification gets the tiny BERT and the news csv."""
    if recipe != "text_classification":
        return [f"recipe={recipe}"]
    from benchmarks.tiny_inputs import news_csv, tiny_encoder

    return [
        f"recipe={recipe}",
        f"model.pretrained={tiny_encoder(out / 'tiny_bert')}",
        f"data.path={news_csv(out / f'data{per_class}', per_class)}",
    ]


def first_rate_estimate(run) -> float | None:
    """The earlier estimate: the seconds per sample of every stretch that trained every unit (warm-up included),
    times every sample the run trained."""
    from ptrun.report.savings import epoch_pieces

    pieces = [piece for epoch in run.epochs for piece in (epoch_pieces(run, epoch) or [])]
    unfrozen = [(s, n) for plan, s, n in pieces if not plan.get("frozen_units")]
    samples = math.fsum(n for _, n in unfrozen)
    if not samples:
        return None
    return math.fsum(s for s, _ in unfrozen) / samples * math.fsum(n for _, _, n in pieces)


def rate_ratio(on, off) -> float | None:
    """The freezing run's steady seconds per sample with every unit training (what the estimate prices the
    frozen samples at) over the run without freezing's, in the same epochs, warm-up left out of both: 1 when
    the machine ran both alike. On a shared machine it drifts, and the estimate's error with it."""
    from ptrun.report.savings import WARM_UP, run_pieces, steady_pieces

    on_pieces, off_pieces = run_pieces(on), run_pieces(off)
    if on_pieces is None or off_pieces is None:
        return None
    steady = steady_pieces(on, on_pieces[1])
    epochs = {p[0] for p in steady}
    same = [p for p in off_pieces[1] if p[0] in epochs and not p[1].get(WARM_UP)]
    if not steady or not same:
        return None
    rate = lambda pieces: math.fsum(p[2] for p in pieces) / math.fsum(p[3] for p in pieces)  # noqa: E731
    return rate(steady) / rate(same)


def measure(dirs: dict[str, Path]) -> dict:
    """One round: the freezing run's estimate (and the earlier one) against the measured run without freezing."""
    from ptrun.report import load_run
    from ptrun.report.savings import freezing_savings

    on_run, off_run = load_run(dirs[FREEZING]), load_run(dirs[OFF])
    on, off = freezing_savings(on_run), freezing_savings(off_run)
    first = first_rate_estimate(on_run)
    estimate = on.unfrozen_s  # None: too few steady steps with every unit training to estimate
    span = on.unfrozen_range_s
    return {
        "label": "estimate against measured",
        "estimate_s": estimate,
        "measured_s": off.train_s,
        "train_s": on.train_s,
        "error": estimate and estimate / off.train_s - 1,
        "line": on.line(),
        "range_s": span and list(span),
        "in_range": span and span[0] <= off.train_s <= span[1],
        "steady_steps": on.steady_steps,
        "rate_ratio": rate_ratio(on_run, off_run),
        "first_rate_estimate_s": first,
        "first_rate_error": first and first / off.train_s - 1,
        "runs": {label: str(d) for label, d in dirs.items()},
    }


def caption(result: dict) -> str:
    data = f" on the tiny BERT, {result['per_class']} articles a topic" if result.get("per_class") else ""
    return (
        f"{result['recipe']}{data}: {result['repeats']} round(s) of 2 runs (freezing, freezing off), interleaved; "
        f"medians"
        + (" (min-max over the rounds)" if result["repeats"] > 1 else "")
        + "; error = estimate / measured - 1; rate ratio = the freezing run's steady seconds per sample with "
        "every unit training over the run without freezing's in the same epochs (1: the machine ran both alike)"
    )


def table(result: dict) -> str:
    n, row = result["repeats"], result["rows"][0]
    lines = markdown_lines(
        [
            "training with freezing (s)",
            "estimate without freezing (s)",
            "measured without freezing (s)",
            "error",
            "earlier estimate (s)",
            "its error",
        ],
        [
            [
                cell(row, "train_s", ".2f", "", n),
                cell(row, "estimate_s", ".2f", "", n),
                cell(row, "measured_s", ".2f", "", n),
                pct(row, "error", n),
                cell(row, "first_rate_estimate_s", ".2f", "", n),
                pct(row, "first_rate_error", n),
            ]
        ],
    )
    per_round = markdown_lines(
        [
            "round",
            "steady steps",
            "rate ratio",
            "estimate (s)",
            "the line's range (s)",
            "measured (s)",
            "error",
            "earlier error",
        ],
        [
            [
                str(i),
                fmt(r.get("steady_steps"), "d"),
                fmt(r.get("rate_ratio")),
                fmt(r["estimate_s"]),
                span_cell(r),
                f"{r['measured_s']:.2f}",
                "-" if r["error"] is None else f"{100 * r['error']:+.0f}%",
                "-" if r["first_rate_error"] is None else f"{100 * r['first_rate_error']:+.0f}%",
            ]
            for i, r in enumerate(row["runs"])
        ],
    )
    return "\n".join(lines + [""] + per_round)


def span_cell(r: dict) -> str:
    """The line's range and whether the measured run fell in it ("-": the line gave none)."""
    if not r.get("range_s"):
        return "-"
    return f"{r['range_s'][0]:.2f}-{r['range_s'][1]:.2f} ({'in' if r['in_range'] else 'out'})"


def pct(row: dict, key: str, repeats: int) -> str:
    if row[key] is None:
        return "-"
    text = f"{100 * row[key]:+.0f}%"
    span = row.get(f"{key}_range")
    if repeats > 1 and span:
        text += f" ({100 * span[0]:+.0f}% to {100 * span[1]:+.0f}%)"
    return text


def main() -> None:
    parser = rounds_parser(__doc__, "runs/check_savings", recipe=None, repeats=3)
    parser.add_argument(
        "--recipe",
        action="append",
        help="repeatable; default: digits_vit and text_classification "
        "(which runs on the tiny BERT; any other recipe runs as shipped)",
    )
    parser.add_argument("--per-class", type=int, default=80, help="text_classification's articles per topic")
    args, overrides = parser.parse_known_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for recipe in args.recipe or RECIPES:
        common = [*recipe_overrides(recipe, out, args.per_class), "train.export=false", *overrides]
        rounds = [
            [
                measure(
                    {
                        label: train(out / recipe / f"round{r}" / dir_name(label), [*common, *extra], args.reuse)
                        for label, extra in RUNS.items()
                    }
                )
            ]
            for r in range(args.repeats)
        ]
        result = {
            "command": command_line(),
            "date": date.today().isoformat(),
            "machine": machine(),
            "recipe": recipe,
            "overrides": common,
            "repeats": args.repeats,
            "rows": label_rows(rounds, KEYS),
        }
        name = recipe + (f"_{args.per_class}" if recipe == "text_classification" and args.per_class != 80 else "")
        result["per_class"] = args.per_class if recipe == "text_classification" else None
        publish(result, out / f"check_savings_{name}.json", caption, table)


if __name__ == "__main__":
    main()
