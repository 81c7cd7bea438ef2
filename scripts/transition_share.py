"""Each layout change of a run as a share of an epoch: `python scripts/transition_share.py RUN_DIR`.

Reads RUN_DIR/metrics.jsonl: a `plan` event's `transition_s` (the change into that epoch's layout) against
the mean training time of the run's epochs (the issue's goal: under 2%)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(run_dir: str) -> None:
    events = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    epochs = [e for e in events if e["event"] == "epoch"]
    mean_epoch = sum(e["epoch_time_s"] for e in epochs) / len(epochs)
    changes = [p for p in events if p["event"] == "plan" and p.get("transition_s", 0) > 0]
    print(f"{len(epochs)} epochs, mean epoch {mean_epoch:.2f}s; {len(changes)} layout changes")
    for p in changes:
        print(f"before epoch {p['epoch'] + 1}: K={p['pp']} DP={p['dp']} frozen {p['frozen_units']} units: "
              f"{p['transition_s']:.3f}s = {100 * p['transition_s'] / mean_epoch:.2f}% of an epoch")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.splitlines()[0])
    main(sys.argv[1])
