"""The rounds of `benchmarks.peers` summarized: each round's target, time to it and speedups against the faster
plain peer, the medians and ranges over the rounds, the throughput checks, and the Markdown tables.
"""

from __future__ import annotations

from benchmarks.harness import cell, fmt, label_rows, median, rounds_caption, rows_table, spread
from benchmarks.peer_runs import BY_KEY, COLD, EAGER, TOP1, WARM, Metric, is_peer

CHECKS = {"ptrun, freezing off, 1 worker": "plain loop", "ptrun, freezing off, 2 workers": "plain DDP"}
"""ptrun run -> the plain peer on the same processes and threads, whose samples/s it should keep up with."""
FLOOR = 0.95
"""The least ratio (ptrun's samples/s over its peer's, the median over the rounds) a check passes at."""


def check_pairs() -> list[tuple[str, str]]:
    """(ptrun run, plain peer) pairs whose samples/s are checked: CHECKS, and each eager, and compiled on a
    cold and on a warm cache, like against like."""
    return [(mine + s, peer + s) for mine, peer in CHECKS.items() for s in ("", EAGER, COLD, WARM)]


def time_to(curve: list[list[float]], target: float | None, metric: Metric = TOP1) -> float | None:
    """Cumulative training time at the first evaluated epoch whose metric reaches `target`; None if none does."""
    if target is None:
        return None
    return next((t for t, value in curve if metric.reaches(value, target)), None)


def measure(runs: list[dict], metric: Metric = TOP1) -> list[dict]:
    """One round's rows: each run's measurements plus its time outside training, the round's target (the best
    plain peer's final metric: the highest top-1, the lowest perplexity) and the time to it, and speedups
    against the round's faster plain peer."""
    peers = [r for r in runs if is_peer(r["label"])]
    target = metric.best([r[f"final_{metric.key}"] for r in peers])
    best_wall = min((r["wall_s"] for r in peers), default=None)
    best_train = min((r["train_time_s"] for r in peers), default=None)
    return [
        dict(
            r,
            overhead_s=r["wall_s"] - r["train_time_s"],
            target=target,
            time_to_target_s=time_to(r["curve"], target, metric),
            speedup_wall=best_wall and best_wall / r["wall_s"],
            speedup_train=best_train and best_train / r["train_time_s"],
        )
        for r in runs
    ]


def keys(metric: Metric = TOP1) -> tuple[str, ...]:
    """The measures of a row (`final_top1`, or `final_perplexity`, for the metric)."""
    return (
        "wall_s",
        "train_time_s",
        "overhead_s",
        "samples_per_s",
        f"final_{metric.key}",
        "time_to_target_s",
        "speedup_wall",
        "speedup_train",
        *UNTABLED,
    )


OUTSIDE = ("to_first_step_s", "eval_s", "rest_s")
"""The parts of a run's time outside training (`outside_training`)."""
UNTABLED = (*OUTSIDE, "ptrun_total_time_s", "measure_share", "signal_share")
"""The measures the runs' table leaves out (the parts outside training and the freeze measure have tables of
their own; `signal_share` is its older name)."""


def aggregate(rounds: list[list[dict]], metric: Metric = TOP1) -> dict:
    """Over the rounds (each `measure`d): per label the median and range of every measure and its rows; per
    check the ratio of samples/s (ptrun over its peer, round by round), its median and range."""
    rows = [
        {"label": row["label"], "kind": "plain" if is_peer(row["label"]) else "ptrun", **row}
        for row in label_rows(rounds, keys(metric))
    ]
    by_label = {row["label"]: row["runs"] for row in rows}
    checks = []
    for mine, peer in check_pairs():
        if mine in by_label and peer in by_label:
            ratios = [
                a["samples_per_s"] / b["samples_per_s"] for a, b in zip(by_label[mine], by_label[peer], strict=True)
            ]
            ratio = median(ratios)
            checks.append(
                {
                    "ptrun": mine,
                    "peer": peer,
                    "ratio": ratio,
                    "ratio_range": spread(ratios),
                    "rounds": ratios,
                    "floor": FLOOR,
                    "passed": ratio >= FLOOR,
                }
            )
    for row in rows:
        final = [r[f"final_{metric.key}"] for r in row["runs"] if r.get(f"final_{metric.key}") is not None]
        row[f"mean_{metric.key}"] = sum(final) / len(final) if final else None
    return {
        "rows": rows,
        "checks": checks,
        "target": median([rnd[0]["target"] for rnd in rounds]),
        "metric": metric.key,
    }


