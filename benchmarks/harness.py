"""What every benchmark of ptrun shares: runs of `ptrun train` in interleaved rounds (so a slow spell of the
shared machine hits every run alike), their rows measured against the round's baseline, medians and ranges,
table cells, and publishing a result (printed, and written as the JSON the README's tables are generated
from, with the command line that produced it). The benchmarks: the other modules of `benchmarks`, each
started as `python -m benchmarks.NAME`."""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

COMBINATIONS = {
    "baseline": ["auto.freeze=false", "auto.cache=false"],
    "freeze only": ["auto.pipe=false", "auto.dp=false", "auto.cache=false"],
    "freeze + AutoPipe + AutoCache": ["auto.dp=false", "auto.cache=true"],
    "freeze + AutoPipe + AutoDP": ["auto.cache=false"],
    "all four": ["auto.cache=true"],
}
PAPER = {
    "freeze only": 0.95,
    "freeze + AutoPipe + AutoCache": 1.26,
    "freeze + AutoPipe + AutoDP": 2.27,
    "all four": 2.83,
}
"""Figure 9's speedups (ViT-B/16 on ImageNet, 2 x 8 GPUs), for the shape only."""
PAPER_BERT = {"all four": 2.10}
"""Table 1's speedup for BERT-large on SQuAD v1.1 (all four components; Figure 9 breaks down ViT only)."""


def paper_for(recipe: str) -> tuple[dict[str, float], str]:
    """The paper's numbers to print beside a recipe's, and the column's name."""
    if "bert" in recipe:
        return PAPER_BERT, "paper (Table 1, BERT)"
    return PAPER, "paper (Fig. 9)"


def command_line(argv: Sequence[str] | None = None) -> str:
    """This invocation as typed (`python -m benchmarks.NAME`, or `python` and the script's path, then its
    arguments, or `argv` in their place): every benchmark stores it in its JSON, so the README tables generated
    from that JSON name the command that produced them."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)  # None unless started as `python -m NAME`
    program = ["-m", spec.name.removesuffix(".__main__")] if spec is not None else sys.argv[:1]
    return shlex.join(["python", *program, *(sys.argv[1:] if argv is None else argv)])


def machine_description() -> str:
    """This machine in a few words, for a result's `machine`: its cores, CPU model and GPUs."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        cpu = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
    except OSError:
        cpu = None
    import torch

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return (
        f"{cores} CPU cores"
        + (f" ({cpu})" if cpu else "")
        + ", "
        + (f"GPU: {len(gpus)} x {' / '.join(sorted(set(gpus)))}" if gpus else "no GPU")
    )


def publish(result: dict, path: Path, caption, table) -> None:
    """Print a benchmark's caption and table (what `benchmarks/results_page.py` puts in the README) and write its
    result as JSON to `path`."""
    print(f"\n{caption(result)}\n")
    print(table(result))
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwritten: {path}")


def run_to_end(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
    """Run a benchmark's `cmd` to its end, its stdout discarded, as `subprocess.run(check=True)` does. On Linux
    the child is stopped (SIGTERM) when the benchmark's process dies, however it dies: a benchmark killed
    mid-run leaves no run going on beside the next one (ptrun's launcher stops its workers on SIGTERM)."""
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=env, cwd=cwd, preexec_fn=_stop_with_parent())


PR_SET_PDEATHSIG = 1
"""prctl's option: the signal a process gets when its parent dies (linux/prctl.h)."""


def _stop_with_parent():
    """What the child runs before its command (Linux; None elsewhere): SIGTERM when the parent dies. libc's prctl
    is looked up here, in the parent, so the forked child only calls it (no import or library load between fork
    and exec)."""
    if sys.platform != "linux":
        return None
    import ctypes

    return functools.partial(ctypes.CDLL(None).prctl, PR_SET_PDEATHSIG, signal.SIGTERM)


def fresh_run_dir(marker: Path, reuse: bool) -> bool:
    """Whether to make a run: not with `reuse` when its `marker` (a file the finished run leaves in its
    directory) is there, the run being read back (`--reuse`); else the run's directory, the marker's folder,
    is emptied for it."""
    if reuse and marker.is_file():
        return False
    shutil.rmtree(marker.parent, ignore_errors=True)
    marker.parent.mkdir(parents=True)
    return True


