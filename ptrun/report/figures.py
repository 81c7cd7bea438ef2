"""PNG figures of one or more runs, and the pipeline timeline of one step.

Each function draws on its own `matplotlib.figure.Figure` (no pyplot: no global figure state, no GUI
backend; PNGs render through Agg), saves it to `path` and returns the Figure, so a caller or a test can read
the plotted series back with `ax.get_lines()[i].get_xdata() / get_ydata()`. Every line carries a label
naming its run (and series), and x values are 1-based epochs as the terminal prints them.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ptrun.report.runs import Run
from ptrun.report.summary import reached, time_to_accuracy, transitions

DPI = 100


def _save(fig: Figure, path: str | Path) -> Figure:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return fig


def _integer_epochs(*axes) -> None:
    for ax in axes:
        ax.xaxis.get_major_locator().set_params(integer=True)


def _epochs(run: Run) -> list[int]:
    return [e["epoch"] + 1 for e in run.epochs]


def _mark_transitions(ax, run: Run) -> None:
    """Dotted verticals where a single run's layout changed: where the throughput jumps should be."""
    for t in transitions(run):
        ax.axvline(t["epoch"] - 0.5, color="grey", linestyle=":", linewidth=1)


def samples_per_s_figure(runs: list[Run], path: str | Path) -> Figure:
    """(1) Training throughput (samples/s) per epoch; one line per run."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for run in runs:
        ax.plot(_epochs(run), [e["samples_per_s"] for e in run.epochs], marker=".", label=run.label)
    if len(runs) == 1:
        _mark_transitions(ax, runs[0])
    ax.set(xlabel="epoch", ylabel="samples/s", title="Training throughput")
    ax.set_ylim(bottom=0)
    _integer_epochs(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def layout_steps(run: Run) -> tuple[list[float], list[dict[str, Any]]]:
    """Where each layout of `run` began, in epochs trained (a change at step S of 0-based epoch E of N steps
    lies at E + S / N; the change at an epoch's start at E), with the plan there; closed by the last plan again
    at the end of the last epoch the run logged, so that a step plot holds it to the end."""
    steps = {e["epoch"]: e.get("steps") for e in run.epochs}
    xs, plans = [], []
    for p in run.plans:
        per_epoch = (
            steps.get(p["epoch"]) or max([q.get("step", 0) for q in run.plans if q["epoch"] == p["epoch"]] + [0]) + 1
        )
        xs.append(p["epoch"] + p.get("step", 0) / per_epoch)
        plans.append(p)
    if plans:
        xs.append(float(max(len(run.epochs), int(xs[-1]) + 1)))
        plans.append(plans[-1])
    return xs, plans


def layout_figure(runs: list[Run], path: str | Path) -> Figure:
    """(2) The layout from the plan events, drawn where it changed (inside an epoch too): frozen units (top),
    K and DP width (bottom), against the epochs trained.

    Lines are labelled "RUN: frozen units", "RUN: K" and "RUN: DP"; their points are the plan events
    (`layout_steps`), drawn as steps that hold each layout until the next; the y axes tick whole units.
    """
    fig = Figure(figsize=(7, 5), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    for i, run in enumerate(runs):
        xs, plans = layout_steps(run)
        color = f"C{i}"
        top.plot(
            xs,
            [p["frozen_units"] for p in plans],
            drawstyle="steps-post",
            color=color,
            label=f"{run.label}: frozen units",
        )
        bottom.plot(xs, [p["pp"] for p in plans], drawstyle="steps-post", color=color, label=f"{run.label}: K")
        bottom.plot(
            xs, [p["dp"] for p in plans], drawstyle="steps-post", color=color, linestyle="--", label=f"{run.label}: DP"
        )
        if plans:
            top.axhline(plans[0]["num_units"], color=color, linewidth=0.5, alpha=0.5)
    top.set(ylabel="frozen units", title="Layout as it changed (thin line: the model's unit count)")
    bottom.set(xlabel="epochs trained", ylabel="K (solid) / DP (dashed)")
    for ax in (top, bottom):
        ax.set_ylim(bottom=0)
        ax.yaxis.get_major_locator().set_params(integer=True)  # whole units, whole devices
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    _integer_epochs(bottom)
    return _save(fig, path)


def loss_figure(runs: list[Run], path: str | Path) -> Figure:
    """(3) Training loss per epoch (left) and the eval metric at each evaluated epoch (right)."""
    fig = Figure(figsize=(10, 4), layout="constrained")
    left, right = fig.subplots(1, 2)
    keys, losses = set(), []
    for i, run in enumerate(runs):
        losses += [e["train_loss"] for e in run.epochs]
        left.plot(_epochs(run), [e["train_loss"] for e in run.epochs], color=f"C{i}", label=run.label)
        if run.metric:
            key = run.metric[0]
            keys.add(key)
            evals = run.evals(key)
            right.plot(
                [ep + 1 for ep, _, _ in evals],
                [v for _, _, v in evals],
                marker=".",
                color=f"C{i}",
                label=f"{run.label}: eval {key}",
            )
    left.set(xlabel="epoch", ylabel="train loss", title="Training loss")
    if losses and min(losses) > 0:
        left.set_yscale("log")  # the loss falls by orders of magnitude; linear hides the late epochs
    right.set(xlabel="epoch", ylabel="eval " + "/".join(sorted(keys)), title="Evaluation")
    _integer_epochs(left, right)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize="small")
    return _save(fig, path)


def time_to_accuracy_figure(runs: list[Run], path: str | Path) -> Figure:
    """(4) The baseline's (first run's) eval metric vs cumulative wall time for every run that logs it.

    A dashed horizontal marks the target (the baseline's final value); each legend entry gives the run's
    speedup to it (see `summary.time_to_accuracy`). The lines' data are (wall_s, value) per evaluation.
    """
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    tta = time_to_accuracy(runs)
    if tta is None:
        ax.text(0.5, 0.5, "no evaluations in the baseline run", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path)
    key, target = tta["metric"], tta["target"]
    for i, (run, row) in enumerate(zip(runs, tta["runs"], strict=True)):
        evals = run.evals(key)
        if not evals:
            continue
        speed = f", {row['speedup']:.2f}x" if row["speedup"] else ", target not reached"
        ax.plot(
            [w for _, w, _ in evals],
            [v for _, _, v in evals],
            marker=".",
            color=f"C{i}",
            label=f"{run.label}{' (baseline)' if i == 0 else speed}",
        )
        hit = reached(evals, target, tta["higher_is_better"])
        if hit:
            ax.plot([hit[1]], [target], marker="o", color=f"C{i}", markerfacecolor="none", markersize=9)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1)
    ax.set(xlabel="wall time (s)", ylabel=f"eval {key}", title=f"Time to the baseline's final {key} ({target:.2f})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


# ---- the pipeline timeline ---------------------------------------------------------------------------------
TIMELINE_COLORS = {"F": "tab:blue", "B": "tab:orange", "W": "tab:green"}


def timeline_figure(events: Iterable[dict[str, Any]], path: str | Path, title: str = "Pipeline timeline") -> Figure:
    """A Gantt chart of one training step: a row per pipeline stage, a bar per micro-batch's pass.

    `events` is what a profiling hook in the runtime would record for one step, a dict per pass:
      {"stage": int (the pipeline stage; row 0 at the top), "microbatch": int (printed in the bar),
       "kind": "F" (forward) | "B" (backward; for the zero-bubble schedules the input-gradient half)
               | "W" (the zero-bubble schedules' weight-gradient half),
       "start_s": float, "end_s": float}  (seconds on any one clock shared by the stages, e.g. the
       `time.perf_counter()` of each rank after a barrier; only differences are drawn)
    Bars start at the earliest start_s. Returns the Figure: each event is one Rectangle in
    `fig.axes[0].patches`, in input order, with x = start_s - t0, width = end_s - start_s, centred on its stage.
    """
    events = list(events)
    if not events:
        raise ValueError("timeline_figure needs at least one event")
    for ev in events:
        if ev.get("kind") not in TIMELINE_COLORS:
            raise ValueError(f"timeline event {ev!r}: kind must be one of {', '.join(TIMELINE_COLORS)}")
        if ev["end_s"] < ev["start_s"]:
            raise ValueError(f"timeline event {ev!r}: end_s before start_s")
    t0 = min(ev["start_s"] for ev in events)
    stages = sorted({int(ev["stage"]) for ev in events})
    fig = Figure(figsize=(10, 1.0 + 0.6 * len(stages)), layout="constrained")
    ax = fig.add_subplot()
    for ev in events:
        x, w = ev["start_s"] - t0, ev["end_s"] - ev["start_s"]
        ax.barh(
            int(ev["stage"]), w, left=x, height=0.8, color=TIMELINE_COLORS[ev["kind"]], edgecolor="black", linewidth=0.5
        )
        ax.text(x + w / 2, int(ev["stage"]), str(ev["microbatch"]), ha="center", va="center", fontsize=8)
    ax.set_yticks(stages, [f"stage {s}" for s in stages])
    ax.invert_yaxis()  # stage 0 (the input) on top, as pipeline diagrams are drawn
    ax.set(xlabel="time (s)", title=title)
    kinds = [k for k in TIMELINE_COLORS if any(ev["kind"] == k for ev in events)]
    names = {"F": "forward", "B": "backward", "W": "weight grad"}
    # Outside the axes: inside, it would hide the bars of the last micro-batches.
    ax.legend(
        handles=[Patch(color=TIMELINE_COLORS[k], label=names[k]) for k in kinds],
        fontsize="small",
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def run_figures(runs: list[Run], out_dir: str | Path) -> dict[str, Path]:
    """Write every figure for `runs` into `out_dir`; title -> path (the time-to-accuracy one needs 2+ runs)."""
    out = Path(out_dir)
    made = {
        "Training throughput": (samples_per_s_figure, "samples_per_s.png"),
        "Layout": (layout_figure, "layout.png"),
        "Loss and evaluation": (loss_figure, "loss_eval.png"),
    }
    if len(runs) > 1:
        made["Time to accuracy"] = (time_to_accuracy_figure, "time_to_accuracy.png")
    paths = {}
    for title, (fn, name) in made.items():
        fn(runs, out / name)
        paths[title] = out / name
    return paths
