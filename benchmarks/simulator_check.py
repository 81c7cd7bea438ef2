"""Check `ptrun plan`'s cost model against measured runs on this machine, epoch by epoch.

For each run directory of a `benchmarks/speedup.py` output (`DIR/round*/COMBINATION/`: the resolved
config.yaml and metrics.jsonl), the simulator prices the run's own config on `--cluster` (default
`this_machine`) with the measured per-unit profile (`--profile`), **replaying the run's freeze schedule**:
the frozen blocks of each epoch are read from the run's `plan` events and given as `freeze.policy=schedule
freeze.blocks=[...]`, so the comparison tests the cost model, not the freeze policy (the runs' own policy,
`pipetransformer`, reads gradient norms). The simulated plans are checked against the measured ones (frozen
and cached units, K, DP, M, stage bounds); a difference is reported.

Measured per epoch = `epoch_time_s` (the training loop of the epoch) + the layout change before it (the
`plan` event's `transition_s`), the median over the rounds: the machine is shared, so one run's epochs
are noisy. Predicted = the simulated epoch (steps x step time + `cluster.transition_s` on a change).

Calibration and validation. Everything the model prices comes from measurements that are not these
runs (the profile and the preset's constants: benchmarks/cpu_costs.py), except one number: how busy
the shared machine was while the benchmark ran. The runs shared the 2 cores with other jobs, and the
model's `cluster.background_load` (runnable processes of other jobs, assumption 7 of `ptrun.sim.simulate`)
is fitted so that the **baseline** run's total comes out as measured (`--calibrate baseline`, the default;
`--calibrate none` keeps the preset's 0, a machine to itself). The baseline's own numbers are therefore
not a validation; the four other combinations' are: they freeze, cache, and change K, DP and M, which the
baseline never does.

Prints per combination and epoch predicted vs measured seconds and the relative error, then the totals;
writes all of it, and the exact command line, as JSON to `--out`. It is a report: the exit code is 0
whatever the errors are.

    python -m benchmarks.simulator_check [--runs /tmp/bench3] [--profile docs/results/cpu_costs_digits_vit.json]
        [--cluster this_machine] [--calibrate baseline|none] [--out FILE] [--tolerance 0.15]
        [cluster.FIELD=VALUE ...]

`--profile none` uses the FLOP model instead of a measured profile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

from benchmarks.harness import command_line

DEFAULT_PROFILE = Path(__file__).resolve().parents[1] / "docs" / "results" / "cpu_costs_digits_vit.json"
CALIBRATED = "background_load"
"""The one cluster field fitted to measured runs (the baseline's), by `calibrate`."""


def read_run(run: Path) -> dict:
    """A run's plans and epoch times by epoch (a resumed epoch's last record wins) and its start record."""
    plans, epochs, start = {}, {}, {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("event") == "plan":
            plans[event["epoch"]] = event
        elif event.get("event") == "epoch":
            epochs[event["epoch"]] = event
        elif event.get("event") == "start":
            start = event
    return {"plans": plans, "epochs": epochs, "start": start}


def plan_key(p) -> dict:
    """The fields a measured plan event and a simulated Plan are compared on."""
    get = p.get if isinstance(p, dict) else lambda k: getattr(p, k)
    return {
        "frozen_units": get("frozen_units"),
        "cached_units": get("cached_units"),
        "pp": get("pp"),
        "dp": get("dp"),
        "microbatches": get("microbatches"),
        "stage_bounds": [list(b) for b in get("stage_bounds")],
    }


def describe(key: dict) -> str:
    return (
        f"{key['frozen_units']:>2}/{key['cached_units']:<2} K{key['pp']} DP{key['dp']} M{key['microbatches']} "
        f"{'|'.join(f'{lo}-{hi}' for lo, hi in key['stage_bounds'])}"
    )


def simulate_run(config: Path, blocks: list[int], samples: int, costs_path, cluster):
    """The simulated epochs of one run's config with its freeze schedule replayed."""
    from ptrun.config import load_resolved
    from ptrun.sim import costs_from_config, load_profile
    from ptrun.sim.simulate import simulate_one

    cfg = load_resolved(config)
    cfg = replace(
        cfg,
        freeze=replace(cfg.freeze, policy="schedule", blocks=list(blocks), max_fraction=1.0),
        launcher=replace(cfg.launcher, nproc_per_node=cluster.gpus_per_node, nnodes=str(cluster.nodes)),
    )
    costs = costs_from_config(cfg.model, cfg.data)
    if costs_path is not None:
        costs = load_profile(costs_path, costs)
    return cfg, simulate_one(costs, cluster, cfg, samples)


def measured_epochs(runs: list[Path]) -> tuple[list[dict], list[int], int, list[str]]:
    """Per epoch: the plan event of the first round and the measured seconds of every round; the replayed
    freeze schedule; the training-set size; notes."""
    from ptrun.freezing.counts import blocks_of_units

    data = [read_run(r) for r in runs]
    n = min(len(d["epochs"]) for d in data)
    notes = []
    schedules = [[blocks_of_units(d["plans"][e]["frozen_units"]) for e in range(n)] for d in data]
    if any(s != schedules[0] for s in schedules):
        notes.append(
            "the rounds froze differently; the first round's schedule is replayed, and each epoch is "
            "compared with the median of all rounds"
        )
    samples = data[0]["start"].get("train_samples")
    if not samples:
        from ptrun.config import load_resolved
        from ptrun.sim.simulate import default_samples

        samples = default_samples(load_resolved(runs[0] / "config.yaml"))
    epochs = [
        {
            "plan": data[0]["plans"][e],
            "steps": data[0]["epochs"][e].get("steps"),
            "rounds_s": [d["epochs"][e]["epoch_time_s"] + d["plans"][e].get("transition_s", 0.0) for d in data],
        }
        for e in range(n)
    ]
    return epochs, schedules[0], samples, notes


def calibration_epochs(name: str, epochs: list[dict], mode: str) -> set[int]:
    """The epochs of this combination `cluster.background_load` is fitted on: with `each`, the run's own
    epochs before its first freeze (they have the baseline's plan); with `baseline`, every epoch of the
    baseline run; none otherwise."""
    if mode == "each":
        first = next((e for e, x in enumerate(epochs) if x["plan"]["frozen_units"]), len(epochs))
        return set(range(first))
    if mode == "baseline" and name == "baseline":
        return set(range(len(epochs)))
    return set()


def price(runs: list[Path], costs_path, cluster) -> tuple[list, list[dict], list[int], int, list[str]]:
    """The simulated records of a combination's config with its measured schedule, and what was measured."""
    epochs, blocks, samples, notes = measured_epochs(runs)
    _, records = simulate_run(runs[0] / "config.yaml", blocks, samples, costs_path, cluster)
    return records, epochs, blocks, samples, notes


def fit_load(runs: list[Path], which: set[int], costs_path, cluster) -> tuple[float, float]:
    """The `background_load` >= 0 at which the simulated seconds of epochs `which` sum to the measured ones
    (medians over the rounds), by bisection (the time grows with the load); and the error at 0."""

    def error(load: float) -> float:
        records, epochs, *_ = price(runs, costs_path, replace(cluster, **{CALIBRATED: load}))
        predicted = sum(records[e].time_s for e in which)
        return predicted / sum(statistics.median(epochs[e]["rounds_s"]) for e in which) - 1

    at_zero = error(0.0)
    if at_zero >= 0:
        return 0.0, at_zero
    lo, hi = 0.0, 1.0
    while error(hi) < 0 and hi < 64:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if error(mid) < 0 else (lo, mid)
    return hi, at_zero


def validate_combination(
    name: str,
    runs: list[Path],
    costs_path,
    cluster,
    tolerance: float,
    calibrated: set[int] = frozenset(),
    fit: dict | None = None,
) -> dict:
    """Predicted against measured seconds, epoch by epoch; `calibrated` epochs are marked (their sum was
    fitted, not predicted)."""
    records, measured, blocks, samples, notes = price(runs, costs_path, cluster)
    epochs = []
    for e, m in enumerate(measured):
        rec = records[e]
        median = statistics.median(m["rounds_s"])
        measured_key, simulated_key = plan_key(m["plan"]), plan_key(rec.plan)
        same = measured_key == simulated_key
        if not same:
            notes.append(
                f"epoch {e}: simulated plan {describe(simulated_key)} differs from the measured "
                f"{describe(measured_key)}"
            )
        if m["steps"] is not None and m["steps"] != rec.steps:
            notes.append(f"epoch {e}: {rec.steps} simulated steps, {m['steps']} measured")
        error = rec.time_s / median - 1
        epochs.append(
            {
                "epoch": e,
                "role": "calibration" if e in calibrated else "validation",
                "plan": measured_key,
                "plan_matches": same,
                "predicted_s": rec.time_s,
                "step_s": rec.step.total_s,
                "slowdown": rec.step.slowdown,
                "measured_s": median,
                "measured_rounds_s": m["rounds_s"],
                "error": error,
                "within_tolerance": abs(error) <= tolerance,
            }
        )

    def summary(xs: list[dict]) -> dict:
        if not xs:
            return {}
        predicted, measured_s = sum(x["predicted_s"] for x in xs), sum(x["measured_s"] for x in xs)
        worst = max(xs, key=lambda x: abs(x["error"]))
        return {
            "epochs": len(xs),
            "predicted_s": predicted,
            "measured_s": measured_s,
            "error": predicted / measured_s - 1,
            "worst_epoch": worst["epoch"],
            "worst_epoch_error": worst["error"],
            "within_tolerance": sum(x["within_tolerance"] for x in xs),
        }

    return {
        "combination": name,
        "runs": [str(r) for r in runs],
        "freeze_blocks": blocks,
        "samples": samples,
        "background_load": getattr(cluster, CALIBRATED),
        "fit": fit,
        "epochs": epochs,
        "total": summary(epochs),
        "validation_epochs": summary([x for x in epochs if x["role"] == "validation"]),
        "measured_totals_per_round_s": [sum(r) for r in zip(*(x["measured_rounds_s"] for x in epochs), strict=True)],
        "notes": notes,
    }


def run_mode(
    combos: dict[str, list[Path]], names: list[str], mode: str, costs_path, cluster, tolerance: float
) -> list[dict]:
    """Every combination's report under one calibration mode: `each`, `baseline` or `none`."""
    shared = None
    if mode == "baseline":
        if "baseline" not in combos:
            raise ValueError("--calibrate baseline: no run directory named baseline")
        epochs, *_ = measured_epochs(combos["baseline"])
        shared = fit_load(combos["baseline"], set(range(len(epochs))), costs_path, cluster)
    results = []
    for name in names:
        epochs, *_ = measured_epochs(combos[name])
        which = calibration_epochs(name, epochs, mode)
        load, fit = getattr(cluster, CALIBRATED), None
        if mode == "each" and which:
            load, at_zero = fit_load(combos[name], which, costs_path, cluster)
            fit = {"fitted_on_epochs": sorted(which), "value": load, "error_at_0": at_zero}
        elif mode == "baseline":
            load, at_zero = shared
            fit = {"fitted_on": "the baseline run, all epochs", "value": load, "error_at_0": at_zero}
        results.append(
            validate_combination(
                name, combos[name], costs_path, replace(cluster, **{CALIBRATED: load}), tolerance, which, fit
            )
        )
    return results


def pct(v: float) -> str:
    return f"{100 * v:+.0f}%"


def print_report(results: list[dict], tolerance: float) -> None:
    for r in results:
        fit = r["fit"]
        how = (
            f"background_load {r['background_load']:.2f} fitted on epochs {fit['fitted_on_epochs'][0]}-"
            f"{fit['fitted_on_epochs'][-1]} (c)"
            if fit and "fitted_on_epochs" in fit
            else f"background_load {r['background_load']:.2f}"
        )
        print(f"== {r['combination']} ({len(r['runs'])} rounds; freeze blocks {r['freeze_blocks']}; {how})")
        print(
            f"{'epoch':>5}  {'frozen/cached K DP M stages':<28} {'predicted':>9} {'measured':>9} "
            f"{'(rounds)':<20} {'error':>6}"
        )
        for x in r["epochs"]:
            rounds = " ".join(f"{v:.2f}" for v in x["measured_rounds_s"])
            flag = " c" if x["role"] == "calibration" else "" if x["within_tolerance"] else " *"
            print(
                f"{x['epoch']:>5}  {describe(x['plan']):<28} {x['predicted_s']:>8.2f}s {x['measured_s']:>8.2f}s "
                f"{rounds:<20} {pct(x['error']):>6}{flag}"
            )
        t = r["total"]
        print(
            f"total  {'':<28} {t['predicted_s']:>8.1f}s {t['measured_s']:>8.1f}s "
            f"{' '.join(f'{v:.1f}' for v in r['measured_totals_per_round_s']):<20} {pct(t['error']):>6}"
        )
        for note in r["notes"]:
            print(f"  note: {note}")
        print()
    summary_table(results, tolerance)


def summary_table(results: list[dict], tolerance: float) -> None:
    print(
        f"{'combination':<26} {'total: predicted':>16} {'measured':>9} {'error':>6} | {'validation epochs:':>18} "
        f"{'error':>6} {'worst':>11} {'within':>7}"
    )
    for r in results:
        t, v = r["total"], r["validation_epochs"]
        tail = (
            f"{v['epochs']:>9} epochs {pct(v['error']):>6} {pct(v['worst_epoch_error']):>6} "
            f"(e{v['worst_epoch']:<2}) {v['within_tolerance']:>3}/{v['epochs']:<3}"
            if v
            else f"{'(all calibration)':>42}"
        )
        print(
            f"{r['combination']:<26} {t['predicted_s']:>15.1f}s {t['measured_s']:>8.1f}s {pct(t['error']):>6} | {tail}"
        )
    print(f"(c = a calibration epoch; * = a validation epoch outside +-{100 * tolerance:.0f}%)")


MODES = ("each", "baseline", "none")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="/tmp/bench3", help="a benchmarks.speedup --out directory")
    ap.add_argument("--profile", default=str(DEFAULT_PROFILE), help="measured profile JSON, or 'none'")
    ap.add_argument("--cluster", default="this_machine")
    ap.add_argument("--out", default=None, help="write the JSON report here")
    ap.add_argument("--tolerance", type=float, default=0.15)
    ap.add_argument(
        "--calibrate",
        default="each",
        choices=MODES,
        help=f"what cluster.{CALIBRATED} is fitted on (the full report; the others are summarised)",
    )
    args, rest = ap.parse_known_args(argv)
    command = command_line(argv)
    try:
        from ptrun.config import ConfigError
        from ptrun.sim import get_cluster

        overrides = {}
        for item in rest:
            key, eq, value = item.partition("=")
            if not (eq and key.startswith("cluster.")):
                raise ConfigError(f"cannot parse {item!r}: cluster.FIELD=VALUE")
            overrides[key[len("cluster.") :]] = value
        cluster = get_cluster(args.cluster, overrides)
        costs_path = None if args.profile == "none" else Path(args.profile)
        root = Path(args.runs)
        combos: dict[str, list[Path]] = {}
        for rnd in sorted(root.glob("round*")):
            for run in sorted(p for p in rnd.iterdir() if (p / "metrics.jsonl").is_file()):
                combos.setdefault(run.name, []).append(run)
        if not combos:
            raise ConfigError(f"--runs {root}: no round*/COMBINATION/metrics.jsonl")
        order = ["baseline", "freeze_only", "freeze+AutoPipe+AutoCache", "freeze+AutoPipe+AutoDP", "all_four"]
        names = sorted(combos, key=lambda c: (order.index(c) if c in order else len(order), c))
        modes = [args.calibrate] + [m for m in MODES if m != args.calibrate]
        reports = {m: run_mode(combos, names, m, costs_path, cluster, args.tolerance) for m in modes}
    except Exception as e:  # a report: say what went wrong and exit 0
        print(f"simulator_check: {type(e).__name__}: {e}", file=sys.stderr)
        return 0
    print(f"cluster {cluster.name}, profile {costs_path or 'none (FLOP model)'}, runs {root}")
    print(f"calibration: {CALIBRATION_TEXT[args.calibrate]}\n")
    print_report(reports[args.calibrate], args.tolerance)
    for m in modes[1:]:
        print(f"\n-- the same with --calibrate {m}: {CALIBRATION_TEXT[m]}")
        summary_table(reports[m], args.tolerance)
    if args.out:
        doc = {
            "command": command,
            "runs": str(root),
            "profile": str(costs_path) if costs_path else None,
            "cluster": asdict(cluster),
            "tolerance": args.tolerance,
            "measured": "median over rounds of epoch_time_s + the plan event's transition_s",
            "calibrate": args.calibrate,
            "modes": {m: {"calibration": CALIBRATION_TEXT[m], "combinations": reports[m]} for m in modes},
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"\nwrote {args.out}")
    return 0


CALIBRATION_TEXT = {
    "each": f"cluster.{CALIBRATED} fitted per run on its epochs before the first freeze (the baseline's plan); "
    "the later epochs (frozen, cached, other K / DP / M) are predicted",
    "baseline": f"cluster.{CALIBRATED} fitted once, on the baseline run's total; every other run is predicted",
    "none": f"nothing fitted: cluster.{CALIBRATED} as given (the preset's 0: a machine to itself)",
}


if __name__ == "__main__":
    raise SystemExit(main())
