"""The runs `benchmarks.peers` makes side by side: the plain peers and ptrun's, what each is compared on (its
metric), the command line of each, how one is made, and what it measured (read back from its files).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import fresh_run_dir, run_to_end

PLAIN = "benchmarks.plain_loop"
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
TRAINER = "HF Trainer"
"""The Trainer peer (`--trainer`: `benchmarks.hf_trainer`, transformers' Trainer in one process with both
threads; with a LoRA recipe the Trainer + peft run), a plain peer beside the loop and DDP, outside the
letters a-e."""


def is_peer(label: str) -> bool:
    """Whether `label` (its `--compiled` suffix aside) is a run without ptrun: a plain peer or the Trainer."""
    return base(label)[0] in (*PEERS, TRAINER)


EAGER, COLD, WARM = ", eager", ", compiled, cold cache", ", compiled, warm cache"
"""`--compiled`: each run three times, `LABEL, eager` (`train.compile=false`) and compiled (`train.compile=true`:
ptrun's units; the plain loop's library model through torch.compile, as a user writes it) on an empty inductor
cache of its own (`cold`: every graph built, a first run) and then on the cache that run filled (`warm`)."""
COMPILED = (COLD, WARM)
COMPILE_OVERRIDE = {EAGER: "train.compile=false", COLD: "train.compile=true", WARM: "train.compile=true"}


def twins(labels: list[str]) -> list[str]:
    """Each label's eager and compiled runs, cold then warm (`--compiled`), in order."""
    return [label + suffix for label in labels for suffix in (EAGER, COLD, WARM)]


def inductor_cache(label: str, run_dir: Path) -> Path | None:
    """The inductor cache a compiled run of `label` uses: one per run and round beside its run directories,
    emptied before the cold run (None for a run that does not compile)."""
    if not label.endswith(COMPILED):
        return None
    return run_dir.parent / f"inductor_{base(label)[0].replace(' ', '_').replace(',', '')}"


def base(label: str) -> tuple[str, list[str]]:
    """The run a label names, and the override its `--compiled` suffix adds (none without one)."""
    for suffix, override in COMPILE_OVERRIDE.items():
        if label.endswith(suffix):
            return label.removesuffix(suffix), [override]
    return label, []


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
    from benchmarks.plain_loop import recipe_config

    task = recipe_config(recipe, overrides).model.task
    if task not in METRICS:
        raise ValueError(f"--recipe {recipe}: model.task={task!r}; the plain peer trains {', '.join(METRICS)}")
    return METRICS[task]


def pick(only: list[str]) -> list[str]:
    """The runs `--only` names (labels, or letters a-e comma-separated), in the benchmark's order."""
    letters = dict(zip("abcde", LABELS, strict=True))
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
    if label == TRAINER:
        return [
            sys.executable,
            "-m",
            "benchmarks.hf_trainer",
            f"--recipe={recipe}",
            "--threads=2",
            f"--out={run_dir / 'plain.json'}",
            *overrides,
        ]
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
    """A command as the user would type it: `ptrun train ...` or `python -m benchmarks.plain_loop ...`."""
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
        env = {**os.environ, "PTRUN_TOKENIZED_DIR": str(run_dir / "tokenized")} if is_peer(label) else None
        if label in (pythons or {}):
            # Another checkout's interpreter imports its own ptrun, not the one in the working directory (the
            # repository root the benchmarks run from), which `-m` would otherwise put first on its path.
            env = {**(env or os.environ), "PYTHONSAFEPATH": "1"}
        cache = inductor_cache(label, run_dir)
        if cache is not None:  # compiled: cold on an empty cache of its own, warm on what the cold run left
            if label.endswith(COLD):
                shutil.rmtree(cache, ignore_errors=True)
            env = {**(env or os.environ), "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        spawned, t0 = time.time(), time.perf_counter()
        run_to_end(cmd, env)
        wall_file.write_text(json.dumps({"wall_s": time.perf_counter() - t0, "spawn_time": spawned}))
    wall = json.loads(wall_file.read_text())
    run = dict(
        read_plain(run_dir, metric) if is_peer(label) else read_ptrun(run_dir, metric),
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
    # the host time rank 0 spent taking the freeze policy's measure, as a share of training (`signal_s` in a
    # run recorded before the measure had its name)
    taken = [e.get("measure_s", e.get("signal_s")) for e in epochs]
    measure = sum(taken) / train_s if None not in taken else None
    first = next((e["first_step_time"] for e in events if e["event"] == "epoch" and "first_step_time" in e), None)
    start = next((e for e in events if e["event"] == "start"), {})
    return {
        "train_time_s": train_s,
        "samples_per_s": sum(e["samples"] for e in epochs) / train_s,
        f"final_{metric.key}": final,
        "curve": curve,
        "ptrun_total_time_s": end.get("total_time_s"),
        "measure_share": measure,
        "first_step_time": first,
        "eval_s": eval_seconds(epochs),
        "worker_start_time": start.get("worker_start_time"),
        "start_phases": start.get("start_phases"),
    }
