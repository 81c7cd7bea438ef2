"""The run's record on one worker: its events (`metrics.jsonl` and the trackers, rank 0), the terminal's lines
and live view, the clocks of its start and of its steps, the recordings of chosen steps (the timeline and the
profile), the statistics of each epoch and the savings line at the end. The trainer says what happened; this
part says it, in the formats of `run_output.py`."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from ptrun.config import PtrunConfig
from ptrun.layout.plan import Plan
from ptrun.report.savings import run_savings
from ptrun.train import epoch_stats
from ptrun.train.run_output import MetricsLog, ProgressView, done_line, epoch_line, start_line, transition_line
from ptrun.train.state import EpochSums, TrainState
from ptrun.train.traces import StepTraces

AllSum = Callable[[list[float] | torch.Tensor], torch.Tensor]
"""The sum over every rank of the job (`ptrun.train.epoch_stats.all_sum`)."""


class RunRecord:
    """What one worker records of its run (rank 0 writes the events and the lines)."""

    def __init__(
        self,
        cfg: PtrunConfig,
        rank: int,
        device: torch.device,
        start_clock: epoch_stats.StartClock,
        all_sum: AllSum,
        tuning=None,
    ):
        self.cfg, self.rank = cfg, rank
        self.start_clock = start_clock
        """The start's phases, for the start event."""
        self.tuning = tuning
        """The micro-batch tuning (`ptrun.layout.tuning.Tuning`), or None."""
        self.tuned = tuning.event_fields() if tuning is not None else {}
        """Its fields, for the first plan event this process writes."""
        self.resumed_from: str | None = None
        """The checkpoint the run resumed from."""
        self.view = ProgressView(enabled=rank == 0)
        # The live view's running loss is an all-reduce, so every rank must agree that there is a view.
        self.live = bool(all_sum([float(self.view.live)]).item())
        self.traces = StepTraces(cfg.train.timeline_step, cfg.train.profile_step, cfg.run_dir, rank, device)
        self.clock = epoch_stats.StepClock(device)
        self.metrics: MetricsLog | None = None
        self.announced = False
        """Whether the start event is written: from then on the run has a record to continue."""

    def open(self) -> None:
        """Open the events' file once the start has succeeded: a failed start leaves no new file."""
        if self.rank == 0:
            self.metrics = MetricsLog(self.cfg.run_dir, self.cfg.logger, self.cfg)

    def event(self, event: str, **fields) -> None:
        """A record in metrics.jsonl (and the trackers); rank 0 keeps them."""
        if self.metrics is not None:
            self.metrics.write(event, **fields)

    def print(self, line: str) -> None:
        self.view.print(line)

    # ---- the run's milestones ---------------------------------------------------------------------------
    def announce(
        self, layered, data, world_size: int, device: torch.device, plan: Plan, compiler=None, compiling=None
    ) -> None:
        """The start event and the terminal's first lines (the start, the micro-batch tuning's choice, whether
        the units compile and why (`compiling`, a `CompileDecision`), what compiling them cost (`compiler`),
        the layout)."""
        cfg = self.cfg
        self.announced = True
        start = dict(
            world_size=world_size,
            recipe=cfg.recipe,
            model=cfg.model.name,
            num_units=len(layered.units),
            num_blocks=layered.num_blocks,
            params=sum(s.numel() for s in layered.param_shapes.values()),
            trainable_params=sum(s.numel() for n, s in layered.param_shapes.items() if n not in layered.fixed),
            train_samples=len(data.train),
            eval_samples=len(data.eval),
            resumed_from=self.resumed_from,
            device=str(device),
            precision=cfg.train.precision,
        )
        self.event("start", **start, worker_start_time=self.start_clock.began, start_phases=self.start_clock.phases)
        self.print(start_line(start, cfg.run_dir))
        if self.tuning is not None:
            self.print(self.tuning.summary())
        if compiling is not None:
            self.compile_decided(compiling, 0, 0)
        if compiler is not None:
            self.print(compiler.summary())
        self.view.show_layout(plan, layered.unit_names)

    def compile_decided(self, decision, epoch: int, step: int, compiled_s: float | None = None) -> None:
        """A `train.compile` decision (`ptrun.compiling.price.CompileDecision`) before step `step` of
        `epoch`: its `compile` event and its line (`compiled_s`: the seconds of a layout built again compiled)."""
        self.event("compile", epoch=epoch, step=step, **decision.event_fields(), compiled_s=compiled_s)
        self.print(decision.line + (f"; compiled in {compiled_s:.1f} s" if compiled_s is not None else ""))

    def epoch_plan(self, epoch: int, step: int, moved: dict, plan: Plan) -> None:
        """The plan event an epoch starts with (`moved`: the transition into it, if any); the first one carries
        the micro-batch tuning's fields."""
        tuned, self.tuned = self.tuned, {}
        self.event("plan", epoch=epoch, step=step, **{"transition_s": 0.0, **moved}, **plan.to_dict(), **tuned)

    def transition(
        self, epoch: int, old: Plan, new: Plan, cost: dict, position: int, announce: bool, unit_names: list[str]
    ) -> None:
        """A layout change before step `position` of `epoch`, shown and (`announce`: inside an epoch) recorded."""
        self.print(
            transition_line(epoch, old, new, cost["transition_s"], position, self.clock.step_s, cost.get("compile_s"))
        )
        self.view.show_layout(new, unit_names)
        if announce:
            self.event("plan", epoch=epoch, step=position, **cost, **new.to_dict())

    def epoch_ended(self, epoch: int, epoch_stats: dict, ev: dict, plan: Plan) -> None:
        """The epoch event and line."""
        self.event("epoch", epoch=epoch, eval=ev, **epoch_stats)
        self.print(epoch_line(epoch, self.cfg.train.epochs, epoch_stats, ev, plan))

    def training_ended(self) -> None:
        """The last step is done: a profile still running is written."""
        self.traces.close()

    def ended(self, total_s: float, state: TrainState) -> None:
        """The run's end: what freezing saved, the end event and the last lines."""
        epochs, run_dir = self.cfg.train.epochs, self.cfg.run_dir
        saved = run_savings(run_dir) if self.metrics is not None else None
        if saved is not None:
            self.event("savings", **saved.event_fields())
        self.event("end", epochs=epochs, total_time_s=total_s, final_eval=state.last_eval, best_eval=state.best_eval)
        self.print(done_line(epochs, total_s, state.last_eval, run_dir))
        if saved is not None:
            self.print(saved.line())

    def stopped(self, why: dict, state: TrainState) -> None:
        """Where a stop left the run (once it had started training), and `why`: the signal, or the divergence."""
        self.view.end_epoch()
        if self.announced:
            self.event(
                "stopped",
                **why,
                epoch=state.epoch,
                global_step=state.global_step,
                checkpoint_step=state.last_checkpoint_step,
            )

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    # ---- steps ------------------------------------------------------------------------------------------
    def step_begins(self, runtime, global_step: int) -> None:
        """Before step `global_step`'s batch goes to the runtime: a recording may start."""
        self.traces.begin(runtime, global_step)

    def step_passed(self, runtime, plan: Plan, global_step: int) -> None:
        """After step `global_step`'s passes, before its update: a timeline may end."""
        self.traces.end(runtime, plan, global_step)

    def live_update(self, step: int, sums: EpochSums, all_sum: AllSum) -> None:
        """Collective every `train.log_every_steps` steps when there is a live view: its running loss."""
        if (step + 1) % self.cfg.train.log_every_steps == 0 and self.live:
            running = all_sum(sums.loss).item() / (step + 1)
            self.view.update(step + 1, running, sums.samples / (time.perf_counter() - sums.t0))

    def epoch_stats(
        self, sums: EpochSums, elapsed: float, steps: int, resumed_at: int, all_sum: AllSum, extra: dict
    ) -> dict:
        """Collective: the epoch event's statistics from its sums and its seconds (`extra`: what the layout and
        the scaler add), the first steps' times on the epoch they fell in."""
        seen = all_sum(sums.seen)
        resumed = {"resumed_at_step": resumed_at} if resumed_at else {}
        return {
            "train_loss": all_sum(sums.loss).item() / steps,
            "samples_per_s": sums.samples / elapsed,
            "epoch_time_s": elapsed,
            "lr": sums.lr,
            "steps": steps,
            "measure_s": sums.measure_s,
            "samples": int(sums.samples_before + sums.samples),
            **resumed,
            "sample_uses_min": int(seen.min().item()),
            "sample_uses_max": int(seen.max().item()),
            **extra,
            **self.clock.epoch_fields(),
        }
