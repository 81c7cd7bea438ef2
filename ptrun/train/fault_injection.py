"""Deliberate faults, for testing that ptrun survives them (chaos testing) or ends them calmly.

`PTRUN_KILL_AT` holds a JSON list of points, `[{"rank": R, "point": P, "step": S}, ...]`; the i-th entry is
for the worker group's i-th attempt (elastic's TORCHELASTIC_RESTART_COUNT), so one job can die at several
points in turn, each time after resuming from the one before. The worker whose global RANK is R sends
itself SIGKILL, with no chance to clean up, when it reaches point P at global step S:

- `step`: right after the optimizer step that makes the global step S (mid-epoch);
- `transition`: in the middle of a layout change at global step S (state shared, new layout not built);
- `checkpoint`: in the middle of writing the checkpoint of global step S (its own files written, the
  directory not yet complete);
- `export`: rank 0 writing the exported model (the step is the run's last);
- `metrics`: rank 0 writing an event to metrics.jsonl (`"event": KIND` picks the first event of that kind);
- `start`: once the trainer is built, before the first step.

Instead of dying, an entry with
- `"raise": MESSAGE` raises TypeError(MESSAGE) there, on every rank when it names none (a bug that a restart
  would only repeat);
- `"errno": N` raises OSError(N) there, as a write to a full disk does (28, ENOSPC);
- `"oom": true` raises torch.OutOfMemoryError there, as a GPU allocation that does not fit does.
Each of these fires once in a process.

Unset (always, outside tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import json
import os
import signal
from functools import cache

import torch

POINTS = ("step", "transition", "checkpoint", "export", "metrics", "start")
_fired: list[dict] = []


@cache
def _planned() -> dict | None:
    spec = os.environ.get("PTRUN_KILL_AT")
    if not spec:
        return None
    plan = json.loads(spec)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return plan[attempt] if attempt < len(plan) else None


def reached(point: str, step: int, event: str | None = None) -> None:
    """Die here (or raise) if this worker's attempt planned to (`event`: the kind of event being written, at
    the `metrics` point)."""
    planned = _planned()
    rank = int(os.environ.get("RANK", "0"))
    if (
        planned
        and planned["point"] == point
        and planned.get("step", step) == step
        and planned.get("event", event) == event
        and planned.get("rank", rank) == rank
        and planned not in _fired
    ):
        if "raise" in planned:
            raise TypeError(planned["raise"])
        if "errno" in planned:
            _fired.append(planned)
            raise OSError(planned["errno"], os.strerror(planned["errno"]))
        if planned.get("oom"):
            _fired.append(planned)
            raise torch.OutOfMemoryError(f"planned out of memory at {point} (global step {step})")
        os.kill(os.getpid(), signal.SIGKILL)
