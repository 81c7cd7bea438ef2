"""Hand-made runs for the tests of what reads a run's `metrics.jsonl` (the report, the savings estimate, the
benchmarks' readers, the simulator's validator): its events in the documented format, one JSON object a line."""

from __future__ import annotations

import json
from pathlib import Path


def event(name: str, t: float, **fields) -> dict:
    """One event as ptrun's metrics writer records it: its name, its time, then its own fields in order."""
    return {"event": name, "time": t, **fields}


def write_events(run_dir: Path, events: list[dict], tail: str = "") -> Path:
    """`events` as the `metrics.jsonl` of the existing `run_dir`, then `tail` (a torn last line, say)."""
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + tail)
    return run_dir


def write_run(run_dir: Path, events: list[dict], tail: str = "") -> Path:
    """A new run directory whose `metrics.jsonl` holds `events`, then `tail`."""
    run_dir.mkdir(parents=True)
    return write_events(run_dir, events, tail)


def write_simulated(run_dir: Path, records, slower: float) -> None:
    """The events of a run of 1437 training samples whose layout changed as the simulator's `records` say
    (`ptrun.sim.simulate.simulate_one`), each epoch measured at `slower` x the simulated epoch."""
    events = [{"event": "start", "train_samples": 1437}]
    for r in records:
        events.append({"event": "plan", "epoch": r.epoch, "transition_s": r.transition_s, **r.plan.to_dict()})
        events.append(
            {"event": "epoch", "epoch": r.epoch, "epoch_time_s": slower * r.time_s - r.transition_s, "steps": r.steps}
        )
    write_events(run_dir, events)


def start(t: float, num_units: int, **kw) -> dict:
    """The start event of a 2-worker digits_vit run of a ViT of `num_units` units, not resumed (`kw` adds or
    overrides fields)."""
    return {
        "event": "start",
        "time": t,
        "world_size": 2,
        "recipe": "digits_vit",
        "model": "vit_tiny",
        "num_units": num_units,
        "resumed_from": None,
        **kw,
    }


def plan(
    t: float,
    epoch: int,
    num_units: int,
    frozen: int,
    pp: int,
    dp: int,
    m: int,
    transition_s: float = 0.0,
    schedule: str = "GPipe",
    **fields,
) -> dict:
    """A plan event: `frozen` of `num_units` units frozen, all of them split evenly over `pp` stages (one or
    two), each replicated `dp` times, `m` microbatches, after a change of `transition_s`; `fields` adds more."""
    bounds = [[0, num_units // 2], [num_units // 2, num_units]] if pp == 2 else [[0, num_units]]
    return event(
        "plan",
        t,
        epoch=epoch,
        num_units=num_units,
        frozen_units=frozen,
        pp=pp,
        dp=dp,
        stage_bounds=bounds,
        microbatches=m,
        schedule=schedule,
        stages_per_rank=1,
        transition_s=transition_s,
        **fields,
    )


def epoch(
    t: float,
    e: int,
    loss: float,
    samples_per_s: float,
    seconds: float,
    steps: int,
    samples: int,
    evaluation: dict | None = None,
    **fields,
) -> dict:
    """An epoch event: `steps` steps over `samples` samples in `seconds`, its `evaluation` (none by default);
    `fields` adds more."""
    return event(
        "epoch",
        t,
        epoch=e,
        train_loss=loss,
        samples_per_s=samples_per_s,
        epoch_time_s=seconds,
        steps=steps,
        samples=samples,
        eval=evaluation or {},
        **fields,
    )
