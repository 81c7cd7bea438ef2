"""`benchmarks.startup`: the times it reads from a real run (a ptrun trainer's events, the plain loop's JSON),
its rows and table on synthetic rounds, the runs it picks for a recipe, and its optional sections of the
results page.
"""

from __future__ import annotations

import json
import shutil
from contextlib import closing
from pathlib import Path

import pytest
import torch
from conftest import TINY, TINY_MODEL, compose_config, run_events

from benchmarks import peer_runs, results_contents, results_page
from benchmarks import startup as bench_startup
from benchmarks.harness import label_rows


def test_a_real_runs_events_give_its_first_step_after_its_start(tmp_path, one_rank_group):
    """ptrun's trainer records when its first step began and ended on its first epoch event only; the
    benchmark reads them, after the start event's time."""
    from ptrun.train.trainer import Trainer

    run_dir = tmp_path / "run"
    cfg = compose_config(
        [
            *TINY,
            "launcher.nproc_per_node=1",
            "train.epochs=2",
            "train.max_steps_per_epoch=2",
            "train.export=false",
            "auto.cache=false",
        ],
        run_dir,
    )
    run_dir.mkdir()
    with closing(Trainer(cfg, 0, 1, torch.device("cpu"), resume=False)) as trainer:
        trainer.fit()
    events = run_events(run_dir)
    marks = bench_startup.ptrun_marks(events)
    epochs = [e for e in events if e["event"] == "epoch"]
    assert len(epochs) == 2 and "first_step_time" not in epochs[1] and "first_step_end_time" not in epochs[1]
    assert marks["start_time"] <= marks["first_step_time"] <= marks["first_step_end_time"] <= epochs[0]["time"]
    spawn = marks["start_time"] - 2.5
    seconds = bench_startup.since(spawn, marks)
    assert seconds["start_event_s"] == pytest.approx(2.5)
    assert seconds["first_step_s"] == marks["first_step_time"] - spawn
    assert seconds["first_step_end_s"] == marks["first_step_end_time"] - spawn
    # each epoch's evaluation is timed, inside the epoch's record; the peer benchmark adds them up
    assert all(0 < e["eval_time_s"] < e["time"] - marks["start_time"] for e in epochs)
    run = peer_runs.read_ptrun(run_dir)
    assert run["eval_s"] == pytest.approx(sum(e["eval_time_s"] for e in epochs))
    assert run["first_step_time"] == marks["first_step_time"]


def test_the_plain_loop_records_its_first_step(tmp_path):
    from benchmarks import plain_loop

    out = tmp_path / "plain.json"
    plain_loop.main(
        [
            "--recipe=digits_vit",
            "--threads=1",
            f"--out={out}",
            *TINY_MODEL,
            "train.epochs=1",
            "train.max_steps_per_epoch=2",
        ]
    )
    result = json.loads(out.read_text())
    assert result["process_start_time"] <= result["first_step_time"] <= result["first_step_end_time"]
    marks = bench_startup.plain_marks(result)
    assert marks["start_time"] is None and bench_startup.since(0.0, marks)["start_event_s"] is None
    assert marks["first_step_time"] == result["first_step_time"]
    assert [e["eval_time_s"] > 0 for e in result["epochs"]] == [True]
    run = peer_runs.read_plain(tmp_path)
    assert run["eval_s"] == result["epochs"][0]["eval_time_s"] and run["first_step_time"] == result["first_step_time"]


def row(label: str, first: float, end: float, start: float | None, wall: float) -> dict:
    return {
        "label": label,
        "first_step_s": first,
        "first_step_end_s": end,
        "start_event_s": start,
        "wall_s": wall,
        "run_dir": "/x",
    }


P, C, W = bench_startup.PLAIN, bench_startup.COLD, bench_startup.WARM


def rounds() -> list[list[dict]]:
    return [
        bench_startup.measure(r)
        for r in (
            [row(P, 6.0, 7.5, None, 12.0), row(C, 16.0, 17.5, 15.9, 25.0), row(W, 14.0, 15.5, 13.9, 23.0)],
            [row(P, 5.0, 6.5, None, 11.0), row(C, 17.0, 18.5, 16.9, 27.0), row(W, 13.0, 14.5, 12.9, 21.0)],
            [row(P, 7.0, 8.5, None, 13.0), row(C, 15.0, 16.5, 14.9, 26.0), row(W, 15.0, 16.5, 14.9, 22.0)],
        )
    ]


