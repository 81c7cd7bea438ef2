"""`train.compile=auto`: compile only where it pays, as a pure function of the figures a run gathers.

What the run will train: its remaining steps times the eager step time (measured on this machine: kept from an
earlier run of the same model and layout, the micro-batch tuning's, or the first steps'). What compiling costs:
the graphs the layout needs, each one cold (inductor builds it) or warm (its on-disk cache holds it), at this
machine's per-graph seconds. What a compiled step saves: the fraction measured on this machine for this model
and kept, or with no measurement yet `DEFAULT_SAVING`. Compiling is chosen when the seconds it saves exceed
the seconds it costs by `MARGIN`; the decision's line names every figure it rests on
(`ptrun.compiling.kept_costs` keeps the measurements, the trainer gathers them).
"""

from __future__ import annotations

from dataclasses import dataclass

MARGIN = 1.5
"""Compile only where the seconds saved are at least 1.5 times the seconds spent compiling. Each side is an
estimate (a step time measured over a few steps, a saving measured on an earlier run or defaulted, a
per-graph cost from one earlier compile): a wrong `on` then needs both to be off by half, and a choice this
close loses little either way, since the two runs' wall times differ by less than a third of the cost."""

DEFAULT_SAVING: dict[str, float] = {"cpu": 0.0, "cuda": 0.10}
"""The fraction of an eager step a compiled step saves, by device type, until this machine has measured it
for the model: on the CPU none (inductor's CPU kernels made no recipe's steps faster: 0.94x and 0.99x,
docs/results.md); on a GPU a tenth, the low end of what regional compilation of transformer blocks gains
where steps are launch-bound (fused norms, activations and residual adds), so an unmeasured model compiles
only where a tenth of its training is well over the compile."""

DEFAULT_GRAPH_S: dict[str, tuple[float, float]] = {"cpu": (2.3, 0.2), "cuda": (2.3, 0.2)}
"""Seconds a graph costs (cold: inductor builds it; warm: its cache serves it), by device type, until this
machine has measured them: the default recipe's 15 graphs took 35 s cold and 3 s warm on 2 CPU cores; a GPU's
graphs are not cheaper (triton's kernels and their autotuning), so it starts from the same figures."""


@dataclass(frozen=True)
class CompileFigures:
    """What the decision rests on, gathered by the run."""

    steps: int
    """Training steps still to run."""
    step_s: float | None
    """Seconds of an eager step on this machine; None before any is known (then the run starts eager and
    decides again after its first steps)."""
    graphs: int
    """Graphs the layout needs compiled (forward and backward per trained variant, one per no-grad one)."""
    cached: int
    """Of those, the ones inductor's cache holds."""
    cold_s: float
    """Seconds to build one graph on this machine."""
    warm_s: float
    """Seconds to load one graph from inductor's cache."""
    saving: float
    """Fraction of an eager step a compiled step saves (negative: compiled steps are slower)."""
    saving_measured: bool = False
    """Whether `saving` was measured on this machine for this model (else the default)."""

    @property
    def train_s(self) -> float:
        return self.steps * (self.step_s or 0.0)

    @property
    def compile_s(self) -> float:
        cached = min(self.cached, self.graphs)
        return (self.graphs - cached) * self.cold_s + cached * self.warm_s

    @property
    def saved_s(self) -> float:
        return self.train_s * self.saving


@dataclass(frozen=True)
class CompileDecision:
    compile: bool
    line: str
    """`compile: on|off (...)`: the decision and its figures."""
    figures: CompileFigures | None = None
    forced: bool = False
    """`train.compile` was true or false: no pricing decided it."""

    def event_fields(self) -> dict:
        """For the plan event: the decision and what it rested on."""
        f = self.figures
        out = {"compile": self.compile, "forced": self.forced}
        if f is not None:
            out.update(
                steps=f.steps,
                step_s=f.step_s,
                graphs=f.graphs,
                cached_graphs=f.cached,
                compile_estimate_s=round(f.compile_s, 3),
                saving=f.saving,
                saving_measured=f.saving_measured,
            )
        return {"compile_decision": out}


def graphs_phrase(f: CompileFigures) -> str:
    """`15 cold graphs ~35 s`, `15 cached graphs ~3 s` or `15 graphs, 12 cached, ~10 s`."""
    cached = min(f.cached, f.graphs)
    if cached == 0:
        kind = f"{f.graphs} cold graphs"
    elif cached == f.graphs:
        kind = f"{f.graphs} cached graphs"
    else:
        kind = f"{f.graphs} graphs, {cached} cached,"
    return f"{kind} ~{_seconds(f.compile_s)}"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s >= 1.95 else f"{s:.1f} s"


def decide(setting, figures: CompileFigures, why_not: str = "") -> CompileDecision:
    """`train.compile` (`true`, `false` or `auto`) priced on `figures`. `why_not`: what rules compiling out
    on this machine or schedule, which `auto` obeys (and `true` was refused for before any worker started)."""
    if isinstance(setting, bool):  # `true` and `false` force it; `true` says what it will cost
        cost = f"; {graphs_phrase(figures)}" if setting else ""
        line = f"compile: {'on' if setting else 'off'} (train.compile={str(setting).lower()}{cost})"
        return CompileDecision(setting, line, figures, forced=True)
    if why_not:
        return CompileDecision(False, f"compile: off ({why_not})", figures)
    rate = "" if figures.saving_measured else " at the default rate"
    if figures.step_s is None:
        if figures.saving <= 0:  # no step time would make it pay: decided now
            return CompileDecision(
                False,
                f"compile: off (a compiled step saves nothing{rate or ', measured'}; {graphs_phrase(figures)})",
                figures,
            )
        return CompileDecision(
            False, f"compile: off until the first steps are timed ({graphs_phrase(figures)})", figures
        )
    on = figures.saved_s > 0 and figures.saved_s >= MARGIN * figures.compile_s
    saved = figures.saved_s
    effect = f"saves ~{_seconds(saved)}" if saved >= 0 else f"compiled steps take ~{_seconds(-saved)} more"
    trains = f"trains ~{_seconds(figures.train_s)}, {effect}{rate}"
    return CompileDecision(on, f"compile: {'on' if on else 'off'} ({trains}; {graphs_phrase(figures)})", figures)
