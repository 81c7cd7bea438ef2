"""The paper's speedup breakdown (Table 1 and Figure 9), measured side by side in one invocation.

Runs one recipe five times with the same seed and data: the baseline (the starting layout, no freezing)
and each component combination of the paper's Figure 9. Prints and writes (`bench_speedup.json` beside the
runs) per combination: training time for the recipe's epoch budget (the Table-1 measure) and its speedup,
wall time to the baseline's final accuracy (the stricter measure) and its speedup, final accuracy, mean
samples/s, and the ideal speedup the run's own freeze schedule allows: the model's training cost over the
cost of its active units, summed over the epochs (per-unit FLOPs from `ptrun.sim.costs`; a frozen unit
counted at nothing), and how much of that ideal the run reached.

    python scripts/bench_speedup.py [--recipe digits_vit] [--repeats 3] [--out DIR] [--reuse] [overrides ...]

Without AutoDP, ptrun keeps the pipeline length (it never leaves workers idle), so "freeze + AutoPipe +
AutoCache" moves stage boundaries and caches, but does not shorten the pipeline as the paper's did.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

COMBINATIONS = {
    "baseline": ["auto.freeze=false", "auto.cache=false"],
    "freeze only": ["auto.pipe=false", "auto.dp=false", "auto.cache=false"],
    "freeze + AutoPipe + AutoCache": ["auto.dp=false", "auto.cache=true"],
    "freeze + AutoPipe + AutoDP": ["auto.cache=false"],
    "all four": ["auto.cache=true"],
}
PAPER = {"freeze only": 0.95, "freeze + AutoPipe + AutoCache": 1.26, "freeze + AutoPipe + AutoDP": 2.27,
         "all four": 2.83}
"""Figure 9's speedups (ViT-B/16 on ImageNet, 2 x 8 GPUs), for the shape only."""


def train(run_dir: Path, overrides: list[str], reuse: bool) -> Path:
    if reuse and (run_dir / "metrics.jsonl").is_file():
        return run_dir
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *overrides]
    print("$ ptrun train " + " ".join(cmd[4:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return run_dir


def ideal_speedup(run_dir: Path) -> float:
    """Sum over epochs of the full model's training cost over its active units' (3x forward FLOPs each)."""
    from ptrun.config import load_resolved
    from ptrun.sim.costs import costs_from_config

    cfg = load_resolved(run_dir / "config.yaml")
    flops = costs_from_config(cfg.model, cfg.data).fwd_flops
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    frozen = [e["frozen_units"] for e in events if e["event"] == "plan"]
    return len(frozen) * sum(flops) / sum(sum(flops[f:]) for f in frozen)


def measure(dirs: dict[str, Path]) -> list[dict]:
    """One repeat's row per combination; speedups against this repeat's own baseline."""
    from ptrun.report import load_run
    from ptrun.report.summary import summarize, time_to_accuracy

    runs = [load_run(d) for d in dirs.values()]
    for run, name in zip(runs, dirs):
        run.label = name
    sums = [summarize(r) for r in runs]
    target = time_to_accuracy(runs)
    tta = {row["label"]: row for row in target["runs"]}
    base = sums[0]["train_time_s"]
    rows = []
    for name, summary, run_dir in zip(dirs, sums, dirs.values()):
        ideal = ideal_speedup(run_dir)
        speedup = base / summary["train_time_s"]
        rows.append({"combination": name, "train_time_s": summary["train_time_s"], "speedup": speedup,
                     "time_to_target_s": tta[name]["time_s"], "speedup_to_target": tta[name]["speedup"],
                     "final": summary["final"], "metric": summary["metric"], "target": target["target"],
                     "mean_samples_per_s": summary["mean_samples_per_s"], "ideal_speedup": ideal,
                     "share_of_ideal": speedup / ideal if ideal > 1 else None,
                     "paper_speedup": PAPER.get(name), "run_dir": str(run_dir)})
    return rows


def median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits_vit")
    parser.add_argument("--out", default="runs/bench_speedup")
    parser.add_argument("--repeats", type=int, default=1,
                        help="rounds of all five runs, interleaved (a slow spell of the machine hits every "
                             "combination alike); the table shows medians and the speedups' range")
    parser.add_argument("--reuse", action="store_true", help="analyse runs already in --out again")
    args, extra = parser.parse_known_args()
    out = Path(args.out)
    repeats = []
    for r in range(args.repeats):
        dirs = {name: train(out / f"round{r}" / name.replace(" + ", "+").replace(" ", "_"),
                            [f"recipe={args.recipe}", "train.export=false", *extra, *overrides], args.reuse)
                for name, overrides in COMBINATIONS.items()}
        repeats.append(measure(dirs))

    rows = []
    for i, name in enumerate(COMBINATIONS):
        runs = [rep[i] for rep in repeats]
        row = {k: median([r[k] for r in runs]) for k in ("train_time_s", "speedup", "time_to_target_s",
                                                          "speedup_to_target", "final", "ideal_speedup",
                                                          "share_of_ideal")}
        speedups = [r["speedup"] for r in runs]
        row.update(combination=name, speedup_range=(min(speedups), max(speedups)), paper_speedup=PAPER.get(name),
                   metric=runs[0]["metric"], runs=runs)
        rows.append(row)
    metric, target = rows[0]["metric"], median([rep[0]["target"] for rep in repeats])
    print(f"\n{args.recipe}: {args.repeats} round(s) of five runs; medians; target = the baseline's final "
          f"{metric} (median {target:.2f})\n")
    print("| combination | training time (s) | speedup (range) | time to target (s) | speedup to target | "
          f"final {metric} | ideal speedup | share of ideal | paper (Fig. 9) |")
    print("|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f=".2f", suffix="": "-" if v is None else f"{v:{f}}{suffix}"  # noqa: E731
    for r in rows:
        low, high = r["speedup_range"]
        spread = f" ({low:.2f}-{high:.2f})" if args.repeats > 1 else ""
        print(f"| {r['combination']} | {r['train_time_s']:.1f} | {r['speedup']:.2f}x{spread} "
              f"| {fmt(r['time_to_target_s'], '.1f')} | {fmt(r['speedup_to_target'], '.2f', 'x')} | {fmt(r['final'])} "
              f"| {r['ideal_speedup']:.2f}x | {fmt(r['share_of_ideal'] and 100 * r['share_of_ideal'], '.0f', '%')} "
              f"| {fmt(r['paper_speedup'], '.2f', 'x')} |")
    (out / "bench_speedup.json").write_text(json.dumps({"recipe": args.recipe, "overrides": extra,
                                                        "repeats": args.repeats, "rows": rows}, indent=1))
    print(f"\nwritten: {out / 'bench_speedup.json'}")


if __name__ == "__main__":
    main()