def result_json(recipe: str = "text_classification", cached: bool = True) -> dict:
    return {
        "command": f"python -m benchmarks.startup --recipe {recipe} --out /tmp/s",
        "date": "2026-11-26T10:00:00",
        "machine": "16 CPU cores, GPU: 1 x NVIDIA H100",
        "recipe": recipe,
        "overrides": [],
        "repeats": 3,
        "steps": 3,
        "tokenized_cache": cached,
        "rows": label_rows(rounds(), bench_startup.KEYS),
    }


def test_rows_against_the_plain_loop_of_each_round_and_the_table():
    first = rounds()[0]
    assert [r["over_plain_s"] for r in first] == [None, 10.0, 8.0]
    result = result_json()
    text = bench_startup.table(result)
    assert "| plain loop | 6.0 (5.0-7.0) | 7.5 (6.5-8.5) | - | - | 12.0 (11.0-13.0) |" in text
    assert "| ptrun, cold cache | 16.0 (15.0-17.0) | 17.5 (16.5-18.5) | 10.0 (8.0-12.0) | 15.9 (14.9-16.9) |" in text
    assert "| ptrun, warm cache | 14.0 (13.0-15.0) | 15.5 (14.5-16.5) | 8.0 (8.0-8.0) | 13.9 (12.9-14.9) |" in text
    assert bench_startup.caption(result) == (
        "text_classification: 3 round(s) of 3 runs, interleaved; medians (min-max over the rounds); seconds from "
        "spawning each command; 3 training step(s) of 1 epoch per run; the tokenized-data cache emptied before "
        "the plain loop and the cold run of each round"
    )
    assert "no tokenized-data cache" in bench_startup.caption(result_json("bbc_news_bert", cached=False))
    json.dumps(result)


def test_runs_and_sample_data_per_recipe(tmp_path):
    """Text of `data.name=hf` goes through the tokenized-data cache (a cold and a warm ptrun run); the packaged
    corpus of bbc_news_bert does not (one ptrun run). text_classification gets the sample file unless a
    data path is given."""
    sample = bench_startup.sample_data("text_classification", [], tmp_path, per_class=2)
    assert sample == [f"data.path={tmp_path / 'samples' / 'news.csv'}"]
    assert len((tmp_path / "samples" / "news.csv").read_text().strip().splitlines()) == 1 + 2 * 5
    assert bench_startup.sample_data("text_classification", ["data.path=/d.csv"], tmp_path, 2) == []
    assert bench_startup.sample_data("bbc_news_bert", [], tmp_path, 2) == []
    assert bench_startup.uses_token_cache("text_classification", sample)
    assert bench_startup.uses_token_cache("bbc_news_bert", [])
    assert not bench_startup.uses_token_cache("digits_vit", [])
    assert bench_startup.labels(True) == [P, C, W] and bench_startup.labels(False) == [P, bench_startup.PTRUN]
    cold = bench_startup.command(C, "text_classification", Path("/r"), ["train.epochs=1"])
    assert bench_startup.shown(cold) == "ptrun train hydra.run.dir=/r recipe=text_classification train.epochs=1"
    plain = bench_startup.command(P, "text_classification", Path("/r"), ["train.epochs=1"])
    assert bench_startup.shown(plain) == (
        "python -m benchmarks.plain_loop --recipe=text_classification --threads=2 --out=/r/plain.json train.epochs=1"
    )


def test_results_page_shows_a_startup_result_only_once_there_is_one(tmp_path):
    """The start-up sections are optional: without their JSON the page leaves them out (and is generated);
    with it, the section shows its command, the date and machine the JSON records, and the table."""
    results = tmp_path / "results"
    shutil.copytree(Path(results_contents.__file__).parents[1] / "docs" / "results", results)
    titles = [t.title for t in results_contents.TABLES if t.module == "benchmarks.startup"]
    assert len(titles) == 2
    for published in results.glob("bench_startup_*.json"):  # absent first
        published.unlink()
    page = results_page.page(results)
    assert not any(title in page for title in titles)
    (results / "bench_startup_text_classification.json").write_text(json.dumps(result_json()))
    page = results_page.page(results)
    title = "### Start-up: process start to the first step, text_classification"
    assert page.count(title) == 1 and titles[1] not in page
    section = page.split(title)[1].split("\n### ")[0]
    assert "- command: `python -m benchmarks.startup --recipe text_classification --out /tmp/s`" in section
    assert "- measured: 2026-11-26\n" in section and "- machine: 16 CPU cores, GPU: 1 x NVIDIA H100\n" in section
    assert "| ptrun, warm cache | 14.0 (13.0-15.0) |" in section