def train(run_dir: Path, overrides: list[str], reuse: bool = False) -> Path:
    """One `ptrun train` run into `run_dir` (or, with `reuse`, the one already there)."""
    if fresh_run_dir(run_dir / "metrics.jsonl", reuse):
        cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *overrides]
        print("$ ptrun train " + " ".join(cmd[4:]), flush=True)
        run_to_end(cmd)
    return run_dir


def final_top1(run_dir: Path) -> float:
    """The top-1 of a run's last evaluation, as its `end` event records it."""
    from ptrun.report.runs import read_events

    end = next(e for e in read_events(run_dir) if e["event"] == "end")
    return float(end["final_eval"]["top1"])


def ideal_speedup(run_dir: Path) -> float:
    """The full model's training cost over the run's, each layout weighted by the share of the run it trained
    (its steps; a layout that changed inside an epoch covers part of one), with a unit's cost 3x its forward
    FLOPs while it trains: what freezing alone could save."""
    from ptrun.config import load_resolved
    from ptrun.costs.from_config import costs_from_config
    from ptrun.report import load_run

    cfg = load_resolved(run_dir / "config.yaml")
    flops = costs_from_config(cfg.model, cfg.data).fwd_flops
    run = load_run(run_dir)
    steps = {e["epoch"]: e["steps"] for e in run.epochs}
    at = [p["epoch"] + p.get("step", 0) / steps[p["epoch"]] for p in run.plans]
    spans = [end - start for start, end in zip(at, at[1:] + [len(run.epochs)], strict=True)]
    cost = sum(span * sum(flops[p["frozen_units"] :]) for span, p in zip(spans, run.plans, strict=True))
    return sum(spans) * sum(flops) / cost


def measure(dirs: dict[str, Path], paper: dict[str, float] = PAPER) -> list[dict]:
    """One repeat's row per run, labelled by its key in `dirs`; speedups and the time-to-accuracy target
    against the first run (the baseline) of this repeat."""
    from ptrun.report import load_run
    from ptrun.report.summary import summarize, time_to_accuracy

    runs = [load_run(d) for d in dirs.values()]
    for run, name in zip(runs, dirs, strict=True):
        run.label = name
    sums = [summarize(r) for r in runs]
    target = time_to_accuracy(runs)
    tta = {row["label"]: row for row in target["runs"]}
    base = sums[0]["train_time_s"]
    rows = []
    for name, summary, run_dir in zip(dirs, sums, dirs.values(), strict=True):
        ideal = ideal_speedup(run_dir)
        speedup = base / summary["train_time_s"]
        rows.append(
            {
                "combination": name,
                "train_time_s": summary["train_time_s"],
                "speedup": speedup,
                "time_to_target_s": tta[name]["time_s"],
                "speedup_to_target": tta[name]["speedup"],
                "final": summary["final"],
                "metric": summary["metric"],
                "target": target["target"],
                "mean_samples_per_s": summary["mean_samples_per_s"],
                "ideal_speedup": ideal,
                "share_of_ideal": speedup / ideal if ideal > 1 else None,
                "paper_speedup": paper.get(name),
                "run_dir": str(run_dir),
            }
        )
    return rows


def median(values: list) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def spread(values: list) -> list | None:
    """[min, max] of the values that exist; None if none does."""
    known = [v for v in values if v is not None]
    return [min(known), max(known)] if known else None


def label_rows(rounds: list[list[dict]], keys: tuple[str, ...]) -> list[dict]:
    """One row per label of the first round, in its order: the label, the median and range (`<key>_range`)
    over the rounds of each of `keys`, and the runs."""
    rows = []
    for label in [r["label"] for r in rounds[0]]:
        runs = [next(r for r in rnd if r["label"] == label) for rnd in rounds]
        row = {"label": label, "runs": runs}
        for key in keys:
            row[key] = median([r.get(key) for r in runs])
            row[f"{key}_range"] = spread([r.get(key) for r in runs])
        rows.append(row)
    return rows


