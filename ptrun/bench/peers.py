"""ptrun against the plain PyTorch a competent user writes without it, side by side in one invocation.

Per recipe, in interleaved rounds (a slow spell of the shared machine hits every run alike), five runs with
the same config, data split, seed and global batch:
  a  plain loop                      `ptrun.bench.plain_loop`, 1 process with every core as threads
  b  plain DDP                       the same module under torchrun, 2 processes x 1 thread, DDP over gloo
  c  ptrun, freezing off, 1 worker   `ptrun train` without freezing or AutoCache, K = 1 on 1 worker x 2 threads
  d  ptrun, freezing off, 2 workers  the same on 2 workers (K = 1, DP = 2)
  e  ptrun default                   `ptrun train recipe=NAME`, as the recipe is
Per run: wall time from process start to exit, training time (the epochs' training loops only), start-up
overhead (wall - training: imports, data and model set-up, evaluation, checkpoints, shut-down), samples/s
in training, final top-1, and the training time to the best plain peer's final top-1 (cumulative over the
epochs, to the first epoch that reaches it). A causal-LM recipe (`model.task=causal_lm`) is compared on the
eval perplexity instead, where lower is better: the target is the plain peers' lowest final perplexity.
Over the rounds: medians and min-max ranges, speedups against the faster plain peer of each round (by wall
and by training time), and the throughput of ptrun without freezing against the plain peer on the same
processes (the "at least 0.95x" checks). Prints the tables and writes them with the command line to
`bench_peers_<recipe>.json` in --out (`readme_results.py` makes the README's tables from it).

    python scripts/bench_peers.py [--recipe digits_vit] [--recipe bbc_news_bert] [--repeats 3] [--seeds] [--out DIR]
        [--reuse] [--only 'plain loop' --only 'ptrun default' | --only a,e] [--variant 'LABEL: KEY=V ...']
        [--compiled] [overrides ...]

The causal-LM recipe needs a decoder and a text file; without a model hub, `ptrun.bench.decoder` writes a small
random-weight Llama and BBC News text (its docstring has the sizes):

    python -m ptrun.bench.decoder /tmp/lm
    python scripts/bench_peers.py --recipe causal_lm \\
        --only a,c model.pretrained=/tmp/lm/llama data.path=/tmp/lm/news.jsonl

Overrides (`train.epochs=2`) apply to every run, the plain peers' included. With `--seeds`, round r runs every
run with `train.seed=r` (the split, the initial weights and the batch order all follow it), so the rounds are
seeds, and the table adds each run's mean final top-1 over them. Each `--variant 'LABEL: KEY=V ...'` adds a
ptrun run with those overrides after the recipe's (a seeded sweep of a recipe's keys against the same peers:
`--only a,e --seeds --repeats 5 --variant 'start 12: freeze.start=12'`). Each `--engine 'LABEL: PYTHON [KEY=V ...]'`
adds a ptrun run of the recipe (with those overrides) made by another interpreter, such as another checkout's
venv: the engine before and after a change, side by side (`--only e --engine 'before: ../base/.venv/bin/python'`).
With `--compiled`, every chosen run is made twice, like against like: `LABEL, eager` with `train.compile=false`
and `LABEL, compiled` with `train.compile=true` (ptrun compiles its units; the plain loop compiles the library
model with `torch.compile`, as a user writes it); the throughput checks pair eager with eager and compiled with
compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ptrun.bench.harness import (
    cell,
    command_line,
    dir_name,
    fmt,
    fresh_run_dir,
    label_rows,
    median,
    publish,
    rounds_caption,
    rounds_parser,
    rows_table,
    spread,
)

PLAIN = "ptrun.bench.plain_loop"
"""The peers' module, run as `python -m`: a plain PyTorch loop that uses nothing of ptrun's engine."""
PEERS = {  # label -> (processes, threads per process) of the plain loop
    "plain loop": (1, 2),
    "plain DDP": (2, 1),
}
# label -> `ptrun train` overrides after `recipe=NAME`. The layout is left to `pipe.length=auto`, which
# starts both recipes at K = 1 (the model fits a device), the peers' layout; the threads to
# `launcher.threads_per_worker=auto` (one worker: both cores, as the plain loop).
PTRUN = {
    "ptrun, freezing off, 1 worker": ["auto.freeze=false", "auto.cache=false", "launcher.nproc_per_node=1"],
    "ptrun, freezing off, 2 workers": ["auto.freeze=false", "auto.cache=false", "launcher.nproc_per_node=2"],
    "ptrun default": [],
}
LABELS = [*PEERS, *PTRUN]
CHECKS = {"ptrun, freezing off, 1 worker": "plain loop", "ptrun, freezing off, 2 workers": "plain DDP"}
EAGER, COMPILED = ", eager", ", compiled"
"""`--compiled`: each run twice, `LABEL, eager` (`train.compile=false`) and `LABEL, compiled` (`train.compile=true`:
ptrun's units; the plain loop's library model through torch.compile, as a user writes it)."""
COMPILE_OVERRIDE = {EAGER: "train.compile=false", COMPILED: "train.compile=true"}


def twins(labels: list[str]) -> list[str]:
    """Each label's eager and compiled runs (`--compiled`), in order."""
    return [label + suffix for label in labels for suffix in (EAGER, COMPILED)]


