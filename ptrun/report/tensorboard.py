"""`TensorBoardLog`: the `metrics.jsonl` events as TensorBoard scalars, written as a run goes.

It mirrors `MetricsLog.write(event, **fields)`, so the trainer can call both with the same arguments:

  plan  -> layout/K, layout/DP, layout/frozen_units, layout/microbatches, layout/transition_s and, when the
           plan has it, layout/cached_units
  epoch -> train/loss, train/samples_per_s, train/epoch_time_s, train/lr, train/sample_uses_min,
           train/sample_uses_max, eval/<key> for every number in `eval` (eval/top1, eval/loss) and
           cache/<key> for every number in `cache` (AutoCache's hits, computed, memory_bytes, ...)
  start -> the text "run/start" (the event as JSON)
  end   -> the scalar run/total_time_s and the text "run/end"
  other events are ignored.

The step of an epoch's scalars (and of the plan it ran in) is `epoch + 1`, the 1-based epoch the terminal
and `ptrun report` show; the end event's step is `epochs`. Wall times are the events' `time` when given
(as `MetricsLog` writes it), now otherwise. The event file goes into the run directory itself, so
`tensorboard --logdir runs` lists each run under its directory name. A resumed run adds a second event
file beside the first; TensorBoard shows the repeated epochs of both.

`event_scalars` and `TEXT_EVENTS` hold this mapping for every mirror of the events, so the experiment
trackers (`ptrun.report.trackers`: Weights & Biases, MLflow) show the same tags at the same steps.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# metrics.jsonl field -> scalar tag, per event
PLAN_SCALARS = {
    "pp": "layout/K",
    "dp": "layout/DP",
    "frozen_units": "layout/frozen_units",
    "microbatches": "layout/microbatches",
    "cached_units": "layout/cached_units",
    "transition_s": "layout/transition_s",
}
EPOCH_SCALARS = {
    "train_loss": "train/loss",
    "samples_per_s": "train/samples_per_s",
    "epoch_time_s": "train/epoch_time_s",
    "lr": "train/lr",
    "sample_uses_min": "train/sample_uses_min",
    "sample_uses_max": "train/sample_uses_max",
}


# events whose whole record (as JSON) is kept as text under this tag, at the step `event_scalars` gives
TEXT_EVENTS = {"start": "run/start", "end": "run/end"}


def event_scalars(event: str, fields: dict[str, Any]) -> tuple[int, dict[str, float]]:
    """The step and the scalars (tag -> number) that one `metrics.jsonl` event becomes; no scalars for the
    start event (step 0) and for events no mirror shows. Non-numbers (a missing eval, a string) are left out."""
    if event in ("plan", "epoch"):
        step = fields["epoch"] + 1
        values = _numbers(PLAN_SCALARS if event == "plan" else EPOCH_SCALARS, fields)
        if event == "epoch":
            for group in ("eval", "cache"):
                numbers = fields.get(group) or {}
                values.update(_numbers({key: f"{group}/{key}" for key in numbers}, numbers))
        return step, values
    if event == "end":
        return fields.get("epochs", 0), _numbers({"total_time_s": "run/total_time_s"}, fields)
    return 0, {}


def _numbers(tags: dict[str, str], fields: dict[str, Any]) -> dict[str, float]:
    return {tag: fields[key] for key, tag in tags.items() if isinstance(fields.get(key), (int, float))}


class TensorBoardLog:
    def __init__(self, run_dir: str | Path, config: Any = None):
        """Scalars into `run_dir` (the run's `config` is not written: TensorBoard shows scalars)."""
        # inner import: optional library (torch's writer needs the `tensorboard` package)
        from torch.utils.tensorboard import SummaryWriter

        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(log_dir=str(self.run_dir))

    def write(self, event: str, **fields: Any) -> None:
        wall = fields.get("time", time.time())
        step, values = event_scalars(event, fields)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step, walltime=wall)
        if event in TEXT_EVENTS:
            self.writer.add_text(TEXT_EVENTS[event], json.dumps(fields), step, walltime=wall)
        if event in ("epoch", "end"):
            self.writer.flush()  # once an epoch: a TensorBoard open beside the run follows it live

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