def rounds_caption(result: dict) -> str:
    """How interleaved rounds are summarised, the start of a caption: the recipe, rounds and runs, medians."""
    return f"{result['recipe']}: {result['repeats']} round(s) of {len(result['rows'])} runs, interleaved; medians" + (
        " (min-max over the rounds)" if result["repeats"] > 1 else ""
    )


def rounds_parser(
    doc: str,
    out: str,
    recipe: str | None = "digits_vit",
    repeats: int = 1,
    repeats_help: str = "rounds of all the runs, interleaved",
) -> argparse.ArgumentParser:
    """The command line of a benchmark that runs interleaved rounds, described by its docstring's first line:
    `--recipe` (unless `recipe` is None), `--out`, `--repeats` and `--reuse`."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    if recipe is not None:
        parser.add_argument("--recipe", default=recipe)
    parser.add_argument("--out", default=out)
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)
    parser.add_argument("--reuse", action="store_true", help="analyse runs already in --out again")
    return parser


def dir_name(label: str) -> str:
    """A run's directory under a round: its label without spaces or slashes ("all four" -> "all_four",
    "alpha 1/3" -> "alpha_1-3", "K = 2" -> "K_2"), readable in `ls` and safe inside a Hydra override."""
    return re.sub(r"[^\w+.\-]+", "_", label.replace(" + ", "+").replace("/", "-")).strip("_")


def run_rounds(
    out: Path, runs: dict[str, list[str]], common: list[str], repeats: int, reuse: bool, paper: dict[str, float] = PAPER
) -> list[list[dict]]:
    """`repeats` rounds of every run in `runs` (label -> overrides; the first is the baseline), each run with
    `common` before its own overrides, measured round by round. Rounds are interleaved rather than each run
    repeated in a row, so a slow spell of the shared machine hits every run alike."""
    rounds = []
    for r in range(repeats):
        dirs = {
            name: train(out / f"round{r}" / dir_name(name), [*common, *overrides], reuse)
            for name, overrides in runs.items()
        }
        rounds.append(measure(dirs, paper))
    return rounds


def aggregate(rounds: list[list[dict]], paper: dict[str, float] = PAPER) -> list[dict]:
    """One row per run: the medians over the rounds, the speedups' range and every round's own row."""
    rows = []
    for i, first in enumerate(rounds[0]):
        runs = [rep[i] for rep in rounds]
        row = {
            k: median([r[k] for r in runs])
            for k in (
                "train_time_s",
                "speedup",
                "time_to_target_s",
                "speedup_to_target",
                "final",
                "ideal_speedup",
                "share_of_ideal",
            )
        }
        speedups = [r["speedup"] for r in runs]
        row.update(
            combination=first["combination"],
            speedup_range=(min(speedups), max(speedups)),
            paper_speedup=paper.get(first["combination"]),
            metric=first["metric"],
            runs=runs,
        )
        rows.append(row)
    return rows


def fmt(value: float | None, spec: str = ".2f", suffix: str = "") -> str:
    """A number for a table cell; "-" for a value that does not exist (no ideal, never reached the target)."""
    return "-" if value is None else f"{value:{spec}}{suffix}"


def cell(row: dict, key: str, spec: str, suffix: str = "", repeats: int = 1) -> str:
    """A median, with its range over the rounds (`<key>_range`) when there was more than one."""
    text = fmt(row[key], spec, suffix)
    span = row.get(f"{key}_range")
    if repeats > 1 and span is not None and row[key] is not None:
        text += f" ({span[0]:{spec}}-{span[1]:{spec}})"
    return text


def markdown_lines(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header's cells, the separator, then each row's cells."""
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|", *("| " + " | ".join(r) + " |" for r in rows)]


def rows_table(rows: list[dict], columns: list[tuple[str, str, str, str]], repeats: int) -> list[str]:
    """A Markdown table, one line per row: a `label` column, then a column per (header, key, format spec,
    suffix), each a `cell`."""
    return markdown_lines(
        ["run", *(c[0] for c in columns)],
        ([r["label"], *(cell(r, key, spec, suffix, repeats) for _, key, spec, suffix in columns)] for r in rows),
    )