def base(label: str) -> tuple[str, list[str]]:
    """The run a label names, and the override its `--compiled` suffix adds (none without one)."""
    for suffix, override in COMPILE_OVERRIDE.items():
        if label.endswith(suffix):
            return label.removesuffix(suffix), [override]
    return label, []


def check_pairs() -> list[tuple[str, str]]:
    """(ptrun run, plain peer) pairs whose samples/s are checked: CHECKS, and each as eager and compiled twins."""
    return [(mine + s, peer + s) for mine, peer in CHECKS.items() for s in ("", EAGER, COMPILED)]


"""ptrun run -> the plain peer on the same processes and threads, whose samples/s it should keep up with."""
FLOOR = 0.95


@dataclass(frozen=True)
class Metric:
    """What a recipe's runs are compared on: a key of the eval results (ptrun's epoch events, the plain
    loop's epochs)."""

    key: str
    name: str
    """Its name in the tables."""
    higher_is_better: bool
    tolerance: float
    """A value reaches the target within this: top-1 in percentage points (the same count of correct samples
    may be computed in another order by ptrun and the peer); perplexity relative to the target (the same
    token losses summed in another order)."""
    samples_spec: str = ".0f"
    """The format of samples/s in the tables: a causal LM's samples are blocks of hundreds of tokens, a few
    a second on a CPU, so they keep two decimals."""

    def reaches(self, value: float, target: float) -> bool:
        if self.higher_is_better:
            return value >= target - self.tolerance
        return value <= target * (1 + self.tolerance)

    def best(self, values: list[float]) -> float | None:
        return (max if self.higher_is_better else min)(values, default=None)


TOP1 = Metric("top1", "top-1", higher_is_better=True, tolerance=1e-6)
PERPLEXITY = Metric("perplexity", "perplexity", higher_is_better=False, tolerance=1e-6, samples_spec=".2f")
METRICS = {"classification": TOP1, "causal_lm": PERPLEXITY}
"""`model.task` -> the metric its runs are compared on (the plain loop trains these two tasks)."""
BY_KEY = {m.key: m for m in METRICS.values()}


def metric_of(recipe: str, overrides: list[str]) -> Metric:
    """The metric of the recipe's task, from its composed config (as the plain loop composes it)."""
    from ptrun.bench.plain_loop import recipe_config

    task = recipe_config(recipe, overrides).model.task
    if task not in METRICS:
        raise ValueError(f"--recipe {recipe}: model.task={task!r}; the plain peer trains {', '.join(METRICS)}")
    return METRICS[task]


def pick(only: list[str]) -> list[str]:
    """The runs `--only` names (labels, or letters a-e comma-separated), in the benchmark's order."""
    letters = dict(zip("abcde", LABELS))
    wanted = set()
    for value in only:
        for item in [value] if value in LABELS else [w.strip() for w in value.split(",")]:
            if letters.get(item, item) not in LABELS:
                raise ValueError(f"--only {item!r}: not a letter a-e nor one of: {'; '.join(LABELS)}")
            wanted.add(letters.get(item, item))
    return [label for label in LABELS if label in wanted]


