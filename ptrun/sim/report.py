"""What `ptrun plan` prints: each component combination's simulated epochs (the plan and its estimated time)
and the speedups over the baseline, beside the paper's where it reports one."""

from __future__ import annotations

from collections.abc import Sequence

from ptrun.sim.simulate import COMBINATIONS, PAPER_FIG9, PAPER_TABLE1, EpochRecord, speedups, total_seconds


def hms(seconds: float) -> str:
    s = round(seconds)
    h, m, s = s // 3600, s % 3600 // 60, s % 60
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{seconds:.1f}s"


LEGEND = (
    "frozen / cached: units of the model's prefix; stage max: the slowest stage's micro-batch time; allred: "
    "the gradient all-reduce of a step; cache: its cache read + fill; epoch: steps x step + a layout change"
)


def epoch_table(records: Sequence[EpochRecord]) -> str:
    """One line per epoch: the plan (K, DP, M, frozen and cached units) and its estimated time."""
    head = (
        f"{'epoch':>5} {'frozen':>7} {'cached':>6} {'K':>2} {'DP':>3} {'M':>3} {'batch':>6} {'steps':>6} "
        f"{'stage max':>9} {'allred':>7} {'cache':>7} {'step':>7} {'samples/s':>9} {'epoch':>10}"
    )
    lines = [head]
    for r in records:
        p, st = r.plan, r.step
        per_s = r.steps * r.global_batch / max(r.time_s - r.transition_s, 1e-12)
        lines.append(
            f"{r.epoch:>5} {p.frozen_units:>3}/{p.num_units:<3} {p.cached_units:>6} {p.pp:>2} {p.dp:>3} "
            f"{p.microbatches:>3} {r.global_batch:>6} {r.steps:>6} {1e3 * max(st.stage_s):>7.1f}ms "
            f"{1e3 * st.allreduce_s:>5.0f}ms {1e3 * (st.cache_read_s + st.cache_fill_s):>5.0f}ms "
            f"{st.total_s:>6.2f}s {per_s:>9.0f} {hms(r.time_s):>10}"
        )
    lines.append(f"{'total':>5} {hms(total_seconds(records))}")
    return "\n".join(lines)


def summary(recipe: str | None, results: dict[str, list[EpochRecord]]) -> str:
    """Table 1 and Figure 9 in the paper's shape, the paper's numbers beside ours where it has them."""
    up = speedups(results)
    base, ours = total_seconds(results["baseline"]), total_seconds(results["all"])
    t1 = PAPER_TABLE1.get(recipe or "")
    lines = [f"Table 1 ({recipe}):          simulated      paper"]
    lines.append(f"  baseline time        {hms(base):>12} {hms(t1[1]) if t1 else '-':>10}")
    lines.append(f"  PipeTransformer time {hms(ours):>12} {hms(t1[2]) if t1 else '-':>10}")
    lines.append(f"  speedup              {up['all']:>11.2f}x {f'{t1[0]:.2f}x' if t1 else '-':>10}")
    fig = PAPER_FIG9.get(recipe or "", {})
    lines.append("Figure 9 (speedup over the baseline):  simulated   paper")
    for name, (label, _) in COMBINATIONS.items():
        if name != "baseline":
            paper = f"{fig[name]:.2f}x" if name in fig else "-"
            lines.append(f"  {label:<38} {up[name]:>6.2f}x {paper:>7}")
    return "\n".join(lines)


def report(recipe: str | None, results: dict[str, list[EpochRecord]]) -> str:
    """The per-combination tables, then the summary."""
    parts = [LEGEND]
    for name, records in results.items():
        label, switches = COMBINATIONS[name]
        flags = " ".join(f"{k}={'on' if v else 'off'}" for k, v in switches.items())
        parts.append(f"== {label}  [auto: {flags}]\n{epoch_table(records)}")
    parts.append(summary(recipe, results))
    return "\n\n".join(parts)