COLUMNS = {
    c[1]: c
    for c in (
        ("wall (s)", "wall_s", ".1f", ""),
        ("training (s)", "train_time_s", ".1f", ""),
        ("outside training (s)", "overhead_s", ".1f", ""),
        ("samples/s", "samples_per_s", ".0f", ""),
        *((f"final {m.name}", f"final_{m.key}", ".2f", "") for m in BY_KEY.values()),
        ("time to target (s)", "time_to_target_s", ".1f", ""),
        ("speedup, wall", "speedup_wall", ".2f", "x"),
        ("speedup, training", "speedup_train", ".2f", "x"),
        *((f"mean {m.name}", f"mean_{m.key}", ".2f", "") for m in BY_KEY.values()),
    )
}
"""A measure's table column, by its key: (header, key, format spec, suffix), as `rows_table` takes it."""


def metric_in(result: dict) -> Metric:
    """The metric a result compares (top-1 in a result that names none)."""
    return BY_KEY[result.get("metric", TOP1.key)]


def caption(result: dict) -> str:
    """The line above the tables: what was run, how it is summarized, and the target."""
    seeds = "; round r ran with train.seed=r" if result.get("seeds") else ""
    metric = metric_in(result)
    target = (
        f"the best plain peer's final {metric.name}"
        if metric.higher_is_better
        else f"the plain peers' lowest final {metric.name}"
    )
    return (
        rounds_caption(result) + seeds + f"; speedups against the faster plain peer of each round; target = "
        f"{target} (median {fmt(result['target'])})"
    )


def table(result: dict) -> str:
    """The Markdown tables of a `bench_peers_<recipe>.json`: the runs, then the throughput checks."""
    n, metric = result["repeats"], metric_in(result)
    seeds = [f"mean_{metric.key}"] if result.get("seeds") else []
    shown_keys = [k for k in keys(metric) if k not in UNTABLED] + seeds
    columns = {**COLUMNS, "samples_per_s": ("samples/s", "samples_per_s", metric.samples_spec, "")}
    lines = rows_table(result["rows"], [columns[key] for key in shown_keys], n)
    if result["checks"]:
        lines += ["", "| samples/s in training | ratio | at least |", "|---|---|---|"]
        for c in result["checks"]:
            verdict = "yes" if c["passed"] else "**no**"
            lines.append(
                f"| {c['ptrun']} / {c['peer']} | {cell(c, 'ratio', '.2f', 'x', n)} | {c['floor']:.2f}x: {verdict} |"
            )
    split = [r for r in result["rows"] if r.get("to_first_step_s") is not None]
    if split:
        lines += [
            "",
            "| where the time outside training went (s) | to the first step | evaluation | the rest: layout "
            "changes, checkpoints, export, exit |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['label']} | " + " | ".join(cell(r, k, ".1f", "", n) for k in OUTSIDE) + " |" for r in split]
    # results recorded before the freeze policy's measure had its name call it its signal
    share = next((k for k in ("measure_share", "signal_share") if any(r.get(k) for r in result["rows"])), "")
    measured = [r for r in result["rows"] if r.get(share)]
    if measured:
        lines += ["", "| the freeze policy's measure (host time taking it) | share of training time |", "|---|---|"]
        lines += [f"| {r['label']} | {cell(r, share, '.2%', '', n)} |" for r in measured]
    return "\n".join(lines)