def variant(text: str) -> tuple[str, list[str]]:
    """`--variant 'LABEL: KEY=V KEY=V'` -> (LABEL, [overrides])."""
    label, sep, overrides = text.partition(":")
    if not sep or not label.strip() or label.strip() in LABELS:
        raise ValueError(f"--variant {text!r}: expected 'LABEL: KEY=VALUE ...' with a label of its own")
    return label.strip(), overrides.split()


def engine(text: str) -> tuple[str, list[str]]:
    """`--engine 'LABEL: PYTHON KEY=V ...'` -> (LABEL, [PYTHON, overrides])."""
    try:
        label, words = variant(text)
    except ValueError:
        words = []
    if not words:
        raise ValueError(f"--engine {text!r}: expected 'LABEL: PYTHON [KEY=VALUE ...]' with a label of its own")
    return label, words


def command(
    label: str,
    recipe: str,
    run_dir: Path,
    overrides: list[str],
    variants: dict[str, list[str]] = PTRUN,
    pythons: dict[str, str] | None = None,
) -> list[str]:
    """The command line of one run (its results land in `run_dir`): a plain peer, or the ptrun run `label`
    names in `variants` (label -> overrides after `recipe=NAME`), by the interpreter `pythons` names for it
    (this one by default)."""
    label, compiling = base(label)
    overrides = [*overrides, *compiling]
    if label in PEERS:
        nproc, threads = PEERS[label]
        # torchrun's logs to /dev/null: by default it leaves a torchelastic_* directory in /tmp per run
        launcher = (
            ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", f"--log-dir={os.devnull}"]
            if nproc > 1
            else []
        )
        return [
            sys.executable,
            *launcher,
            "-m",
            PLAIN,
            f"--recipe={recipe}",
            f"--threads={threads}",
            f"--out={run_dir / 'plain.json'}",
            *overrides,
        ]
    return [
        (pythons or {}).get(label, sys.executable),
        "-m",
        "ptrun.cli",
        "train",
        f"hydra.run.dir={run_dir}",
        f"recipe={recipe}",
        *variants[label],
        *overrides,
    ]


def shown(cmd: list[str]) -> str:
    """A command as the user would type it: `ptrun train ...` or `python -m ptrun.bench.plain_loop ...`."""
    if cmd[1:3] == ["-m", "ptrun.cli"]:
        return "ptrun " + " ".join(cmd[3:])
    return " ".join(["python", *cmd[1:]])


def commands(
    labels: list[str],
    recipe: str,
    overrides: list[str],
    variants: dict[str, list[str]] = PTRUN,
    pythons: dict[str, str] | None = None,
) -> dict[str, str]:
    """Each run's command line as the user would type it, RUN_DIR standing for its directory (a result's
    `commands`; a run by another interpreter says which)."""
    pythons = pythons or {}
    return {
        label: shown(command(label, recipe, Path("RUN_DIR"), overrides, variants))
        + (f"  (by {pythons[label]})" if label in pythons else "")
        for label in labels
    }


def execute(
    label: str,
    recipe: str,
    run_dir: Path,
    overrides: list[str],
    reuse: bool,
    variants: dict[str, list[str]] = PTRUN,
    metric: Metric = TOP1,
    pythons: dict[str, str] | None = None,
) -> dict:
    """Run one (or, with `reuse`, read the one already in `run_dir`): its measurements, on `metric`."""
    wall_file = run_dir / "wall.json"
    if fresh_run_dir(wall_file, reuse):
        cmd = command(label, recipe, run_dir, overrides, variants, pythons)
        print(f"$ {shown(cmd)}", flush=True)
        # A plain loop tokenizes its data on every run, as a loop written without ptrun does: a cache of its own,
        # empty (ptrun's runs use the user's cache, as ptrun does).
        env = {**os.environ, "PTRUN_TOKENIZED_DIR": str(run_dir / "tokenized")} if base(label)[0] in PEERS else None
        spawned, t0 = time.time(), time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env)
        wall_file.write_text(json.dumps({"wall_s": time.perf_counter() - t0, "spawn_time": spawned}))
    wall = json.loads(wall_file.read_text())
    run = dict(
        read_plain(run_dir, metric) if base(label)[0] in PEERS else read_ptrun(run_dir, metric),
        label=label,
        wall_s=wall["wall_s"],
        run_dir=str(run_dir),
    )
    return dict(run, **outside_training(run, wall.get("spawn_time")))


