"""What rank 0 tells the user and the run record: `metrics.jsonl`, the log, and the terminal.

`metrics.jsonl` holds one JSON object a line; benchmarks and reports read it, so its events are stable:
  {"event": "start", "time": ..., "world_size": W, "recipe": ..., "model": ..., "num_units": N, "params": P,
   "trainable_params": the parameters that train (fewer than P under adapters: the adapters and the task head),
   "resumed_from": ..., "worker_start_time": ... (Unix time rank 0's worker began), "start_phases": {"process_group_s",
   "data_s", "model_s", "controller_s", "cache_s", "layout_s"} (seconds of each, in order, from then to the start)}
  {"event": "plan", "epoch": E, "step": S, "frozen_units": F, "pp": K, "dp": D, "stage_bounds": [[lo, hi], ...],
   "microbatches": M, "schedule": ..., "stages_per_rank": V, "cached_units": C, "transition_s": ...,
   after a layout change "moved_bytes" (parameters and optimizer state sent between the workers),
   "unheld_param_bytes" (parameter storage the workers keep outside their stages, after the start and after each
   change: always 0), on a process's first plan "rss_bytes" (each worker's resident memory once started, by
   rank); one at each
   epoch's start (S = 0) and one at each change inside an epoch (S = the step it happened before),
   with pipe.microbatches=auto on a run's first plan also "microbatches_reason": "M=2 at K=2: ...",
   "microbatch_tuning": {"source": measured|cached|no choice, "seconds", "chosen": {K: M}, "table": {K: M},
   "samples_per_s": {K: {M: ...}}, "cache_file"}}
  {"event": "epoch", "epoch": E, "train_loss": ..., "samples_per_s": ..., "epoch_time_s": ..., "eval_time_s": ...,
   "lr": ..., "steps": S, "samples": N, "eval": {"top1": ..., "loss": ...} or {} when not evaluated,
   "cache": {"hits", "advanced", "computed", "corrupt", "written", the same counters of the epoch's
             evaluation as "eval_hits", "eval_advanced", ..., "cached_units", "memory_bytes", "disk_bytes"}
             with auto.cache only,
   "memory": {"param_bytes": [per rank], "optim_bytes": [...], "rss_bytes": [...], "peak_rss_bytes": [...]},
   on the first epoch a worker process trains also "first_step_time" and "first_step_end_time" (Unix times:
   its first step began, before the forward pass, and ended, after the update)}
  {"event": "compile", "epoch": E, "step": S, "compile_decision": {"compile": bool, "forced": bool, "steps",
   "step_s", "graphs", "cached_graphs", "compile_estimate_s", "saving", "saving_measured"}, "compiled_s": ...}
   with train.compile auto or true: its decision at the start, after the first steps where the start waited for
   them (`compiled_s`: the layout built again compiled), at a compiled run's transitions
  {"event": "savings", "train_time_s": ..., "unfrozen_time_s": ..., "saved_s": ..., "speedup": ..., "froze": bool,
   "steady_steps": ..., "unfrozen_range_s": [low, high] or null, "line": "freezing saved ~41 s: ..."} just
   before the end event: what freezing saved
   (`ptrun.report.savings`; the estimate's three fields null when too few steps trained every unit)
  {"event": "end", "epochs": E, "total_time_s": ..., "final_eval": {...}, "best_eval": {...}}
  {"event": "stopped", "signal": "SIGINT"|"SIGTERM" or "diverged": {"epoch", "step", "global_step", "lr", "why"},
   "epoch": E, "global_step": G, "checkpoint_step": G}

The terminal's lines (`start_line`, `epoch_line`, `transition_line`, `done_line`) are written here too, so
the trainer's loop holds no formatting.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from ptrun.installed import LOGGER_SPECS
from ptrun.train import fault_injection, machine_faults
from ptrun.train.run_end import OutOfSpace


class MetricsLog:
    """Appends events to `metrics.jsonl` (always) and mirrors them to the run's `logger`: TensorBoard scalars
    in the run directory (`tensorboard`), a Weights & Biases run (`wandb`) or an MLflow run (`mlflow`), which
    also get `config` (the run's config). `jsonl` mirrors nothing."""

    def __init__(self, run_dir: str | Path, logger: str = "jsonl", config: Any = None):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.mirror = open_mirror(logger, run_dir, config)

    def write(self, event: str, **fields: Any) -> None:
        """One event. A write that finds no space is noted for the workers' next step boundary, where they all
        stop (`ptrun.train.machine_faults.note`), and nothing more is written."""
        if machine_faults.noted() is not None:
            return
        record = {"time": round(time.time(), 3), **fields}
        line = json.dumps({"event": event, **record}) + "\n"
        try:
            fault_injection.reached("metrics", -1, event=event)
            with open(self.path, "a") as f:
                f.write(line)
            if self.mirror is not None:
                self.mirror.write(event, **record)
        except Exception as e:
            if not machine_faults.no_space(e):
                raise
            machine_faults.note(OutOfSpace("metrics", self.path, len(line)))

    def close(self) -> None:
        if self.mirror is not None:
            self.mirror.close()


def open_mirror(logger: str, run_dir: str | Path, config: Any = None):
    """The writer that mirrors the events for `logger` (`ptrun.installed.LOGGER_SPECS`; see
    `ptrun.config.PtrunConfig.logger`) with the run's `config`; None for `jsonl`. Each library is imported only
    when a run asks for it."""
    writer = LOGGER_SPECS[logger].writer
    if writer is None:
        return None
    module, name = writer.rsplit(".", 1)
    return getattr(importlib.import_module(f"ptrun.report.{module}"), name)(run_dir, config)


class RunLogHandler(logging.FileHandler):
    """train.log: a record that finds no space is noted for the workers' next step boundary, where they all
    stop (`ptrun.train.machine_faults.note`), instead of logging's traceback on stderr."""

    def handleError(self, record: logging.LogRecord) -> None:
        if not machine_faults.no_space(sys.exc_info()[1]):
            super().handleError(record)
        else:
            machine_faults.note(OutOfSpace("log", self.baseFilename, len(self.format(record)) + 1))


def setup_logging(run_dir: str | Path, rank: int) -> None:
    """Rank 0 logs to run_dir/train.log and stderr; other ranks log warnings to stderr only."""
    root = logging.getLogger()
    root.handlers.clear()
    fmt = logging.Formatter(f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s")
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    err.setFormatter(fmt)
    root.addHandler(err)
    if rank == 0:
        fh = RunLogHandler(Path(run_dir) / "train.log")
        fh.setFormatter(fmt)
        root.addHandler(fh)
    root.setLevel(logging.INFO)
    # torch.distributed.pipelining logs every schedule it builds at INFO; keep it for the file only.
    logging.getLogger("torch").setLevel(logging.WARNING)


class ProgressView:
    """A rich progress bar on a terminal; one plain line per epoch otherwise (CI, log files)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.console = Console(highlight=False)
        self.live = enabled and self.console.is_terminal
        self.progress: Progress | None = None
        self.task = None

    def start_epoch(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.live:
            return
        self.progress = Progress(
            TextColumn(f"epoch {epoch + 1}/{epochs}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[speed]} samples/s"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=steps, loss="-", speed="-")

    def update(self, step: int, loss: float | None, speed: float) -> None:
        if self.progress is not None:
            self.progress.update(
                self.task, completed=step, speed=f"{speed:.0f}", loss="-" if loss is None else f"{loss:.4f}"
            )

    def end_epoch(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def print(self, message: str) -> None:
        if self.enabled:
            self.console.print(message) if self.live else print(message, flush=True)

    def show_layout(self, plan, unit_names: list[str]) -> None:
        """The layout a run trains in: a table of its stages on a terminal, one line otherwise."""
        if not self.enabled:
            return
        if self.live:
            self.console.print(layout_table(plan, unit_names))
        else:
            print(layout_line(plan), flush=True)


def _stage_rows(plan) -> list[tuple[int, int, int, int, int]]:
    """(stage, rank position, first unit, end unit, of which frozen, of which cached) per stage."""
    rows = []
    for s, (lo, hi) in enumerate(plan.stage_bounds):
        position = next(r for r in range(plan.pp) if s in plan.local_stages(r))
        frozen = max(0, min(hi, plan.frozen_units) - lo)
        cached = max(0, min(hi, plan.cached_units) - lo)
        rows.append((s, position, lo, hi, frozen, cached))
    return rows


def _replication(plan) -> str:
    """PipeDream's stage replication, said where the layout is shown."""
    if not plan.replicate_first_only:
        return ""
    return f" (first stage on {plan.dp} workers, later stages on one each: {plan.world_size} workers)"


def layout_line(plan) -> str:
    """One plain line: K, DP, M and each stage's unit range with its frozen / cached share."""
    stages = " ".join(
        f"[{lo},{hi})" + (f"f{frozen}" if frozen else "") + (f"c{cached}" if cached else "")
        for _, _, lo, hi, frozen, cached in _stage_rows(plan)
    )
    return (
        f"layout: K={plan.pp} DP={plan.dp}{_replication(plan)} M={plan.microbatches} {plan.schedule}; frozen "
        f"{plan.frozen_units}/{plan.num_units} units, cached {plan.cached_units}; stages {stages}"
    )


def layout_table(plan, unit_names: list[str]):
    """A rich Table: one row per stage (rank position, units by name, frozen and cached units)."""
    table = Table(
        title=f"K={plan.pp} x DP={plan.dp}{_replication(plan)}, M={plan.microbatches} ({plan.schedule}); "
        f"{plan.frozen_units} of {plan.num_units} units frozen, {plan.cached_units} cached",
        title_justify="left",
    )
    for column in ("stage", "rank", "units", "frozen", "cached"):
        table.add_column(column)
    for s, position, lo, hi, frozen, cached in _stage_rows(plan):
        table.add_row(
            str(s), str(position), f"{unit_names[lo]} .. {unit_names[hi - 1]} [{lo},{hi})", str(frozen), str(cached)
        )
    return table


# ---- the terminal's lines ---------------------------------------------------------------------------------


def start_line(start: dict, run_dir: str) -> str:
    """The terminal's first line, from the start event's fields."""
    params, trained = start["params"], start.get("trainable_params", start["params"])
    shown = f"{params / 1e6:.2f} M params" + (f", {trained / 1e6:.3f} M trained" if trained != params else "")
    return (
        f"ptrun: {start['model']} ({start['num_units']} units, {shown}) on "
        f"{start['train_samples']} train / {start['eval_samples']} eval samples; {start['world_size']} workers "
        f"on {start['device'].split(':')[0]}, precision {start['precision']}; run dir {run_dir}"
    )


def served(counters: dict, prefix: str = "") -> str:
    """The share of samples an entry served whole (`hits`) and, where some were, the share an entry of a
    shallower depth served with only the newly frozen units run (`advanced`)."""
    hits, advanced = counters.get(f"{prefix}hits", 0), counters.get(f"{prefix}advanced", 0)
    used = max(hits + advanced + counters.get(f"{prefix}computed", 0), 1)
    return f"{100 * hits / used:.0f}% hits" + (f" + {100 * advanced / used:.0f}% advanced" if advanced else "")


def epoch_line(epoch: int, epochs: int, stats: dict, ev: dict, plan) -> str:
    """One epoch: its loss and speed, the eval (if any), the cache's use, the layout it ran in."""
    shown = " ".join(f"eval_{k} {v:.2f}" for k, v in ev.items())
    if stats.get("cache", {}).get("cached_units"):
        c = stats["cache"]
        evaluated = any(c.get(f"eval_{k}", 0) for k in ("hits", "advanced", "computed"))
        eval_share = f", eval {served(c, 'eval_')}" if evaluated else ""
        shown += (
            f"  cache {c['cached_units']} units, {served(c)}{eval_share} "
            f"({(c['memory_bytes'] + c['disk_bytes']) / 2**20:.1f} MiB)"
        )
    return (
        f"epoch {epoch + 1}/{epochs}  loss {stats['train_loss']:.4f}  {stats['samples_per_s']:.0f} samples/s  "
        f"{stats['epoch_time_s']:.1f}s  {shown}  [K={plan.pp} DP={plan.dp} M={plan.microbatches}]"
    )


def transition_line(
    epoch: int,
    old,
    new,
    transition_s: float,
    step: int = 0,
    step_s: float | None = None,
    compile_s: float | None = None,
) -> str:
    """A layout change before `epoch` (0-based), or before its step `step` (1-based in the line); with the
    run's recent seconds a step (`step_s`), its cost in steps too; with compiled units, the seconds of it spent
    compiling the new layout's variants (`compile_s`)."""
    at = f"epoch {epoch + 1}" + (f", step {step + 1}" if step else "")
    steps = transition_s / step_s if step_s else None
    in_steps = "" if steps is None else f" ({steps:.2g} steps' time)" if steps < 10 else f" ({steps:.0f} steps' time)"
    return (
        f"{at}: {new.frozen_units} of {new.num_units} units frozen (was {old.frozen_units}); "
        f"K {old.pp} -> {new.pp}, DP {old.dp} -> {new.dp}, M {old.microbatches} -> {new.microbatches}; "
        f"stages {list(map(list, new.stage_bounds))}; transition {transition_s:.2f}s{in_steps}"
        + (f", compiling {compile_s:.2f}s" if compile_s is not None else "")
    )


def done_line(epochs: int, total_s: float, final_eval: dict, run_dir: str) -> str:
    final = " ".join(f"{k} {v:.2f}" for k, v in final_eval.items())
    return f"done: {epochs} epochs in {total_s:.1f}s; final eval: {final}; metrics in {Path(run_dir) / 'metrics.jsonl'}"
