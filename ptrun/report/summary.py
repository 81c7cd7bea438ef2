"""Numbers for the report: per-run summaries, time to accuracy across runs, and `report.md`.

Epochs are shown 1-based, as the terminal prints them ("epoch 1/20"); `metrics.jsonl` stores them 0-based.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ptrun.report.paper import paper_lines
from ptrun.report.runs import Run
from ptrun.report.savings import freezing_savings

# What makes two epochs "the same layout" for the throughput table: what the controller can change.
# `cached_units` (AutoCache's prefix) is newer than the first metrics files; absent means 0.
LAYOUT_KEYS = ("frozen_units", "pp", "dp", "microbatches", "cached_units")


@dataclass
class LayoutStats:
    frozen_units: int
    pp: int
    dp: int
    microbatches: int
    cached_units: int
    epochs: list[int]  # 1-based epochs run in this layout
    mean_samples_per_s: float


def layouts(run: Run) -> list[LayoutStats]:
    """Mean training throughput per distinct layout, in the order the run first used them."""
    groups: dict[tuple, list[dict]] = {}
    for e in run.epochs:
        plan = run.plan_for(e["epoch"])
        if plan is None:
            continue
        groups.setdefault(tuple(plan.get(k, 0) for k in LAYOUT_KEYS), []).append(e)
    return [
        LayoutStats(
            *key, epochs=[e["epoch"] + 1 for e in es], mean_samples_per_s=sum(e["samples_per_s"] for e in es) / len(es)
        )
        for key, es in groups.items()
    ]


def transitions(run: Run) -> list[dict[str, Any]]:
    """Each layout change: the epoch it led into or happened in (1-based) and its step there (0 at the
    boundary), from -> to, its cost and share of a mean epoch."""
    mean_epoch = sum(e["epoch_time_s"] for e in run.epochs) / len(run.epochs) if run.epochs else 0.0
    out = []
    for before, plan in zip(run.plans, run.plans[1:], strict=False):
        if (
            all(before.get(k, 0) == plan.get(k, 0) for k in LAYOUT_KEYS)
            and before["stage_bounds"] == plan["stage_bounds"]
        ):
            continue
        cost = plan.get("transition_s", 0.0)
        out.append(
            {
                "epoch": plan["epoch"] + 1,
                "step": plan.get("step", 0),
                "from": before,
                "to": plan,
                "transition_s": cost,
                "share": cost / mean_epoch if mean_epoch else 0.0,
            }
        )
    return out


def summarize(run: Run) -> dict[str, Any]:
    """The one-row summary of a run for the report's table."""
    metric = run.metric
    final = best = best_epoch = None
    if metric:
        key, higher = metric
        values = run.evals(key)
        if values:
            final = values[-1][2]
            best_epoch, _, best = (max if higher else min)(values, key=lambda v: v[2])
            best_epoch += 1
    tr = transitions(run)
    return {
        "label": run.label,
        "path": str(run.path),
        "recipe": run.start.get("recipe"),
        "model": run.start.get("model"),
        "world_size": run.start.get("world_size"),
        "epochs": len(run.epochs),
        "finished": run.end is not None,
        "resumes": run.segments - 1,
        "metric": metric[0] if metric else None,
        "final": final,
        "best": best,
        "best_epoch": best_epoch,
        "total_wall_s": run.total_wall_s,
        "train_time_s": sum(e["epoch_time_s"] for e in run.epochs),
        "mean_samples_per_s": sum(e["samples_per_s"] for e in run.epochs) / len(run.epochs) if run.epochs else None,
        "layouts": layouts(run),
        "transitions": tr,
        "transition_s": sum(t["transition_s"] for t in tr),
        "savings": freezing_savings(run),
    }


def reached(values: list[tuple[int, float, float]], target: float, higher: bool) -> tuple[int, float] | None:
    """(epoch, wall_s) of the first evaluation at or beyond `target`, or None when never reached."""
    for epoch, wall, value in values:
        if (value >= target) if higher else (value <= target):
            return epoch, wall
    return None


def time_to_accuracy(runs: list[Run]) -> dict[str, Any] | None:
    """Wall time of each run to the baseline's (the first run's) final eval value, and the speedups.

    speedup = baseline's time to the target / this run's time to it (> 1: this run got there sooner). The
    baseline's own time is that of its first evaluation at the target, which can come before its last.
    None when the baseline has no evaluation.
    """
    base = runs[0]
    if base.metric is None or not base.evals(base.metric[0]):
        return None
    key, higher = base.metric
    target = base.evals(key)[-1][2]
    rows = []
    for run in runs:
        hit = reached(run.evals(key), target, higher)
        rows.append({"label": run.label, "epoch": hit[0] + 1 if hit else None, "time_s": hit[1] if hit else None})
    base_t = rows[0]["time_s"]
    for row in rows:
        row["speedup"] = base_t / row["time_s"] if row["time_s"] else None
    return {"metric": key, "higher_is_better": higher, "target": target, "baseline": base.label, "runs": rows}