def outside_training(run: dict, spawned: float | None) -> dict:
    """Where a run's time outside its training loop went: from the spawn to its first training step
    (`to_first_step_s`: imports, workers, data, model; of it, for ptrun, `to_worker_s` until its worker began:
    the launcher and the workers' server), its evaluations (`eval_s`), and the rest (`rest_s`: layout changes,
    checkpoints, export, exit). Empty for a run measured before these were recorded."""
    if spawned is None or run.get("first_step_time") is None or run.get("eval_s") is None:
        return {}
    to_first = run["first_step_time"] - spawned
    split = {"to_first_step_s": to_first, "rest_s": run["wall_s"] - run["train_time_s"] - to_first - run["eval_s"]}
    if run.get("worker_start_time") is not None:  # a ptrun run: the launcher's share of the way to the first step
        split["to_worker_s"] = run["worker_start_time"] - spawned
    return split


def read_plain(run_dir: Path, metric: Metric = TOP1) -> dict:
    """A plain peer's `plain.json`: training time, samples/s, the final metric (`final_top1`), and the metric
    over training time."""
    r = json.loads((run_dir / "plain.json").read_text())
    final = f"final_{metric.key}"
    return {
        "train_time_s": r["train_time_s"],
        "samples_per_s": r["samples_per_s"],
        final: r[final],
        "curve": [[e["elapsed_train_s"], e[metric.key]] for e in r["epochs"]],
        "first_step_time": r.get("first_step_time"),
        "eval_s": eval_seconds(r["epochs"]),
    }


def eval_seconds(epochs: list[dict]) -> float | None:
    """The epochs' evaluations in seconds (None where a run did not record them)."""
    return sum(e["eval_time_s"] for e in epochs) if all("eval_time_s" in e for e in epochs) else None


def read_ptrun(run_dir: Path, metric: Metric = TOP1) -> dict:
    """A ptrun run's `metrics.jsonl`: the same, from the epoch events (the latest record of each epoch) and
    the end event (`total_time_s`: its training loop with evaluation and layout changes)."""
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epochs = list({e["epoch"]: e for e in events if e["event"] == "epoch"}.values())
    end = next((e for e in reversed(events) if e["event"] == "end"), {})
    train_s = sum(e["epoch_time_s"] for e in epochs)
    curve, elapsed = [], 0.0
    for e in epochs:
        elapsed += e["epoch_time_s"]
        if metric.key in (e.get("eval") or {}):
            curve.append([elapsed, e["eval"][metric.key]])
    final = curve[-1][1] if curve else (end.get("final_eval") or {}).get(metric.key)
    # the host time rank 0 spent measuring what the freeze policy reads, as a share of training
    signal = sum(e["signal_s"] for e in epochs) / train_s if all("signal_s" in e for e in epochs) else None
    first = next((e["first_step_time"] for e in events if e["event"] == "epoch" and "first_step_time" in e), None)
    start = next((e for e in events if e["event"] == "start"), {})
    return {
        "train_time_s": train_s,
        "samples_per_s": sum(e["samples"] for e in epochs) / train_s,
        f"final_{metric.key}": final,
        "curve": curve,
        "ptrun_total_time_s": end.get("total_time_s"),
        "signal_share": signal,
        "first_step_time": first,
        "eval_s": eval_seconds(epochs),
        "worker_start_time": start.get("worker_start_time"),
        "start_phases": start.get("start_phases"),
    }


def time_to(curve: list[list[float]], target: float | None, metric: Metric = TOP1) -> float | None:
    """Cumulative training time at the first evaluated epoch whose metric reaches `target`; None if none does."""
    if target is None:
        return None
    return next((t for t, value in curve if metric.reaches(value, target)), None)


