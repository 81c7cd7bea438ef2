"""A diverged run stops: a non-finite training loss ends every worker at a step they agree on, and nothing of
the diverged state is checkpointed or exported.

A non-finite loss makes non-finite gradients, hence a non-finite global gradient norm, and `sync_and_clip` has
already made that norm the same on every rank (the gradients all-reduced over the replicas, the squared norms
over the stages). So each rank reads its own copy and the step's existing all-reduce is the agreement; how the
host reads it decides when the workers stop:

- where the host reads the norm anyway, they stop at that very step: on the CPU a read costs nothing, and fp16
  reads it every step for the scaler's verdict (with a synchronous schedule every rank is at the same step);
- on a GPU in fp32 or bf16 a read would make the host wait for the device every step. There the device keeps
  the first non-finite step in a one-element tensor (three small kernels a step), copied to pinned host memory
  without waiting and read once the copy's event has completed. The host's value rides in the stop all-reduce
  that every step boundary already starts (`ptrun.train.stop.StopRequests`), so the workers stop together a
  step or two later; before a checkpoint and at an epoch's end they wait for the copy and agree at once, so no
  checkpoint holds a diverged state and no diverged model is evaluated or exported. An asynchronous pipeline
  (PipeDream), whose stages stop only at an epoch's end, agrees the same way there and before a checkpoint.

fp16 skips a step whose gradients overflowed and halves its loss scale: one skip, or a few in a row while the
scale settles at the start, is not divergence. `SKIPS_DIVERGED` consecutive skips are: the scale has then
fallen by 2^20 (from its initial 2^16 to 1/16), so the gradients are not finite even unscaled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ptrun.train.run_end import Diverged

SKIPS_DIVERGED = 20
"""Consecutive fp16 steps skipped on an overflow that count as divergence (the scale halves at each)."""


@dataclass(frozen=True)
class StepRecord:
    """Where a step was, for the line that says where the run diverged."""

    epoch: int
    step: int
    """Its index in the epoch (from 0)."""
    global_step: int
    """Its index in the run (from 0)."""
    lr: float
    """The learning rate the schedule gave it."""


class DivergenceWatch:
    """One worker's watch over the global gradient norm, step by step (see the module's text). `flag` is what
    the host knows: 1 + the first step that diverged, 0 while none has."""

    def __init__(self):
        self.flag = 0
        self.why = "the training loss is not finite"
        self.skips = 0
        """fp16: steps skipped in a row."""
        self.records: dict[int, StepRecord] = {}
        """The steps not yet known to be finite, by global step."""
        self.first_bad: torch.Tensor | None = None
        """On a GPU: the first non-finite step (inf: none) on the device, and below its copy on the host."""
        self.host: torch.Tensor | None = None
        self.copied: torch.cuda.Event | None = None
        self.copy_step: int | None = None
        """The step the copy in flight was made after (None: none in flight)."""

    def observe(
        self,
        norm: torch.Tensor,
        stepped: bool,
        fp16: bool,
        synchronous: bool,
        record: StepRecord,
        on_host: bool | None = None,
    ) -> None:
        """After step `record`, updated with the global gradient `norm` (`stepped`: fp16 did not skip it), in a
        `synchronous` runtime or not. Raises Diverged where the host reads the norm (`on_host`; None: where that
        is free, fp16 or not a GPU) and the runtime is synchronous; otherwise `flag` says what the host knows."""
        self.records[record.global_step] = record
        on_host = fp16 or norm.device.type != "cuda" if on_host is None else on_host
        if fp16:
            self.skips = 0 if stepped else self.skips + 1
            if self.skips < SKIPS_DIVERGED:
                return self._forget_before(record.global_step - self.skips + 1)
            self.why = f"fp16 overflowed {self.skips} steps in a row (each skipped, its loss scale halved)"
            return self._found(record.global_step - self.skips + 1, at_once=synchronous)
        if on_host:
            if math.isfinite(norm.item()):
                return self._forget_before(record.global_step + 1)
            return self._found(record.global_step, at_once=synchronous)
        if self.first_bad is None:
            self.first_bad = torch.full((), math.inf, dtype=torch.float64, device=norm.device)
            self.host = torch.full((), math.inf, dtype=torch.float64, pin_memory=norm.device.type == "cuda")
            self.copied = torch.cuda.Event() if norm.device.type == "cuda" else None
        bad_at = torch.where(torch.isfinite(norm), math.inf, float(record.global_step))
        torch.fmin(self.first_bad, bad_at, out=self.first_bad)
        self._read_copy(record.global_step)

    def read_now(self) -> None:
        """Where the host waits for the device anyway (a checkpoint, an epoch's end): `flag` up to date."""
        if self.first_bad is not None:
            self._take(self.first_bad.item(), up_to=max(self.records, default=-1))

    def report(self, global_step: int) -> dict:
        """What the launcher's line says of the step the workers agreed diverged."""
        return {**asdict(self.records[global_step]), "why": self.why}

    def _read_copy(self, global_step: int) -> None:
        """Without waiting: the copy made at an earlier step if it has arrived, then a new copy."""
        if self.copy_step is not None and (self.copied is None or self.copied.query()):
            self._take(self.host.item(), up_to=self.copy_step)
            self.copy_step = None
        if self.copy_step is None:
            self.host.copy_(self.first_bad, non_blocking=self.copied is not None)
            if self.copied is not None:
                self.copied.record()
            self.copy_step = global_step

    def _take(self, first_bad: float, up_to: int) -> None:
        """The device's first non-finite step as of step `up_to` (inf: none)."""
        if math.isfinite(first_bad):
            self._found(int(first_bad), at_once=False)
        else:
            self._forget_before(up_to + 1)

    def _found(self, global_step: int, at_once: bool) -> None:
        self.flag = self.flag or global_step + 1  # the first: the steps after it diverge too
        if at_once:
            raise Diverged(global_step)

    def _forget_before(self, global_step: int) -> None:
        for g in [g for g in self.records if g < global_step]:
            del self.records[g]
