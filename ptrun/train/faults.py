"""Deliberate worker deaths, for testing that ptrun survives them (chaos testing).

`PTRUN_KILL_AT` holds a JSON list of points, `[{"rank": R, "point": P, "step": S}, ...]`; the i-th entry is
for the worker group's i-th attempt (elastic's TORCHELASTIC_RESTART_COUNT), so one job can die at several
points in turn, each time after resuming from the one before. The worker whose global RANK is R sends
itself SIGKILL, with no chance to clean up, when it reaches point P at global step S:

- `step`: right after the optimizer step that makes the global step S (mid-epoch);
- `transition`: in the middle of a layout change at global step S (state shared, new layout not built);
- `checkpoint`: in the middle of writing the checkpoint of global step S (its own files written, the
  directory not yet complete);
- `start`: once the trainer is built, before the first step; an entry with `"raise": MESSAGE` raises
  TypeError(MESSAGE) there instead of dying, on every rank when it names none (a bug that a restart would
  only repeat).

Unset (always, outside tests) it costs one dictionary lookup per call.
"""

from __future__ import annotations

import json
import os
import signal
from functools import cache

POINTS = ("step", "transition", "checkpoint", "start")


@cache
def _planned() -> dict | None:
    spec = os.environ.get("PTRUN_KILL_AT")
    if not spec:
        return None
    plan = json.loads(spec)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return plan[attempt] if attempt < len(plan) else None


def reached(point: str, step: int) -> None:
    """Die here (or raise) if this worker's attempt planned to."""
    planned = _planned()
    if (
        planned
        and planned["point"] == point
        and planned.get("step", step) == step
        and planned.get("rank", int(os.environ.get("RANK", "0"))) == int(os.environ.get("RANK", "0"))
    ):
        if "raise" in planned:
            raise TypeError(planned["raise"])
        os.kill(os.getpid(), signal.SIGKILL)
