"""Compiled units against eager: `train.compile=true` and `false`, training and wall time, inductor's cache
cold and warm.

Per workload, in interleaved rounds (a slow spell of the shared machine hits every run alike): `ptrun train`
eager (`train.compile=false`), compiled with an empty inductor cache (`cold`: every graph built, as a first run
on a machine), and compiled again on the cache that run filled (`warm`: what every later run of the same model
pays). Workloads:
  digits_vit  the recipe as it is (a small ViT from scratch, 2 workers)
  small       bbc_news_bert on the tiny random BERT of `benchmarks.overhead --mode small` (4 layers, 64 wide):
              steps of tens of milliseconds, where per-operator overhead shows as on a GPU
  default     bbc_news_bert as it is (`ptrun train`: all-MiniLM-L6-v2, 3 epochs, 2 workers)
Per run: wall time (the command, start to exit), training time (the epochs' training loops), compile seconds
(the busiest worker's, from the epoch events: the start's compile and every transition's), final top-1.
Medians over the rounds, ratios against the round's eager run (> 1: faster than eager).

    python -m benchmarks.compiled [--workload digits_vit] [--workload small] [--workload default]
        [--repeats 2] [--default-repeats 1] [--out DIR] [--reuse] [overrides ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from benchmarks.harness import (
    cell,
    command_line,
    fresh_run_dir,
    label_rows,
    machine_description,
    markdown_lines,
    publish,
    rounds_parser,
    run_to_end,
)

WORKLOADS = ("digits_vit", "small", "default")
RUNS = {
    "eager": ["train.compile=false"],
    "compiled, cold cache": ["train.compile=true"],
    "compiled, warm cache": ["train.compile=true"],
}
"""Each round's runs of a workload; the cold run starts on an empty inductor cache, the warm one on its cache."""
KEYS = ("wall_s", "train_time_s", "compile_s", "final_top1", "wall_ratio", "train_ratio")


def workload_overrides(workload: str, out: Path) -> list[str]:
    """A workload's `ptrun train` overrides."""
    if workload == "digits_vit":
        return ["recipe=digits_vit"]
    if workload == "small":
        from benchmarks.overhead import mode_overrides

        return ["recipe=bbc_news_bert", *mode_overrides("small", out)]
    return ["recipe=bbc_news_bert"]


def run(run_dir: Path, overrides: list[str], env: dict[str, str], reuse: bool) -> dict:
    """One `ptrun train` with `env` over this environment (inductor's cache: `TORCHINDUCTOR_CACHE_DIR`); its
    times, compile seconds and final top-1."""
    from ptrun.report import load_run
    from ptrun.report.summary import summarize

    wall_file = run_dir / "wall.json"
    if fresh_run_dir(wall_file, reuse):
        cmd = [sys.executable, "-m", "ptrun.cli", "train", f"hydra.run.dir={run_dir}", *overrides]
        shown = " ".join(f"{k}={v}" for k, v in env.items())
        print(f"$ {shown} ptrun train {' '.join(cmd[4:])}", flush=True)
        t0 = time.perf_counter()
        run_to_end(cmd, {**os.environ, **env})
        wall_file.write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
    loaded = load_run(run_dir)
    summary = summarize(loaded)
    compiled = [e.get("compile", {}) for e in loaded.epochs]
    return {
        "wall_s": json.loads(wall_file.read_text())["wall_s"],
        "train_time_s": summary["train_time_s"],
        "compile_s": sum(c.get("compile_s", 0.0) for c in compiled),
        "recompiles": sum(c.get("recompiles", 0) for c in compiled),
        "final_top1": summary["final"],
        "run_dir": str(run_dir),
    }


def round_of(workload: str, out: Path, r: int, overrides: list[str], reuse: bool) -> list[dict]:
    """Round `r` of a workload: eager, compiled cold, compiled warm; ratios against the eager run."""
    base = workload_overrides(workload, out)
    here = out / workload / f"round{r}"
    cache = here / "inductor"  # empty for the cold run (fresh_run_dir empties the round's runs, not this)
    if not reuse:
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    rows = []
    for label, extra in RUNS.items():
        row = run(
            here / label.replace(", ", "_").replace(" ", "_"),
            [*base, *extra, *overrides],
            {"TORCHINDUCTOR_CACHE_DIR": str(cache if label != "eager" else here / "inductor_eager")},
            reuse,
        )
        rows.append({"label": label, **row})
    eager = rows[0]
    for row in rows:
        row["wall_ratio"] = eager["wall_s"] / row["wall_s"]
        row["train_ratio"] = eager["train_time_s"] / row["train_time_s"]
    return rows


def caption(result: dict) -> str:
    repeats = ", ".join(f"{w} {n}" for w, n in result["repeats"].items())
    return (
        f"Compiled units against eager, {result['machine']}: rounds per workload ({repeats}), interleaved; "
        f"medians (min-max over the rounds); ratios against each round's eager run (> 1: faster)"
    )


def table(result: dict) -> str:
    lines = []
    for workload, rows in result["workloads"].items():
        n = result["repeats"][workload]
        lines += markdown_lines(
            [
                workload,
                "wall (s)",
                "training (s)",
                "compiling (s)",
                "final top-1",
                "wall vs eager",
                "training vs eager",
            ],
            (
                [
                    r["label"],
                    cell(r, "wall_s", ".1f", "", n),
                    cell(r, "train_time_s", ".1f", "", n),
                    cell(r, "compile_s", ".1f", "", n),
                    cell(r, "final_top1", ".2f", "", n),
                    cell(r, "wall_ratio", ".2f", "x", n),
                    cell(r, "train_ratio", ".2f", "x", n),
                ]
                for r in rows
            ),
        )
        lines.append("")
    return "\n".join(lines).rstrip()


def main(argv: list[str] | None = None) -> None:
    parser = rounds_parser(__doc__, "runs/bench_compile", recipe=None, repeats=2)
    parser.add_argument("--workload", action="append", choices=WORKLOADS, help="repeatable; default: all three")
    parser.add_argument("--default-repeats", type=int, default=1, help="rounds of the default (minutes each)")
    args, overrides = parser.parse_known_args(argv)
    out = Path(args.out)
    workloads = args.workload or list(WORKLOADS)
    repeats = {w: args.default_repeats if w == "default" else args.repeats for w in workloads}
    rounds: dict[str, list[list[dict]]] = {w: [] for w in workloads}
    for r in range(max(repeats.values())):
        for w in workloads:
            if r < repeats[w]:
                rounds[w].append(round_of(w, out, r, overrides, args.reuse))
    result = {
        "command": command_line(),
        "date": date.today().isoformat(),
        "machine": machine_description(),
        "overrides": overrides,
        "repeats": repeats,
        "workloads": {w: label_rows(rounds[w], KEYS) for w in workloads},
    }
    out.mkdir(parents=True, exist_ok=True)
    publish(result, out / "bench_compile.json", caption, table)


if __name__ == "__main__":
    main()
