"""Run one `ptrun train` command with two installs of ptrun and compare what the runs record: the events of
metrics.jsonl and the printed lines, apart from times, memory use and paths. A restructuring keeps both equal.

    python scripts/compare_runs.py --ptrun OLD/.venv/bin/ptrun --ptrun NEW/.venv/bin/ptrun [key=value ...]

Without overrides the run is the digits recipe for three short epochs on two workers: two in-place freezes, the
cache serving the frozen prefix, and checkpoints inside the epochs. Exits 1 on the first difference, printed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT_RUN = [
    "recipe=digits_vit",
    "train.epochs=3",
    "train.max_steps_per_epoch=12",
    "freeze.start=0",
    "checkpoint.every_steps=5",
    "cache.min_frozen_units=1",
    "launcher.nproc_per_node=2",
]
"""Two in-place transitions (K = 1, DP = 2 throughout), AutoCache from the first, a checkpoint every 5 steps."""

VARYING = {
    "time",
    "transition_s",
    "epoch_time_s",
    "samples_per_s",
    "eval_time_s",
    "measure_s",
    "signal_s",
    "worker_start_time",
    "start_phases",
    "first_step_time",
    "first_step_end_time",
    "warm_up_end_time",
    "total_time_s",
    "train_time_s",
    "unfrozen_time_s",
    "saved_s",
    "speedup",
    "line",
    "rss_bytes",
    "peak_rss_bytes",
}
"""Event fields that differ between two runs of the same code: clocks, durations and rates, resident memory."""

VARYING_TEXT = [
    (re.compile(r"\d+ samples/s"), "N samples/s"),
    (re.compile(r"\d+(\.\d+)?s\b"), "Ns"),
    (re.compile(r" \([^()]* steps' time\)"), ""),
    (re.compile(r"offers \d+(\.\d+)? GiB"), "offers N GiB"),
    (re.compile(r"^freezing.*"), "freezing ..."),
]
"""The printed numbers that differ between two runs of the same code: rates, seconds, free memory, the savings."""


def without_varying(value, run_dir: str):
    """`value` (an event) without its varying fields, its run directory replaced by a name."""
    if isinstance(value, dict):
        return {k: without_varying(v, run_dir) for k, v in value.items() if k not in VARYING}
    if isinstance(value, list):
        return [without_varying(v, run_dir) for v in value]
    if isinstance(value, str):
        return value.replace(run_dir, "RUN")
    return value


def masked(line: str, run_dir: str) -> str:
    line = line.replace(run_dir, "RUN")
    for pattern, text in VARYING_TEXT:
        line = pattern.sub(text, line)
    return line


def run(ptrun: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """One run's events and printed lines, normalised, one string each."""
    # From the run's own directory: a worker imports ptrun from its working directory before the install's.
    run_dir.mkdir(parents=True)
    command = [ptrun, "train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, cwd=run_dir, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{ptrun} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [masked(line, str(run_dir)) for line in done.stdout.splitlines()]
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return lines + [json.dumps(without_varying(e, str(run_dir)), sort_keys=True) for e in events]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptrun", action="append", required=True, help="a ptrun executable (twice)")
    parser.add_argument("overrides", nargs="*", help="the run's key=value overrides (default: the digits run)")
    args = parser.parse_args()
    if len(args.ptrun) != 2:
        parser.error("--ptrun twice: the two installs to compare")
    overrides = args.overrides or DEFAULT_RUN
    with tempfile.TemporaryDirectory() as tmp:
        outputs = [run(ptrun, Path(tmp) / f"run{i}", overrides) for i, ptrun in enumerate(args.ptrun)]
    diff = list(difflib.unified_diff(*outputs, *args.ptrun, lineterm="", n=1))
    print("\n".join(diff) if diff else f"the same: {len(outputs[0])} lines and events apart from times")
    sys.exit(1 if diff else 0)


if __name__ == "__main__":
    main()
