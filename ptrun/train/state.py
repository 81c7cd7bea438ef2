"""Where a run is: one value that every checkpoint saves whole and a resume loads whole."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import ClassVar

import torch


def metric_key(result: dict) -> str:
    """The eval number that ranks checkpoints: the GLUE score, SQuAD F1 or top-1 when there is one (higher
    is better), else the loss (lower is better)."""
    return next((k for k in ("score", "f1", "top1") if k in result), "loss")


@dataclass
class TrainState:
    """The run's position and what it has learnt of itself; the rest of a worker's state (weights, optimizer
    state, the layout) is rebuilt from the checkpoint's files and the Plan.

    A value: each change makes a new one (`dataclasses.replace`, as `ptrun.train.step.train_step` does at each
    step), and nothing changes one in place, so a state handed to a checkpoint or a record stays as it was.
    Not frozen: a frozen dataclass's constructor would add microseconds to every step."""

    epoch: int = 0
    """The epoch being trained (the next one at a boundary)."""
    step_in_epoch: int = 0
    """Where the epoch resumes: non-zero only after a mid-epoch checkpoint."""
    global_step: int = 0
    """Optimizer steps taken (or skipped on an fp16 overflow) since the run began."""
    interval: int = 0
    """The freeze interval in force: the controller has decided up to its start."""
    interval_steps: int = 0
    """Steps trained in that interval so far (its gradient norms are averaged over them)."""
    last_checkpoint_step: int = 0
    """The global step of the newest checkpoint."""
    best_eval: dict = field(default_factory=dict)
    """The best evaluation so far by `metric_key`, with its epoch."""
    last_eval: dict = field(default_factory=dict)
    """The newest evaluation."""
    global_batch: int = 0
    """The global batch that `step_in_epoch` counts in (0: not known yet); a resume whose layout has another
    maps the step to the same sample offset (`ptrun.train.checkpoint.checkpoints.resume_step`)."""
    progress: dict[str, torch.Tensor] = field(default_factory=dict)
    """Mid-epoch: the epoch's sums so far (summed over the ranks: loss, sample uses, samples); and at any
    position, what the freeze measurement has taken of the open interval (an interval may span a boundary)."""

    def to_dict(self) -> dict:
        """The JSON part (`progress`, tensors, is written beside it)."""
        return {k: v for k, v in asdict(replace(self, progress={})).items() if k != "progress"}

    @classmethod
    def from_dict(
        cls, saved: dict, progress: dict[str, torch.Tensor] | None = None, *, interval: int = 0, global_batch: int = 0
    ) -> TrainState:
        """The state a checkpoint holds (its JSON part and its tensors). `interval` and `global_batch` stand in
        for a checkpoint written before they were saved. A checkpoint's position is its last checkpoint step."""
        known = {f.name for f in fields(cls)} - {"progress"}
        values = {k: v for k, v in saved.items() if k in known}
        values.setdefault("interval", interval)
        values.setdefault("global_batch", global_batch)
        values["last_checkpoint_step"] = values.get("global_step", 0)
        return cls(**values, progress=dict(progress or {}))

    def remembered(self, ev: dict) -> TrainState:
        """This state with the newest eval kept, and the best one by its ranking metric."""
        if not ev:
            return self
        key = metric_key(ev)
        better = (
            (ev[key] > self.best_eval.get(key, -1))
            if key != "loss"
            else (ev[key] < self.best_eval.get(key, float("inf")))
        )
        return replace(self, last_eval=ev, best_eval={**ev, "epoch": self.epoch} if better else self.best_eval)


@dataclass(frozen=True)
class Due:
    """What falls after one step of an epoch, decided once before the step runs. The loop reads it twice: when
    it feeds the step (an asynchronous pipeline drains first) and when the step's update is applied, which
    PipeDream does steps later, so the loop keeps it by step until then."""

    segment_ends: bool
    """A decision point follows: a freeze decision, `train.compile=auto`'s after its first timed steps, or the
    epoch's end (`Positions.segment_end`)."""
    checkpoint: bool
    """A mid-epoch checkpoint (`checkpoint.every_steps`): written after the step, or where the segment ends,
    after the decision, so that a restart resumes in the new layout."""

    @property
    def drain(self) -> bool:
        """Every update in flight is applied by the end of the step."""
        return self.segment_ends or self.checkpoint

    @property
    def checkpoint_now(self) -> bool:
        """The checkpoint is written as soon as the step's update is applied."""
        return self.checkpoint and not self.segment_ends

    @staticmethod
    def of(segment_ends: bool, checkpoint: bool) -> Due:
        """The Due of these two answers: one of four values made once, so a step allocates none."""
        return _DUES[segment_ends][checkpoint]