def _num(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _spans(epochs: list[int]) -> str:
    """[1, 2, 3, 7] -> "1-3, 7": a layout can come back after another one."""
    out, lo = [], None
    for i, e in enumerate(epochs):
        lo = e if lo is None else lo
        if i + 1 == len(epochs) or epochs[i + 1] != e + 1:
            out.append(f"{lo}-{e}" if e != lo else f"{e}")
            lo = None
    return ", ".join(out)


def _layout(p: dict[str, Any]) -> str:
    cached = f" cached {p['cached_units']}" if p.get("cached_units") else ""
    return f"K={p['pp']} DP={p['dp']} M={p['microbatches']} frozen {p['frozen_units']}{cached}"


def markdown(runs: list[Run], figures: dict[str, Path], out_dir: Path) -> str:
    """The text of `report.md`: the runs table, each run's layouts and transitions, the comparison, figures."""
    sums = [summarize(r) for r in runs]
    lines = ["# ptrun report", ""]
    header = [
        "run",
        "recipe",
        "workers",
        "epochs",
        "final eval",
        "best eval (epoch)",
        "wall time (s)",
        "training time (s)",
        "mean samples/s",
        "transitions: total (s)",
    ]
    lines += ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for s in sums:
        metric = s["metric"] or "eval"
        status = "" if s["finished"] else " (unfinished)"
        resumed = f", {s['resumes']} resume(s)" if s["resumes"] else ""
        lines.append(
            f"| {s['label']} | {s['recipe']} | {s['world_size']} | {s['epochs']}{status}{resumed} | "
            f"{metric} {_num(s['final'])} | {metric} {_num(s['best'])} ({s['best_epoch'] or '-'}) | "
            f"{s['total_wall_s']:.1f} | {s['train_time_s']:.1f} | {_num(s['mean_samples_per_s'], '.1f')} | "
            f"{len(s['transitions'])}: {s['transition_s']:.3f} |"
        )
    for s in sums:
        lines += [
            "",
            f"## {s['label']}",
            "",
            f"`{s['path']}`: {s['model']}",
            "",
            "| layout | epochs | mean samples/s |",
            "|---|---|---|",
        ]
        for lay in s["layouts"]:
            lines.append(
                f"| {_layout(asdict(lay))} | {_spans(lay.epochs)} ({len(lay.epochs)}) | {lay.mean_samples_per_s:.1f} |"
            )
        if s["transitions"]:
            lines += ["", "| before epoch | from | to | cost (s) | share of a mean epoch |", "|---|---|---|---|---|"]
            for t in s["transitions"]:
                lines.append(
                    f"| {t['epoch']} | {_layout(t['from'])} | {_layout(t['to'])} | "
                    f"{t['transition_s']:.3f} | {100 * t['share']:.2f}% |"
                )
        else:
            lines += ["", "No layout changes."]
        if s["savings"] is not None:
            lines += ["", s["savings"].line()]
    tta = time_to_accuracy(runs) if len(runs) > 1 else None
    if tta:
        lines += [
            "",
            "## Time to accuracy",
            "",
            f"Target: the baseline's ({tta['baseline']}) final {tta['metric']} {tta['target']:.2f}. "
            f"Speedup = the baseline's wall time to the target / the run's.",
            "",
            "| run | epoch reached | wall time (s) | speedup |",
            "|---|---|---|---|",
        ]
        for row in tta["runs"]:
            lines.append(
                f"| {row['label']} | {row['epoch'] or 'not reached'} | {_num(row['time_s'], '.1f')} | "
                f"{_num(row['speedup'])} |"
            )
    beside = paper_lines(runs)
    if beside:
        lines += ["", "## The paper", ""] + [f"- {line}" for line in beside]
    if figures:
        lines += ["", "## Figures", ""]
        for title, path in figures.items():
            lines += [f"![{title}]({path.relative_to(out_dir) if path.is_relative_to(out_dir) else path})", ""]
    return "\n".join(lines).rstrip() + "\n"


def sweep_table(runs: list[Run], settings: list[str]) -> str:
    """A sweep's closing summary as markdown: each point's setting, final eval, training time, and its
    speedup in training time over the first point (the sweep's baseline)."""
    sums = [summarize(r) for r in runs]
    base = sums[0]["train_time_s"] if sums else None
    lines = ["| point | setting | final eval | training time (s) | speedup vs point 0 |", "|---|---|---|---|---|"]
    for n, (s, setting) in enumerate(zip(sums, settings, strict=True)):
        final = f"{s['metric']} {s['final']:.2f}" if s["final"] is not None else "-"
        speedup = f"{base / s['train_time_s']:.2f}x" if base and s["train_time_s"] else "-"
        lines.append(f"| {n} | {setting} | {final} | {s['train_time_s']:.1f} | {speedup} |")
    return "\n".join(lines)
