"""`train.compile` in a run: the figures `ptrun.compiling.price.decide` prices, gathered where they are
known, and the builder that compiles (or not) from then on.

- At the start: the steps the run has left, the eager step time this machine measured for the model and
  layout (kept by an earlier run, or the micro-batch tuning's), the graphs the first layout needs and how many
  of them inductor's cache holds. With no step time known yet, `auto` starts eager, ends its first segment
  once its `timed_steps` are timed (`segment_end`) and decides there (`after_first_steps`), compiling then if
  it pays.
- At a transition of a compiled run: the new layout's variants priced the same way against what compiling
  still saves; where they do not pay, the new layout runs eager.
- What the run measured is kept for the next (`ptrun.compiling.kept_costs`): the per-graph seconds and the
  graphs the first layout's compile took, and the step time, eager or compiled.

Rank 0 gathers and decides; every rank takes its decision (a broadcast), so the workers compile together.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ptrun.compiling.compiler import _max_over_ranks, make_compiler, ruled_out, variants
from ptrun.compiling.kept_costs import KeptCosts, inductor_entries, model_key
from ptrun.compiling.price import CompileDecision, decide
from ptrun.data.splits import first_sample
from ptrun.layout.plan import Plan

if TYPE_CHECKING:
    from ptrun.auto.autodp import Builder

log = logging.getLogger("ptrun.train.trainer")


class Compiling:
    """One worker's `train.compile`: its decisions and what it keeps of the run's measurements."""

    def __init__(self, cfg, layered, data, device: torch.device, rank: int, timed_steps: int):
        self.cfg, self.layered, self.data, self.device, self.rank = cfg, layered, data, device, rank
        self.timed_steps = timed_steps
        """Steps a process runs before its step time prices compiling: the trainer's twice its clock's warm-up
        (`ptrun.train.epoch_stats.WARM_UP_STEPS`), so the median of the times between them (`StepClock.step_s`) is a
        step's after the warm-up."""
        self.setting = cfg.train.compile
        self.why_not = ruled_out(device, cfg.pipe.schedule)
        self.kept = KeptCosts(device, cfg.train.compile_mode) if rank == 0 else None
        """What this machine measured (rank 0's): an eager run keeps its step time too."""
        self.tuned_step_s: float | None = None
        """The micro-batch tuning's eager step time of the first layout, where it measured one."""
        probe = dict(data.train[[0]])
        self.model_fields = {
            "model": asdict(cfg.model),
            "inputs": {k: [list(probe[k].shape[1:]), str(probe[k].dtype)] for k in layered.input_names if k in probe},
            "batch": [cfg.train.global_batch_size, cfg.train.pipeline_batch_size, cfg.auto.batch],
            "precision": cfg.train.precision,
            "recompute": cfg.pipe.recompute,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        }
        self.decision: CompileDecision | None = None
        self.pending = False
        """`auto` started eager without a step time: it decides again after the first steps."""
        self.compiled: set = set()
        """The variants compiled so far in this run (`ptrun.compiling.compiler.variants`)."""
        self._before = inductor_entries() if self.kept is not None and self.setting is not False else set()
        """Inductor's cache entries before this run's first compile (the ones it leaves are the model's)."""
        self._first_key: str | None = None
        """The layout the first compile was for."""
        self._learned: set[bool] = set()
        """Whether an eager (False) and a compiled (True) step time were kept."""
        self._since = 0
        """The steps this process had trained when its units began to run the way they run now."""

    def key(self, plan: Plan) -> str:
        """The kept record of the model in `plan`'s layout (`ptrun.compiling.kept_costs`)."""
        return model_key({**self.model_fields, "layout": plan.to_dict()})

    def _decide(self, plan: Plan, steps: int, step_s: float | None, new_only: bool = False) -> CompileDecision:
        """Collective: rank 0's decision on `plan` (`new_only`: pricing only the variants not compiled yet)."""
        box: list = [None]
        if self.kept is not None:
            need = variants(self.layered, plan)
            graphs = sum(g for v, g in need.items() if not (new_only and v in self.compiled))
            figures = self.kept.figures(self.key(plan), steps, step_s, graphs, inductor_entries())
            if new_only:  # a transition: the graphs estimated for its new variants, never a whole layout's record
                figures = replace(figures, graphs=graphs, cached=min(figures.cached, graphs))
                known = self.decision.figures if self.decision is not None else None
                if known is not None and known.saving_measured and not figures.saving_measured:
                    # what compiling saved this model, measured, over a new layout's default
                    figures = replace(figures, saving=known.saving, saving_measured=True)
            box[0] = decide(self.setting, figures, self.why_not)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def _with_compiler(self, builder: Builder, plan: Plan, on: bool) -> Builder:
        if not on:
            return replace(builder, compiler=None) if builder.compiler is not None else builder
        self.compiled |= set(variants(self.layered, plan))
        self._first_key = self._first_key or self.key(plan)
        if builder.compiler is not None:
            return builder
        if self.kept is not None:
            self._before = inductor_entries()
        probe = first_sample(self.data, self.layered.input_names)
        return replace(builder, compiler=make_compiler(self.cfg.train, self.layered, self.device, probe))

    def start(self, builder: Builder, plan: Plan, steps: int) -> Builder:
        """Collective, before the first layout is built: the start's decision, and the builder that follows
        it (`train.compile=true` built its compiler already, for the micro-batch tuning)."""
        if self.setting is False:
            return builder
        self.decision = self._decide(plan, steps, self.tuned_step_s)
        figures = self.decision.figures
        # only a step time is missing: a forced setting, a ruled-out or a saving of nothing are decided for good
        self.pending = figures.step_s is None and figures.saving > 0 and not self.decision.forced and not self.why_not
        return self._with_compiler(builder, plan, self.decision.compile)

    def segment_end(self, position: int, end: int, trained: int) -> int:
        """Where a segment from step `position` to `end` ends: a start that waits for its first timed steps
        (`trained` so far) ends it after them, so it decides there and not at the next freeze interval's end."""
        return min(end, position + self.timed_steps - trained) if self.pending and trained < self.timed_steps else end

    def after_first_steps(self, builder: Builder, plan: Plan, steps: int, step_s: float | None, trained: int):
        """Collective at a decision point (between two segments): once the first steps are timed, what they
        measured is kept, and a start that waited for them decides now. Returns the builder (with a compiler
        where compiling pays: the caller builds the layout again) and that decision (None where none was
        made)."""
        if trained - self._since < self.timed_steps:
            return builder, None
        self._learn(builder, plan, step_s)
        if not self.pending:
            return builder, None
        self.pending = False
        self.decision = self._decide(plan, steps, step_s)
        if self.decision.compile:
            self._since = trained  # the compiled steps are timed from here (the caller clears the clock's)
        return self._with_compiler(builder, plan, self.decision.compile), self.decision

    def at_transition(self, builder: Builder, plan: Plan, steps: int, step_s: float | None):
        """Collective, before a transition to `plan` in a compiled run of `auto`: its new variants priced
        against what compiling still saves (the eager step time from the compiled one); where they do not pay
        the new layout runs eager. Returns the builder and the decision (None where nothing was priced)."""
        if builder.compiler is None:
            return builder, None
        if self.setting is True:
            self.compiled |= set(variants(self.layered, plan))
            return builder, None
        saving = self.decision.figures.saving if self.decision and self.decision.figures else 0.0
        eager_s = step_s / max(1.0 - saving, 0.05) if step_s else None
        self.decision = self._decide(plan, steps, eager_s, new_only=True)
        return self._with_compiler(builder, plan, self.decision.compile), self.decision

    def _learn(self, builder: Builder, plan: Plan, step_s: float | None) -> None:
        """Collective, the first time the units run eager and the first time they run compiled: the step time
        of this layout, and with it compiled what the first compile cost (the busiest worker's), kept for the
        next run."""
        compiler = builder.compiler
        if (compiler is not None) in self._learned:
            return
        self._learned.add(compiler is not None)
        cost = _max_over_ranks(compiler.counts.snapshot()) if compiler is not None else None
        if self.kept is None:
            return
        self.kept.learn_step(self.key(plan), compiler is not None, step_s)
        if cost is not None and self._first_key is not None:
            self.kept.learn_compile(self._first_key, cost, inductor_entries() - self._before)
        self.kept.save()