_DUES = ((Due(False, False), Due(False, True)), (Due(True, False), Due(True, True)))
"""Every `Due`, by (segment_ends, checkpoint)."""


@dataclass(frozen=True)
class Boundary:
    """What the loop does at one kind of boundary, in this order (`ptrun.train.trainer.Trainer._boundary`):
    decide, compile if it pays, checkpoint if due, stop if agreed. One value per kind, made once: the boundary
    after each step allocates none."""

    decides: bool = False
    """The controller decides where a freeze interval has ended since its last decision."""
    announce: bool = False
    """A layout change decided here writes its own `plan` event (inside an epoch; an epoch's start writes one)."""
    stops_cache: bool = False
    """First, AutoCache stops where the epoch served its samples more slowly than recomputing them."""
    compiles: bool = False
    """`train.compile=auto` decides once the first steps are timed, between two segments of steps."""
    polls: bool = False
    """After a step of a synchronous runtime: the stop all-reduce started a step before is read, the next one
    started (`ptrun.train.stop.StopRequests.poll`)."""
    waits: bool = False
    """Every worker's word up to now is read (`StopRequests.now`): no step's compute is left to hide the
    all-reduce. A boundary with a checkpoint due waits too: a checkpoint never holds a diverged state."""
    stops: bool = False
    """A stop the workers agreed on ends the run here: a checkpoint if none is at this step, then Interrupted."""

    # The kinds, one value each (set below).
    EPOCH_STARTS: ClassVar[Boundary]
    """Before the run's first epoch (nothing is recorded yet) and each next one: a stop agreed by then."""
    RESUMES: ClassVar[Boundary]
    """Where an epoch starts or resumes: a decision still due there (the epoch's `plan` event records it)."""
    SEGMENT_STARTS: ClassVar[Boundary]
    """Before each segment of an epoch's steps: a decision inside the epoch, `train.compile=auto`'s, and the
    checkpoint due at the previous segment's end, written after them so that a restart resumes in the new layout."""
    STEP_ENDS: ClassVar[Boundary]
    """After a step of a synchronous runtime, inside the epoch: a checkpoint due, a stop."""
    LAST_STEP_ENDS: ClassVar[Boundary]
    """After an epoch's last step of a synchronous runtime: a stop polled there ends the run at the epoch's end."""
    PIPELINED_STEP_ENDS: ClassVar[Boundary]
    """After a step of an asynchronous runtime (later steps are in flight): a checkpoint due; a stop waits for the
    epoch's end."""
    TRAINED: ClassVar[Boundary]
    """An epoch's steps or the run's end: the stop all-reduce in flight ends before the collectives that follow,
    and the run stops on divergence or a full disk agreed by then."""
    EPOCH_ENDS: ClassVar[Boundary]
    """Between two epochs: AutoCache's stop, the next epoch's layout, then the checkpoint due, so that a restart
    resumes in that layout (a stop is `EPOCH_STARTS`')."""
    LAST_EPOCH_ENDS: ClassVar[Boundary]
    """After the run's last epoch: the checkpoint due, and nothing decided."""


Boundary.EPOCH_STARTS = Boundary(waits=True, stops=True)
Boundary.RESUMES = Boundary(decides=True)
Boundary.SEGMENT_STARTS = Boundary(decides=True, announce=True, compiles=True)
Boundary.STEP_ENDS = Boundary(polls=True, stops=True)
Boundary.LAST_STEP_ENDS = Boundary(polls=True)
Boundary.PIPELINED_STEP_ENDS = Boundary()
Boundary.TRAINED = Boundary(waits=True)
Boundary.EPOCH_ENDS = Boundary(decides=True, stops_cache=True)
Boundary.LAST_EPOCH_ENDS = Boundary()


@dataclass
class EpochSums:
    """What one rank adds up over an epoch."""

    loss: torch.Tensor
    """This rank's share of the summed step losses (last stages only)."""
    seen: torch.Tensor
    """Uses of each training sample (first stages only)."""
    samples_before: float = 0.0
    """Samples the epoch had trained before a mid-epoch resume."""
    samples: float = 0.0
    t0: float = field(default_factory=time.perf_counter)
    lr: float = 0.0
    measure_s: float = 0.0
    """Host seconds this rank spent taking the freeze policy's measure (per step: its share of the update,
    and counting it)."""

    def so_far(self, all_sum) -> dict[str, torch.Tensor]:
        """Collective (`all_sum` sums over the ranks): the epoch's sums so far, for a mid-epoch checkpoint."""
        return {
            "loss_sum": all_sum(self.loss.reshape(1)).cpu(),
            "seen": all_sum(self.seen).cpu(),
            "samples": torch.tensor([self.samples_before + self.samples], dtype=torch.float64),
        }
