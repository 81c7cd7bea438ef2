"""The continuation benchmark's reading of its runs and its table: the final top-1 is the run's `end` event's,
and the difference and its mean are the continued run's against the longer run's."""

from __future__ import annotations

from helpers.metrics import write_events

from benchmarks.harness import final_top1
from benchmarks.lora_continue import caption, table


def test_the_final_top1_is_the_end_events(tmp_path):
    events = [
        {"event": "eval", "time": 1.0, "epoch": 0, "top1": 90.0},
        {"event": "end", "time": 2.0, "epochs": 1, "final_eval": {"top1": 97.5}, "best_eval": {"top1": 98.0}},
    ]
    write_events(tmp_path, events)
    assert final_top1(tmp_path) == 97.5


def test_the_table_shows_each_seed_and_the_mean_difference():
    rows = [
        {"seed": 0, "longer": 97.0, "shorter": 96.0, "continued": 97.5, "difference": 0.5},
        {"seed": 1, "longer": 98.0, "shorter": 97.0, "continued": 97.0, "difference": -1.0},
    ]
    result = {"recipe": "bbc_news_lora", "epochs": 3, "rows": rows}
    assert caption(result).endswith("mean -0.25")
    lines = table(result).splitlines()
    assert lines[0] == "| seed | 3 epochs | 2 epochs | 2 + 1 continued | continued - longer |"
    assert lines[2:] == [
        "| 0 | 97.00% | 96.00% | 97.50% | +0.50 |",
        "| 1 | 98.00% | 97.00% | 97.00% | -1.00 |",
        "| mean | 97.50% | 96.50% | 97.25% | -0.25 |",
    ]
