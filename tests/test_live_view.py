"""The terminal view: a layout table on a terminal, plain lines without one (CI, log files)."""

from __future__ import annotations

import io

from rich.console import Console

from ptrun.parallel.plan import Plan
from ptrun.train.report import ProgressView, epoch_line, layout_line, layout_table

NAMES = ["embed"] + [f"block.{b}.{h}" for b in range(6) for h in ("attn", "mlp")] + ["head"]
PLAN = Plan(num_units=14, frozen_units=5, pp=2, dp=2, stage_bounds=((0, 9), (9, 14)), microbatches=4,
            schedule="1F1B", cached_units=5).check()


def test_the_table_lists_each_stage_with_its_units_and_frozen_and_cached_counts():
    console = Console(file=io.StringIO(), force_terminal=True, width=160, record=True)
    console.print(layout_table(PLAN, NAMES))
    text = console.export_text()
    assert "K=2 x DP=2, M=4 (1F1B); 5 of 14 units frozen, 5 cached" in text
    rows = [[cell.strip() for cell in l.split("│")[1:-1]] for l in text.splitlines() if "[" in l and "│" in l]
    assert rows == [["0", "0", "embed .. block.3.mlp [0,9)", "5", "5"],
                    ["1", "1", "block.4.attn .. head [9,14)", "0", "0"]]


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
    assert layout_line(PLAN) == ("layout: K=2 DP=2 M=4 1F1B; frozen 5/14 units, cached 5; "
                                 "stages [0,9)f5c5 [9,14)")


def test_the_epoch_line_shows_the_cache_hit_rates_of_training_and_of_its_evaluation():
    cache = {"hits": 90, "advanced": 0, "computed": 10, "eval_hits": 0, "eval_advanced": 0, "eval_computed": 0,
             "cached_units": 5, "memory_bytes": 3 << 19, "disk_bytes": 0}
    stats = {"train_loss": 0.5, "samples_per_s": 100.0, "epoch_time_s": 2.0, "cache": cache}
    assert "  cache 5 units, 90% hits (1.5 MiB)  [K=2" in epoch_line(0, 3, stats, {}, PLAN)  # not evaluated
    cache.update(eval_hits=30, eval_advanced=10)
    line = epoch_line(0, 3, stats, {"top1": 50.0}, PLAN)
    assert "eval_top1 50.00  cache 5 units, 90% hits, eval 75% hits (1.5 MiB)" in line