def measure(runs: list[dict], metric: Metric = TOP1) -> list[dict]:
    """One round's rows: each run's measurements plus its time outside training, the round's target (the best
    plain peer's final metric: the highest top-1, the lowest perplexity) and the time to it, and speedups
    against the round's faster plain peer."""
    peers = [r for r in runs if base(r["label"])[0] in PEERS]
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
UNTABLED = (*OUTSIDE, "ptrun_total_time_s", "signal_share")
"""The measures the runs' table leaves out (the parts outside training and the signal have tables of their own)."""


def aggregate(rounds: list[list[dict]], metric: Metric = TOP1) -> dict:
    """Over the rounds (each `measure`d): per label the median and range of every measure and its rows; per
    check the ratio of samples/s (ptrun over its peer, round by round), its median and range."""
    rows = [
        {"label": row["label"], "kind": "plain" if base(row["label"])[0] in PEERS else "ptrun", **row}
        for row in label_rows(rounds, keys(metric))
    ]
    by_label = {row["label"]: row["runs"] for row in rows}
    checks = []
    for mine, peer in check_pairs():
        if mine in by_label and peer in by_label:
            ratios = [a["samples_per_s"] / b["samples_per_s"] for a, b in zip(by_label[mine], by_label[peer])]
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
    signal = [r for r in result["rows"] if r.get("signal_share")]
    if signal:
        lines += ["", "| the freeze policy's signal (host time measuring it) | share of training time |", "|---|---|"]
        lines += [f"| {r['label']} | {cell(r, 'signal_share', '.2%', '', n)} |" for r in signal]
    return "\n".join(lines)


def main() -> None:
    parser = rounds_parser(__doc__, "runs/bench_peers", recipe=None)
    parser.add_argument(
        "--recipe",
        action="append",
        help="bbc_news_bert (the embedded default, default), "
        "digits_vit, or causal_lm (with model.pretrained and data.path: `python -m "
        "ptrun.bench.decoder DIR` writes both); repeatable",
    )
    parser.add_argument(
        "--seeds",
        action="store_true",
        help="round r runs with train.seed=r: the rounds are seeds (the table adds the mean final top-1 or perplexity)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="'LABEL: KEY=V ...': one more ptrun run, the recipe with these overrides (repeatable)",
    )
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        help="'LABEL: PYTHON [KEY=V ...]': one more "
        "ptrun run of the recipe (with these overrides), by another interpreter (another checkout's "
        "venv; repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        help="a run to make (repeatable): its label, or letters "
        "a-e for the runs in order, comma-separated (--only a,b,e); default: all five",
    )
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="each run twice: eager (train.compile=false) "
        "and compiled (train.compile=true; the plain loop compiles the library model)",
    )
    args, overrides = parser.parse_known_args()
    try:
        labels = pick(args.only) if args.only else list(LABELS)
        variants = {**PTRUN, **dict(map(variant, args.variant))}
        engines = {label: words for label, words in map(engine, args.engine)}
        pythons = {label: words[0] for label, words in engines.items()}
        variants.update({label: words[1:] for label, words in engines.items()})
    except ValueError as e:
        parser.error(str(e))
    labels += [label for label in variants if label not in LABELS]
    labels = twins(labels) if args.compiled else labels
    out = Path(args.out)
    for recipe in args.recipe or ["bbc_news_bert"]:
        try:
            metric = metric_of(recipe, overrides)
        except ValueError as e:
            parser.error(str(e))
        rounds = [
            measure(
                [
                    execute(
                        label,
                        recipe,
                        out / recipe / f"round{r}" / dir_name(label),
                        [*overrides, *([f"train.seed={r}"] if args.seeds else [])],
                        args.reuse,
                        variants,
                        metric,
                        pythons,
                    )
                    for label in labels
                ],
                metric,
            )
            for r in range(args.repeats)
        ]
        result = {
            "command": command_line(),
            "recipe": recipe,
            "overrides": overrides,
            "repeats": args.repeats,
            "seeds": args.seeds,
            "commands": commands(labels, recipe, overrides, variants, pythons),
            **aggregate(rounds, metric),
        }
        publish(result, out / f"bench_peers_{recipe}.json", caption, table)


if __name__ == "__main__":
    main()
