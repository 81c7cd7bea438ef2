"""The terminal view: a layout table on a terminal, plain lines without one (CI, log files)."""

from __future__ import annotations

import io

from rich.console import Console

from ptrun.layout.plan import Plan
from ptrun.train.run_output import ProgressView, epoch_line, layout_line, layout_table

NAMES = ["embed"] + [f"block.{b}.{h}" for b in range(6) for h in ("attn", "mlp")] + ["head"]
PLAN = Plan(
    num_units=14,
    frozen_units=5,
    pp=2,
    dp=2,
    stage_bounds=((0, 9), (9, 14)),
    microbatches=4,
    schedule="1F1B",
    cached_units=5,
).check()


def test_the_table_lists_each_stage_with_its_units_and_frozen_and_cached_counts():
    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    console.print(layout_table(PLAN, NAMES))
    text = console.export_text()
    assert "K=2 x DP=2, M=4 (1F1B); 5 of 14 units frozen, 5 cached" in text
    table = [line for line in text.splitlines() if "[" in line and "│" in line]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in table]
    assert rows == [
        ["0", "0", "embed .. block.3.mlp [0,9)", "5", "5"],
        ["1", "1", "block.4.attn .. head [9,14)", "0", "0"],
    ]


def test_without_a_terminal_the_view_prints_plain_lines(capsys):
    view = ProgressView(enabled=True)
    assert not view.live  # pytest captures stdout: not a terminal
    view.start_epoch(0, 3, 10)
    view.update(5, 0.5, 100.0)  # no progress bar without a terminal: nothing printed
    view.end_epoch()
    view.show_layout(PLAN, NAMES)
    view.print("epoch 1/3 done")
    out = capsys.readouterr().out.splitlines()
    assert out == [layout_line(PLAN), "epoch 1/3 done"]
    assert layout_line(PLAN) == ("layout: K=2 DP=2 M=4 1F1B; frozen 5/14 units, cached 5; stages [0,9)f5c5 [9,14)")


def test_the_epoch_line_shows_the_cache_hit_rates_of_training_and_of_its_evaluation():
    cache = {
        "hits": 90,
        "advanced": 0,
        "computed": 10,
        "eval_hits": 0,
        "eval_advanced": 0,
        "eval_computed": 0,
        "cached_units": 5,
        "memory_bytes": 3 << 19,
        "disk_bytes": 0,
    }
    stats = {"train_loss": 0.5, "samples_per_s": 100.0, "epoch_time_s": 2.0, "cache": cache}
    assert "  cache 5 units, 90% hits (1.5 MiB)  [K=2" in epoch_line(0, 3, stats, {}, PLAN)  # not evaluated
    cache.update(eval_hits=30, eval_computed=10)
    line = epoch_line(0, 3, stats, {"top1": 50.0}, PLAN)
    assert "eval_top1 50.00  cache 5 units, 90% hits, eval 75% hits (1.5 MiB)" in line
    # entries of a shallower depth, advanced by the newly frozen units, are served too: the line says so
    cache.update(hits=18, advanced=82, computed=0, eval_hits=2, eval_advanced=98, eval_computed=0)
    line = epoch_line(0, 3, stats, {"top1": 50.0}, PLAN)
    assert "cache 5 units, 18% hits + 82% advanced, eval 2% hits + 98% advanced (1.5 MiB)" in line


def test_a_transition_says_its_cost_in_steps():
    """The transition line gives the change's seconds and, once steps have been timed, their number in steps of
    the run's recent median: two significant digits below 10, whole steps above."""
    from dataclasses import replace

    from ptrun.train.run_output import transition_line

    new = replace(PLAN, frozen_units=7)
    assert transition_line(1, PLAN, new, 0.02).endswith("transition 0.02s")
    assert transition_line(1, PLAN, new, 0.02, step=27, step_s=0.65).startswith("epoch 2, step 28: 7 of 14 units")
    assert transition_line(1, PLAN, new, 0.02, 27, 0.65).endswith("transition 0.02s (0.031 steps' time)")
    assert transition_line(1, PLAN, new, 3.0, 27, 0.02).endswith("transition 3.00s (150 steps' time)")


def test_the_step_clock_times_steps_in_a_row_only(monkeypatch):
    """The recent step time is the median of the gaps between step ends within a segment: the gap across a
    pause (a decision, an evaluation) is no step's. The clock's time is the test's own (the gaps are exactly
    what it says, however busy the machine)."""
    import torch

    from ptrun.train import epoch_stats

    class Time:
        now = 1000.0

        def perf_counter(self) -> float:
            return self.now

        def time(self) -> float:
            return self.now

    fake = Time()
    monkeypatch.setattr(epoch_stats, "time", fake)
    clock = epoch_stats.StepClock(torch.device("cpu"))
    assert clock.step_s is None
    for gap in (0.0, 0.25, 0.75):
        fake.now += gap
        clock.step_ended()
    clock.pause()
    fake.now += 5.0
    clock.step_ended()
    # two gaps counted, neither of them the one across the pause
    assert clock.steps == 4 and list(clock.recent) == [0.25, 0.75]
    assert clock.step_s == 0.5
